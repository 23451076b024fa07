"""Time compute_gae on CUDA against a CleanRL-style loop, torch.compile and a device copy, in one run.

    python scripts/benchmark_gae.py                      # every shape, both layouts
    python scripts/benchmark_gae.py --shapes 1x2048 16x1048576 --no-compile
    python scripts/benchmark_gae.py --after-kernel --shapes 4x131072 --layouts time   # after a torch kernel
    python scripts/benchmark_gae.py --sweep --shapes 4x131072 --layouts time --configs default default+e

Per shape `NxT` and layout (env-major `[N, T]`; time-major `[T, N]` passed as `.T`):
  call      full compute_gae call, wrapper included, back to back (what a training loop pays)
  GPU       GPU time of the same call: calls queued behind a GPU sleep, so the GPU runs them without
            waiting for the host, as training calls it. Repeated calls replay CUDA graphs of their
            launch (kernels/README.md, "Launching"); this is the median of three rounds that alternate
            with the eager launch's (eager GPU; on sm_90+ a programmatic dependent launch, which
            overlaps the previous call's tail where a replay does not)
  GB/s      bytes the call must move (22 B/element: 4 rewards, 4 values, 1+1 flags, 4 bootstrap,
            4+4 outputs) over its GPU time; %copy is the copy's time over ours: the fraction of copy
            bandwidth we reach on the same bytes. Env-major tiles of up to 1024 steps read bootstrap
            values only around truncations and the last column, so with rare episode ends they move
            about 18 of the 22 bytes and can pass 100%
  copy      a device-to-device copy of the same bytes (the floor)
  loop      CleanRL's reverse Python loop of torch ops (only for short rows: it is slow)
  compile   torch.compile of a vectorised GAE built on torch's associative_scan
  call/empty  the full call over a launch of an empty one-argument Triton kernel: the median of the
            ratios of neighbouring blocks of each, alternated (a shared host's launch cost drifts
            within a run; a yardstick timed minutes apart drifts with it)
  eager/empty, eager GPU  call/empty and the GPU time again with the launch eager (graphs off)
Times are medians. Small shapes are launch-bound; compare them only inside one run.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
from dev.gae_cases import (  # scripts/dev/
    BYTES_PER_ELEMENT,
    GAMMA,
    LAM,
    launch_tile,
    make_inputs,
    parse_tile,
    reference_advantages,
    reference_check,
    relative_error,
    run_gae,
)
from dev.timing import copy_time_us, empty_launch, median_time_us, paired_time_us, queued_time_us, warm_up_gpu

from kernels import compute_gae
from kernels import gae as gae_module

DEFAULT_SHAPES = ["1x2048", "64x256", "4096x32", "4096x128", "1024x1024", "16384x1024",
                  "16x65536", "4x131072", "1x1048576", "16x1048576"]
SWEEP_CONFIGS = ["default", "1x1024/4", "1x2048/8", "2x512/4", "128x8/1", "64x16/1", "32x32/1", "16x64/1", "8x128/1",
                 "32x64/2", "16x256/4"]


def cleanrl_loop(rewards, values, terminateds, truncateds, bootstrap_values, gamma, lam):
    """CleanRL's ppo_continuous_action GAE, time-major, with truncation bootstrap added."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextvalues = bootstrap_values[t]
        else:
            nextvalues = torch.where(truncateds[t], bootstrap_values[t], values[t + 1])
        nextnonterminal = 1.0 - terminateds[t].float()
        notdone = 1.0 - (terminateds[t] | truncateds[t]).float()
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * notdone * lastgaelam
    return advantages, advantages + values


def _compose_later_first(later, current):
    return current[0] + current[1] * later[0], current[1] * later[1]


def _compose_current_first(current, later):
    return current[0] + current[1] * later[0], current[1] * later[1]


