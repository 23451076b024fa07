"""The collector and buffer on a toy environment with known values: dummy steps, truncation
bootstraps and the advantages that come out, computed by hand."""

import os
import types
import warnings

import numpy as np
import pytest
import torch

from buffers import RolloutBuffer
from ppo.collect import Collector
from ppo.config import ConfigError, EnvSettings
from ppo.envs import EnvpoolEnvs, backend, make_envs
from ppo.normalize import ObservationNormalizer, RewardScaler
from tests.conftest import filled_buffer
from tests.toy_env import STAGGER_ID, TOY_ID, register_toy_envs, stagger_episodes

GAMMA, LAM = 0.9, 0.8


class KnownPolicy:
    """V(obs) = 10 + obs[0]; actions are zero (the toy env ignores them)."""

    def get_value(self, obs):
        return 10.0 + obs[:, 0]

    def sample_action(self, obs):
        zeros = torch.zeros(obs.shape[0], 1)
        return zeros, zeros

    def log_prob(self, action, mean):
        return torch.zeros(action.shape[0])


def collect_toy(num_steps: int, num_envs: int = 2, groups: int = 1) -> RolloutBuffer:
    register_toy_envs()
    device = torch.device("cpu")
    envs = make_envs(EnvSettings(id=TOY_ID, num_envs=num_envs, backend="gymnasium", groups=groups), device, seed=0)
    buffer = RolloutBuffer(num_steps, num_envs, 1, 1, device)
    collector = Collector(envs, KnownPolicy(), ObservationNormalizer(1, device, enabled=False),
                          RewardScaler(num_envs, GAMMA, device, enabled=False), device, seed=0)
    collector.collect(buffer)
    envs.close()
    return buffer


# The toy env's first 8 steps from reset (see toy_env.py): episode 0 terminates at c=2, the next
# step is the autoreset dummy, episode 1 is truncated at c=3, dummy again, episode 2 begins.
OBSERVATIONS = [0, 1, 2, 0, 1, 2, 3, 0]
REWARDS = [1, 2, 0, 1, 2, 3, 0, 1]
TERMINATED = [False, True, False, False, False, False, False, False]
TRUNCATED = [False, False, False, False, False, True, False, False]
VALID = [True, True, False, True, True, True, False, True]


def hand_computed_advantages():
    values = [10.0 + o for o in OBSERVATIONS]
    next_values = values[1:] + [10.0 + 1]  # after the window: obs 1 of episode 2
    next_values[5] = 10.0 + 3  # truncated at step 5: V of its final observation (c = 3)
    advantage, advantages = 0.0, [0.0] * 8
    for t in reversed(range(8)):
        done = TERMINATED[t] or TRUNCATED[t]
        delta = REWARDS[t] + GAMMA * (0.0 if TERMINATED[t] else next_values[t]) - values[t]
        advantage = delta + GAMMA * LAM * (0.0 if done else 1.0) * advantage
        advantages[t] = advantage
    return advantages, values


def test_buffer_records_flags_rewards_and_dummy_steps():
    buffer = collect_toy(8)
    for env in range(2):  # both envs run the same deterministic episodes
        assert buffer.observations[:, env, 0].tolist() == OBSERVATIONS
        assert buffer.rewards[:, env].tolist() == REWARDS
        assert buffer.terminateds[:, env].tolist() == TERMINATED
        assert buffer.truncateds[:, env].tolist() == TRUNCATED
        assert buffer.valid[:, env].tolist() == VALID


def test_bootstrap_values_are_the_final_observation_values_at_truncations_and_window_end():
    buffer = collect_toy(8)
    expected = [0.0] * 8
    expected[5] = 13.0  # V(final obs c=3) of the truncated episode, not V(reset obs)
    expected[7] = 11.0  # V(obs after the window)
    assert buffer.bootstrap_values[:, 0].tolist() == expected


def test_advantages_and_returns_match_hand_computation():
    buffer = collect_toy(8)
    buffer.compute_advantages(GAMMA, LAM)
    advantages, values = hand_computed_advantages()
    torch.testing.assert_close(buffer.advantages[:, 0], torch.tensor(advantages))
    torch.testing.assert_close(buffer.returns[:, 0], torch.tensor(advantages) + torch.tensor(values))


