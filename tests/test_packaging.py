"""The Docker image holds what a run needs. CI has no Docker engine to build it, so a package added to
pyproject.toml but not copied into the image would only show as an ImportError on a user's GPU host."""

import ast
import re

from tests.conftest import ROOT


def dockerfile_instructions() -> list[tuple[str, str]]:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    return [tuple(line.split(maxsplit=1)) for line in lines if line.strip() and not line.startswith("#")]


def test_the_image_copies_every_package_the_configs_the_entry_point_and_the_scripts():
    # Every package, subpackages included: pip installs only those listed (a non-editable install).
    listed = set(ast.literal_eval(re.search(r"^packages = (\[.*\])$", (ROOT / "pyproject.toml").read_text(),
                                            re.M).group(1)))
    on_disk = {".".join(path.parent.relative_to(ROOT).parts) for top in ("ppo", "buffers", "kernels")
               for path in (ROOT / top).rglob("__init__.py")}
    assert on_disk <= listed, f"packages pip would leave out: {sorted(on_disk - listed)}"
    declared = re.search(r"^packages = (\[.*\])$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared, "pyproject.toml lists its packages under [tool.setuptools]"
    copied = {source for op, args in dockerfile_instructions() if op == "COPY" for source in args.split()[:-1]}
    # pip reads README.md too: it is pyproject's `readme`.
    # train.py imports hydra_edge.py beside it.
    needed = {package.split(".")[0] for package in ast.literal_eval(declared.group(1))} | {
        "configs", "scripts", "examples", "train.py", "hydra_edge.py", "pyproject.toml", "README.md"}
    assert needed <= copied, f"not copied into the image: {sorted(needed - copied)}"


def test_the_image_has_a_c_compiler_for_triton_and_trains_by_default():
    installs = " ".join(args for op, args in dockerfile_instructions() if op == "RUN" and "apt-get install" in args)
    assert re.search(r"\bgcc\b", installs), "Triton builds its launcher with a C compiler on first use"
    entrypoint = [args for op, args in dockerfile_instructions() if op == "ENTRYPOINT"]
    assert entrypoint and ast.literal_eval(entrypoint[-1])[:2] == ["python", "train.py"]


def test_ci_runs_the_readme_quick_starts_test_command():
    # The quick start is two commands from a fresh clone (install and train; install and test), and
    # CI must run the second as a user would type it, not a variant of its own.
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md has a Quick start with a bash block"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) == 2 and "train.py" in commands[0] and "pytest" in commands[1]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert commands[1] in ci, f".ci/run does not run the README's test command: {commands[1]}"
