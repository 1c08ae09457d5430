"""Every relative link and image in README.md and docs/ resolves in the checkout (a fresh clone
has no ignored files: a figure must be committed to be shown)."""

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