def test_dummy_steps_carry_zero_weight_in_the_minibatches():
    buffer = collect_toy(8)
    buffer.compute_advantages(GAMMA, LAM)
    generator = torch.Generator().manual_seed(0)
    batches = list(buffer.minibatches(4, generator, normalize_advantages=False))
    assert [mb.observations.shape[0] for mb in batches] == [4, 4, 4, 4]  # fixed shapes
    seen = torch.cat([mb.observations[:, 0] for mb in batches])
    weights = torch.cat([mb.weights for mb in batches])
    assert sorted(seen.tolist()) == sorted(float(o) for o in OBSERVATIONS * 2)  # every sample once
    weighted = [(o, w) for o, w in zip(seen.tolist(), weights.tolist(), strict=True)]
    assert sum(w for _, w in weighted) == 2 * sum(VALID)
    assert all(w == 0.0 for o, w in weighted if o == 3.0)  # obs 3 only ever appears at a dummy step


def test_sample_table_gathers_every_field_as_the_buffer_holds_it():
    # One gather of packed rows must give, field by field, the rows of the flat batch at `index`.

    buffer = filled_buffer(1, num_steps=5, num_envs=7)
    index = torch.randperm(35, generator=torch.Generator().manual_seed(2))[:11]
    for normalize in (False, True):
        flat = buffer.flat_batch(normalize)
        mb = buffer.sample_table(normalize).select(index)
        for name in ("observations", "actions", "log_probs", "values", "advantages", "returns", "weights"):
            expected = getattr(flat, name).index_select(0, index)
            assert getattr(mb, name).shape == expected.shape, name
            assert torch.equal(getattr(mb, name), expected), name


def test_advantage_normalisation_uses_valid_samples_only():
    buffer = collect_toy(8)
    buffer.compute_advantages(GAMMA, LAM)
    buffer.advantages[~buffer.valid] = 1e6  # a dummy step's advantage must not shift the statistics
    generator = torch.Generator().manual_seed(0)
    batches = list(buffer.minibatches(1, generator))
    advantages, weights = batches[0].advantages, batches[0].weights
    valid = advantages[weights > 0]
    assert abs(valid.mean().item()) < 1e-5 and abs(valid.std().item() - 1) < 1e-4
    assert (advantages[weights == 0] == 0).all()


def test_episodes_continue_across_windows():
    # Two windows of 4 steps: the same transitions as one window of 8, with the window edge bootstrap.
    register_toy_envs()
    device = torch.device("cpu")
    envs = make_envs(EnvSettings(id=TOY_ID, num_envs=1, backend="gymnasium"), device, seed=0)
    collector = Collector(envs, KnownPolicy(), ObservationNormalizer(1, device, enabled=False),
                          RewardScaler(1, GAMMA, device, enabled=False), device, seed=0)
    first, second = RolloutBuffer(4, 1, 1, 1, device), RolloutBuffer(4, 1, 1, 1, device)
    collector.collect(first)
    collector.collect(second)
    envs.close()
    observations = first.observations[:, 0, 0].tolist() + second.observations[:, 0, 0].tolist()
    valid = first.valid[:, 0].tolist() + second.valid[:, 0].tolist()
    assert observations == OBSERVATIONS and valid == VALID
    assert first.bootstrap_values[-1, 0].item() == 10.0 + 1  # V(obs 1 of episode 1), carried on next window


@pytest.mark.parametrize("groups", [1, 2])
def test_episode_returns_and_lengths_are_the_raw_rewards_of_each_finished_episode(groups):
    # Staggered episodes (terminated and truncated, several envs ending on one step, some none in a
    # window) over three windows, with the reward scaler and observation normaliser on: each window's
    # count, return sum and length sum are those of the episodes that ended in it, from the env's rules.
    register_toy_envs()
    device, num_envs, num_steps = torch.device("cpu"), 6, 5
    envs = make_envs(EnvSettings(id=STAGGER_ID, num_envs=num_envs, backend="gymnasium", groups=groups), device,
                     seed=0)
    collector = Collector(envs, KnownPolicy(), ObservationNormalizer(1, device), RewardScaler(num_envs, GAMMA, device),
                          device, seed=0)
    buffer = RolloutBuffer(num_steps, num_envs, 1, 1, device)
    known = stagger_episodes(num_envs, 3 * num_steps)
    for window in range(3):
        collector.collect(buffer)
        ended = [(r, length) for end, _, r, length in known if window * num_steps <= end < (window + 1) * num_steps]
        count, return_sum, length_sum = collector.episodes.pop().tolist()
        assert (count, return_sum, length_sum) == (len(ended), sum(r for r, _ in ended), sum(n for _, n in ended))
    assert collector.episodes.pop().tolist() == [0, 0, 0]  # popped: nothing twice
    envs.close()


