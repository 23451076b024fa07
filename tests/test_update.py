"""The PPO loss: dummy samples (weight 0) change nothing, whatever they hold."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from buffers import Minibatch, SampleTable
from ppo.agent import Agent
from ppo.config import PPOSettings
from ppo.update import STAT_NAMES, ppo_loss
from ppo.update.compiled_step import vector_width_option
from tests.conftest import ROOT, filled_buffer


def random_minibatch(n: int, seed: int, obs_dim: int = 5, act_dim: int = 2) -> Minibatch:
    g = torch.Generator().manual_seed(seed)
    return Minibatch(observations=torch.randn(n, obs_dim, generator=g), actions=torch.randn(n, act_dim, generator=g),
                     log_probs=torch.randn(n, generator=g) - 2, values=torch.randn(n, generator=g),
                     advantages=torch.randn(n, generator=g), returns=torch.randn(n, generator=g),
                     weights=torch.ones(n))


def test_dummy_samples_do_not_change_the_loss_or_its_gradient():
    torch.manual_seed(0)
    agent = Agent(5, 2)
    settings = PPOSettings(ent_coef=0.01)
    clean = random_minibatch(6, seed=1)
    garbage = random_minibatch(3, seed=2)
    garbage.log_probs[:] = -float("inf")  # a stale log-prob: an inf ratio if not masked
    garbage.advantages[:] = 1e6
    mixed = Minibatch(*(torch.cat([getattr(clean, f), getattr(garbage, f)]) for f in
                        ("observations", "actions", "log_probs", "values", "advantages", "returns")),
                      weights=torch.cat([torch.ones(6), torch.zeros(3)]))

    def loss_and_grad(mb):
        agent.zero_grad()
        loss, stats = ppo_loss(agent, mb, settings)
        loss.backward()
        return loss.detach(), stats, [p.grad.clone() for p in agent.parameters()]

    loss_a, stats_a, grads_a = loss_and_grad(clean)
    loss_b, stats_b, grads_b = loss_and_grad(mixed)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(stats_a, stats_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b)


def cleanrl_loss(agent: Agent, mb: Minibatch, settings: PPOSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """CleanRL's ppo_continuous_action loss and diagnostics, written as it writes them (a Normal
    distribution, plain means), over the valid samples only: the reference for `ppo_loss`."""
    keep = mb.weights > 0
    obs, actions = mb.observations[keep], mb.actions[keep]
    mean = agent.actor_mean(obs)
    dist = torch.distributions.Normal(mean, agent.actor_log_std.expand_as(mean).exp())
    new_log_prob, entropy = dist.log_prob(actions).sum(1), dist.entropy().sum(1)
    new_value = agent.critic(obs).view(-1)
    log_ratio = new_log_prob - mb.log_probs[keep]
    ratio = log_ratio.exp()
    adv, values, returns = mb.advantages[keep], mb.values[keep], mb.returns[keep]
    if settings.norm_adv == "minibatch":
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - settings.clip_coef, 1 + settings.clip_coef)).mean()
    v_unclipped = (new_value - returns) ** 2
    v_clipped = (values + torch.clamp(new_value - values, -settings.clip_coef, settings.clip_coef) - returns) ** 2
    v_loss = 0.5 * (torch.max(v_unclipped, v_clipped).mean() if settings.clip_vloss else v_unclipped.mean())
    entropy_loss = entropy.mean()
    loss = pg_loss - settings.ent_coef * entropy_loss + v_loss * settings.vf_coef
    with torch.no_grad():
        stats = torch.stack([pg_loss, v_loss, entropy_loss, ((ratio - 1) - log_ratio).mean(),
                             ((ratio - 1.0).abs() > settings.clip_coef).float().mean(), (-log_ratio).mean()])
    return loss, stats


@pytest.mark.parametrize("clip_vloss,norm_adv,shared_trunk",
                         [(True, "minibatch", False), (False, "minibatch", False), (True, "batch", False),
                          (True, "minibatch", True)])
def test_loss_and_gradient_match_cleanrl(clip_vloss, norm_adv, shared_trunk):
    torch.manual_seed(4)
    agent = Agent(5, 2, init_log_std=-0.3, shared_trunk=shared_trunk)
    settings = PPOSettings(ent_coef=0.01, vf_coef=0.7, clip_coef=0.15, clip_vloss=clip_vloss, norm_adv=norm_adv)
    mb = random_minibatch(37, seed=5)
    mb.advantages.mul_(3.0).add_(0.5)  # far from normalised: per-minibatch normalisation must show
    mb.log_probs += 0.3 * torch.randn(37)  # ratios on both sides of the clip range
    mb.weights[[3, 17, 30]] = 0  # a few dummy samples, which both must ignore

    def loss_and_grad(loss_fn):
        agent.zero_grad()
        loss, stats = loss_fn(agent, mb, settings)
        loss.backward()
        return loss.detach(), stats, [p.grad.clone() for p in agent.parameters()]

    ours, reference = loss_and_grad(ppo_loss), loss_and_grad(cleanrl_loss)
    assert 0 < reference[1][4] < 1, "some ratios must be clipped and some not"
    torch.testing.assert_close(ours[0], reference[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours[1], reference[1], rtol=1e-5, atol=1e-6)
    for a, b in zip(ours[2], reference[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_normalized_value_loss_is_measured_in_the_critics_units():
    # rl_games' normalize_value: the raw critic output is compared with the returns and old values
    # normalised by the running statistics; the agent's values are the denormalised output.
    from ppo.normalize import ValueNormalizer

    torch.manual_seed(6)
    normalizer = ValueNormalizer(torch.device("cpu"))
    normalizer.update(torch.randn(200) * 30 + 50, torch.ones(200))
    agent = Agent(5, 2, value_normalizer=normalizer)
    settings = PPOSettings(vf_coef=2.0, clip_coef=0.2)
    mb = random_minibatch(29, seed=7)
    mb.returns.mul_(30).add_(50)
    mb.values.copy_(agent.get_value(mb.observations).detach() + 10 * torch.randn(29))  # some clipped, some not
    mb.weights[[4, 11]] = 0
    obs = mb.observations
    torch.testing.assert_close(agent.get_value(obs), agent.critic(obs).squeeze(-1) * normalizer.std + normalizer.mean)

    def value_part(loss_fn):
        agent.zero_grad()
        loss, stats = loss_fn(agent, mb, settings)
        loss.backward()
        return stats[1], agent.critic[0].weight.grad.clone()

    def reference(agent, mb, settings):
        keep = mb.weights > 0
        raw = agent.critic(obs[keep]).squeeze(-1)
        returns, old = normalizer.normalize(mb.returns[keep]), normalizer.normalize(mb.values[keep])
        clipped = old + (raw - old).clamp(-settings.clip_coef, settings.clip_coef)
        v_loss = 0.5 * torch.max((raw - returns) ** 2, (clipped - returns) ** 2).mean()
        return settings.vf_coef * v_loss, torch.stack([v_loss.detach()] * 2)

    (ours, ours_grad), (ref, ref_grad) = value_part(ppo_loss), value_part(reference)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_grad, ref_grad, rtol=1e-4, atol=1e-6)
    unnormalized = ppo_loss(Agent(5, 2), mb, settings)[1][1]
    assert unnormalized > 100 * ours, "normalised errors are in units of the returns' std (30 here)"


@pytest.mark.parametrize("side_by_side", [False, True], ids=["separate", "side_by_side"])
def test_compiled_loss_matches_eager(side_by_side):
    # On CUDA the compiled loss runs the two networks side by side (train.py); here on the CPU the
    # compiled side-by-side loss must match the eager loss of the separate networks as well.
    from ppo import update

    torch.manual_seed(0)
    agent = Agent(5, 2)
    mb = random_minibatch(8, seed=3)
    mb.advantages.mul_(3.0).add_(1.0)  # the per-minibatch normalisation (the default) has work to do
    mb.weights[5:] = 0

    def loss_stats_and_grads(loss_fn, settings):
        agent.zero_grad()
        loss, stats = loss_fn(agent, mb, settings)
        loss.backward()
        return [loss.detach(), stats] + [p.grad.clone() for p in agent.parameters()]

    eager = loss_stats_and_grads(ppo_loss, PPOSettings())
    settings = PPOSettings(compile=True)
    agent.side_by_side = side_by_side
    compiled = loss_stats_and_grads(update._loss_function(settings, torch.device("cpu")), settings)
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def run_updates(device: torch.device, graphs: bool, settings: PPOSettings, plain: bool = False) -> tuple[list, list]:
    """Three updates on changing buffer contents and learning rates; parameters and stats after each.
    By `Updater`, or with `plain`, by calling `ppo_update` itself."""
    from ppo.normalize import ValueNormalizer
    from ppo.update import Updater, current_learning_rate, make_optimizer, ppo_update, set_learning_rate

    torch.manual_seed(0)
    normalizer = ValueNormalizer(device, settings.normalize_values)
    agent = Agent(5, 2, value_normalizer=normalizer).to(device)
    optimizer = make_optimizer(agent, settings, device, graphs)
    updater = Updater(agent, optimizer, settings, graphs)
    if plain:
        def updater(buffer, generator):
            return ppo_update(agent, optimizer, buffer, settings, generator)
    generator = torch.Generator(device).manual_seed(3)
    buffer = filled_buffer(0, device=device)
    parameters, stats = [], []
    for iteration in range(3):
        fresh = filled_buffer(iteration, device=device)
        for name in ("observations", "actions", "log_probs", "values", "advantages", "returns", "valid"):
            getattr(buffer, name).copy_(getattr(fresh, name))
        if settings.adaptive_lr_kl is None:
            set_learning_rate(optimizer, 1e-2 / (iteration + 1))  # annealing must reach a captured step
        buffer.returns.mul_(20 * (iteration + 1)).add_(10)  # the value statistics move between updates
        normalizer.update(buffer.returns, buffer.valid)  # as train.py does, before the update
        result = updater(buffer, generator)
        result["learning_rate"] = current_learning_rate(optimizer)
        stats.append(torch.stack([result[k].float().cpu() for k in sorted(result)]))
        parameters.append([p.detach().cpu().clone() for p in agent.parameters()])
    return parameters, stats


def assert_same_updates(got: tuple[list, list], want: tuple[list, list], param_atol: float = 1e-5,
                        stat_rtol: float = 1e-4) -> None:
    """`run_updates` results agree, update by update: statistics, then every parameter."""
    (got_params, got_stats), (want_params, want_stats) = got, want
    for iteration in range(len(want_stats)):
        torch.testing.assert_close(got_stats[iteration], want_stats[iteration], rtol=stat_rtol, atol=1e-5)
        for a, b in zip(got_params[iteration], want_params[iteration], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=param_atol)


@pytest.mark.parametrize("normalize_values", [False, True])
def test_updater_without_graphs_is_ppo_update(normalize_values):
    # The CPU path: the Updater runs the plain loop itself, bit for bit, and set_learning_rate sets
    # float rates that reach it.
    settings = PPOSettings(num_minibatches=4, update_epochs=2, normalize_values=normalize_values)
    params_a, stats_a = run_updates(torch.device("cpu"), False, settings)
    params_b, stats_b = run_updates(torch.device("cpu"), False, settings, plain=True)
    for got, want in zip(params_a + stats_a, params_b + stats_b, strict=True):
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
    assert not torch.equal(params_a[0][0], params_a[-1][0]), "the updates did not train"


@pytest.mark.parametrize("target_kl, adaptive_lr_kl, normalize_values, norm_adv",
                         [(None, None, True, "minibatch"), (1e-4, None, False, "batch"), (None, 1e-3, False, "off")])
def test_the_compiled_whole_step_matches_the_plain_loop(target_kl, adaptive_lr_kl, normalize_values, norm_adv):
    # On a CPU a compiled loss makes each minibatch step one compiled function (gradient, clipping and
    # Adam written out): three updates of it must track the plain eager loop, with annealed or
    # adaptive rates, value normalisation, a target-KL stop and every advantage normalisation.
    from ppo.update import compiles_whole_step

    settings = PPOSettings(num_minibatches=4, update_epochs=2, target_kl=target_kl, adaptive_lr_kl=adaptive_lr_kl,
                           normalize_values=normalize_values, norm_adv=norm_adv, compile=True)
    cpu = torch.device("cpu")
    assert compiles_whole_step(settings, cpu) and not compiles_whole_step(settings, torch.device("cuda"))
    compiled = run_updates(cpu, False, settings)
    # param_atol 5e-5: the compiled step's tanh (2 / (1 + exp(-2x)) - 1) is within ~1e-7 of torch's, and
    # Adam turns such differences on near-zero gradients into up to ~2e-5 after these 24 steps; the
    # updates themselves move parameters by up to ~7e-3, so a wrong step still fails by far.
    assert_same_updates(compiled, run_updates(cpu, False, dataclasses.replace(settings, compile=False)),
                        param_atol=5e-5)
    assert not torch.equal(compiled[0][0][0], compiled[0][2][0]), "the updates did not train"


def plain_step(agent: Agent, optimizer: torch.optim.Optimizer, mb: Minibatch, settings: PPOSettings) -> None:
    """One eager minibatch step, as the plain update loop takes it: the reference for the compiled step."""
    loss, _ = ppo_loss(agent, mb, settings)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(agent.parameters()), settings.max_grad_norm)
    optimizer.step()


def _steps(runs: list[tuple[PPOSettings, Agent]], compiled: bool, steps: int = 3) -> list[list[torch.Tensor]]:
    """Minibatch steps of each (settings, agent) in turn, step by step: each with a CompiledStep of
    its own, or the plain eager step. Returns each agent's parameters and Adam second moments."""
    from ppo.update import make_optimizer
    from ppo.update.compiled_step import CompiledStep

    optimizers = [make_optimizer(agent, settings, torch.device("cpu"), graphs=False) for settings, agent in runs]
    step_fns = [CompiledStep(agent, optimizer, settings, ppo_loss) if compiled else None
                for (settings, agent), optimizer in zip(runs, optimizers, strict=True)]
    total = torch.zeros(len(STAT_NAMES))
    for seed in range(steps):
        for (settings, agent), optimizer, step in zip(runs, optimizers, step_fns, strict=True):  # interleaved
            mb = random_minibatch(16, seed=seed)
            if step is not None:
                before = total.clone()
                stats = step(SampleTable(16, 5, 2, torch.device("cpu")).fill(mb), torch.arange(16)[None], total)
                torch.testing.assert_close(total, before + stats)  # the running total, added in the graph
            else:
                plain_step(agent, optimizer, mb, settings)
    return [[p.detach().clone() for p in agent.parameters()]
            + [optimizer.state[p]["exp_avg_sq"].clone() for p in agent.parameters()]
            for (_, agent), optimizer in zip(runs, optimizers, strict=True)]


