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