def _envpool_has(env_id: str) -> bool:
    try:
        return env_id in backend("envpool").known_ids(EnvSettings(backend="envpool"), "")
    except ConfigError:  # no envpool here
        return False


def test_envpool_0_8_beside_numpy_2_is_refused_before_it_returns_wrong_env_ids(monkeypatch):
    # envpool 0.8.4 (Python 3.10's last) was built against numpy 1: beside numpy 2 it reported every
    # env id as 0 (seen on Python 3.10 with numpy 2.2.6). The run must stop with a fix, not start.
    fake = types.SimpleNamespace(__version__="0.8.4", make=lambda *args, **kwargs: pytest.fail("make was called"))
    monkeypatch.setattr("ppo.envs.envpool.import_envpool", lambda: fake)
    monkeypatch.setattr(np, "__version__", "2.2.6")
    with pytest.raises(ConfigError, match=r"envpool 0.8.4 needs numpy < 2 \(here 2.2.6\)"):
        EnvpoolEnvs(EnvSettings(id="Ant-v4", num_envs=2, backend="envpool"), torch.device("cpu"), seed=0)
    monkeypatch.setattr(np, "__version__", "1.26.4")
    with pytest.raises(pytest.fail.Exception, match="make was called"):  # numpy 1 goes on to make the envs
        EnvpoolEnvs(EnvSettings(id="Ant-v4", num_envs=2, backend="envpool"), torch.device("cpu"), seed=0)


def test_envpool_seeds_past_int32_wrap_and_those_below_are_kept():
    # envpool refuses seeds past 2**31 - 1; a run's env seeds (its seed, up to 2**32 - 1, plus the
    # iteration it resumes at and a worker's offset) reach them. Two groups: the second starts 2 later.
    pytest.importorskip("envpool")

    def first_observations(seed: int) -> torch.Tensor:
        envs = make_envs(EnvSettings(id="InvertedPendulum-v4", num_envs=4, groups=2, backend="envpool"),
                         torch.device("cpu"), seed=seed)
        try:
            return envs.reset(seed)
        finally:
            envs.close()

    assert torch.equal(first_observations(2**32 - 2), first_observations(2**31 - 2))
    assert not torch.equal(first_observations(2**31 - 2), first_observations(2**31 - 1))


# CI's envpool has Pendulum-v1; the GPU host's bundled build carries only the MuJoCo tasks.
@pytest.mark.skipif(not _envpool_has("Pendulum-v1"), reason="this envpool build has no Pendulum-v1")
def test_envpool_backend_follows_the_same_autoreset_rules():
    # Pendulum-v1 is cut by its 200-step limit: the collector must mark the truncation, take the
    # bootstrap from the final observation, and make the following reset step an invalid dummy.
    device = torch.device("cpu")
    envs = make_envs(EnvSettings(id="Pendulum-v1", num_envs=2, backend="envpool"), device, seed=0)
    buffer = RolloutBuffer(203, 2, envs.obs_dim, envs.act_dim, device)
    collector = Collector(envs, KnownPolicy(), ObservationNormalizer(envs.obs_dim, device, enabled=False),
                          RewardScaler(2, GAMMA, device, enabled=False), device, seed=0)
    collector.collect(buffer)
    envs.close()
    assert buffer.truncateds[:, 0].nonzero().squeeze(1).tolist() == [199]
    assert not buffer.terminateds.any()
    assert buffer.valid[:, 0].logical_not().nonzero().squeeze(1).tolist() == [200]
    assert buffer.rewards[200].tolist() == [0.0, 0.0]
    # the dummy step ran the policy on the final observation: its value is the bootstrap
    assert buffer.bootstrap_values[199].tolist() == buffer.values[200].tolist()
    assert buffer.bootstrap_values[199, 0].item() == (10.0 + buffer.observations[200, 0, 0]).item()
    assert buffer.bootstrap_values[:199].abs().sum().item() == 0.0