def _assert_same_steps(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> None:
    for got_run, want_run in zip(got, want, strict=True):
        for a, b in zip(got_run, want_run, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_compiled_whole_step_trains_a_shared_trunk_like_the_plain_step():
    # Tied parameters (the trunk appears once in parameters() but feeds both heads): the gradient
    # through functional_call must reach it from both, as backward does.
    def runs():
        torch.manual_seed(0)
        return [(PPOSettings(compile=True), Agent(5, 2, hidden_sizes=(8, 8), shared_trunk=True))]

    _assert_same_steps(_steps(runs(), compiled=True), _steps(runs(), compiled=False))


def test_the_compiled_step_takes_its_minibatches_in_pairs_where_it_can():
    from ppo.update import make_optimizer, ppo_update
    from ppo.update.compiled_step import CompiledStep, pairs_or_one

    assert [pairs_or_one(n) for n in (1, 2, 3, 32)] == [1, 2, 1, 2]
    agent = Agent(5, 2)
    settings = PPOSettings(compile=True)
    step = CompiledStep(agent, make_optimizer(agent, settings, torch.device("cpu"), graphs=False), settings, ppo_loss,
                        minibatches_per_call=2)
    table = SampleTable(16, 5, 2, torch.device("cpu")).fill(random_minibatch(16, seed=0))
    with pytest.raises(ValueError, match=r"rows must be \[2, minibatch size\]"):
        step(table, torch.arange(16), torch.zeros(len(STAT_NAMES)))  # one minibatch, not two: before compiling
    with pytest.raises(ValueError, match="at least 1"):
        CompiledStep(agent, make_optimizer(agent, settings, torch.device("cpu"), graphs=False), settings, ppo_loss,
                     minibatches_per_call=0)
    odd = dataclasses.replace(settings, num_minibatches=1)
    with pytest.raises(ValueError, match="1 minibatches per epoch do not split into calls of 2"):
        ppo_update(agent, make_optimizer(agent, odd, torch.device("cpu"), graphs=False),
                   filled_buffer(0), odd, torch.Generator().manual_seed(0), step)


def test_each_compiled_step_keeps_its_own_settings():
    # CompiledStep drops the guards on Python values (clip norm, loss coefficients, the activation),
    # so two instances in one process must never share a compiled graph: agents of the same shapes
    # with other settings, stepped in turn, must each follow their own plain steps.
    def runs():
        torch.manual_seed(0)
        first = Agent(5, 2)
        second = Agent(5, 2, activation="relu")
        second.load_state_dict(first.state_dict())
        return [(PPOSettings(compile=True), first),
                (PPOSettings(compile=True, max_grad_norm=1e-3, clip_coef=0.05, vf_coef=2.0), second)]

    _assert_same_steps(_steps(runs(), compiled=True), _steps(runs(), compiled=False))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA graphs")
@pytest.mark.parametrize("target_kl, compile, adaptive_lr_kl, normalize_values",
                         [(None, False, None, False), (1e-4, False, None, False), (None, True, None, False),
                          (None, False, 1e-3, False), (None, False, None, True), (None, True, 1e-3, True)])
def test_cuda_graph_updates_match_the_eager_loop(target_kl, compile, adaptive_lr_kl, normalize_values):
    # Same seeds, same buffers, same annealed learning rates: replayed epochs must give the
    # parameters and statistics of the eager loop (the first update is eager in both).
    settings = PPOSettings(num_minibatches=4, update_epochs=3, target_kl=target_kl, compile=compile,
                           adaptive_lr_kl=adaptive_lr_kl, normalize_values=normalize_values, fused_update=False)
    cuda = torch.device("cuda")
    graph_params, graph_stats = run_updates(cuda, True, settings)
    assert_same_updates((graph_params, graph_stats), run_updates(cuda, False, settings))
    assert not torch.equal(graph_params[1][0], graph_params[2][0]), "the replayed update did not train"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: TF32 tensor cores")
def test_a_tf32_update_stays_within_two_percent_of_the_fp32_update():
    # ppo.matmul_precision=tf32 reads the products' inputs to 10 mantissa bits (~1e-3 relative). Held here:
    # over 2 epochs x 4 minibatches of a preset-sized network and batch, each parameter tensor's change and
    # each statistic stays within 2% of fp32's; and TF32 really ran (the two differ).
    from ppo.update import Updater, make_optimizer, set_matmul_precision

    cuda = torch.device("cuda")
    settings = PPOSettings(num_minibatches=4, update_epochs=2, learning_rate=1e-3, fused_update=False, compile=False)

    def update(precision: str) -> tuple[list[torch.Tensor], torch.Tensor]:
        torch.manual_seed(0)
        agent = Agent(27, 8, hidden_sizes=(512, 256, 128), activation="elu").to(cuda)
        start = [p.detach().clone() for p in agent.parameters()]
        set_matmul_precision(dataclasses.replace(settings, matmul_precision=precision), cuda)
        try:
            stats = Updater(agent, make_optimizer(agent, settings, cuda, False), settings)(
                filled_buffer(0, num_steps=16, num_envs=1024, obs_dim=27, act_dim=8, device=cuda),
                torch.Generator(cuda).manual_seed(1))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
        return ([p.detach() - s for p, s in zip(agent.parameters(), start, strict=True)],
                torch.stack([stats[name] for name in STAT_NAMES]))

    (tf32_changes, tf32_stats), (fp32_changes, fp32_stats) = update("tf32"), update("ieee")
    assert not all(torch.equal(a, b) for a, b in zip(tf32_changes, fp32_changes, strict=True)), "TF32 did not run"
    for tf32, fp32 in zip(tf32_changes, fp32_changes, strict=True):
        assert (tf32 - fp32).norm() <= 0.02 * fp32.norm()
    torch.testing.assert_close(tf32_stats, fp32_stats, rtol=0.02, atol=1e-4)


def test_matmul_precision_is_checked_and_leaves_a_cpu_run_in_fp32():
    from ppo.config import ConfigError
    from ppo.update import set_matmul_precision

    with pytest.raises(ConfigError, match="`ppo.matmul_precision` must be one of ieee, tf32, got 'bf16'"):
        PPOSettings(matmul_precision="bf16")
    assert not set_matmul_precision(PPOSettings(matmul_precision="tf32"), torch.device("cpu"))
    assert not torch.backends.cuda.matmul.allow_tf32
    try:  # a CUDA run sets torch's flag (settable without a GPU too)
        assert set_matmul_precision(PPOSettings(matmul_precision="tf32"), torch.device("cuda"))
        assert torch.backends.cuda.matmul.allow_tf32
        assert not set_matmul_precision(PPOSettings(matmul_precision="ieee"), torch.device("cuda"))
        assert not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def test_explained_variance_matches_numpy_over_the_valid_samples_only():
    import numpy as np

    from ppo.update import explained_variance

    buffer = filled_buffer(5, num_steps=9, num_envs=13, invalid_fraction=0.3)
    buffer.returns[~buffer.valid] = 1e6  # a dummy step's numbers must not count
    returns, values = buffer.returns[buffer.valid].double().numpy(), buffer.values[buffer.valid].double().numpy()
    expected = 1 - np.var(returns - values) / np.var(returns)
    assert abs(explained_variance(buffer).item() - expected) < 1e-5
    buffer.returns[buffer.valid] = 3.0  # constant returns: undefined, not a number that passes for one
    assert torch.isnan(explained_variance(buffer))


def test_set_learning_rate_keeps_a_capturable_tensor_and_floats_elsewhere():
    from ppo.update import set_learning_rate

    agent = Agent(5, 2)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3)
    optimizer.param_groups[0]["lr"] = torch.tensor(1e-3)  # as a GPU-graph checkpoint brings it
    set_learning_rate(optimizer, 5e-4)
    assert optimizer.param_groups[0]["lr"] == 5e-4 and not isinstance(optimizer.param_groups[0]["lr"], torch.Tensor)
    rate = torch.tensor(1e-3)
    optimizer.param_groups[0].update(lr=rate, capturable=True)
    set_learning_rate(optimizer, 2e-4)
    assert optimizer.param_groups[0]["lr"] is rate and abs(float(rate) - 2e-4) < 1e-9  # filled in place


def test_when_the_update_compiles_and_which_loss_it_runs(monkeypatch):
    from ppo import update
    from ppo.update import CPU_COMPILE_MIN_STEPS, _loss_function, compiles, compiles_whole_step

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compiles(PPOSettings(), cuda) and not compiles(PPOSettings(), cpu)
    monkeypatch.setattr(update, "has_cxx_compiler", lambda: True)
    assert compiles(PPOSettings(), cpu, CPU_COMPILE_MIN_STEPS)
    assert not compiles(PPOSettings(), cpu, CPU_COMPILE_MIN_STEPS - 1)
    assert compiles_whole_step(PPOSettings(compile=True), cpu)  # the whole step: on a CPU only, in one process
    assert not compiles_whole_step(PPOSettings(compile=True), cuda) and not compiles_whole_step(PPOSettings(), cpu)
    assert _loss_function(PPOSettings(compile=False), cpu) is ppo_loss
    monkeypatch.setattr(update, "has_cxx_compiler", lambda: False)  # nothing to build the CPU code with
    assert not compiles(PPOSettings(), cpu, 10 * CPU_COMPILE_MIN_STEPS)
    assert compiles(PPOSettings(compile=True), cpu, 1)
    assert not compiles(PPOSettings(compile=False), cuda, 10 * CPU_COMPILE_MIN_STEPS)


def test_the_cuda_loss_compile_does_not_ask_for_the_cpu_vector_width(monkeypatch):
    # Inductor finds the width by trying its ISAs with the host's C++ compiler: 45 s of the first update
    # on a GPU host, for nothing (CUDA code has no CPU width). The CPU compile names it (see below).
    from ppo import update

    asked, options = [], {}
    monkeypatch.setattr(update, "vector_width_option", lambda: asked.append(1) or {"cpp.simdlen": 256})
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: options.update({fn: kwargs["options"]}) or fn)
    for device, width in (("cuda", {}), ("cpu", {"cpp.simdlen": 256})):
        monkeypatch.setattr(update, "_compiled_loss", None)
        assert update._loss_function(PPOSettings(compile=True), torch.device(device)) is ppo_loss
        assert options[ppo_loss] == width
    assert len(asked) == 1


