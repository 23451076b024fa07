"""Running normalisers: statistics match numpy's, weights pick samples, freezing stops updates, state
round-trips."""

import numpy as np
import torch

from ppo.normalize import ObservationNormalizer, RewardScaler, RunningMeanStd, ValueNormalizer


def test_running_mean_std_matches_the_whole_batch():
    g = torch.Generator().manual_seed(0)
    data = torch.randn(1000, 3, generator=g) * torch.tensor([1.0, 5.0, 0.1]) + 2
    rms = RunningMeanStd((3,), torch.device("cpu"))
    for chunk in data.split(37):
        rms.update(chunk)
    np.testing.assert_allclose(rms.mean.numpy(), data.double().mean(0).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(rms.var.numpy(), data.double().var(0, unbiased=False).numpy(), rtol=1e-3)


def test_frozen_observation_normalizer_does_not_update_and_clips():
    normalizer = ObservationNormalizer(2, torch.device("cpu"), clip=3.0)
    normalizer(torch.tensor([[0.0, 0.0], [2.0, 4.0]]))
    state = {k: v.clone() for k, v in normalizer.state_dict().items()}
    normalizer.frozen = True
    out = normalizer(torch.tensor([[1000.0, -1000.0]]))
    assert out.abs().max().item() == 3.0
    assert all(torch.equal(state[k], v) for k, v in normalizer.state_dict().items())


def test_reward_scaler_restarts_the_discounted_return_at_episode_ends():
    scaler = RewardScaler(2, gamma=0.5, device=torch.device("cpu"))
    scaler(torch.tensor([1.0, 1.0]), torch.tensor([False, True]))
    assert scaler.discounted_return.tolist() == [1.0, 0.0]
    scaler(torch.tensor([1.0, 1.0]), torch.tensor([False, False]))
    assert scaler.discounted_return.tolist() == [1.5, 1.0]


def test_state_round_trips():
    a = ObservationNormalizer(3, torch.device("cpu"))
    a(torch.randn(10, 3))
    b = ObservationNormalizer(3, torch.device("cpu"))
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 3)
    a.frozen = b.frozen = True
    torch.testing.assert_close(a(x), b(x))


def test_weighted_running_mean_std_counts_only_the_samples_of_weight_one():
    g = torch.Generator().manual_seed(1)
    data = torch.randn(500, 2, generator=g) * 3 + 1
    keep = torch.rand(500, generator=g) > 0.3
    weighted, selected = RunningMeanStd((2,), torch.device("cpu")), RunningMeanStd((2,), torch.device("cpu"))
    for chunk, flags in zip(data.split(41), keep.split(41), strict=True):
        garbage = torch.where(flags[:, None], chunk, torch.tensor(1e6))  # what weight 0 hides must not count
        weighted.update(garbage, flags.float())
        selected.update(chunk[flags])
    for name in ("mean", "var", "count"):
        torch.testing.assert_close(getattr(weighted, name), getattr(selected, name))
    before = {k: v.clone() for k, v in weighted.state_dict().items()}
    weighted.update(torch.full((7, 2), 5.0), torch.zeros(7))  # nothing of weight 1: nothing changes
    assert all(torch.equal(before[k], v) for k, v in weighted.state_dict().items())