def collect_toy_rollouts(device: torch.device, graphs: bool, rollouts: int = 3, num_steps: int = 5,
                         num_envs: int = 3, groups: int = 1) -> list[dict]:
    """Rollouts of a real Agent on the toy env (actions ignored), with both normalisers on."""
    from ppo.agent import Agent

    register_toy_envs()
    torch.manual_seed(0)
    envs = make_envs(EnvSettings(id=TOY_ID, num_envs=num_envs, backend="gymnasium", groups=groups), device, seed=0)
    agent = Agent(1, 1).to(device)
    buffer = RolloutBuffer(num_steps, num_envs, 1, 1, device)
    collector = Collector(envs, agent, ObservationNormalizer(1, device), RewardScaler(num_envs, GAMMA, device),
                          device, seed=0, graphs=graphs)
    results = []
    for _ in range(rollouts):
        collector.collect(buffer)
        fields = ("observations", "values", "rewards", "terminateds", "truncateds", "bootstrap_values", "valid")
        snapshot = {name: getattr(buffer, name).cpu().clone() for name in fields}
        snapshot["obs_mean"] = collector.obs_normalizer.rms.mean.cpu().clone()
        snapshot["reward_var"] = collector.reward_scaler.rms.var.cpu().clone()
        snapshot["episodes"] = collector.episodes.pop().cpu()
        results.append(snapshot)
        with torch.no_grad():  # change the policy between rollouts, as an update would: in place
            for p in agent.parameters():
                p.add_(0.01)
    envs.close()
    return results


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA graphs")
@pytest.mark.parametrize("num_envs, groups", [(3, 1), (4, 2)])
def test_cuda_graph_collection_matches_the_eager_loop(num_envs, groups):
    # The toy env ignores actions, so everything but the sampled actions is deterministic: the
    # replayed rollouts (the 2nd and 3rd) must record what the eager loop records, and keep the
    # normalisers and episode statistics moving the same way.
    cuda = torch.device("cuda")
    eager = collect_toy_rollouts(cuda, graphs=False, num_envs=num_envs, groups=groups)
    graphed = collect_toy_rollouts(cuda, graphs=True, num_envs=num_envs, groups=groups)
    for rollout_eager, rollout_graphed in zip(eager, graphed, strict=True):
        for name, expected in rollout_eager.items():
            torch.testing.assert_close(rollout_graphed[name], expected, msg=name)
    assert not torch.equal(graphed[1]["values"], graphed[2]["values"]), "replays must see the changed policy"


def test_toy_rollouts_of_the_eager_loop_are_reproducible():
    # What the CUDA graph test relies on: apart from the sampled actions, toy rollouts are a
    # function of the seed (on CPU, where that test cannot run, this much is checked).
    first, second = (collect_toy_rollouts(torch.device("cpu"), graphs=False, rollouts=2) for _ in range(2))
    for a, b in zip(first, second, strict=True):
        for name, expected in a.items():
            torch.testing.assert_close(b[name], expected, msg=name)
    assert first[0]["episodes"][0] > 0, "the toy rollouts should finish episodes"


ROLLOUT_FIELDS = ("observations", "values", "rewards", "terminateds", "truncateds", "bootstrap_values", "valid")


@pytest.mark.parametrize("num_envs, groups", [(4, 2), (6, 3), (5, 5)])
def test_grouped_simulators_record_what_one_simulator_records(num_envs, groups):
    # Pipelining changes when each group steps, not what lands in its columns: over a window with
    # terminations, truncations and dummy steps, every field matches the lockstep collector's.
    one, grouped = collect_toy(11, num_envs), collect_toy(11, num_envs, groups)
    for name in ROLLOUT_FIELDS:
        assert torch.equal(getattr(grouped, name), getattr(one, name)), name


def test_grouped_rollouts_with_normalisers_keep_the_statistics_of_one_simulator():
    # A real agent and both normalisers, over windows. Each group normalises its observations and
    # rewards with the statistics as they stand when it is received (so a later group's step t has
    # seen the earlier groups' step t); after each whole step the statistics have folded in the
    # same samples as one simulator's, and the flags and episode totals are the same.
    one = collect_toy_rollouts(torch.device("cpu"), graphs=False, num_envs=4)
    grouped = collect_toy_rollouts(torch.device("cpu"), graphs=False, num_envs=4, groups=2)
    for a, b in zip(one, grouped, strict=True):
        for name in ("terminateds", "truncateds", "valid", "episodes", "obs_mean", "reward_var"):
            torch.testing.assert_close(b[name], a[name], msg=name)
        assert not torch.equal(b["observations"][:, :2], a["observations"][:, :2])  # see above
        torch.testing.assert_close(b["observations"][:, 2:], a["observations"][:, 2:])  # the last group