def test_a_cxx_compiler_is_looked_up_on_the_path(monkeypatch, tmp_path):
    import sysconfig

    from ppo.update import has_cxx_compiler

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert not has_cxx_compiler()
    compiler = tmp_path / "my-c++"
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", "my-c++")
    assert has_cxx_compiler()  # (this machine has Python's headers: the CPU tests compile the loss)
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(tmp_path))  # a Python without its headers
    assert not has_cxx_compiler()


@pytest.mark.parametrize("name", ["g++", "c++", "clang++"])
def test_each_usual_cxx_compiler_name_is_found_without_cxx_set(monkeypatch, tmp_path, name):
    from ppo.update import has_cxx_compiler

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    compiler = tmp_path / name
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    assert has_cxx_compiler()


@pytest.mark.parametrize("capturable", [False, True])
@pytest.mark.parametrize("threshold, kl, expected", [
    (0.01, 0.05, 1e-3 / 1.5), (0.01, 0.001, 1.5e-3), (0.01, 0.01, 1e-3),
    # the bounds, in numbers float32 holds exactly: 0.5 and 0.125 themselves leave the rate as it is
    (0.25, 0.5, 1e-3), (0.25, 0.625, 1e-3 / 1.5), (0.25, 0.125, 1e-3), (0.25, 0.1, 1.5e-3)])
