"""The architecture as the README draws it, read from the imports themselves: no import circle anywhere,
dependencies pointing one way (`train.py -> ppo -> buffers -> kernels`), Hydra at the edge, and the
simulator backends reached through `ppo.envs` alone."""

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("ppo", "buffers", "kernels")


def project_modules() -> dict[str, Path]:
    """Every module of the project by dotted name: the packages' modules, train.py and hydra_edge.py."""
    modules = {"train": ROOT / "train.py", "hydra_edge": ROOT / "hydra_edge.py"}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports, at its top or inside functions: `from a import b` names a.b
    where that is a module, else a."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                     for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in modules or name.split(".")[0] in ("hydra", "omegaconf")}
    return found


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, modules) for name, path in modules.items()}


def test_no_module_imports_itself_through_others():
    edges = graph()
    circles, stack, state = [], [], {}

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                circles.append(stack[stack.index(target):] + [target])
            elif target in edges and target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not circles, "import circles: " + "; ".join(" -> ".join(circle) for circle in circles)


def test_dependencies_point_one_way_and_hydra_stays_at_the_edge():
    layer = {"kernels": 0, "buffers": 1, "ppo": 2, "hydra_edge": 3, "train": 4}
    wrong = []
    for module, targets in graph().items():
        for target in targets:
            top = target.split(".")[0]
            if top in ("hydra", "omegaconf"):
                if module not in ("train", "hydra_edge"):
                    wrong.append(f"{module} imports {target}")
            elif layer[top] > layer[module.split(".")[0]]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, wrong


def test_the_simulator_backends_are_reached_through_ppo_envs_alone():
    backends = {name for name in project_modules() if name.startswith("ppo.envs.") and name != "ppo.envs.interface"}
    assert {"ppo.envs.envpool", "ppo.envs.gymnasium", "ppo.envs.mjwarp"} <= backends
    scripts = {path.stem: path for path in (ROOT / "scripts").rglob("*.py")}
    modules = project_modules()
    direct = [f"{name} imports {target}" for name, path in {**modules, **scripts}.items()
              if not name.startswith("ppo.envs") for target in imports_of(path, modules) if target in backends]
    assert not direct, direct


def test_old_import_paths_users_may_have_written_still_work():
    from ppo.envs import make_envs
    from ppo.policy import load_policy

    assert callable(make_envs) and callable(load_policy)


def test_every_page_the_readme_links_to_exists():
    import re

    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert "docs/reliability.md" in local and "docs/mujoco-warp.md" in local
    assert [link for link in local if not (ROOT / link).exists()] == []
