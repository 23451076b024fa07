"""Record an envpool trajectory under fixed random actions, or compare one against a recording;
or summarise a backend's statistics under random actions.

    python scripts/dev/simulator_trajectory.py write ant_here.npz            # on one machine
    python scripts/dev/simulator_trajectory.py compare ant_here.npz          # on another: where do they part?
    python scripts/dev/simulator_trajectory.py stats - --backend gymnasium --steps 3000

`stats` (any backend, through `ppo.envs`) prints the reward per step, terminations, truncations,
mean episode length and the observations' per-dimension mean and std over valid steps (the
autoreset dummy steps left out): builds whose trajectories part can still be the same task.

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


def random_action_statistics(task: str, backend: str, num_envs: int, steps: int, seed: int, action_seed: int) -> None:
    import torch

    from ppo.config import EnvSettings
    from ppo.envs import make_envs, simulator_version

    envs = make_envs(EnvSettings(id=task, num_envs=num_envs, backend=backend, groups=1), torch.device("cpu"), seed)
    envs.reset(seed)
    rng = np.random.default_rng(action_seed)
    low, high = envs.action_low.numpy(), envs.action_high.numpy()
    dummy = torch.zeros(num_envs, dtype=torch.bool)
    length = torch.zeros(num_envs)
    rewards, observations, lengths, terminations, truncations = [], [], [], 0, 0
    for _ in range(steps):
        action = torch.from_numpy(rng.uniform(low, high, (num_envs, envs.act_dim)).astype(np.float32))
        obs, reward, terminated, truncated = envs.step(action)
        valid = ~dummy
        rewards.append(reward[valid]), observations.append(obs[valid])
        length += valid
        done = (terminated | truncated) & valid
        terminations += int((terminated & valid).sum())
        truncations += int((truncated & valid).sum())
        lengths.append(length[done].clone())
        length[done] = 0
        dummy = done
    envs.close()
    r, o, n = torch.cat(rewards), torch.cat(observations), torch.cat(lengths)
    print(f"{simulator_version(backend)}: {task}, {num_envs} envs x {steps} random-action steps, seed {seed}")
    print(f"reward per step {r.mean():.4f} +- {r.std():.4f}; terminations {terminations}, truncations "
          f"{truncations}, mean episode length {n.mean():.1f}")
    with np.printoptions(precision=3, suppress=True, linewidth=120):
        print("observation mean", o.mean(0).numpy())
        print("observation std ", o.std(0).numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["write", "compare", "stats"])
    parser.add_argument("path", help="the recording (write, compare); ignored by stats")
    parser.add_argument("--backend", default="envpool", help="stats only: envpool or gymnasium")
    parser.add_argument("--task", default="Ant-v4")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--action-seed", type=int, default=0)
    parser.add_argument("--atol", type=float, default=1e-6)
    args = parser.parse_args()
    if args.mode == "stats":
        random_action_statistics(args.task, args.backend, args.num_envs, args.steps, args.seed, args.action_seed)
        return
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