def test_adaptive_learning_rate_follows_the_kl(capturable, threshold, kl, expected):
    # Above twice the threshold the rate drops by 1.5, below half of it it rises by 1.5, else it stays.
    from ppo.update import adapt_learning_rate, current_learning_rate

    agent = Agent(5, 2)
    lr = torch.tensor(1e-3) if capturable else 1e-3
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, capturable=capturable)
    adapt_learning_rate(optimizer, torch.tensor(kl), threshold=threshold)
    assert isinstance(optimizer.param_groups[0]["lr"], torch.Tensor) == capturable
    assert current_learning_rate(optimizer).item() == pytest.approx(expected, rel=1e-6)


def test_adaptive_learning_rate_stays_within_rl_games_bounds():
    from ppo.update import MAX_ADAPTIVE_LR, MIN_ADAPTIVE_LR, adapt_learning_rate

    optimizer = torch.optim.Adam(Agent(5, 2).parameters(), lr=MAX_ADAPTIVE_LR)
    adapt_learning_rate(optimizer, torch.tensor(0.0), threshold=0.01)
    assert optimizer.param_groups[0]["lr"] == MAX_ADAPTIVE_LR
    optimizer.param_groups[0]["lr"] = MIN_ADAPTIVE_LR
    adapt_learning_rate(optimizer, torch.tensor(1.0), threshold=0.01)
    assert optimizer.param_groups[0]["lr"] == MIN_ADAPTIVE_LR


