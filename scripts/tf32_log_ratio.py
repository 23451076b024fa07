"""How far would TF32 matrix products move a trained policy's log-probabilities? (CPU; a diagnostic.)

    python scripts/tf32_log_ratio.py runs/Ant-v4/seed1_... runs/Hopper-v4/seed1_...

`ppo.fused_precision=tf32` runs the update's products on tensor cores, which read each input to
10 mantissa bits, while the rollout's log-probabilities come from fp32 products: the update's first
epoch then starts from ratios that are not exactly 1. This measures that gap without a GPU: it
rolls a checkpoint's policy out for 64 envs x 32 steps (its own sampled actions, frozen
normalisers), then scores the same actions again with every `nn.Linear` computed from inputs cut
to TF32 (truncated, as tensor cores read fp32 registers, and rounded to nearest), and prints the
log-ratio's size, the share of samples past the clip range and the approximate KL it amounts to.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluate import envs_and_policy  # noqa: E402

LOW_BITS = 0x1FFF  # the 13 mantissa bits fp32 has and TF32 drops


def to_tf32(x: torch.Tensor, rounded: bool) -> torch.Tensor:
    bits = x.contiguous().view(torch.int32)
    if rounded:
        bits = bits + (LOW_BITS + 1) // 2
    return (bits & ~LOW_BITS).view(torch.float32)


def tf32_linear(rounded: bool):
    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # Products of TF32 inputs are exact in float64; the sum then rounds once to fp32.
        out = (to_tf32(x, rounded).double() @ to_tf32(weight, rounded).double().T).float()
        return out if bias is None else out + bias
    return linear


@torch.no_grad()
def measure(path: str, clip: float, seed: int) -> str:
    envs, policy = envs_and_policy(path, torch.device("cpu"), seed, num_envs=64, groups=1)
    agent, normalizer = policy.agent, policy.normalizer
    observations, actions = [], []
    obs = normalizer(envs.reset(seed))
    for _ in range(32):
        action, _, _, _ = agent.get_action_and_value(obs)
        observations.append(obs)
        actions.append(action)
        raw_obs, _, _, _ = envs.step(action.clamp(envs.action_low, envs.action_high))
        obs = normalizer(raw_obs)
    envs.close()
    observations, actions = torch.cat(observations), torch.cat(actions)
    _, fp32_log_prob, _, _ = agent.get_action_and_value(observations, actions)
    line = [f"{path}: policy std {agent.actor_log_std.exp().mean():.3f}"]
    fp32_linear = F.linear
    for rounded in (False, True):
        F.linear = tf32_linear(rounded)  # nn.Linear looks it up at each call
        try:
            _, log_prob, _, _ = agent.get_action_and_value(observations, actions)
        finally:
            F.linear = fp32_linear
        log_ratio = log_prob - fp32_log_prob
        ratio = log_ratio.exp()
        line.append(f"{'rounded' if rounded else 'truncated'}: |log ratio| mean {log_ratio.abs().mean():.4f} "
                    f"max {log_ratio.abs().max():.3f}, past the clip {((ratio - 1).abs() > clip).float().mean():.2%}, "
                    f"approx KL {((ratio - 1) - log_ratio).mean():.1e}")
    return " | ".join(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="run dirs or checkpoint files")
    parser.add_argument("--clip", type=float, default=0.2, help="the clip range to count samples past")
    parser.add_argument("--seed", type=int, default=777)
    args = parser.parse_args()
    for path in args.checkpoints:
        print(measure(path, args.clip, args.seed), flush=True)


if __name__ == "__main__":
    main()
