"""Every script answers `--help`; scripts that only measure CUDA kernels say so in one line on a machine
without a GPU, instead of a traceback from deep inside torch ("Torch not compiled with CUDA enabled")."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# Each with the arguments it requires, so that it gets past argparse to its device check.
CUDA_ONLY = [("benchmark_gae.py",), ("benchmark_scan_floor.py",), ("benchmark_copy_pdl.py",),
             ("profile_gae_costs.py",), ("profile_gae_overhead.py",), ("profile_update.py",),
             ("check_gae_tiles.py", "--shapes", "1x2048"), ("profile_gae_ncu.py", "1x2048", "env")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what these scripts say where there is no GPU")
@pytest.mark.parametrize("command", CUDA_ONLY, ids=[c[0] for c in CUDA_ONLY])
def test_a_cuda_only_script_says_so_in_one_line_without_a_gpu(command):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / command[0]), *command[1:]], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f"{command[0]} needs a CUDA GPU")


SCRIPTS = sorted(path.name for path in (ROOT / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help(script):
    # Importing a script is most of what `--help` runs: this also catches a script a refactor broke.
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith(f"usage: {script} "), result.stderr[-2000:]