def test_adaptive_rate_moves_in_the_eager_update():
    # With a tiny threshold every epoch's KL is too large: three epochs divide the rate by 1.5 ** 3.
    from ppo.update import current_learning_rate, make_optimizer, ppo_update

    settings = PPOSettings(num_minibatches=4, update_epochs=3, adaptive_lr_kl=1e-9, learning_rate=1e-2)
    torch.manual_seed(0)
    agent = Agent(5, 2)
    optimizer = make_optimizer(agent, settings, torch.device("cpu"), graphs=False)
    ppo_update(agent, optimizer, filled_buffer(0), settings, torch.Generator().manual_seed(0))
    assert current_learning_rate(optimizer).item() == pytest.approx(1e-2 / 1.5**3)


def test_adam_state_binding_checks_the_optimizer_and_shares_one_step_count():
    # The fused and compiled steps take Adam's step themselves on the optimizer's own tensors.
    from ppo.update.adam_state import bind_adam_state

    agent = Agent(5, 2)
    params = list(agent.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-3)  # never stepped: binding creates Adam's state
    exp_avg, exp_avg_sq, steps = bind_adam_state(optimizer, params, "this step")
    assert [t.shape for t in exp_avg] == [p.shape for p in params] and steps.shape == (len(params),)
    steps.add_(3)
    assert {float(optimizer.state[p]["step"]) for p in params} == {3.0}, "the state must hold views of `steps`"
    with pytest.raises(ValueError, match="this step: the optimizer's parameters are not exactly the agent's"):
        bind_adam_state(optimizer, params[:-1], "this step")
    decaying = torch.optim.Adam(params, lr=1e-3, weight_decay=0.1)
    with pytest.raises(ValueError, match="plain Adam"):
        bind_adam_state(decaying, params, "this step")
    optimizer.state[params[0]]["step"] = torch.tensor(7.0)
    with pytest.raises(ValueError, match="same Adam step count"):
        bind_adam_state(optimizer, params, "this step")