def test_value_normalizer_tracks_the_valid_returns_and_round_trips():
    g = torch.Generator().manual_seed(2)
    returns = torch.randn(16, 8, generator=g) * 40 + 100
    valid = torch.rand(16, 8, generator=g) > 0.2
    normalizer = ValueNormalizer(torch.device("cpu"))
    normalizer.update(returns, valid)
    expected = returns[valid].double()
    torch.testing.assert_close(normalizer.mean, expected.mean().float(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(normalizer.std, expected.std(unbiased=False).float(), rtol=1e-4, atol=1e-4)
    x = torch.randn(5, generator=g)
    torch.testing.assert_close(normalizer.normalize(normalizer.denormalize(x)), x)
    restored = ValueNormalizer(torch.device("cpu"))
    restored.load_state_dict(normalizer.state_dict())
    torch.testing.assert_close(restored.denormalize(x), normalizer.denormalize(x))
    off = ValueNormalizer(torch.device("cpu"), enabled=False)
    off.update(returns, valid)
    assert off.normalize(x) is x and off.denormalize(x) is x and off.mean.item() == 0 and off.std.item() == 1


class NumpyRunningStats:
    """The running statistics the normalisers keep, written plainly for the tests: every value seen, with the
    prior (mean 0, variance 1, weight 1e-4) the normalisers start from."""

    def __init__(self, width: int):
        self.seen = np.zeros((0, width))

    def add(self, batch: np.ndarray) -> None:
        self.seen = np.concatenate([self.seen, batch.reshape(len(batch), -1)])

    def mean_var(self) -> tuple[np.ndarray, np.ndarray]:
        prior, n = 1e-4, len(self.seen)
        mean = self.seen.sum(0) / (prior + n)
        var = (prior * (1 + mean**2) + ((self.seen - mean) ** 2).sum(0)) / (prior + n)
        return mean, var


def test_the_observation_normalizers_outputs_match_a_numpy_reference():
    # Each batch is folded in, then normalised by the running mean and std (not the variance) and clipped.
    rng = np.random.default_rng(3)
    normalizer = ObservationNormalizer(3, torch.device("cpu"), clip=2.5)
    reference = NumpyRunningStats(3)
    for size in (1, 7, 32, 5):
        batch = rng.normal([1.0, -4.0, 0.0], [0.5, 3.0, 20.0], (size, 3)).astype(np.float32)
        if size == 7:
            batch[0] = [50.0, -50.0, 500.0]  # far outside: clipped
        out = normalizer(torch.from_numpy(batch)).numpy()
        reference.add(batch.astype(np.float64))
        mean, var = reference.mean_var()
        expected = np.clip((batch - mean) / np.sqrt(var + 1e-8), -2.5, 2.5)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert np.abs(out).max() <= 2.5
    normalizer.frozen = True  # evaluation: the same map, statistics kept
    probe = rng.normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_allclose(normalizer(torch.from_numpy(probe)).numpy(),
                               np.clip((probe - mean) / np.sqrt(var + 1e-8), -2.5, 2.5), rtol=1e-5, atol=1e-5)


def test_the_reward_scalers_outputs_match_a_numpy_reference():
    # Per env, the discounted return G = gamma G + r is folded into the running statistics every step (all
    # envs' at once) and restarts after an episode's end; rewards are divided by the std of G and clipped.
    rng = np.random.default_rng(4)
    num_envs, gamma, clip = 3, 0.9, 4.0
    scaler = RewardScaler(num_envs, gamma, torch.device("cpu"), clip=clip)
    reference, returns = NumpyRunningStats(1), np.zeros(num_envs)
    for step in range(40):
        rewards = rng.normal(2.0, 3.0, num_envs).astype(np.float32)
        if step == 17:
            rewards[1] = 400.0  # clipped
        dones = rng.random(num_envs) < 0.2
        out = scaler(torch.from_numpy(rewards), torch.from_numpy(dones)).numpy()
        returns = gamma * returns + rewards
        reference.add(returns[:, None])
        _, var = reference.mean_var()
        np.testing.assert_allclose(out, np.clip(rewards / np.sqrt(var + 1e-8), -clip, clip), rtol=1e-5, atol=1e-6)
        returns[dones] = 0.0
        np.testing.assert_allclose(scaler.discounted_return.numpy(), returns, rtol=1e-9)
    assert abs(out).max() <= clip


def test_disabled_normalizers_hand_back_their_inputs_untouched():
    obs, rewards = torch.randn(4, 2) * 100, torch.randn(3) * 100
    assert ObservationNormalizer(2, torch.device("cpu"), enabled=False)(obs) is obs
    assert RewardScaler(3, 0.99, torch.device("cpu"), enabled=False)(rewards, torch.zeros(3, dtype=torch.bool)) \
        is rewards


def test_a_reward_scaler_restores_its_running_returns_only_for_as_many_envs():
    scaler = RewardScaler(3, 0.9, torch.device("cpu"))
    scaler(torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3, dtype=torch.bool))
    same, fewer = RewardScaler(3, 0.9, torch.device("cpu")), RewardScaler(2, 0.9, torch.device("cpu"))
    same.load_state_dict(scaler.state_dict())
    fewer.load_state_dict(scaler.state_dict())  # a resume with another env count: statistics only
    assert same.discounted_return.tolist() == [1.0, 2.0, 3.0] and fewer.discounted_return.tolist() == [0.0, 0.0]
    assert fewer.rms.var.item() == scaler.rms.var.item()


def test_the_statistics_are_float64_on_the_runs_device_whatever_torchs_default_dtype():
    # The "meta" device stands for a GPU here: every tensor must be made on the device it is given.
    meta, default = torch.device("meta"), torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if default == torch.float32 else torch.float32)
    try:
        parts = [RunningMeanStd((3,), meta), ObservationNormalizer(3, meta).rms, RewardScaler(4, 0.9, meta).rms,
                 ValueNormalizer(meta).rms]
        tensors = [t for rms in parts for t in (rms.mean, rms.var, rms.count)]
        scaler, values = RewardScaler(4, 0.9, meta), ValueNormalizer(meta)
        tensors.append(scaler.discounted_return)
        assert all(t.device == meta and t.dtype == torch.float64 for t in tensors)
        assert values.mean.device == meta and values.std.device == meta
    finally:
        torch.set_default_dtype(default)