class RecordingEnvs:
    """A simulator that logs its send/recv calls into a shared list."""

    def __init__(self, name: str, log: list, num_envs: int = 2):
        self.name, self.log, self.num_envs, self.obs_dim, self.act_dim = name, log, num_envs, 1, 1
        self.obs_layout = [["", [1]]]
        self.action_low, self.action_high = torch.tensor([-1.0]), torch.tensor([1.0])
        self.members = [self]

    def reset(self, seed: int) -> torch.Tensor:
        return torch.zeros(self.num_envs, 1)

    def send(self, actions: torch.Tensor) -> None:
        self.log.append(f"send {self.name}")

    def recv(self, out=None):
        self.log.append(f"recv {self.name}")
        n = self.num_envs
        return torch.zeros(n, 1), torch.ones(n), torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)


def test_the_pipeline_sends_one_group_before_receiving_the_next():
    from ppo.envs import EnvGroups

    log: list[str] = []
    envs = EnvGroups([RecordingEnvs("A", log), RecordingEnvs("B", log)])
    device = torch.device("cpu")
    collector = Collector(envs, KnownPolicy(), ObservationNormalizer(1, device, enabled=False),
                          RewardScaler(4, GAMMA, device, enabled=False), device, seed=0)
    collector.collect(RolloutBuffer(3, 4, 1, 1, device))
    # While A simulates step t, B's step t-1 is received and its step t sent, and the reverse.
    assert log == ["send A", "send B",
                   "recv A", "send A", "recv B", "send B",
                   "recv A", "send A", "recv B", "send B",
                   "recv A", "recv B"]


@pytest.mark.skipif(not _envpool_has("Hopper-v4"), reason="this envpool build has no Hopper-v4")
def test_envpool_groups_are_the_envs_of_one_simulator():
    # Seeding: group g is made with seed + g * size, so env i of the groups is env i of one pool.
    import numpy as np

    device = torch.device("cpu")
    settings = EnvSettings(id="Hopper-v4", num_envs=6, backend="envpool", num_threads=2)
    one = make_envs(settings, device, seed=3)
    grouped = make_envs(EnvSettings(id="Hopper-v4", num_envs=6, backend="envpool", num_threads=2, groups=3),
                        device, seed=3)
    assert len(grouped.members) == 3 and grouped.num_envs == 6
    assert torch.equal(grouped.reset(3), one.reset(3))
    rng = np.random.default_rng(0)
    for _ in range(300):  # long enough for Hopper's early falls: terminations and autoresets
        actions = torch.from_numpy(rng.uniform(-1, 1, (6, one.act_dim)).astype(np.float32))
        for a, b in zip(grouped.step(actions), one.step(actions), strict=True):
            assert torch.equal(a, b)
    one.close()
    grouped.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: the pinned copy"))])
def test_step_outputs_hold_what_the_simulator_returned(device):
    # Fixed tensors for CUDA graphs, filled from the simulator's numpy arrays (float64 as gymnasium's
    # MuJoCo observations are, bool or 0/1 integer flags) through one packed buffer: each view must
    # read back its own array, refill after refill, at the same addresses.
    import numpy as np

    from ppo.envs import StepOutputs

    rng = np.random.default_rng(0)
    outputs = StepOutputs(5, 3, torch.device(device))
    addresses = [t.data_ptr() for t in outputs.tensors]
    for _ in range(3):
        arrays = (rng.normal(size=(5, 3)), rng.normal(size=5), rng.random(5) < 0.5,
                  (rng.random(5) < 0.5).astype(np.uint8))
        tensors = outputs.fill(arrays)
        assert [t.data_ptr() for t in tensors] == addresses
        assert [t.dtype for t in tensors] == [torch.float32, torch.float32, torch.bool, torch.bool]
        for tensor, array in zip(tensors, arrays, strict=True):
            expected = torch.from_numpy(array).to(tensor.dtype)
            assert torch.equal(tensor.cpu(), expected)