_STEP_AGAINST_EAGER = """
import torch
from buffers import SampleTable
from ppo.agent import Agent
from ppo.update.compiled_step import CompiledStep
from ppo.config import PPOSettings
from ppo.update import STAT_NAMES, make_optimizer, ppo_loss
from tests.test_update import plain_step, random_minibatch

def steps(compiled):
    torch.manual_seed(0)
    agent, settings = Agent(17, 6), PPOSettings(compile=True)  # HalfCheetah's sizes: they showed the fault
    optimizer = make_optimizer(agent, settings, torch.device("cpu"), graphs=False)
    step = CompiledStep(agent, optimizer, settings, ppo_loss) if compiled else None
    for seed in range(2):
        mb = random_minibatch(64, seed, obs_dim=17, act_dim=6)
        if compiled:
            table = SampleTable(64, 17, 6, torch.device("cpu")).fill(mb)
            step(table, torch.arange(64)[None], torch.zeros(len(STAT_NAMES)))
        else:
            plain_step(agent, optimizer, mb, settings)
    return list(agent.parameters())

for got, want in zip(steps(True), steps(False), strict=True):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

def loss_and_gradients(loss_fn):  # the compiled loss alone, as data-parallel CPU runs use it
    torch.manual_seed(0)
    agent = Agent(17, 6)
    loss, stats = loss_fn(agent, random_minibatch(64, 2, obs_dim=17, act_dim=6), PPOSettings(compile=True))
    loss.backward()
    return [loss.detach(), stats] + [p.grad for p in agent.parameters()]

from ppo import update
compiled_loss = update._loss_function(PPOSettings(compile=True), torch.device("cpu"))
for got, want in zip(loss_and_gradients(compiled_loss), loss_and_gradients(ppo_loss), strict=True):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
print("same as eager")
"""


