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
        # In place throughout: a CUDA graph of the collection step replays these very tensors.
        self.returns += torch.where(valid, rewards.double(), 0.0)
        self.lengths += valid.long()
        self.finished += torch.stack([dones.sum().double(), torch.where(dones, self.returns, 0.0).sum(),
                                      torch.where(dones, self.lengths, 0).sum().double()])
        self.returns.masked_fill_(dones, 0.0)
        self.lengths.masked_fill_(dones, 0)

    def pop(self) -> torch.Tensor:
        finished = self.finished.clone()
        self.finished.zero_()
        return finished


class Collector:
    """Steps the envs with the current policy and fills a RolloutBuffer.

    With `graphs` (one CUDA device), the first `collect` runs eagerly on a side stream (the warm-up
    CUDA graph capture needs), then every step's device work before and after the simulator is
    captured, one graph per step and side: later rollouts replay them, and only the simulator's
    hand-off (actions out, observations in) stays in Python. The captured code is the eager code;
    it keeps all state in tensors updated in place, so a replay reads and writes the same memory.
    """

    def __init__(self, envs: VecEnv, agent: Agent, obs_normalizer: ObservationNormalizer,
                 reward_scaler: RewardScaler, device: torch.device, seed: int, graphs: bool = False):
        self.envs, self.agent, self.device = envs, agent, device
        self.obs_normalizer, self.reward_scaler = obs_normalizer, reward_scaler
        self.next_obs = obs_normalizer(envs.reset(seed)).clone()
        self.next_is_dummy = torch.zeros(envs.num_envs, dtype=torch.bool, device=device)
        self.episodes = EpisodeStats(envs.num_envs, device)
        self.env_seconds = self.inference_seconds = 0.0
        self.graphs = graphs
        self._captured: tuple | None = None  # (buffer, before-env graphs, after-env graphs, final graph)

    @torch.no_grad()
    def collect(self, buffer: RolloutBuffer) -> None:
        """Fill every row of `buffer`: observations, actions, log-probs, values, rewards, flags,
        validity and bootstrap values."""
        if not self.graphs:
            self._collect_eagerly(buffer)
        elif self._captured is None:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._collect_eagerly(buffer)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._capture(buffer)
        else:
            self._replay(buffer)

    def _collect_eagerly(self, buffer: RolloutBuffer) -> None:
        for t in range(buffer.num_steps):
            start = time.perf_counter()
            action = self._before_env(buffer, t)
            middle = time.perf_counter()
            raw_obs, reward, terminated, truncated = self.envs.step(action)
            after_env = time.perf_counter()
            self._after_env(buffer, t, raw_obs, reward, terminated, truncated)
            self.env_seconds += after_env - middle
            self.inference_seconds += (middle - start) + (time.perf_counter() - after_env)
        start = time.perf_counter()
        self._finish(buffer)
        self.inference_seconds += time.perf_counter() - start

    def _before_env(self, buffer: RolloutBuffer, t: int) -> torch.Tensor:
        """Act on `next_obs`, record step t's inputs; returns the clipped action for the simulator."""
        envs, obs = self.envs, self.next_obs
        action, log_prob, _, value = self.agent.get_action_and_value(obs)
        buffer.observations[t] = obs
        buffer.actions[t] = action
        buffer.log_probs[t] = log_prob
        buffer.values[t] = value
        buffer.valid[t] = ~self.next_is_dummy
        if t > 0:  # this step's observation is the final one of an episode truncated at t-1
            buffer.bootstrap_values[t - 1] = torch.where(buffer.truncateds[t - 1], value, 0.0)
        return torch.maximum(torch.minimum(action, envs.action_high), envs.action_low)

    def _after_env(self, buffer: RolloutBuffer, t: int, raw_obs: torch.Tensor, reward: torch.Tensor,
                   terminated: torch.Tensor, truncated: torch.Tensor) -> None:
        """Record step t's outcome and normalise the next observation."""
        valid = buffer.valid[t]
        # A dummy step's flags say nothing about an episode; its reward is 0 on both backends.
        terminated = terminated & valid
        truncated = truncated & valid
        done = terminated | truncated
        self.episodes.record(reward, done, valid)
        buffer.rewards[t] = self.reward_scaler(reward, done)
        buffer.terminateds[t] = terminated
        buffer.truncateds[t] = truncated
        self.next_obs.copy_(self.obs_normalizer(raw_obs))
        self.next_is_dummy.copy_(done)

    def _finish(self, buffer: RolloutBuffer) -> None:
        next_value = self.agent.get_value(self.next_obs)
        buffer.bootstrap_values[-1] = torch.where(buffer.terminateds[-1], 0.0, next_value)

    def _capture(self, buffer: RolloutBuffer) -> None:
        envs, device = self.envs, self.device
        self.env_outputs = (torch.zeros(envs.num_envs, envs.obs_dim, device=device),
                            torch.zeros(envs.num_envs, device=device),
                            torch.zeros(envs.num_envs, dtype=torch.bool, device=device),
                            torch.zeros(envs.num_envs, dtype=torch.bool, device=device))
        # Capturing records kernels without running them: the state the eager rollout left behind
        # is what the first replay starts from.
        pool = torch.cuda.graph_pool_handle()  # one memory pool: the graphs always replay in this order
        before, after, self.actions = [], [], []
        for t in range(buffer.num_steps):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.actions.append(self._before_env(buffer, t))
            before.append(graph)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._after_env(buffer, t, *self.env_outputs)
            after.append(graph)
        final = torch.cuda.CUDAGraph()
        with torch.cuda.graph(final, pool=pool):
            self._finish(buffer)
        self._captured = (buffer, before, after, final)

    def _replay(self, buffer: RolloutBuffer) -> None:
        captured_buffer, before, after, final = self._captured
        if buffer is not captured_buffer:
            raise ValueError("Collector: the CUDA graphs were captured on another RolloutBuffer")
        for t in range(buffer.num_steps):
            start = time.perf_counter()
            before[t].replay()
            middle = time.perf_counter()
            self.envs.step(self.actions[t], out=self.env_outputs)
            after_env = time.perf_counter()
            after[t].replay()
            self.env_seconds += after_env - middle
            self.inference_seconds += (middle - start) + (time.perf_counter() - after_env)
        start = time.perf_counter()
        final.replay()
        self.inference_seconds += time.perf_counter() - start
