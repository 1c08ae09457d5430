"""The architecture as the tree shows it: service's rooms import only downwards (ops -> clients
-> workers -> http -> grpc -> protocol -> edge -> core -> the shared modules), no package of
the project imports in a cycle, not even through a function-level or TYPE_CHECKING import;
spark_jobs takes from service only what a client needs, and accelerators nothing."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.support.daemon import ROOT

PACKAGES = ("service", "accelerators", "spark_jobs", "kernels")
# service's rooms, lowest first; a module may import its own room's and lower ones'.
RANKS = {"service.errors": 0, "service.settings": 0, "service.contract": 0,
         "service.unix_socket": 0, "service.client_socket": 0, "service.parent_death": 0,
         "service.local_daemon": 0,
         "service.core": 1, "service.edge": 2, "service.protocol": 3, "service.grpc": 4,
         "service.http": 5, "service.workers": 6, "service.clients": 7, "service.ops": 8}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules that `name` imports anywhere in its source."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                imported.add(target)
    return imported


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


# What a client of the daemon may take from service: its rules, its errors, and the one module
# that finds, checks, starts and stops a node's daemon (and the package itself, which `from service
# import contract` names: its __init__ imports nothing).
CLIENT_SIDE = {"service", "service.contract", "service.errors", "service.local_daemon"}


def _rank(module: str) -> int | None:
    for prefix, rank in RANKS.items():
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def test_service_rooms_import_only_downwards() -> None:
    upward = [f"{a} imports {b}" for a, targets in _graph().items() for b in targets
              if _rank(a) is not None and _rank(b) is not None and _rank(b) > _rank(a)]
    assert not upward, upward


def test_no_module_imports_in_a_cycle() -> None:
    graph = _graph()
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_spark_jobs_takes_only_the_client_side_of_service() -> None:
    reached = [f"{a} imports {b}" for a, targets in _graph().items() for b in targets
               if a.startswith("spark_jobs") and b.startswith("service") and b not in CLIENT_SIDE]
    assert not reached, reached


def test_accelerators_import_nothing_from_service() -> None:
    reached = [f"{a} imports {b}" for a, targets in _graph().items() for b in targets
               if a.startswith("accelerators") and (b == "service" or b.startswith("service."))]
    assert not reached, reached


def test_no_test_imports_another_test_module_or_a_conftest() -> None:
    """Shared helpers live in tests/support; conftests hold fixtures, found by pytest."""
    reached = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            reached += [f"{path.relative_to(ROOT)} imports {name}" for name in names
                        if name.startswith("tests.") and
                        name.rpartition(".")[2].startswith(("test_", "conftest"))]
    assert not reached, reached


def test_the_wheel_holds_every_package() -> None:
    """pyproject.toml lists the packages by name: a new room must be listed, or a wheel (the
    image's install) lacks it while an editable checkout still imports it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts)
             for package in PACKAGES for init in (ROOT / package).rglob("__init__.py")}
    assert found == listed, (sorted(found - listed), sorted(listed - found))