class _DictObservations:
    """A stand-in vector env observing a Dict: each step's dict lists its keys in sorted order, which is
    not the space's order."""

    def __init__(self, space, num_envs: int):
        self.space, self.num_envs, self.rng, self.last = space, num_envs, np.random.default_rng(0), None

    def _observe(self):
        def draw(space):  # a dict's keys sorted, nested dicts too
            from gymnasium.spaces import Dict

            if isinstance(space, Dict):
                return {key: draw(space[key]) for key in sorted(space.spaces)}
            return self.rng.normal(size=(self.num_envs, *space.shape))

        self.last = draw(self.space)
        return self.last

    def reset(self, seed):
        return self._observe(), {}

    def step(self, actions):
        n = self.num_envs
        return self._observe(), np.ones(n), np.zeros(n, bool), np.zeros(n, bool), {}

    def close(self):
        pass


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: the pinned copy"))])
def test_a_dict_of_observations_is_flattened_in_the_order_its_space_lists_its_keys(device):
    # DeepMind Control's tasks (envpool's CheetahRun-v1) observe a Dict of Boxes. The MLP sees them
    # concatenated in the space's key order (the order a checkpoint was trained in), whatever order a
    # step's dict has; a Box of shape () (a humanoid's head height) is one column; a nested Dict
    # (FrankaKitchen-v1's goals) is walked in its own space's order.
    from collections import OrderedDict

    from gymnasium.spaces import Box, Dict

    from ppo.envs import NumpyVecEnv, StepOutputs

    goal = Dict(OrderedDict(kettle=Box(-1.0, 1.0, (2,)), burner=Box(-1.0, 1.0, (1,))))
    space = Dict(OrderedDict(velocity=Box(-9.0, 9.0, (2,)), height=Box(0.0, 9.0, ()), goal=goal,
                             joints=Box(-1.0, 1.0, (2, 3))))
    stub = _DictObservations(space, num_envs=3)
    envs = NumpyVecEnv(stub, "Run-v1", 3, space, Box(-1.0, 1.0, (2,)), torch.device(device))
    assert envs.obs_dim == 2 + 1 + 2 + 1 + 6

    def expected() -> torch.Tensor:
        last = stub.last
        parts = [last["velocity"], last["height"], last["goal"]["kettle"], last["goal"]["burner"], last["joints"]]
        parts = [part.reshape(3, -1) for part in parts]
        return torch.from_numpy(np.concatenate(parts, axis=1)).float()

    assert torch.equal(envs.reset(seed=0).cpu(), expected())
    envs.send(torch.zeros(3, 2, device=device))
    assert torch.equal(envs.recv()[0].cpu(), expected())
    outputs = StepOutputs(3, envs.obs_dim, torch.device(device))
    envs.send(torch.zeros(3, 2, device=device))
    assert torch.equal(envs.recv(out=outputs)[0].cpu(), expected())


def test_envpool_deepmind_control_observations_arrive_flattened(deepmind_control_task):
    import envpool

    settings = EnvSettings(id=deepmind_control_task, num_envs=2, backend="envpool")
    envs = make_envs(settings, torch.device("cpu"), seed=3)
    raw = envpool.make(deepmind_control_task, env_type="gymnasium", num_envs=2, seed=3)
    assert envs.obs_dim == 8 + 9  # position, velocity

    def flat(obs) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([obs["position"], obs["velocity"]], axis=1)).float()

    assert torch.equal(envs.reset(seed=3), flat(raw.reset()[0]))
    actions = torch.linspace(-1, 1, 12).reshape(2, 6)
    for _ in range(3):
        assert torch.equal(envs.step(actions)[0], flat(raw.step(actions.numpy())[0]))
    envs.close()
    raw.close()


def _threads_on_one_cpu() -> set[str]:
    """This process's threads whose CPU set is a single CPU (Linux), as `tid:cpu`."""
    import glob

    pinned = set()
    for status in glob.glob("/proc/self/task/*/status"):
        try:
            with open(status) as f:
                allowed = next(line.split()[1] for line in f if line.startswith("Cpus_allowed_list:"))
        except FileNotFoundError:  # a thread (of another test's pool) ended between listing and reading
            continue
        if allowed.isdigit():
            pinned.add(f"{status.split('/')[4]}:{allowed}")
    return pinned


