"""A CleanRL-style PPO loop, kept as the throughput baseline (not used for training).

    python scripts/cleanrl_reference.py --env-id Ant-v4 --device cpu   # its steps/s alone, CleanRL's 1 x 2048

scripts/benchmark_e2e.py times it beside our training loop and the raw simulator, in one run.

The structure of CleanRL's ppo_continuous_action.py, with the same network, batch and update
schedule as ours: a host round trip per step (`.cpu().numpy()` of the actions, `torch.tensor` of
the observations), numpy observation/reward normalisation as gymnasium's wrappers do, a Python
loop over time for GAE, and numpy-shuffled minibatches.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

from ppo.agent import Agent
from ppo.config import ConfigError, resolve_device
from ppo.envs import import_envpool


class NumpyRunningMeanStd:
    def __init__(self, shape=()):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, x: np.ndarray) -> None:
        batch_mean, batch_var, n = x.mean(0), x.var(0), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total


def cleanrl_style_sps(env_id: str, num_envs: int, num_steps: int, num_iterations: int, warmup_iterations: int,
                      device: torch.device, num_minibatches: int = 32, update_epochs: int = 10,
                      gamma: float = 0.99, gae_lambda: float = 0.95, seed: int = 1) -> float:
    """Steady-state steps/s of the reference loop over `num_iterations` after the warm-up ones."""
    envpool = import_envpool()
    envs = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed)
    obs_dim, act_dim = envs.observation_space.shape[0], envs.action_space.shape[0]
    agent = Agent(obs_dim, act_dim).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5)
    obs_rms, ret_rms = NumpyRunningMeanStd((obs_dim,)), NumpyRunningMeanStd()
    returns = np.zeros(num_envs)
    obs_buf = torch.zeros((num_steps, num_envs, obs_dim), device=device)
    actions = torch.zeros((num_steps, num_envs, act_dim), device=device)
    logprobs, rewards, dones, values = (torch.zeros((num_steps, num_envs), device=device) for _ in range(4))
    batch_size = num_envs * num_steps

    def normalize(o: np.ndarray) -> np.ndarray:
        obs_rms.update(o)
        return np.clip((o - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10)

    next_obs = torch.tensor(normalize(envs.reset()[0]), dtype=torch.float32, device=device)
    next_done = torch.zeros(num_envs, device=device)
    start = None
    for iteration in range(warmup_iterations + num_iterations):
        if iteration == warmup_iterations:
            start = time.perf_counter()
        for step in range(num_steps):
            obs_buf[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step], actions[step], logprobs[step] = value, action, logprob
            o, r, term, trunc, _ = envs.step(np.clip(action.cpu().numpy(), -1, 1))
            returns = returns * gamma + r
            ret_rms.update(returns)
            returns[term | trunc] = 0
            rewards[step] = torch.tensor(np.clip(r / np.sqrt(ret_rms.var + 1e-8), -10, 10), device=device)
            next_obs = torch.tensor(normalize(o), dtype=torch.float32, device=device)
            next_done = torch.tensor(term | trunc, dtype=torch.float32, device=device)
        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(num_steps)):
                nextnonterminal = 1.0 - (next_done if t == num_steps - 1 else dones[t + 1])
                nextvalues = next_value if t == num_steps - 1 else values[t + 1]
                delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
            returns_t = advantages + values
        b_obs, b_actions = obs_buf.reshape(-1, obs_dim), actions.reshape(-1, act_dim)
        b_logprobs, b_adv, b_ret, b_val = (x.reshape(-1) for x in (logprobs, advantages, returns_t, values))
        indices = np.arange(batch_size)
        minibatch_size = batch_size // num_minibatches
        for _ in range(update_epochs):
            np.random.shuffle(indices)
            for begin in range(0, batch_size, minibatch_size):
                mb = indices[begin:begin + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(0.8, 1.2)).mean()
                v_clipped = b_val[mb] + (newvalue - b_val[mb]).clamp(-0.2, 0.2)
                v_loss = 0.5 * torch.max((newvalue - b_ret[mb]) ** 2, (v_clipped - b_ret[mb]) ** 2).mean()
                loss = pg_loss - 0.0 * entropy.mean() + 0.5 * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    envs.close()
    return num_iterations * batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="Ant-v4", help="an envpool MuJoCo task")
    parser.add_argument("--num-envs", type=int, default=1, help="CleanRL's default: 1")
    parser.add_argument("--num-steps", type=int, default=2048, help="CleanRL's default: 2048")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations, after one warm-up")
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    args = parser.parse_args()
    try:
        device = resolve_device(args.device, "--device")
    except ConfigError as error:
        parser.error(str(error))
    sps = cleanrl_style_sps(args.env_id, args.num_envs, args.num_steps, args.iterations, 1, device)
    print(f"CleanRL-style loop, {args.env_id}, {args.num_envs} x {args.num_steps} on {device}: {sps:,.0f} steps/s")


if __name__ == "__main__":
    main()
