"""Collect one rollout into a RolloutBuffer, handling next-step autoreset.

With next-step autoreset (both backends), the step that ends an episode returns the episode's
*final* observation; the next step ignores its action, gives reward 0 and returns the first
observation of a new episode. So:

- that next step is a **dummy**: marked invalid in the buffer, never in the loss or the advantage
  statistics; its reward and flags are zero, and the done flag of the step before it already cuts
  the advantage trace (beta = 0), so nothing flows across;
- the policy runs on the final observation at the dummy step anyway, so the value it computes
  there *is* `V(final observation)`: written to `bootstrap_values` of the step that truncated;
- after the last step, `V(next observation)` goes into the last row (zero where it terminated).

No host synchronisation happens here beyond the simulator's own hand-off.
"""

from __future__ import annotations

import time

import torch

from buffers import RolloutBuffer
from ppo.agent import Agent
from ppo.envs import VecEnv
from ppo.normalize import ObservationNormalizer, RewardScaler


class EpisodeStats:
    """Per-env running return/length of the raw rewards, and sums over the episodes finished since
    the last `pop()`. Device tensors only: reading them is the caller's one sync per iteration."""

    def __init__(self, num_envs: int, device: torch.device):
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.finished = torch.zeros(3, dtype=torch.float64, device=device)  # [count, return sum, length sum]

    def record(self, rewards: torch.Tensor, dones: torch.Tensor, valid: torch.Tensor) -> None:
        self.returns += torch.where(valid, rewards.double(), 0.0)
        self.lengths += valid.long()
        self.finished += torch.stack([dones.sum().double(), torch.where(dones, self.returns, 0.0).sum(),
                                      torch.where(dones, self.lengths, 0).sum().double()])
        self.returns = torch.where(dones, 0.0, self.returns)
        self.lengths = torch.where(dones, 0, self.lengths)

    def pop(self) -> torch.Tensor:
        finished, self.finished = self.finished, torch.zeros_like(self.finished)
        return finished


class Collector:
    def __init__(self, envs: VecEnv, agent: Agent, obs_normalizer: ObservationNormalizer,
                 reward_scaler: RewardScaler, device: torch.device, seed: int):
        self.envs, self.agent, self.device = envs, agent, device
        self.obs_normalizer, self.reward_scaler = obs_normalizer, reward_scaler
        self.next_obs = obs_normalizer(envs.reset(seed))
        self.next_is_dummy = torch.zeros(envs.num_envs, dtype=torch.bool, device=device)
        self.episodes = EpisodeStats(envs.num_envs, device)
        self.env_seconds = self.inference_seconds = 0.0

    @torch.no_grad()
    def collect(self, buffer: RolloutBuffer) -> None:
        """Fill every row of `buffer`: observations, actions, log-probs, values, rewards, flags,
        validity and bootstrap values."""
        envs, agent = self.envs, self.agent
        for t in range(buffer.num_steps):
            start = time.perf_counter()
            obs = self.next_obs
            action, log_prob, _, value = agent.get_action_and_value(obs)
            buffer.observations[t] = obs
            buffer.actions[t] = action
            buffer.log_probs[t] = log_prob
            buffer.values[t] = value
            valid = ~self.next_is_dummy
            buffer.valid[t] = valid
            if t > 0:  # this step's observation is the final one of an episode truncated at t-1
                buffer.bootstrap_values[t - 1] = torch.where(buffer.truncateds[t - 1], value, 0.0)
            clipped = torch.maximum(torch.minimum(action, envs.action_high), envs.action_low)
            middle = time.perf_counter()

            raw_obs, reward, terminated, truncated = envs.step(clipped)
            after_env = time.perf_counter()

            # A dummy step's flags say nothing about an episode; its reward is 0 on both backends.
            terminated &= valid
            truncated &= valid
            done = terminated | truncated
            self.episodes.record(reward, done, valid)
            buffer.rewards[t] = self.reward_scaler(reward, done)
            buffer.terminateds[t] = terminated
            buffer.truncateds[t] = truncated
            self.next_obs = self.obs_normalizer(raw_obs)
            self.next_is_dummy = done
            self.env_seconds += after_env - middle
            self.inference_seconds += (middle - start) + (time.perf_counter() - after_env)

        start = time.perf_counter()
        next_value = agent.get_value(self.next_obs)
        buffer.bootstrap_values[-1] = torch.where(buffer.terminateds[-1], 0.0, next_value)
        self.inference_seconds += time.perf_counter() - start
