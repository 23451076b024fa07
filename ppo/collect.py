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

With several simulators (`env.groups`), the steps run as a pipeline: group g's step t is sent
before group g+1's step t-1 is received, so one group simulates while the policy acts for the
next. Each group's columns of the buffer get exactly what one simulator's would.

No host synchronisation happens here beyond the simulator's own hand-off.
"""

from __future__ import annotations

import time

import torch

from buffers import RolloutBuffer
from ppo.agent import Agent
from ppo.envs import VecEnv, member_columns
from ppo.normalize import ObservationNormalizer, RewardScaler


class EpisodeStats:
    """Per-env running return/length of the raw rewards, and sums over the episodes finished since
    the last `pop()`. Device tensors only: reading them is the caller's one sync per iteration."""

    def __init__(self, num_envs: int, device: torch.device):
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.finished = torch.zeros(3, dtype=torch.float64, device=device)  # [count, return sum, length sum]

    def record(self, rewards: torch.Tensor, dones: torch.Tensor, valid: torch.Tensor, envs: slice) -> None:
        """One step of the envs `envs` (a slice of the columns)."""
        # In place throughout: a CUDA graph of the collection step replays these very tensors.
        returns, lengths = self.returns[envs], self.lengths[envs]
        returns += torch.where(valid, rewards.double(), 0.0)
        lengths += valid.long()
        self.finished += torch.stack([dones.sum().double(), torch.where(dones, returns, 0.0).sum(),
                                      torch.where(dones, lengths, 0).sum().double()])
        returns.masked_fill_(dones, 0.0)
        lengths.masked_fill_(dones, 0)

    def pop(self) -> torch.Tensor:
        finished = self.finished.clone()
        self.finished.zero_()
        return finished