@pytest.mark.skipif(not _envpool_has("Pendulum-v1") or not os.path.exists("/proc/self/task")
                    or (os.cpu_count() or 1) < 2, reason="needs envpool's Pendulum-v1, Linux and 2+ CPUs")
@pytest.mark.parametrize("pin", [True, False])
def test_env_pin_threads_pins_envpool_workers_one_per_cpu(pin):
    # The setting must reach envpool: pinned, each of the two worker threads keeps one CPU, the
    # first two; unpinned, no new thread is tied to one CPU.
    before = _threads_on_one_cpu()
    envs = make_envs(EnvSettings(id="Pendulum-v1", num_envs=2, backend="envpool", num_threads=2, pin_threads=pin),
                     torch.device("cpu"), seed=0)
    new = _threads_on_one_cpu() - before
    envs.close()
    assert sorted(entry.split(":")[1] for entry in new) == (["0", "1"] if pin else [])


@pytest.mark.skipif(not _envpool_has("Pendulum-v1"), reason="this envpool build has no Pendulum-v1")
def test_envpool_float64_bounds_give_no_precision_warnings():
    # envpool (1.2.5) states Pendulum-v1's observation bounds in float64 and builds float32 Boxes from
    # them: gymnasium warned (four lines) on every run and every evaluate.py that the cast lowers precision.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs = make_envs(EnvSettings(id="Pendulum-v1", num_envs=2, backend="envpool"), torch.device("cpu"), seed=0)
        envs.close()
    assert [str(w.message) for w in caught if "precision" in str(w.message)] == []
    assert (envs.action_low.tolist(), envs.action_high.tolist()) == ([-2.0], [2.0])


def test_mujoco_warnings_print_once_to_stderr_and_leave_no_log_file(tmp_path, monkeypatch, capfd):
    # MuJoCo's own handler prints each warning to stdout and appends it to MUJOCO_LOG.TXT in the working
    # dir: with MuJoCo 4, gymnasium's HalfCheetah model warned once per env (64 times by default).
    # A physics warning is one MuJoCo raises on every version: a NaN position, here in each of two envs.
    import mujoco

    import ppo.envs.interface

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ppo.envs.interface, "_mujoco_warnings_seen", set())
    previous = mujoco.get_mju_user_warning()
    try:
        envs = make_envs(EnvSettings(id="InvertedPendulum-v4", num_envs=2, backend="gymnasium"), torch.device("cpu"),
                         seed=0)
        capfd.readouterr()
        for env in envs.env.envs:
            model, data = env.unwrapped.model, env.unwrapped.data
            data.qpos[0] = np.nan
            mujoco.mj_step(model, data)
    finally:
        mujoco.set_mju_user_warning(previous)
    out, err = capfd.readouterr()
    assert "QPOS" not in out
    assert [line for line in err.splitlines() if "QPOS" in line] == [
        "MuJoCo warning: Nan, Inf or huge value in QPOS at DOF 0. The simulation is unstable. Time = 0.0000."]
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_episode_statistics_and_the_buffer_are_made_on_the_runs_device_in_their_own_dtypes():
    # The "meta" device stands for a GPU: every tensor is made on the device given, in the dtype it needs,
    # whatever torch's default dtype.
    from ppo.collect import EpisodeStats

    meta, default = torch.device("meta"), torch.get_default_dtype()
    for dtype in (torch.float32, torch.float64):
        torch.set_default_dtype(dtype)
        try:
            stats = EpisodeStats(3, meta)
            buffer = RolloutBuffer(4, 3, 5, 2, meta)
        finally:
            torch.set_default_dtype(default)
        assert [(t.device, t.dtype) for t in (stats.returns, stats.lengths, stats.finished)] == [
            (meta, torch.float64), (meta, torch.int64), (meta, torch.float64)]
        floats = ("observations", "actions", "log_probs", "values", "rewards", "bootstrap_values", "advantages",
                  "returns")
        assert all(getattr(buffer, name).device == meta and getattr(buffer, name).dtype == torch.float32
                   for name in floats)
        assert all(getattr(buffer, name).dtype == torch.bool and getattr(buffer, name).device == meta
                   for name in ("terminateds", "truncateds", "valid"))
        assert buffer.table.data.device == meta and buffer.table.data.dtype == torch.float32
        order = buffer.shuffled_order(2, torch.Generator().manual_seed(0))  # drawn on the generator's device
        assert order.device == meta and order.shape == (2, 6)


