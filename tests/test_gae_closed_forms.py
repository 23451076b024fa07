"""GAE against closed forms, on both CPU paths: the pure-torch reference and the Triton kernel
(under the interpreter without a GPU, on CUDA where there is one)."""

import pytest
import torch

import kernels.gae
from kernels import compute_gae
from tests.rollouts import poison_one_step_per_row, random_rollout


@pytest.fixture(params=["reference", "kernel"])
def device(request, monkeypatch):
    """The device to put tensors on; with "reference", compute_gae is forced onto the torch path."""
    if request.param == "reference":
        request.getfixturevalue("gae_by_reference")
        return "cpu"
    # An empty cache of planned calls: what runs a signature was decided under the other setting.
    monkeypatch.setattr(kernels.gae, "_runs", {})
    if torch.cuda.is_available():
        return "cuda"
    assert kernels.gae._INTERPRET, "conftest sets TRITON_INTERPRET=1 on machines without CUDA"
    return "cpu"


def tensors(device, *rows, dtype=torch.float32):
    return [torch.tensor(r, dtype=dtype, device=device) for r in rows]


def test_lambda_zero_gives_one_step_td_error(device):
    g = torch.Generator().manual_seed(1)
    r, v, boot = torch.randn(3, 2, 9, generator=g).to(device)
    term = torch.zeros(2, 9, dtype=torch.bool, device=device)
    trunc = torch.zeros_like(term)
    term[0, 3], trunc[1, 5] = True, True
    boot = torch.where(trunc, boot, torch.zeros((), device=device))
    boot[:, -1] = torch.tensor([0.5, -0.7], device=device)
    adv, ret = compute_gae(r, v, term, trunc, gamma=0.9, lam=0.0, bootstrap_values=boot)
    next_v = torch.cat([v[:, 1:], boot[:, -1:]], dim=1)
    next_v = torch.where(trunc, boot, next_v)
    next_v = torch.where(term, 0.0, next_v)
    expected = r + 0.9 * next_v - v
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + v)


def test_lambda_one_gives_monte_carlo_return_minus_value(device):
    gamma, steps = 0.97, 12
    g = torch.Generator().manual_seed(2)
    r, v = torch.randn(2, 4, steps, generator=g).to(device)
    last = torch.randn(4, generator=g).to(device)
    term = torch.zeros(4, steps, dtype=torch.uint8, device=device)
    adv, ret = compute_gae(r, v, term, gamma=gamma, lam=1.0, last_value=last)
    discounted = last.clone()
    expected_ret = torch.empty_like(r)
    for t in reversed(range(steps)):
        discounted = r[:, t] + gamma * discounted
        expected_ret[:, t] = discounted
    torch.testing.assert_close(ret, expected_ret)
    torch.testing.assert_close(adv, expected_ret - v)


def test_single_terminal_reward_decays_backwards_by_gamma_lambda(device):
    (r,) = tensors(device, [[0.0, 0.0, 0.0, 0.0, 1.0]])
    v = torch.zeros_like(r)
    term = torch.tensor([[False, False, False, False, True]], device=device)
    adv, ret = compute_gae(r, v, term, gamma=0.9, lam=0.5)
    expected = torch.tensor([[0.45**4, 0.45**3, 0.45**2, 0.45, 1.0]], device=device)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_terminal_step_ignores_its_bootstrap_value(device):
    # The bootstrap at a terminal step is unused: even inf there must not leak into the
    # advantage (a multiplication by (1 - terminated) would turn it into NaN).
    r, v = tensors(device, [[1.0, 2.0, 3.0]], [[0.5, 0.75, 0.25]])
    term = torch.tensor([[True, False, False]], device=device)
    trunc = torch.zeros_like(term)
    boot = torch.tensor([[float("inf"), 0.0, 0.0]], device=device)
    adv, ret = compute_gae(r, v, term, trunc, gamma=0.9, lam=0.8, bootstrap_values=boot)
    assert torch.isfinite(adv).all()
    assert adv[0, 0].item() == pytest.approx(1.0 - 0.5)
    assert ret[0, 0].item() == pytest.approx(1.0)


def test_interior_truncation_uses_its_bootstrap_and_cuts_the_trace(device):
    gamma, lam = 0.9, 0.8
    r, v = tensors(device, [[1.0, 2.0, 3.0, 4.0]], [[0.1, 0.2, 0.3, 0.4]])
    term = torch.zeros(1, 4, dtype=torch.bool, device=device)
    trunc = torch.tensor([[False, True, False, False]], device=device)
    boot = torch.tensor([[0.0, 5.0, 0.0, 7.0]], device=device)
    adv, _ = compute_gae(r, v, term, trunc, gamma=gamma, lam=lam, bootstrap_values=boot)
    a3 = 4.0 + gamma * 7.0 - 0.4
    a2 = 3.0 + gamma * 0.4 - 0.3 + gamma * lam * a3
    a1 = 2.0 + gamma * 5.0 - 0.2  # the bootstrap, not values[2]; nothing flows back from step 2
    a0 = 1.0 + gamma * 0.2 - 0.1 + gamma * lam * a1
    torch.testing.assert_close(adv, torch.tensor([[a0, a1, a2, a3]], device=device))


