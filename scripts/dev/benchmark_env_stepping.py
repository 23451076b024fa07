"""How fast does envpool step when other work runs between steps? (CPU; one process run.)

    python scripts/dev/benchmark_env_stepping.py                    # Ant-v4, 64 envs
    python scripts/dev/benchmark_env_stepping.py --env-id Hopper-v4 --num-envs 16
    python scripts/dev/benchmark_env_stepping.py --pin              # worker threads pinned, one per CPU

`scripts/benchmark_e2e.py` compares training with envpool stepping back to back on random actions.
Training puts the policy and bookkeeping between steps, and the simulator then measures slower
in training than alone. This script steps the same envs with the same random actions and, between
steps, (a) nothing, (b) a policy-sized MLP forward, (c) that plus 80 small torch ops (about what
a collection step does); then (d) with this project's `Agent` choosing each action from the
current observation, as collection does, and (e) those same recorded policy actions replayed back
to back with nothing between steps (do a policy's actions cost the simulator more than uniform
noise?); and (f) a busy wait and (g) a sleep of `--gap-us` between steps, with no work at all: if
they slow the `step` calls as much as (d) does, what costs the simulator is the idle gap between
its steps (its worker threads going to sleep and waking up), not what runs in that gap. It
reports the rate of the `step` calls alone and of the whole loop, each mode twice, interleaved,
to show the run-to-run swing.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from ppo.agent import Agent
from ppo.config import EnvSettings
from ppo.envs import envpool_threads, import_envpool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="Ant-v4")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--num-threads", type=int, default=0, help="envpool threads; 0: min(envs, CPUs)")
    parser.add_argument("--pin", action="store_true",
                        help="pin worker thread i to CPU i (envpool's thread_affinity_offset=0; env.pin_threads)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--gap-us", type=float, default=0.0,
                        help="idle gap of modes (f) and (g); 0: the agent's mean time per step in mode (d)")
    args = parser.parse_args()
    envpool = import_envpool()
    torch.set_num_threads(1)
    threads = envpool_threads(EnvSettings(id=args.env_id, num_envs=args.num_envs, num_threads=args.num_threads))
    envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=args.num_envs, seed=1, num_threads=threads,
                        thread_affinity_offset=0 if args.pin else -1)
    obs, _ = envs.reset()
    obs_dim, act_dim = int(np.prod(obs.shape[1:])), int(np.prod(envs.action_space.shape))
    rng = np.random.default_rng(0)
    actions = [rng.uniform(-1, 1, (args.num_envs, act_dim)).astype(np.float32) for _ in range(16)]
    policy = torch.nn.Sequential(torch.nn.Linear(obs_dim, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                 torch.nn.Tanh(), torch.nn.Linear(64, act_dim))

    agent = Agent(obs_dim, act_dim)
    recorded: list[np.ndarray] = []  # mode 3's policy actions, replayed by mode 4
    gap_s = args.gap_us * 1e-6  # modes 5 and 6; set from mode 3's timing when --gap-us is 0

    def between_steps(mode: int, obs: np.ndarray, i: int) -> np.ndarray:
        """The work of `mode` before step i; returns the action to step with."""
        if mode == 3:
            with torch.no_grad():
                action = agent.get_action_and_value(torch.from_numpy(obs.reshape(args.num_envs, -1)).float())[0]
            recorded.append(action.clamp(-1, 1).numpy())
            return recorded[-1]
        if mode == 4:
            return recorded[i]  # from the pass of mode 3 just before
        if mode == 5:
            until = time.perf_counter() + gap_s
            while time.perf_counter() < until:
                pass
            return actions[i % 16]
        if mode == 6:
            time.sleep(gap_s)
            return actions[i % 16]
        if mode >= 1:
            with torch.no_grad():
                policy(torch.from_numpy(obs.reshape(args.num_envs, -1)).float())
        if mode >= 2:
            x = torch.zeros(args.num_envs, dtype=torch.float64)
            for _ in range(80):
                x = x + 1.0
        return actions[i % 16]

    names = ["nothing between steps", "MLP forward between steps", "MLP forward + 80 torch ops",
             "policy acts between steps", "policy's actions replayed", "busy wait between steps",
             "sleep between steps"]
    print(f"# {args.env_id}, {args.num_envs} envs, {threads} envpool threads{' (pinned)' if args.pin else ''}, "
          f"{os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'between steps':32s} {'step() only':>12s} {'whole loop':>12s}   (steps/s)")
    for mode in (0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6):
        if mode == 3:
            recorded.clear()
        for i in range(20):
            obs = envs.step(actions[i % 16])[0]
        env_seconds = 0.0
        start = time.perf_counter()
        for i in range(args.steps):
            action = between_steps(mode, obs, i)
            t = time.perf_counter()
            obs = envs.step(action)[0]
            env_seconds += time.perf_counter() - t
        total = time.perf_counter() - start
        samples = args.steps * args.num_envs
        if mode == 3 and not args.gap_us:  # the idle gap of modes 5 and 6: the agent's time per step
            gap_s = (total - env_seconds) / args.steps
        gap = f"  ({gap_s * 1e6:.0f} us)" if mode in (5, 6) else ""
        print(f"{names[mode]:32s} {samples / env_seconds:12,.0f} {samples / total:12,.0f}{gap}", flush=True)
    envs.close()


if __name__ == "__main__":
    main()
