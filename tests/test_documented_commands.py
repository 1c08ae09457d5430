"""Every command that README.md and docs/ show in a shell block and that runs on this machine
parses with the real program's own parser (hetserve, the benches, the tools, the Spark jobs):
a renamed flag, a removed option or a module that moved fails here, naming the page and the line.
Where running it is cheap and harmless it runs for real. Commands of other programs (kubectl,
docker, systemctl, ...) are left to the deploy tests."""

from __future__ import annotations

import argparse
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MAKEFILE = (ROOT / "Makefile").read_text()


def _commands() -> list[tuple[str, list[str]]]:
    """(where, argv) per command of every sh/bash block; `&&` chains split, continuation lines
    joined, comments and leading VAR=value assignments dropped, [optional] parts left out."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in re.finditer(r"```(?:sh|bash|shell|console)\n(.*?)```", text, re.S):
            number = text[:block.start()].count("\n") + 1  # the fence's line
            for line in re.split(r"(?<!\\)\n", block.group(1)):  # continued lines stay one
                first, number = number + 1, number + 1 + line.count("\n")
                line = re.sub(r"\[[^]]*\]", "", line.replace("\\\n", " "))  # [--json]
                try:
                    words = shlex.split(line, comments=True)
                except ValueError:  # a placeholder such as <your registry>: not a command
                    continue
                for part in " ".join(shlex.quote(w) for w in words).split(" '&&' "):
                    argv = shlex.split(part)
                    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
                        argv.pop(0)
                    if argv:
                        found.append((f"{page.relative_to(ROOT)}:{first}", argv))
    return found


# How each program's command line reaches the parser: (module, or script path, and its argv).
def _entry(argv: list[str]) -> tuple[str, list[str]] | None:
    program = Path(argv[0]).name
    if program == "hetserve":
        return "service", argv[1:]
    if program.startswith("python") and argv[1:2] == ["-m"] and argv[2] != "venv":
        return argv[2], argv[3:]
    if program == "spark-submit":
        script = next(i for i, a in enumerate(argv) if a.endswith(".py"))
        return argv[script], argv[script + 1:]
    return None


COMMANDS = _commands()
OURS = [(where, argv) for where, argv in COMMANDS if _entry(argv)]


class _Parsed(Exception):
    """The command line parsed: the program stops before doing anything."""


@pytest.mark.parametrize("where, argv", OURS, ids=[w for w, _ in OURS])
def test_each_documented_command_parses_with_its_programs_parser(
        where: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    target, args = _entry(argv)  # type: ignore[misc]
    parse_known = argparse.ArgumentParser.parse_known_args

    def parse_then_stop(self, args=None, namespace=None):
        parsed, extras = parse_known(self, args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        raise _Parsed(parsed)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [target, *args])
    monkeypatch.chdir(ROOT)
    try:
        if target.endswith(".py"):
            runpy.run_path(str(ROOT / target), run_name="__main__")
        else:
            monkeypatch.delitem(sys.modules, target, raising=False)  # run as __main__ alone
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except _Parsed:
        return
    except SystemExit as e:  # --help and --version end here
        assert e.code in (0, None), f"{where}: {' '.join(argv)} exits {e.code}"
        return
    pytest.fail(f"{where}: {' '.join(argv)} never parsed a command line")


def test_the_make_targets_the_pages_name_exist() -> None:
    targets = {argv[1] for _, argv in COMMANDS if argv[0] == "make" and len(argv) > 1}
    assert targets and all(re.search(rf"^{t}:", MAKEFILE, re.M) for t in targets), targets


def test_the_cheap_ones_run(tmp_path: Path) -> None:
    """The README's Spark input and the help of each program, for real."""
    python = sys.executable
    digits = tmp_path / "digits.parquet"
    for argv in ([python, "-m", "tools.mnist_digits", "--out", str(digits)],
                 [python, "-m", "service", "serve", "--help"],
                 [python, "-m", "service", "--version"],
                 [python, str(ROOT / "spark_jobs" / "score.py"), "--help"]):
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout, (argv, done.stderr[-2000:])
    assert digits.stat().st_size > 100_000  # 1,000 digits of 784 float32 values
