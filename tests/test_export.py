"""scripts/export.py: the deterministic policy as one file, run in a process where this project does not import."""

import json
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest
import torch

from ppo.config import ModelSettings, TrainSettings
from ppo.policy import load_policy
from tests.conftest import ROOT
from tests.test_policy import hopper_run  # noqa: F401  (a fixture: a short Hopper-v4 run)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

# Loads the file with onnxruntime or torch.jit alone, as a user without this project would.
OUTSIDE = """
import json, sys
import numpy as np
for name in ("ppo", "kernels", "buffers"):
    sys.modules[name] = None  # importing any of them now fails
fmt, path, inputs, names = sys.argv[1], sys.argv[2], np.load(sys.argv[3]), json.loads(sys.argv[4])
arrays = [inputs[name] for name in names]
if fmt == "onnx":
    import onnxruntime
    runtime = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [i.name for i in runtime.get_inputs()] == names, runtime.get_inputs()
    actions = runtime.run(["action"], dict(zip(names, arrays)))[0]
else:
    import torch
    actions = torch.jit.load(path)(*[torch.from_numpy(a) for a in arrays]).numpy()
np.save(sys.argv[5], actions)
"""
# ONNX Runtime's kernels order the float32 sums otherwise than torch's: measured 1.2e-7 on actions in [-1, 1].
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def run_outside(fmt: str, path, named: dict[str, np.ndarray], tmp_path) -> np.ndarray:
    np.savez(tmp_path / "inputs.npz", **named)
    out = tmp_path / "actions.npy"
    result = subprocess.run([sys.executable, "-c", OUTSIDE, fmt, str(path), str(tmp_path / "inputs.npz"),
                             json.dumps(list(named)), str(out)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return np.load(out)


def export_command(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "export.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_an_exported_policy_acts_as_load_policy_does_without_this_project(hopper_run, fmt, tmp_path):  # noqa: F811
    output = tmp_path / f"hopper.{fmt}"
    result = export_command(hopper_run, "--format", fmt, "--output", output)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"{output}: Hopper-v4's deterministic policy; inputs observation [N, 11]")
    # Odd batch sizes (the file was traced with 2), observations far enough out that normalisation clips.
    policy = load_policy(str(hopper_run))
    for batch in (1, 9):
        observations = np.random.default_rng(batch).normal(scale=4.0, size=(batch, 11)).astype(np.float32)
        actions = run_outside(fmt, output, {"observation": observations}, tmp_path)
        assert actions.shape == (batch, 3)
        torch.testing.assert_close(torch.from_numpy(actions), policy(observations), **TOLERANCE)
    assert np.abs(actions).max() <= 1.0


def test_by_default_the_file_goes_into_the_run_dir(hopper_run):  # noqa: F811
    result = export_command(hopper_run, "--format", "torchscript")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (hopper_run / "policy.pt").is_file()


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_dict_tasks_parts_are_separate_inputs_flattened_in_the_agents_order(fmt, tmp_path):
    from gymnasium.spaces import Box, Dict

    from ppo.agent import make_agent
    from ppo.normalize import ObservationNormalizer
    from ppo.policy import Policy
    from ppo.policy.export import export

    goal = Dict(OrderedDict(kettle=Box(-1.0, 1.0, (2,)), burner=Box(-1.0, 1.0, ())))
    space = Dict(OrderedDict(velocity=Box(-9.0, 9.0, (3,)), goal=goal))
    torch.manual_seed(0)
    normalizer = ObservationNormalizer(6, torch.device("cpu"))
    normalizer.rms.mean.copy_(torch.linspace(-1, 1, 6, dtype=torch.float64))
    normalizer.rms.var.copy_(torch.linspace(0.5, 2, 6, dtype=torch.float64))
    normalizer.frozen = True
    policy = Policy(TrainSettings(), make_agent(6, 2, ModelSettings()), normalizer, space, Box(-0.5, 0.5, (2,)),
                    torch.device("cpu"))
    path = export(policy, fmt, tmp_path / f"policy.{fmt}")
    rng = np.random.default_rng(1)
    batch = {"goal": {"burner": rng.normal(size=5), "kettle": rng.normal(size=(5, 2))},
             "velocity": rng.normal(size=(5, 3))}
    named = {"velocity": batch["velocity"], "goal/kettle": batch["goal"]["kettle"],
             "goal/burner": batch["goal"]["burner"]}
    actions = run_outside(fmt, path, {k: v.astype(np.float32) for k, v in named.items()}, tmp_path)
    torch.testing.assert_close(torch.from_numpy(actions), policy(batch), **TOLERANCE)


def test_a_run_dir_without_a_checkpoint_is_one_line(tmp_path):
    result = export_command(tmp_path, "--format", "onnx")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: {tmp_path}: no checkpoint at ")