def make_vectorised_gae(combine):
    from torch._higher_order_ops.associative_scan import associative_scan

    def vectorised_gae(rewards, values, terminateds, truncateds, bootstrap_values, gamma, lam):
        next_values = torch.cat([values[:, 1:], bootstrap_values[:, -1:]], dim=1)
        next_values = torch.where(truncateds, bootstrap_values, next_values)
        next_values = torch.where(terminateds, 0.0, next_values)
        deltas = rewards + gamma * next_values - values
        decays = (~(terminateds | truncateds)).float() * (gamma * lam)
        advantages, _ = associative_scan(combine, (deltas, decays), dim=1, reverse=True)
        return advantages, advantages + values

    return vectorised_gae


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="NxT shapes")
    parser.add_argument("--layouts", nargs="+", default=["env", "time"], choices=["env", "time"])
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--compile-budget-s", type=float, default=240.0, help="stop compiling after this long")
    parser.add_argument("--loop-max-steps", type=int, default=2048, help="run the Python loop only for T <= this")
    parser.add_argument("--check-max-elements", type=int, default=1 << 24, help="float64 check up to N*T")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--sweep", action="store_true", help="instead: GPU time per tile size and warp count")
    parser.add_argument("--configs", nargs="+", default=SWEEP_CONFIGS,
                        help="--sweep tiles as NxT/WARPS or 'default' (the plan's choice), each optionally "
                             "followed by @WINDOW (look-back chunks read per round), #REGS (a cap on "
                             "registers per thread; #0: none; without it, the plan's), :quads or :whole (the "
                             "four-quarter scan on or off), +p "
                             "(the early read of the next chunk on), +m (bounds masks kept), +r / +g (the "
                             "quads' scan carries what follows each quad / a gather reads it), +c / +s "
                             "(chunks publish from the tile's first column / from the tile summed to it), "
                             "+x / +a (with atomics in inline PTX / Triton's atomics), +b / +d "
                             "(bootstrap values read only where they count / at every step) and +l / +e "
                             "(a programmatic dependent launch or not)")
    parser.add_argument("--after-kernel", action="store_true",
                        help="instead: GPU time of the call queued right after a torch kernel that writes "
                             "its values (as a training loop's value pass does), the pair's time minus that kernel's")
    parser.add_argument("--done-rate", type=float,
                        help="--sweep: the fraction of steps that end an episode (default, and the table's: 0.001)")
    parser.add_argument("--gamma-lam", type=float,
                        help="--sweep: gamma and lambda both set to this (1.0 with --done-rate 0: unbroken chains)")
    args = parser.parse_args()
    if not args.sweep and (args.done_rate is not None or args.gamma_lam is not None):
        parser.error("--done-rate and --gamma-lam apply to --sweep only (the table keeps its inputs fixed)")
    if not torch.cuda.is_available():
        sys.exit("benchmark_gae.py needs a CUDA GPU")
    if args.sweep:
        return sweep_tiles(args)
    if args.after_kernel:
        return after_kernel(args)

    device_name = torch.cuda.get_device_name()
    print(f"# {device_name}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    warm_up_gpu()
    empty_us = median_time_us(empty_launch, 200)
    print(f"# empty Triton kernel launch {empty_us:.2f} us", flush=True)

    compile_state = {"combine": None, "spent": 0.0, "enabled": not args.no_compile}
    rows = []
    header = (f"{'N x T':>12} {'layout':>6} {'call us':>9} {'GPU us':>9} {'GB/s':>7} {'%copy':>6} "
              f"{'copy us':>8} {'loop us':>10} {'compile us':>10} {'empty us':>8} {'call/empty':>10} {'max err':>8} "
              f"{'eager/empty':>11} {'eager GPU':>9}")
    print(header, flush=True)
    for spec in args.shapes:
        for layout in args.layouts:
            row = measure(spec, layout, args, compile_state)
            rows.append(row)
            print(f"{spec:>12} {layout:>6} {row['call_us']:9.2f} {row['device_us']:9.2f} {row['gb_per_s']:7.0f} "
                  f"{100 * row['fraction_of_copy_bw']:5.0f}% {row['copy_us']:8.2f} {row['loop_us']:10.0f} "
                  f"{row['compile_us']:10.2f} {row['empty_us']:8.2f} {row['call_over_empty']:10.2f} "
                  f"{row['max_abs_error']:8.1e} {row['eager_over_empty']:11.2f} {row['eager_device_us']:9.2f}",
                  flush=True)
            torch.cuda.empty_cache()

    empty_after = median_time_us(empty_launch, 200)
    copy_bw = max(BYTES_PER_ELEMENT * _elements(row["shape"]) / (row["copy_us"] * 1e-6) for row in rows)
    print(f"# empty Triton kernel launch again at the end: {empty_after:.2f} us; best copy bandwidth "
          f"{copy_bw / 1e12:.2f} TB/s (read + write)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": device_name, "copy_bw": copy_bw, "empty_us": empty_us,
                                         "empty_us_end": empty_after, "rows": rows}, indent=1))


