"""Every relative link and image in README.md and docs/ resolves in the checkout (a fresh clone
has no ignored files: a figure must be committed to be shown), and every file of the repository
that the docs or the code name by its path (`service/core/scheduler.py`) exists."""

from __future__ import annotations

import ast
import re
import subprocess

import pytest

from tests.support.daemon import ROOT

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _documents() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _tracked() -> set[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(listed.split())


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document) -> None:
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.S)  # code is no link
    tracked = _tracked()
    missing = []
    for target in _LINK.findall(text):
        path = target.split("#")[0]
        if not path or re.match(r"[a-z]+:", target):  # an anchor here, or a URL
            continue
        resolved = (document.parent / path).resolve().relative_to(ROOT).as_posix()
        if resolved not in tracked and not any(t.startswith(resolved + "/") for t in tracked):
            missing.append(target)
    assert not missing, f"{document.name}: {missing}"


# Paths under the project's own folders, as prose and comments name them.
_FOLDERS = ("service", "accelerators", "spark_jobs", "bench", "tools", "tests", "kernels",
            "deploy", "docs", "models")
_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(_FOLDERS) + r")/[\w./-]*[\w-]\."
                   r"(?:py|cl|md|toml|ya?ml|sh|json|curve|pbtxt|service|env|onnx))\b")
_SOURCES = ("service", "accelerators", "spark_jobs", "bench", "tools", "tests", "kernels",
            "deploy")


def test_the_files_the_docs_and_the_code_name_exist() -> None:
    texts = [*_documents(), ROOT / "Makefile", ROOT / "pyproject.toml",
             *(p for folder in _SOURCES for p in sorted((ROOT / folder).rglob("*"))
               if p.is_file() and p.suffix in (".py", ".cl", ".yml", ".yaml", ".sh", ".toml",
                                                 ".md", ".service", ".env"))]
    missing = sorted({f"{path} (named in {text.relative_to(ROOT)})" for text in texts
                      for path in _PATH.findall(text.read_text())
                      if not (ROOT / path).exists()})
    assert not missing, missing


# Modules named dotted (`service.core.scheduler`, `python -m bench.floods`), maybe followed by
# an attribute of theirs (`service.core.types.DeferredTensor`).
_MODULE = re.compile(r"(?<![\w./-])((?:service|accelerators|spark_jobs|bench|tools)"
                     r"(?:\.[a-z_][a-z0-9_]*)+)")
# A package docstring's map of its rooms: `core/`, `errors.py`, beside its __init__.py (or
# `kernels/`, at the repository's root).
_ROOM = re.compile(r"(?<![\w./`-])([a-z_][a-z0-9_]*(?:/|\.py))(?![\w])")


def _is_module(dotted: str) -> bool:
    """Whether `dotted`, or a prefix of it longer than its package, is one of our modules."""
    parts = dotted.split(".")
    return any(ROOT.joinpath(*parts[:n]).with_suffix(".py").is_file()
               or (ROOT.joinpath(*parts[:n]) / "__init__.py").is_file()
               for n in range(len(parts), 1, -1))


def test_the_modules_the_docs_and_the_code_name_exist() -> None:
    texts = [*_documents(), ROOT / "Makefile",
             *(p for folder in _SOURCES for p in sorted((ROOT / folder).rglob("*.py")))]
    missing = sorted({f"{name} (named in {text.relative_to(ROOT)})" for text in texts
                      for name in _MODULE.findall(text.read_text())
                      if not _is_module(name.rstrip("."))})
    assert not missing, missing


def test_the_package_maps_name_rooms_that_exist() -> None:
    missing = []
    for init in sorted(p for folder in _SOURCES for p in (ROOT / folder).rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        missing += [f"{name} (in {init.relative_to(ROOT)}'s map)" for name in _ROOM.findall(doc)
                    if not (init.parent / name).exists() and not (ROOT / name).exists()]
    assert not missing, missing
