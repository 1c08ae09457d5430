"""What `hetserve` makes of the command lines and environments that deploy/ gives it, by the
real CLI parser and settings: an unknown flag, variable or bad value fails the test."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service import local_daemon
from service.ops import cli
from service.setting_names import unknown_variables
from service.settings import ENV_PREFIX, Settings


def parse(argv: list[str]) -> argparse.Namespace:
    """`hetserve ...` (argv[0] names the command) through the real parser."""
    assert Path(argv[0]).name == "hetserve", argv
    try:
        return cli._parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"hetserve rejects the command line {argv}")


def settings(argv: list[str], environ: dict[str, str]) -> Settings:
    """The settings `hetserve serve` would run with, from its command line and environment."""
    args = parse(argv)
    assert args.command == "serve", argv
    check_environment(environ)
    return Settings.from_env(environ, **cli._overrides(args))


def check_environment(environ: dict[str, str]) -> None:
    """Every HETSERVE_* variable is one the daemon reads (as its start-up warning judges)."""
    unknown = unknown_variables(environ)
    assert not unknown, unknown
    Settings.from_env(environ)  # every value parses


def read_env_file(path: Path, commented: bool = False) -> dict[str, str]:
    """KEY=VALUE lines of an environment file; with `commented`, also `#KEY=VALUE` examples."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if commented and line.startswith("#") and "=" in line and " " not in line.split("=")[0]:
            line = line[1:]
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def hetserve_executable() -> str:
    """The `hetserve` console script of the environment running the tests."""
    return str(Path(sys.executable).parent / "hetserve")


def start_environment(environ: dict[str, str]) -> dict[str, str]:
    """This process's environment without its own HETSERVE_* settings, plus `environ`."""
    return {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)} | environ


def start(argv: list[str], environ: dict[str, str], log: Path) -> subprocess.Popen:
    """Runs a deploy/ command line as it stands (the console script, not `python -m`)."""
    with open(log, "ab") as out:
        return subprocess.Popen([hetserve_executable(), *argv[1:]],
                                env=start_environment(environ), stdout=out,
                                stderr=subprocess.STDOUT)


def wait_ready(address: str, process: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    try:
        local_daemon.wait_ready(address, process, log, timeout_s)
    except local_daemon.DaemonStartError as e:
        pytest.fail(str(e))


stop = local_daemon.stop
