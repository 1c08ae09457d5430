"""Every relative link and image in README.md and docs/ resolves in the checkout (a fresh clone
has no ignored files: a figure must be committed to be shown), and every file of the repository
that the docs or the code name by its path (`service/core/scheduler.py`) exists."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT

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