def test_a_constant_stream_normalises_to_finite_numbers():
    # A million identical observations (and returns): the variance falls near zero, and the 1e-8 beside it
    # keeps the square root real.
    cpu = torch.device("cpu")
    normalizer = ObservationNormalizer(1, cpu)
    out = normalizer(torch.full((1_000_000, 1), 5.0))
    assert torch.isfinite(out).all() and out.abs().max().item() < 1e-3
    scaler = RewardScaler(1_000_000, 0.9, cpu)
    assert torch.isfinite(scaler(torch.zeros(1_000_000), torch.zeros(1_000_000, dtype=torch.bool))).all()
    values = ValueNormalizer(cpu)
    values.update(torch.full((1_000_000,), 3.0), torch.ones(1_000_000, dtype=torch.bool))
    assert torch.isfinite(values.std) and values.std.item() > 0


def test_the_weighted_statistics_of_a_single_sample_and_of_a_small_spread_are_those_of_the_samples():
    g = torch.Generator().manual_seed(5)
    cases = [(torch.tensor([[4.0], [9.0]]), torch.tensor([1.0, 0.0])),  # one sample of weight 1
             (torch.randn(50, 2, generator=g) * 0.01, torch.rand(50, generator=g) > 0.3)]  # variance far below 1
    for batch, weights in cases:
        weighted, selected = RunningMeanStd(batch.shape[1:], torch.device("cpu")), RunningMeanStd(
            batch.shape[1:], torch.device("cpu"))
        weighted.update(batch, weights.float())
        selected.update(batch[weights > 0])
        for name in ("mean", "var", "count"):
            torch.testing.assert_close(getattr(weighted, name), getattr(selected, name), rtol=1e-9, atol=1e-12)


def test_large_rewards_of_either_sign_are_clipped():
    scaler = RewardScaler(2, 0.9, torch.device("cpu"), clip=3.0)
    scaler(torch.tensor([1.0, -1.0]), torch.zeros(2, dtype=torch.bool))
    scaler.frozen = True  # statistics of rewards near 1: a million is far outside them, either way
    out = scaler(torch.tensor([1e6, -1e6]), torch.zeros(2, dtype=torch.bool))
    assert out.tolist() == [3.0, -3.0]