def test_the_collectors_state_is_made_on_the_runs_device():
    meta = torch.device("meta")

    class MetaEnvs:  # the least of a VecEnv, on the device standing for a GPU
        num_envs, obs_dim, act_dim = 3, 2, 1

        def __init__(self):
            self.members = [self]

        def reset(self, seed):
            return torch.zeros(3, 2, device=meta)

    collector = Collector(MetaEnvs(), KnownPolicy(), ObservationNormalizer(2, meta), RewardScaler(3, GAMMA, meta), meta,
                          seed=0)
    assert collector.next_obs.device == collector.next_is_dummy.device == collector.episodes.returns.device == meta


def test_the_collectors_clocks_add_up_the_simulators_time_and_the_rest():
    # A simulator that takes 20 ms a step: env time holds it, inference time the rest, both only grow,
    # and neither passes the wall clock.
    import time

    register_toy_envs()
    device = torch.device("cpu")
    envs = make_envs(EnvSettings(id=TOY_ID, num_envs=2, backend="gymnasium"), device, seed=0)
    step = envs.env.step

    def slow(actions):
        time.sleep(0.02)
        return step(actions)

    envs.env.step = slow

    class SlowPolicy(KnownPolicy):  # 10 ms to act and 10 ms to value: inference time that adds up
        def sample_action(self, obs):
            time.sleep(0.01)
            return super().sample_action(obs)

        def get_value(self, obs):
            time.sleep(0.01)
            return super().get_value(obs)

    collector = Collector(envs, SlowPolicy(), ObservationNormalizer(1, device), RewardScaler(2, GAMMA, device),
                          device, seed=0)
    buffer = RolloutBuffer(5, 2, 1, 1, device)
    assert collector.env_seconds == collector.inference_seconds == 0.0
    spans = []
    for _ in range(2):
        start = time.perf_counter()
        collector.collect(buffer)
        spans.append((time.perf_counter() - start, collector.env_seconds, collector.inference_seconds))
    envs.close()
    (wall1, env1, inference1), (wall2, env2, inference2) = spans
    assert 0.1 <= env1 <= wall1 and 0.2 <= env2 <= wall1 + wall2 and env2 - env1 >= 0.1
    # 5 steps of acting and valuing, and the value after the window: 110 ms at least a rollout
    assert 0.11 <= inference1 and inference2 - inference1 >= 0.11 and env1 + inference1 <= wall1
    assert env2 + inference2 <= wall1 + wall2


def test_a_truncation_on_a_windows_last_step_is_bootstrapped_in_the_next_window_and_a_termination_is_not():
    # Windows of 5 steps: the toy chain's second episode is cut by its time limit at step 5, the first step of
    # the second window, whose dummy step (6) sees the final observation (c = 3): V = 13. Windows of 2: its
    # first episode terminates at step 1, a window's last step: nothing after it counts (bootstrap 0).
    register_toy_envs()
    device = torch.device("cpu")
    for window, checks in ((5, "truncation"), (2, "termination")):
        envs = make_envs(EnvSettings(id=TOY_ID, num_envs=1, backend="gymnasium"), device, seed=0)
        collector = Collector(envs, KnownPolicy(), ObservationNormalizer(1, device, enabled=False),
                              RewardScaler(1, GAMMA, device, enabled=False), device, seed=0)
        first, second = RolloutBuffer(window, 1, 1, 1, device), RolloutBuffer(window, 1, 1, 1, device)
        collector.collect(first)
        collector.collect(second)
        envs.close()
        if checks == "truncation":
            assert second.truncateds[0, 0] and second.bootstrap_values[0, 0].item() == 13.0
        else:
            assert first.terminateds[-1, 0] and first.bootstrap_values[-1, 0].item() == 0.0
            assert not first.terminateds[0, 0]


def test_advantages_of_two_valid_samples_normalise_with_bessels_correction():
    from buffers import normalized_advantages

    out = normalized_advantages(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0]))
    torch.testing.assert_close(out, torch.tensor([-(0.5**0.5), 0.5**0.5, 0.0]))  # mean 2, std sqrt(2)