def test_compiled_cpu_code_cached_for_another_vector_width_is_not_reused(tmp_path):
    # Inductor's on-disk graph cache (torch 2.13) does not key on the vector instructions it generates:
    # a step compiled for AVX-512, then loaded in a process generating AVX2 code (ATEN_CPU_CAPABILITY=avx2,
    # as a cache shared with an AVX2 machine would be) gave NaN parameters from its first call. The
    # compiled step and the compiled loss name the width in their options (cpp.simdlen), so each width
    # compiles its own graphs.
    if vector_width_option()["cpp.simdlen"] != 512:
        pytest.skip("needs a CPU with AVX-512, to compile for it and then for AVX2")
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path)  # one cache, fresh, shared by both processes
    for capability in (None, "avx2"):
        if capability:
            env["ATEN_CPU_CAPABILITY"] = capability
        result = subprocess.run([sys.executable, "-c", _STEP_AGAINST_EAGER], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0 and result.stdout.strip() == "same as eager", (
            f"ATEN_CPU_CAPABILITY={capability}: exit {result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}")


def reference_update(agent: Agent, buffer, settings: PPOSettings, generator: torch.Generator) -> dict:
    """The update written out plainly, for `ppo_update` to be held to: its own Adam (eps 1e-5), the epochs'
    permutations drawn as the buffer draws them, clipping, per-epoch KL adaptation and the target-KL stop;
    each statistic the mean over the minibatches run."""
    import numpy as np

    from ppo.update import MAX_ADAPTIVE_LR, MIN_ADAPTIVE_LR

    optimizer = torch.optim.Adam(agent.parameters(), lr=settings.learning_rate, eps=1e-5)
    table = buffer.sample_table(settings.norm_adv == "batch")
    seen, epochs, epoch_kls, last_kls = [], 0, [], []
    for _ in range(settings.update_epochs):
        size = buffer.num_steps * buffer.num_envs
        order = torch.randperm(size, generator=generator).view(settings.num_minibatches, -1)
        epoch = []
        for rows in order:
            loss, stats = ppo_loss(agent, table.select(rows), settings)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(agent.parameters()), settings.max_grad_norm)
            optimizer.step()
            epoch.append(stats)
        seen += epoch
        epochs += 1
        kl = float(torch.stack(epoch)[:, 3].mean())
        epoch_kls.append(kl)
        last_kls.append(float(epoch[-1][3]))
        if settings.adaptive_lr_kl is not None:
            lr = optimizer.param_groups[0]["lr"]
            if kl > 2 * settings.adaptive_lr_kl:
                lr = max(lr / 1.5, MIN_ADAPTIVE_LR)
            elif kl < settings.adaptive_lr_kl / 2:
                lr = min(lr * 1.5, MAX_ADAPTIVE_LR)
            optimizer.param_groups[0]["lr"] = lr
        if settings.target_kl is not None and float(epoch[-1][3]) > settings.target_kl:
            break
    valid = buffer.valid.reshape(-1).numpy()
    returns, values = buffer.returns.reshape(-1).numpy()[valid], buffer.values.reshape(-1).numpy()[valid]
    result = dict(zip(STAT_NAMES, torch.stack(seen).mean(0), strict=True))
    result["explained_variance"] = 1 - np.var(returns - values) / np.var(returns)
    result["epochs"], result["lr"] = epochs, optimizer.param_groups[0]["lr"]
    result["epoch_kls"], result["last_kls"] = epoch_kls, last_kls
    return result