def test_last_value_equals_bootstrap_in_last_column(device):
    g = torch.Generator().manual_seed(3)
    r, v = torch.randn(2, 5, 33, generator=g).to(device)
    last = torch.randn(5, generator=g).to(device)
    term = (torch.rand(5, 33, generator=g) < 0.1).to(device)
    boot = torch.zeros_like(v)
    boot[:, -1] = last
    a1, r1 = compute_gae(r, v, term, last_value=last, gamma=0.99, lam=0.95)
    a2, r2 = compute_gae(r, v, term, bootstrap_values=boot, gamma=0.99, lam=0.95)
    torch.testing.assert_close(a1, a2, rtol=0, atol=0)
    torch.testing.assert_close(r1, r2, rtol=0, atol=0)


def test_no_bootstrap_means_zero_value_after_the_window(device):
    r, v = tensors(device, [[1.0, 1.0]], [[0.0, 0.0]])
    term = torch.zeros(1, 2, dtype=torch.bool, device=device)
    adv, _ = compute_gae(r, v, term, gamma=0.5, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[1.5, 1.0]], device=device))


def test_without_a_continuation_value_only_the_last_step_sees_zero_and_float64_stays_float64(device):
    # Three steps, values that are not zero: the interior steps take the next step's value, the last 0.
    gamma, lam = 0.5, 0.5
    for dtype in (torch.float32, torch.float64):
        r = torch.tensor([[1.0, 2.0, 3.0]], dtype=dtype, device=device)
        v = torch.tensor([[4.0, 5.0, 6.0]], dtype=dtype, device=device)
        adv, ret = compute_gae(r, v, torch.zeros(1, 3, dtype=torch.bool, device=device), gamma=gamma, lam=lam)
        deltas = [1 + gamma * 5 - 4, 2 + gamma * 6 - 5, 3 + gamma * 0 - 6]
        expected = [0.0, 0.0, deltas[2]]
        expected[1] = deltas[1] + gamma * lam * expected[2]
        expected[0] = deltas[0] + gamma * lam * expected[1]
        assert adv.dtype == dtype and ret.dtype == dtype
        torch.testing.assert_close(adv, torch.tensor([expected], dtype=dtype, device=device), rtol=0, atol=1e-12)
        torch.testing.assert_close(ret, adv + v, rtol=0, atol=0)


def test_single_step_window(device):
    r, v, last = tensors(device, [[2.0], [3.0]], [[1.0], [1.0]], [4.0, 4.0])
    term = torch.tensor([[False], [True]], device=device)
    adv, ret = compute_gae(r, v, term, last_value=last, gamma=0.5, lam=0.9)
    torch.testing.assert_close(adv, torch.tensor([[2.0 + 2.0 - 1.0], [3.0 - 1.0]], device=device))
    torch.testing.assert_close(ret, adv + v)


def test_empty_rollout_returns_empty_outputs(device):
    r = torch.zeros(3, 0, device=device)
    adv, ret = compute_gae(r, r.clone(), torch.zeros(3, 0, dtype=torch.bool, device=device))
    assert adv.shape == ret.shape == (3, 0)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("num_envs,num_steps", [(10, 40), (5, 300)])
def test_a_non_finite_number_stays_in_its_own_episode(device, num_envs, num_steps):
    # A done step multiplies the advantage after it by 0, and 0 * inf is NaN: the chain must be cut
    # by a select, or a NaN reward late in a rollout poisons every step before it.
    clean = random_rollout(num_envs, num_steps, density=0.05, seed=num_steps, device=device)
    expected_adv, expected_ret = compute_gae(**clean, gamma=0.99, lam=0.95)
    poisoned = {k: v.clone() for k, v in clean.items()}
    affected = poison_one_step_per_row(poisoned, seed=num_envs).to(device)
    assert affected.any(dim=1).sum() >= num_envs // 2, "most rows must carry a poisoned step"
    adv, ret = compute_gae(**poisoned, gamma=0.99, lam=0.95)
    assert not torch.isfinite(adv[affected]).any()
    torch.testing.assert_close(adv[~affected], expected_adv[~affected])
    torch.testing.assert_close(ret[~affected], expected_ret[~affected])


def test_the_reference_computes_on_the_device_of_its_inputs():
    # "meta" stands for a GPU: the scan's state is made where the values are (the oracle runs on CUDA too).
    from kernels.reference import gae_reference

    meta = torch.device("meta")
    shape = (3, 4)
    rewards, values = torch.zeros(shape, device=meta), torch.zeros(shape, device=meta)
    flags = torch.zeros(shape, dtype=torch.bool, device=meta)
    advantages, returns = torch.empty(shape, device=meta), torch.empty(shape, device=meta)
    gae_reference(rewards, values, flags, flags, torch.zeros(shape, device=meta), None, 0.9, 0.9, advantages, returns)
    assert advantages.device == returns.device == meta
