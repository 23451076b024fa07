"""The fused PPO minibatch step (kernels/ppo_step.py, ppo.fused_update) against the plain step it
replaces: `ppo_loss`, `backward`, `clip_grad_norm_`, `torch.optim.Adam.step`. On a machine without
CUDA the kernel runs under Triton's interpreter (tests/conftest.py), at small sizes."""

import copy
import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from buffers import SampleTable
from ppo.agent import Agent
from ppo.config import ConfigError, PPOSettings
from ppo.normalize import ValueNormalizer
from ppo.update import STAT_NAMES, make_optimizer, ppo_loss
from ppo.update.fused import FusedStep, auto_fallback_note, fuses, unsupported_reason
from tests.conftest import ROOT
from tests.rollouts import poisoned_like
from tests.test_update import assert_same_updates, random_minibatch, run_updates

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCES = {  # relative for stats and Adam's moments, absolute for parameters and moments_atol
    "ieee": {"stats": 1e-4, "params": 1e-6, "moments": 1e-3, "moments_atol": 1e-9},
    "tf32": {"stats": 1e-2, "params": 2e-4, "moments": 5e-2, "moments_atol": 1e-4},
    "tf32x3": {"stats": 1e-4, "params": 1e-6, "moments": 1e-3, "moments_atol": 1e-9},
}