@pytest.mark.parametrize("norm_adv, minibatches, epochs, adaptive, target_kl", [
    ("batch", 4, 3, None, None), ("minibatch", 4, 2, 0.001, None), ("batch", 1, 1, None, None),
    ("minibatch", 2, 3, None, 1e-9), ("off", 4, 2, 100.0, None)])
def test_the_update_is_the_plainly_written_update(norm_adv, minibatches, epochs, adaptive, target_kl, monkeypatch):
    import ppo.update
    from ppo.update import current_learning_rate, make_optimizer, ppo_update

    # What the adaptive rule and the target-KL stop are given: each epoch's mean KL, and its last KL.
    adapted, stopped_on = [], []
    adapt = ppo.update.adapt_learning_rate
    monkeypatch.setattr(ppo.update, "adapt_learning_rate",
                        lambda optimizer, kl, threshold: adapted.append(float(kl)) or adapt(optimizer, kl, threshold))
    monkeypatch.setattr(ppo.update.distributed, "mean_over_workers", lambda x: stopped_on.append(float(x)) or x)

    settings = PPOSettings(num_minibatches=minibatches, update_epochs=epochs, norm_adv=norm_adv,
                           adaptive_lr_kl=adaptive, target_kl=target_kl, learning_rate=1e-3, ent_coef=0.01)
    torch.manual_seed(0)
    ours, theirs = Agent(5, 2), Agent(5, 2)
    theirs.load_state_dict(ours.state_dict())
    buffer = filled_buffer(2, num_steps=8, num_envs=6)
    buffer.returns.mul_(0.1)  # returns of a variance well below 1
    optimizer = make_optimizer(ours, settings, torch.device("cpu"), graphs=False)
    result = ppo_update(ours, optimizer, buffer, settings, torch.Generator().manual_seed(4))
    expected = reference_update(theirs, buffer, settings, torch.Generator().manual_seed(4))
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for name in STAT_NAMES:
        torch.testing.assert_close(result[name], expected[name], rtol=1e-5, atol=1e-7)
    assert result["explained_variance"].item() == pytest.approx(expected["explained_variance"], rel=1e-4)
    assert result["epochs"].item() == expected["epochs"] == (1 if target_kl else epochs)
    assert current_learning_rate(optimizer).item() == pytest.approx(expected["lr"], rel=1e-6)
    if adaptive:
        assert expected["lr"] != 1e-3  # the rate moved
        assert adapted == pytest.approx(expected["epoch_kls"], rel=1e-4, abs=1e-9)
    if target_kl:
        assert stopped_on == pytest.approx(expected["last_kls"], rel=1e-4, abs=1e-9)


def test_a_minibatch_of_weight_one_counts_as_one_sample_and_a_dummys_stale_log_prob_does_nothing():
    torch.manual_seed(0)
    agent = Agent(5, 2)
    one = random_minibatch(1, seed=3)
    with_dummy = Minibatch(*(torch.cat([getattr(one, f), getattr(random_minibatch(1, seed=4), f)]) for f in
                             ("observations", "actions", "log_probs", "values", "advantages", "returns")),
                           weights=torch.tensor([1.0, 0.0]))
    settings = PPOSettings(norm_adv="off")
    loss_one, stats_one = ppo_loss(agent, one, settings)
    loss_two, stats_two = ppo_loss(agent, with_dummy, settings)
    torch.testing.assert_close(loss_one, loss_two)
    torch.testing.assert_close(stats_one, stats_two)


def test_the_loss_of_a_single_valid_sample_is_cleanrls_on_that_sample():
    torch.manual_seed(1)
    agent = Agent(5, 2)
    settings = PPOSettings(norm_adv="off", ent_coef=0.01)
    one = random_minibatch(1, seed=6)
    torch.testing.assert_close(ppo_loss(agent, one, settings)[0], cleanrl_loss(agent, one, settings)[0])


def test_the_clip_fraction_counts_ratios_strictly_outside_the_clip_range():
    agent = Agent(5, 2)
    mb = random_minibatch(2, seed=0)
    _, log_prob, _, _ = agent.get_action_and_value(mb.observations, mb.actions)
    mb.log_probs = log_prob.detach() - torch.log(torch.tensor([1.25, 1.0]))  # ratios 1.25 and exactly 1
    _, stats = ppo_loss(agent, mb, PPOSettings(clip_coef=0.25, norm_adv="off"))
    assert stats[STAT_NAMES.index("clipfrac")].item() == 0.0  # |1.25 - 1| is the clip range, not outside it
    _, stats = ppo_loss(agent, mb, PPOSettings(clip_coef=0.2, norm_adv="off"))
    assert stats[STAT_NAMES.index("clipfrac")].item() == 0.5

