"""`hetserve serve`'s flags: Triton's names listed as aliases, how variables are named, and one
line naming the flag for each wrong value, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from service.local_daemon import free_port, serve_command


def _serve(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(serve_command(*flags), capture_output=True, text=True, timeout=120)


def test_help_lists_tritons_names_beside_ours_and_the_variables() -> None:
    shown = " ".join(_serve("--help").stdout.split())
    for aliases in ("--models MODEL_REPOSITORY, --model-repository MODEL_REPOSITORY",
                    "--port GRPC_PORT, --grpc-port GRPC_PORT",
                    "--shutdown-grace-s SHUTDOWN_GRACE_S, --exit-timeout-secs SHUTDOWN_GRACE_S",
                    "--log-verbose N", "--strict-readiness [true|false]",
                    "--exit-on-error [true|false]", "--log-format LOG_FORMAT"):
        assert aliases in shown
    assert "--port: HETSERVE_PORT" in shown and "HETSERVE_UNIX_SOCKET for --socket" in shown


@pytest.mark.parametrize("flags, line", [
    (["--port", "abc"], "hetserve serve: --port (HETSERVE_PORT): 'abc' is not an integer"),
    (["--log-verbose", "x"],
     "hetserve serve: --log-verbose: 'x' is not a verbosity level (0: INFO, 1 or more: DEBUG)"),
    (["--strict-readiness=maybe"], "hetserve serve: --strict-readiness "
                                   "(HETSERVE_STRICT_READINESS): 'maybe' is not one of"),
    (["--log-format", "xml"], "hetserve serve: --log-format (HETSERVE_LOG_FORMAT): 'xml' is "
                              "not one of ['text', 'json']"),
    (["--workers", "-1"], "hetserve: --workers: -1 received, expected 0"),
    (["--exit-timeout-secs", "-5"], "hetserve: --shutdown-grace-s: -5 received, expected "
                                    "seconds"),
    (["--port", "70000"], "hetserve: --port: 70000 received, expected a TCP port"),
    (["--models", "/no/such/folder"], "hetserve: --models: '/no/such/folder' is not a "
                                      "directory"),
    (["--port", "0", "--http-port", "0"], "hetserve: --port, --socket and --http-port are all "
                                          "off: nothing to listen on"),
    (["--power-budget-w", "0"], "hetserve: --power-budget-w: 0 W received"),
])
def test_a_wrong_value_is_one_line_naming_the_flag(flags: list[str], line: str,
                                                   tmp_path: Path) -> None:
    done = _serve("--socket", "", "--metrics-port", "0", "--port", str(free_port()), *flags)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith(line), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