class Collector:
    """Steps the envs with the current policy and fills a RolloutBuffer.

    Each step of a group is cut in two at the simulator. `_act` is what the simulator waits for:
    normalise the observation it returned, sample the next action (the actor alone). `_book` runs
    after `send`, while the group simulates: record the step's outcome, the value, the log-prob and
    the buffer writes. So only the actor's forward stands between an observation arriving and the
    next action leaving (on an H200 host each step's device work sits on that path: the host waits
    for it before it can send).

    With `graphs` (one CUDA device), the first `collect` runs eagerly on a side stream (the warm-up
    CUDA graph capture needs), then both halves of every step are captured, one graph each per
    step and env group: later rollouts replay them, and only the simulator's hand-off (actions out,
    observations in) stays in Python. The captured code is the eager code; it keeps all state in
    tensors updated in place, so a replay reads and writes the same memory.
    """

    def __init__(self, envs: VecEnv, agent: Agent, obs_normalizer: ObservationNormalizer,
                 reward_scaler: RewardScaler, device: torch.device, seed: int, graphs: bool = False,
                 resumed: bool = False):
        self.envs, self.agent, self.device = envs, agent, device
        self.obs_normalizer, self.reward_scaler = obs_normalizer, reward_scaler
        # A resumed run's restored statistics already hold the observations its last step returned; the
        # episodes that restart here are normalised with them, not folded in, as an uninterrupted run does
        # (so on a task whose episodes restart at that step, a resume is that run bit for bit).
        self.next_obs = obs_normalizer(envs.reset(seed), fold_in=not resumed).clone()
        self.next_is_dummy = torch.zeros(envs.num_envs, dtype=torch.bool, device=device)
        self.episodes = EpisodeStats(envs.num_envs, device)
        self.env_seconds = self.inference_seconds = 0.0
        self.graphs = graphs
        self.columns = member_columns(envs)  # each simulator's columns of the buffer
        self._sampled: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (t, group): (action, mean)
        self._captured: tuple | None = None  # (buffer, act graphs, book graphs, final graph)

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
        self._pipeline(buffer.num_steps,
                       receive=lambda group: self.envs.members[group].recv(),
                       act=lambda t, group, envs, outputs: self._act(buffer, t, group, envs, outputs),
                       book=lambda t, group, envs, outputs: self._book(buffer, t, group, envs, outputs),
                       finish=lambda: self._finish(buffer))

    def _pipeline(self, num_steps: int, receive, act, book, finish) -> None:
        """Step every group `num_steps` times in pipeline order, timing the simulator's hand-off
        (`recv`, `send`) apart from the device work around it (`act`, `book`, `finish`)."""
        for t, group, columns in self._schedule(num_steps):
            outputs = None
            start = time.perf_counter()
            if t > 0:  # receive step t-1: the group simulated it while the others were served
                outputs = receive(group)
            acting = time.perf_counter()
            action = act(t, group, columns, outputs)
            sending = time.perf_counter()
            if t < num_steps:
                self.envs.members[group].send(action)
            booking = time.perf_counter()
            book(t, group, columns, outputs)
            self.env_seconds += (acting - start) + (booking - sending)
            self.inference_seconds += (sending - acting) + (time.perf_counter() - booking)
        start = time.perf_counter()
        finish()
        self.inference_seconds += time.perf_counter() - start

    def _schedule(self, num_steps: int):
        """`(t, group, columns)` in pipeline order: at each t, every group in turn receives its step
        t-1 (t > 0) and sends its step t (t < num_steps). With one group this is act, step, record."""
        for t in range(num_steps + 1):
            for group, columns in enumerate(self.columns):
                yield t, group, columns

    def _act(self, buffer: RolloutBuffer, t: int, group: int, envs: slice, outputs: tuple | None
             ) -> torch.Tensor | None:
        """What the simulator waits for: normalise the observation step t-1 returned (t > 0) for
        the envs `envs` (a slice of the columns), then sample their step t's action (t < num_steps).
        Returns the clipped action for the simulator (None after the last step)."""
        if t > 0:
            self.next_obs[envs] = self.obs_normalizer(outputs[0])
        if t == buffer.num_steps:
            return None
        action, mean = self.agent.sample_action(self.next_obs[envs])
        self._sampled[t, group] = action, mean  # for `_book`; kept per step (captured graphs read them)
        return torch.maximum(torch.minimum(action, self.envs.action_high), self.envs.action_low)

    def _book(self, buffer: RolloutBuffer, t: int, group: int, envs: slice, outputs: tuple | None) -> None:
        """The rest, while the group simulates: record step t-1's outcome (t > 0), then step t's
        inputs, log-prob and value (t < num_steps)."""
        if t > 0:
            _, reward, terminated, truncated = outputs
            valid = buffer.valid[t - 1, envs]
            # A dummy step's flags say nothing about an episode; its reward is 0 on both backends.
            terminated = terminated & valid
            truncated = truncated & valid
            done = terminated | truncated
            self.episodes.record(reward, done, valid, envs)
            buffer.rewards[t - 1, envs] = self.reward_scaler(reward, done, envs)
            buffer.terminateds[t - 1, envs] = terminated
            buffer.truncateds[t - 1, envs] = truncated
            self.next_is_dummy[envs] = done
        if t == buffer.num_steps:
            return
        obs = self.next_obs[envs]
        action, mean = self._sampled[t, group]
        value = self.agent.get_value(obs)
        buffer.observations[t, envs] = obs
        buffer.actions[t, envs] = action
        buffer.log_probs[t, envs] = self.agent.log_prob(action, mean)
        buffer.values[t, envs] = value
        buffer.valid[t, envs] = ~self.next_is_dummy[envs]
        if t > 0:  # this step's observation is the final one of an episode truncated at t-1
            buffer.bootstrap_values[t - 1, envs] = torch.where(buffer.truncateds[t - 1, envs], value, 0.0)

    def _finish(self, buffer: RolloutBuffer) -> None:
        next_value = self.agent.get_value(self.next_obs)
        buffer.bootstrap_values[-1] = torch.where(buffer.terminateds[-1], 0.0, next_value)

    def _capture(self, buffer: RolloutBuffer) -> None:
        self.env_outputs = [m.step_outputs() for m in self.envs.members]
        # Capturing records kernels without running them: the state the eager rollout left behind
        # is what the first replay starts from. One memory pool, so the graphs are captured in the
        # order they replay: the pipeline's.
        pool = torch.cuda.graph_pool_handle()
        act, book, self.actions = {}, {}, {}
        for t, group, columns in self._schedule(buffer.num_steps):
            outputs = self.env_outputs[group].tensors if t > 0 else None
            act[t, group] = graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.actions[t, group] = self._act(buffer, t, group, columns, outputs)
            book[t, group] = graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._book(buffer, t, group, columns, outputs)
        final = torch.cuda.CUDAGraph()
        with torch.cuda.graph(final, pool=pool):
            self._finish(buffer)
        self._captured = (buffer, act, book, final)

    def _replay(self, buffer: RolloutBuffer) -> None:
        captured_buffer, act, book, final = self._captured
        if buffer is not captured_buffer:
            raise ValueError("Collector: the CUDA graphs were captured on another RolloutBuffer")

        def replay_act(t: int, group: int, envs: slice, outputs) -> torch.Tensor | None:
            act[t, group].replay()
            return self.actions[t, group]

        self._pipeline(buffer.num_steps,
                       receive=lambda group: self.envs.members[group].recv(out=self.env_outputs[group]),
                       act=replay_act,
                       book=lambda t, group, envs, outputs: book[t, group].replay(),
                       finish=final.replay)
