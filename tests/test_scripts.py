"""Every script answers `--help`; scripts that only measure CUDA kernels say so in one line on a machine
without a GPU, instead of a traceback from deep inside torch ("Torch not compiled with CUDA enabled")."""

import subprocess
import sys

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