def random_table(num_samples: int, obs_dim: int, act_dim: int, agent: Agent, seed: int) -> SampleTable:
    """Samples whose old log-probs and values lie near the agent's own, so that some ratios and
    value steps fall inside the clip range and some outside; about a fifth are dummies."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(num_samples, obs_dim, generator=g)
    with torch.no_grad():
        action, log_prob, _, value = agent.cpu().get_action_and_value(obs)
    mb = random_minibatch(num_samples, seed)
    mb.observations, mb.actions = obs, action
    mb.log_probs = log_prob + 0.3 * torch.randn(num_samples, generator=g)
    mb.values = value + 0.3 * torch.randn(num_samples, generator=g)
    mb.advantages = 2.0 * mb.advantages + 0.7
    mb.weights = (torch.rand(num_samples, generator=g) > 0.2).float()
    table = SampleTable(num_samples, obs_dim, act_dim, torch.device("cpu"))
    table.fill(mb)
    table.data = table.data.to(DEVICE)
    return table


def reference_step(agent: Agent, optimizer: torch.optim.Optimizer, table: SampleTable, rows: torch.Tensor,
                   settings: PPOSettings) -> torch.Tensor:
    loss, stats = ppo_loss(agent, table.select(rows), settings)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(list(agent.parameters()), settings.max_grad_norm)
    optimizer.step()
    return stats


def adam_state(optimizer: torch.optim.Optimizer, agent: Agent) -> list[torch.Tensor]:
    return [optimizer.state[p][key].detach().float().reshape(-1) for p in agent.parameters()
            for key in ("exp_avg", "exp_avg_sq", "step")]


@pytest.mark.parametrize(
    "obs_dim, act_dim, hidden, batch, settings",
    [
        (27, 8, (64, 64), 64, PPOSettings()),  # Ant-v4 under the default config
        (5, 3, (32, 48), 37, PPOSettings(ent_coef=0.01, vf_coef=0.7, clip_coef=0.15)),
        (11, 1, (64, 64), 50, PPOSettings(clip_vloss=False, norm_adv="batch", max_grad_norm=100.0)),
        (3, 2, (16, 20), 16, PPOSettings(norm_adv="off", ent_coef=0.1)),
    ],
    ids=["ant-default", "odd-sizes", "no-value-clip", "tiny"],
)
@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3"])
def test_fused_steps_match_the_plain_steps(obs_dim, act_dim, hidden, batch, settings, precision):
    if precision == "tf32" and DEVICE.type != "cuda":
        pytest.skip("needs CUDA: Triton's interpreter has fp32 products only (FusedStep asks it for ieee)")
    settings = dataclasses.replace(settings, fused_precision=precision)
    # TF32 reads each product's inputs to 10 mantissa bits: ~1e-3 relative error in the losses and
    # gradients. Adam divides each gradient by its own running scale, so a parameter's step keeps
    # that relative error, except where a gradient is near zero and its sign can flip.
    tol = TOLERANCES[precision]
    torch.manual_seed(0)
    agent = Agent(obs_dim, act_dim, hidden, init_log_std=-0.4).to(DEVICE)
    table = random_table(3 * batch, obs_dim, act_dim, agent, seed=1)
    agent.to(DEVICE)
    reference = copy.deepcopy(agent)
    optimizer = make_optimizer(agent, settings, DEVICE, graphs=False)
    reference_optimizer = make_optimizer(reference, settings, DEVICE, graphs=False)
    step = FusedStep(agent, optimizer, settings)  # creates Adam's state on the optimizer
    total = torch.zeros(len(STAT_NAMES), device=DEVICE)
    reference_total = torch.zeros(len(STAT_NAMES))
    order = torch.randperm(3 * batch, generator=torch.Generator().manual_seed(2)).view(3, batch).to(DEVICE)
    for rows in order:  # three steps: Adam's moments and step count matter from the second on
        stats = poisoned_like(torch.zeros(len(STAT_NAMES), device=DEVICE))
        step(table.data, rows, total, stats)
        expected = reference_step(reference, reference_optimizer, table, rows, settings)
        reference_total += expected.cpu()
        torch.testing.assert_close(stats.cpu(), expected.cpu(), rtol=tol["stats"], atol=1e-5)
        for got, want in zip(agent.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=tol["params"])
        for got, want in zip(adam_state(optimizer, agent), adam_state(reference_optimizer, reference), strict=True):
            torch.testing.assert_close(got, want, rtol=tol["moments"], atol=tol["moments_atol"])
    torch.testing.assert_close(total.cpu(), reference_total, rtol=tol["stats"], atol=1e-5)
    assert stats[4] > 0, "no sample was clipped: the test would not see the clipped branch"


def test_dummy_samples_change_nothing_whatever_they_hold():
    torch.manual_seed(0)
    settings = PPOSettings(ent_coef=0.01)
    agent = Agent(5, 2).to(DEVICE)
    table = random_table(32, 5, 2, agent, seed=3)
    agent.to(DEVICE)
    dummies = table.data[:, -1] == 0
    assert dummies.any()
    results = []
    for garbage in (0.0, 1e6):
        copy_agent = copy.deepcopy(agent)
        optimizer = make_optimizer(copy_agent, settings, DEVICE, graphs=False)
        data = table.data.clone()
        data[dummies, :-1] = garbage  # every field but the weight
        stats = torch.zeros(len(STAT_NAMES), device=DEVICE)
        rows = torch.arange(32, device=DEVICE)
        FusedStep(copy_agent, optimizer, settings)(data, rows, torch.zeros_like(stats), stats)
        results.append([stats, *copy_agent.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("target_kl, adaptive_lr_kl", [(None, None), (1e-4, None), (None, 1e-3)])
def test_fused_update_is_the_plain_update(target_kl, adaptive_lr_kl):
    # Whole updates through the Updater (eager loop; the CUDA-graph replay is tested on CUDA below):
    # the same permutations, annealed or adaptive rates, target-KL stops, results.
    plain = PPOSettings(num_minibatches=4, update_epochs=2, target_kl=target_kl, adaptive_lr_kl=adaptive_lr_kl,
                        fused_update=False)
    fused = PPOSettings(num_minibatches=4, update_epochs=2, target_kl=target_kl, adaptive_lr_kl=adaptive_lr_kl,
                        fused_update=True, fused_precision="ieee")
    params, stats = run_updates(DEVICE, False, fused)
    assert_same_updates((params, stats), run_updates(DEVICE, False, plain))
    assert not torch.equal(params[0][0], params[-1][0]), "the fused updates did not train"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA graphs")
@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3"])
@pytest.mark.parametrize("target_kl, adaptive_lr_kl", [(None, None), (1e-4, None), (None, 1e-3)])
def test_fused_cuda_graph_update_is_the_plain_eager_update(target_kl, adaptive_lr_kl, precision):
    plain = PPOSettings(num_minibatches=4, update_epochs=3, target_kl=target_kl, adaptive_lr_kl=adaptive_lr_kl,
                        compile=False, fused_update=False)
    fused = dataclasses.replace(plain, fused_update=True, fused_precision=precision)
    cuda = torch.device("cuda")
    params, stats = run_updates(cuda, True, fused)
    # Kernels that sum in another order than cuBLAS's: over 36 Adam steps an element whose gradient
    # is near zero can drift by a fraction of one step; on the H200 one of 4096 moved 1.1e-5 (ieee).
    # With TF32 products more of them do, by up to a step where a gradient's sign flips: run_updates
    # sets rates up to 1e-2, and 1e-2 is what holds on an H200.
    param_atol = {"ieee": 1e-4, "tf32": 1e-2, "tf32x3": 1e-4}[precision]
    assert_same_updates((params, stats), run_updates(cuda, False, plain), param_atol=param_atol,
                        stat_rtol=TOLERANCES[precision]["stats"])
    assert not torch.equal(params[1][0], params[2][0]), "the replayed fused update did not train"


def test_fused_update_auto_means_one_cuda_device_and_a_supported_model():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # only the device's type is read
    auto, on, off = PPOSettings(), PPOSettings(fused_update=True), PPOSettings(fused_update=False)
    default_model, elu = Agent(27, 8), Agent(27, 8, activation="elu")
    assert auto.fused_update == "auto" and auto.fused_precision == "tf32x3"  # the defaults
    assert fuses(auto, default_model, cuda, 1, 64)
    assert not fuses(auto, default_model, cuda, 2, 64)  # torchrun workers
    assert not fuses(auto, elu, cuda, 1, 64)  # auto falls back without an error (train.py prints why)
    assert not fuses(auto, default_model, cuda, 1, 2048)
    assert not fuses(off, default_model, cuda, 1, 64)
    with pytest.raises(ConfigError, match="ppo.fused_update=true cannot run this configuration: .*two tanh"):
        fuses(on, elu, cuda, 1, 64)
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        assert not fuses(auto, default_model, cpu, 1, 64)
        with pytest.raises(ConfigError, match="runs on CUDA devices"):
            fuses(on, default_model, cpu, 1, 64)
    else:  # the CPU tests: the interpreter runs it where asked, never by default
        assert fuses(on, default_model, cpu, 1, 64) and not fuses(auto, default_model, cpu, 1, 64)


def test_tf32_needs_an_ampere_or_newer_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    cuda, agent = torch.device("cuda"), Agent(27, 8)
    for precision in ("tf32", "tf32x3"):
        reason = unsupported_reason(agent, PPOSettings(fused_precision=precision), cuda)
        assert reason == ("TF32 products need compute capability 8.0 or newer (this GPU's is 7.5; "
                          "ppo.fused_precision=ieee runs there)")
        assert not fuses(PPOSettings(fused_precision=precision), agent, cuda, 1, 64)  # auto: the compiled step
    assert fuses(PPOSettings(fused_precision="ieee"), agent, cuda, 1, 64)
    # a run says why auto did not fuse, where it was on a GPU
    assert auto_fallback_note(PPOSettings(), agent, cuda, 1, 64) == (
        "no fused update step (ppo.fused_update=auto): TF32 products need compute capability 8.0 or newer "
        "(this GPU's is 7.5; ppo.fused_precision=ieee runs there)")
    assert auto_fallback_note(PPOSettings(fused_precision="ieee"), agent, cuda, 1, 64) is None  # it fuses
    assert auto_fallback_note(PPOSettings(fused_update=False), agent, cuda, 1, 64) is None  # not asked
    assert auto_fallback_note(PPOSettings(), agent, torch.device("cpu"), 1, 64) is None  # CPU: never by default
    elu = Agent(27, 8, activation="elu")
    assert "two tanh hidden layers" in auto_fallback_note(PPOSettings(fused_precision="ieee"), elu, cuda, 1, 64)


@pytest.mark.parametrize("value", ["fast", "TF32", "bf16", None])
def test_fused_precision_is_checked(value):
    with pytest.raises(ConfigError, match="`ppo.fused_precision` must be one of tf32, tf32x3, ieee"):
        PPOSettings(fused_precision=value)


@pytest.mark.parametrize("agent_kwargs, world_size, minibatch_size, expected", [
    ({"shared_trunk": True}, 1, 64, "separate actor and critic"),
    ({"value_normalizer": "on"}, 1, 64, "ppo.normalize_values=false"),
    ({"hidden_sizes": (64, 64, 64)}, 1, 64, "two tanh hidden layers"),
    ({"activation": "elu"}, 1, 64, "two tanh hidden layers"),
    ({}, 2, 64, "single process"),
    ({}, 1, 2048, "minibatches of at most 256 samples (this run's: 2048"),
    ({}, 1, 256, None),
    ({"value_normalizer": "off"}, 1, 64, None),
])
def test_unsupported_configurations_are_named(agent_kwargs, world_size, minibatch_size, expected):
    if "value_normalizer" in agent_kwargs:
        enabled = agent_kwargs["value_normalizer"] == "on"
        agent_kwargs = {"value_normalizer": ValueNormalizer(torch.device("cpu"), enabled)}
    reason = unsupported_reason(Agent(5, 2, **agent_kwargs), PPOSettings(), DEVICE, world_size, minibatch_size)
    assert reason is None if expected is None else expected in reason


def test_train_refuses_the_fused_update_where_it_cannot_run():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "train.py", "env=Hopper-v4", "device=cpu", "ppo.fused_update=true",
                             "total_timesteps=64"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0
    assert "ppo.fused_update=true cannot run this configuration: it runs on CUDA devices" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_fused_run_trains_checkpoints_and_resumes(tmp_path):
    # Under the interpreter on a CPU machine (conftest sets TRITON_INTERPRET=1), on the GPU for real.
    common = ["env=Hopper-v4", f"device={DEVICE.type}", "ppo.fused_update=true", "env.num_envs=4",
              "ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2"]
    first = subprocess.run([sys.executable, "train.py", *common, "total_timesteps=128",
                            f"hydra.run.dir={tmp_path / 'a'}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "with fused update step" in first.stdout or "and fused update step" in first.stdout
    second = subprocess.run([sys.executable, "train.py", *common, "total_timesteps=256", f"resume={tmp_path / 'a'}",
                             f"hydra.run.dir={tmp_path / 'b'}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    checkpoint = torch.load(tmp_path / "b" / "checkpoints" / "last.pt", weights_only=True)
    steps = {float(state["step"]) for state in checkpoint["optimizer"]["state"].values()}
    assert steps == {16.0}  # 4 updates x 2 epochs x 2 minibatches, every parameter's count advanced


def test_the_kernel_compiles_for_a_cuda_gpu():
    # The interpreter above never runs Triton's compiler; this compiles the exact launches of
    # `FusedStep` for sm_90 down to a cubin, which needs no GPU.
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "dev" / "compile_kernels.py"), "--kernels", "ppo"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compiled in") == 12, done.stdout  # two kernels x two configurations x three precisions
