"""Running normalisers: statistics match numpy's, freezing stops updates, state round-trips."""

import numpy as np
import torch

from ppo.normalize import ObservationNormalizer, RewardScaler, RunningMeanStd


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
