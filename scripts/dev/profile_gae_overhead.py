"""Where does the host time of one compute_gae call go? (CUDA only; diagnostics, not a benchmark table.)

    python scripts/dev/profile_gae_overhead.py

Prints the host time per call (many calls back to back, then one sync) of an empty Triton kernel
with 1 and with 36 arguments, `launch_gae` (plans every call), `compute_gae` (repeated production
calls replay a CUDA graph; once more with graphs off), a few torch primitives, and a cProfile of
compute_gae. Compare the lines inside one run only.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys

import torch
import triton
from gae_cases import make_inputs
from timing import host_us

from kernels import compute_gae, gae, gae_launch
from kernels.gae_launch import launch_gae


@triton.jit
def _empty_1(x_ptr):
    pass


@triton.jit
def _empty_36(a, b, c, d, e, f, g, h, i, j, k,
              n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15, n16, n17, n18, n19, n20,
              n21, n22, n23, n24):
    pass


def random_rollout(num_envs: int, num_steps: int) -> dict[str, torch.Tensor]:
    """`compute_gae`'s inputs (no outputs), env-major on CUDA."""
    x = make_inputs(num_envs, num_steps, time_major=False)
    return {k: x[k] for k in ("rewards", "values", "terminateds", "truncateds", "bootstrap_values")}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options; answers --help
    if not torch.cuda.is_available():
        sys.exit("profile_gae_overhead.py needs a CUDA GPU")
    dev = torch.empty(16, device="cuda")
    ints = [3, 17, 1, 2048, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43, 45]
    rows = [("empty kernel, 1 arg", lambda: _empty_1[(1,)](dev)),
            ("empty kernel, 36 args", lambda: _empty_36[(1,)](*([dev] * 11), *ints))]
    shapes = {"1x2048": (1, 2048), "16x65536 (chunked)": (16, 65536), "1x1048576 (chunked)": (1, 1 << 20)}
    for spec, (n, t) in shapes.items():
        x = random_rollout(n, t)
        adv, ret = torch.empty_like(x["values"]), torch.empty_like(x["values"])
        args = (x["rewards"], x["values"], x["terminateds"], x["truncateds"], x["bootstrap_values"], None,
                0.99, 0.95, adv, ret)
        rows.append((f"launch_gae {spec}", lambda args=args: launch_gae(*args)))
        rows.append((f"compute_gae {spec}",
                     lambda x=x, adv=adv, ret=ret: compute_gae(**x, advantages=adv, returns=ret)))
        rows.append((f"compute_gae {spec}, outputs allocated", lambda x=x: compute_gae(**x)))
    v = torch.empty(64, 256, device="cuda")
    rows += [("torch.zeros(514, int64)", lambda: torch.zeros(514, dtype=torch.int64, device="cuda")),
             ("torch.empty_like([64, 256])", lambda: torch.empty_like(v)),
             ("tensor.stride()", lambda: v.stride()),
             ("tensor.data_ptr()", lambda: v.data_ptr()),
             ("tensor.device == device", lambda: v.device == dev.device)]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for name, fn in rows:
        print(f"{name:45s} {host_us(fn):8.2f} us/call (host)", flush=True)

    # The rows above replay CUDA graphs where compute_gae does (repeated calls);
    # the same production call again with every launch eager, and the yardstick again beside it.
    x = random_rollout(1, 2048)
    adv, ret = torch.empty_like(x["values"]), torch.empty_like(x["values"])
    graphs, gae_launch._CUDA_GRAPHS = gae_launch._CUDA_GRAPHS, False
    gae._runs.clear()
    print(f"{'compute_gae 1x2048, graphs off (launched)':45s} "
          f"{host_us(lambda: compute_gae(**x, advantages=adv, returns=ret)):8.2f} us/call (host)")
    gae_launch._CUDA_GRAPHS = graphs
    gae._runs.clear()
    print(f"{'compute_gae 1x2048, graphs on (replayed)':45s} "
          f"{host_us(lambda: compute_gae(**x, advantages=adv, returns=ret)):8.2f} us/call (host)")
    print(f"{'empty kernel, 1 arg':45s} {host_us(lambda: _empty_1[(1,)](dev)):8.2f} us/call (host)", flush=True)

    print(f"# compiled kernels cached for the direct launch: {len(gae_launch._compiled)}; "
          f"launch_enter_hook: {gae_launch._knobs.runtime.launch_enter_hook if gae_launch._knobs else 'no knobs'}")
    x = random_rollout(1, 2048)
    adv, ret = torch.empty_like(x["values"]), torch.empty_like(x["values"])
    get_stream = triton.runtime.driver.active.get_current_stream
    print(f"{'get_current_stream':45s} {host_us(lambda: get_stream(0)):8.2f} us")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(500):
        compute_gae(**x, advantages=adv, returns=ret)  # 1x2048: the unchunked production path
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