def after_kernel(args, rounds: int = 3) -> None:
    """Device us of the full call right after a torch kernel that writes its values, back to back:
    the pair's time minus that kernel's alone, beside the call alone and a copy of its bytes. Where the
    launch is a programmatic dependent one (kernels/README.md, "Launching") it overlaps that kernel's tail."""
    print(f"# {torch.cuda.get_device_name()}: GPU us, {rounds} rounds; after = pair - kernel")
    print(f"{'N x T':>12} {'layout':>6} {'copy':>7} {'call':>7} {'kernel':>7} {'pair':>7} {'after':>7}  max err")
    for spec in args.shapes:
        num_envs, num_steps = (int(s) for s in spec.lower().split("x"))
        nbytes = BYTES_PER_ELEMENT * num_envs * num_steps
        calls = max(5, min(100, int(2e8 // nbytes)))
        for layout in args.layouts:
            x = make_inputs(num_envs, num_steps, layout == "time")
            expected = reference_advantages(x, GAMMA, LAM)
            call = functools.partial(run_gae, x)

            def kernel(x=x):
                x["values"].mul_(1.0)  # rewrites the values the call reads next

            def pair(call=call, kernel=kernel):
                kernel()
                call()

            x["advantages"].fill_(float("nan"))
            pair()
            error = relative_error(x, expected)
            for _ in range(rounds):
                copy_us = copy_time_us(nbytes, calls)
                call_us, kernel_us, pair_us = (queued_time_us(fn, calls) for fn in (call, kernel, pair))
                print(f"{spec:>12} {layout:>6} {copy_us:7.2f} {call_us:7.2f} {kernel_us:7.2f} {pair_us:7.2f} "
                      f"{pair_us - kernel_us:7.2f}  {error:.1e}", flush=True)
            del x, call
            torch.cuda.empty_cache()


def sweep_tiles(args) -> None:
    """GPU time of the kernel for each tile and warp count, with the copy of the same bytes.
    A tile whose output (NaN-poisoned first) strays from a float64 loop by more than 1e-3 (relative to the
    largest advantage, where that exceeds 1) is marked '!'. Every cell launches the kernel (no graph
    replay): on sm_90+ a programmatic dependent launch unless the label says `+e`."""
    configs = [parse_tile(label) for label in args.configs]
    labels = args.configs
    gamma, lam = (GAMMA, LAM) if args.gamma_lam is None else (args.gamma_lam, args.gamma_lam)
    done_rate = 0.001 if args.done_rate is None else args.done_rate
    print(f"# {torch.cuda.get_device_name()}: GPU us per tile [block_n x block_t]/warps; "
          f"copy = the same bytes copied; done rate {done_rate:g}, gamma {gamma:g}, lambda {lam:g}")
    print(f"{'N x T':>12} {'layout':>6} {'copy':>7} " + " ".join(f"{label:>9}" for label in labels), flush=True)
    for spec in args.shapes:
        num_envs, num_steps = (int(s) for s in spec.lower().split("x"))
        nbytes = BYTES_PER_ELEMENT * num_envs * num_steps
        calls = max(5, min(100, int(2e8 // nbytes)))
        for layout in args.layouts:
            x = make_inputs(num_envs, num_steps, layout == "time", done_rate)
            copy_us = copy_time_us(nbytes, calls)
            expected = reference_advantages(x, gamma, lam)
            cells = []
            for options in configs:

                def run(x=x, options=options):
                    launch_tile(x, options, gamma, lam)

                x["advantages"].fill_(float("nan"))
                run()
                wrong = not relative_error(x, expected) < 1e-3  # NaN counts as wrong
                cells.append(f"{queued_time_us(run, calls):8.2f}{'!' if wrong else ' '}")
            print(f"{spec:>12} {layout:>6} {copy_us:7.2f} " + " ".join(cells), flush=True)
            del x
            torch.cuda.empty_cache()


def _elements(spec: str) -> int:
    num_envs, num_steps = (int(s) for s in spec.lower().split("x"))
    return num_envs * num_steps


def measure(spec: str, layout: str, args, compile_state: dict) -> dict:
    """Every column of the table for one shape and layout."""
    num_envs, num_steps = (int(s) for s in spec.lower().split("x"))
    nbytes = BYTES_PER_ELEMENT * num_envs * num_steps
    x = make_inputs(num_envs, num_steps, layout == "time")
    gae_args = {k: x[k] for k in ("rewards", "values", "terminateds", "truncateds")}

    ours = functools.partial(run_gae, x)

    calls = max(5, min(200, int(2e8 // max(nbytes, 1))))
    # enough calls that launches overlap; the empty launch alternates with them (see the docstring)
    call_us, empty_us, call_over_empty = paired_time_us(ours, empty_launch, max(calls, 50))
    # At least 50 calls a GPU-time sample too, for replays and launches alike: a sample of 5-17 calls
    # (the large shapes) measured 1-2% more per call than one of 200.
    eager, device_us = eager_times(ours, x, max(calls, 50), max(calls, 50))
    small_rows = num_envs * num_steps <= args.check_max_elements and num_envs <= 16
    if small_rows:  # check what the timed calls ran (a graph replay, where they replay one)
        x["advantages"].fill_(float("nan"))
        ours()
    error = reference_check(x) if small_rows else float("nan")

    copy_us = copy_time_us(nbytes, calls)

    loop_us = float("nan")
    if num_steps <= args.loop_max_steps:
        tm = {k: v.T for k, v in x.items()}  # CleanRL indexes time first

        def loop():
            cleanrl_loop(tm["rewards"], tm["values"], tm["terminateds"], tm["truncateds"],
                         tm["bootstrap_values"], GAMMA, LAM)

        loop()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            loop()
        torch.cuda.synchronize()
        loop_us = (time.perf_counter() - start) / 3 * 1e6

    compile_us = float("nan")
    if compile_state["enabled"] and compile_state["spent"] < args.compile_budget_s:
        start = time.perf_counter()
        try:
            if compile_state["combine"] is None:
                compile_state["combine"] = pick_combine_order(x, gae_args)
            compiled = torch.compile(make_vectorised_gae(compile_state["combine"]), dynamic=False)

            def run():
                return compiled(**gae_args, bootstrap_values=x["bootstrap_values"], gamma=GAMMA, lam=LAM)

            got, _ = run()
            torch.testing.assert_close(got, x["advantages"], rtol=1e-4, atol=1e-3)
            compile_us = median_time_us(run, calls)
        except Exception as e:  # report, don't hide: the baseline is optional
            print(f"# torch.compile baseline failed at {spec}/{layout}: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200]}", flush=True)
            compile_state["enabled"] = False
        compile_state["spent"] += time.perf_counter() - start

    gbps = nbytes / (device_us * 1e-6) / 1e9
    return {"shape": spec, "layout": layout, "call_us": call_us, "device_us": device_us, "gb_per_s": gbps,
            "fraction_of_copy_bw": copy_us / device_us, "copy_us": copy_us, "loop_us": loop_us,
            "compile_us": compile_us, "max_abs_error": error, "empty_us": empty_us, "call_over_empty": call_over_empty,
            **eager}


def eager_times(ours, x: dict[str, torch.Tensor], calls: int, device_calls: int,
                rounds: int = 3) -> tuple[dict[str, float], float]:
    """`(eager columns, GPU us of the call)`. Where `compute_gae` replays CUDA graphs of this
    call's launch, the eager columns time the call again with the launch eager: `calls` paired with
    the empty launch, and the GPU time in `rounds` that alternate with
    the replays' (`device_calls` queued each), medians, so that a drift of the GPU within the row
    cannot favour one. NaN where the call launches eagerly anyway (graphs off)."""
    tensors = (x["rewards"], x["values"], x["terminateds"], x["truncateds"], x["bootstrap_values"], None,
               x["advantages"], x["returns"])
    launch = gae_module._runs.get(gae_module._lookup(tensors)[0], (None,))[0]
    graphs = getattr(launch, "graphs", None)
    if not graphs:
        nan = float("nan")
        eager = {"eager_call_us": nan, "eager_over_empty": nan, "eager_device_us": nan}
        return eager, queued_time_us(ours, device_calls)
    replayed, launched = [], []
    try:
        launch.graphs = None
        eager_us, _, eager_over_empty = paired_time_us(ours, empty_launch, calls)
        for _ in range(rounds):
            launch.graphs = graphs
            replayed.append(queued_time_us(ours, device_calls))
            launch.graphs = None
            launched.append(queued_time_us(ours, device_calls))
    finally:
        launch.graphs = graphs
    eager = {"eager_call_us": eager_us, "eager_over_empty": eager_over_empty,
             "eager_device_us": statistics.median(launched)}
    return eager, statistics.median(replayed)


def pick_combine_order(x, gae_args):
    """torch's associative_scan does not document the operand order of a reverse scan: try both."""
    small = {k: v[:4, :64] for k, v in gae_args.items()}
    boot = x["bootstrap_values"][:4, :64].clone()
    boot[:, -1] = 0
    expected, _ = compute_gae(**small, bootstrap_values=boot, gamma=GAMMA, lam=LAM)
    for combine in (_compose_later_first, _compose_current_first):
        got, _ = torch.compile(make_vectorised_gae(combine))(**small, bootstrap_values=boot, gamma=GAMMA, lam=LAM)
        if torch.allclose(got, expected, rtol=1e-4, atol=1e-4):
            return combine
    raise RuntimeError("neither operand order of torch associative_scan reproduces GAE")


if __name__ == "__main__":
    main()
