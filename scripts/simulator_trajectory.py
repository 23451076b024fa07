"""Record an envpool trajectory under fixed random actions, or compare one against a recording.

    python scripts/simulator_trajectory.py write ant_here.npz            # on one machine
    python scripts/simulator_trajectory.py compare ant_here.npz          # on another: where do they part?

Both runs reset the same task with the same seed and step it with the same actions (drawn from
`--action-seed`), so two envpool builds that simulate alike give identical arrays. `compare`
prints, per array, the largest difference and the first step where it exceeds `--atol`.
"""

from __future__ import annotations

import argparse

import numpy as np


def trajectory(task: str, num_envs: int, steps: int, seed: int, action_seed: int) -> dict[str, np.ndarray]:
    import envpool

    envs = envpool.make(task, env_type="gymnasium", num_envs=num_envs, seed=seed)
    actions = np.random.default_rng(action_seed).uniform(-1, 1, size=(steps, num_envs, envs.action_space.shape[0]))
    obs, rewards, terminated, truncated = [envs.reset()[0]], [], [], []
    for action in actions.astype(np.float32):
        o, r, te, tr, _ = envs.step(action)
        obs.append(o), rewards.append(r), terminated.append(te), truncated.append(tr)
    print(f"envpool {envpool.__version__}: {task}, {num_envs} envs x {steps} steps, seed {seed}")
    return {"obs": np.array(obs), "rewards": np.array(rewards), "terminated": np.array(terminated),
            "truncated": np.array(truncated)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["write", "compare"])
    parser.add_argument("path")
    parser.add_argument("--task", default="Ant-v4")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--action-seed", type=int, default=0)
    parser.add_argument("--atol", type=float, default=1e-6)
    args = parser.parse_args()
    ours = trajectory(args.task, args.num_envs, args.steps, args.seed, args.action_seed)
    if args.mode == "write":
        np.savez_compressed(args.path, **ours)
        return
    recorded = np.load(args.path)
    for name, values in ours.items():
        diff = np.abs(values.astype(np.float64) - recorded[name].astype(np.float64))
        apart = np.argwhere(diff > args.atol)
        first = f"first at step {apart[0][0]}" if len(apart) else "never"
        print(f"{name:10s} largest difference {diff.max():.3g}; above {args.atol:g}: {first}")


if __name__ == "__main__":
    main()
