"""Every script answers `--help`; scripts that only measure CUDA kernels say so in one line on a machine
without a GPU, instead of a traceback from deep inside torch ("Torch not compiled with CUDA enabled")."""

import importlib.util
import subprocess
import sys
import types

import pytest
import torch

from tests.conftest import ROOT

# Each with the arguments it requires, so that it gets past argparse to its device check.
CUDA_ONLY = [("benchmark_gae.py",), ("dev/profile_gae_costs.py",), ("dev/profile_gae_overhead.py",),
             ("dev/profile_update.py",), ("dev/check_gae_tiles.py", "--shapes", "1x2048"),
             ("dev/profile_gae_ncu.py", "1x2048", "env")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what these scripts say where there is no GPU")
@pytest.mark.parametrize("command", CUDA_ONLY, ids=[c[0] for c in CUDA_ONLY])
def test_a_cuda_only_script_says_so_in_one_line_without_a_gpu(command):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / command[0]), *command[1:]], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    name = command[0].rpartition("/")[2]
    assert result.stderr.strip().splitlines()[-1].startswith(f"{name} needs a CUDA GPU")


SOURCES = sorted(path.relative_to(ROOT / "scripts").as_posix() for path in (ROOT / "scripts").rglob("*.py"))
SCRIPTS = [name for name in SOURCES if 'if __name__ == "__main__":' in (ROOT / "scripts" / name).read_text()]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help(script):
    # Importing a script is most of what `--help` runs: this also catches a script a refactor broke.
    # Run from elsewhere than the repo: the installed package and the script's own folder must suffice.
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--help"], cwd=ROOT / "tests",
                            capture_output=True, text=True, timeout=120)
    name = script.rpartition("/")[2]
    assert result.returncode == 0 and result.stdout.startswith(f"usage: {name} "), result.stderr[-2000:]


def test_scripts_import_the_installed_package_without_editing_the_import_path():
    edits = [name for name in SOURCES if "sys.path" in (ROOT / "scripts" / name).read_text()]
    assert not edits and len(SCRIPTS) >= 10, edits


@pytest.mark.parametrize("logged", [1, 3])
def test_benchmark_e2e_has_no_rate_for_a_training_run_stopped_early(logged, tmp_path, monkeypatch):
    # A time limit's SIGTERM ends the training run early and cleanly: the benchmark must then say so,
    # not take a median of warm-up iterations (nor fail on an empty one).
    from torch.utils.tensorboard import SummaryWriter

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("benchmark_e2e", ROOT / "scripts" / "benchmark_e2e.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)

    def train(settings, run_dir, device):
        with SummaryWriter(run_dir) as writer:
            for iteration in range(logged):
                for tag in ("time/iteration", "time/rollout", "time/env", "time/inference", "time/gae", "time/update"):
                    writer.add_scalar(tag, 0.5, (iteration + 1) * settings.batch_size)

    monkeypatch.setattr(benchmark, "train", train)
    settings = types.SimpleNamespace(total_timesteps=3 * 64, batch_size=64)
    if logged < 3:
        with pytest.raises(SystemExit, match="stopped after 1 of its 3 iterations"):
            benchmark.our_sps(settings, torch.device("cpu"), warmup=2)
    else:
        assert benchmark.our_sps(settings, torch.device("cpu"), warmup=2)[0] == 128
