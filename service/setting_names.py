"""The names a setting goes by outside the code: `hetserve serve`'s flags (ours, and Triton's as
aliases), the HETSERVE_* environment variables named after them, and the HETSERVE_* variables
that are no setting, so that a misspelt one is reported instead of silently ignored."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping

ENV_PREFIX = "HETSERVE_"

# serve's flags and the settings fields they set.
FLAGS: dict[str, str] = {
    "--models": "model_repository",
    "--host": "grpc_host",
    "--port": "grpc_port",
    "--http-port": "http_port",
    "--socket": "unix_socket",
    "--socket-group": "socket_group",
    "--tls-cert": "tls_cert",
    "--tls-key": "tls_key",
    "--token-file": "token_file",
    "--admin-token-file": "admin_token_file",
    "--metrics-host": "metrics_host",
    "--metrics-port": "metrics_port",
    "--health-port": "health_port",
    "--model-control-mode": "model_control_mode",
    "--repository-poll-secs": "repository_poll_secs",
    "--load-model": "load_model",
    "--strict-readiness": "strict_readiness",
    "--exit-on-error": "exit_on_error",
    "--workers": "workers",
    "--max-message-bytes": "max_message_bytes",
    "--max-queue-size": "max_queue_size",
    "--max-shm-regions": "max_shm_regions",
    "--max-shm-regions-per-client": "max_shm_regions_per_client",
    "--shm-uid-for-token": "shm_uid_for_token",
    "--max-stream-inflight": "max_stream_inflight",
    "--max-connections-per-peer": "max_connections_per_peer",
    "--stream-idle-s": "stream_idle_s",
    "--max-rpcs-tcp": "max_rpcs_tcp",
    "--max-rpcs-socket": "max_rpcs_socket",
    "--max-rpcs-per-caller": "max_rpcs_per_caller",
    "--max-connections-tcp": "max_connections_tcp",
    "--max-connections-socket": "max_connections_socket",
    "--max-streams-per-connection": "max_streams_per_connection",
    "--max-stream-resets": "max_stream_resets",
    "--max-upload-bytes-per-caller": "max_upload_bytes_per_caller",
    "--max-buffered-bytes": "max_buffered_bytes",
    "--upload-timeout-s": "upload_timeout_s",
    "--connection-idle-s": "connection_idle_s",
    "--connection-age-s": "connection_age_s",
    "--connection-age-grace-s": "connection_age_grace_s",
    "--min-ping-interval-s": "min_ping_interval_s",
    "--intra-op-threads": "intra_op_threads",
    "--shutdown-grace-s": "shutdown_grace_s",
    "--engine-modules": "engine_modules",
    "--log-level": "log_level",
    "--log-format": "log_format",
    "--power-sources": "power_sources",
    "--power-model": "power_model",
    "--power-budget-w": "power_budget_w",
    "--response-energy": "response_energy",
    "--access-log": "access_log",
}


def _verbosity(raw: str) -> str:
    """Triton's --log-verbose N: 0 logs at INFO, 1 and more at DEBUG."""
    if not raw.strip().isdigit():
        raise ValueError(f"{raw!r} is not a verbosity level (0: INFO, 1 or more: DEBUG)")
    return "DEBUG" if int(raw) else "INFO"


# Triton's flag names (those that differ from ours) -> (our flag, how a value becomes ours).
ALIASES: dict[str, tuple[str, Callable[[str], str]]] = {
    "--model-repository": ("--models", str),
    "--grpc-port": ("--port", str),
    "--exit-timeout-secs": ("--shutdown-grace-s", str),
    "--log-verbose": ("--log-level", _verbosity),
}

# HETSERVE_* variables that are no serve setting, each read where its constant is defined.
OTHER_VARIABLES = frozenset({
    "HETSERVE_DAEMON",  # spark_jobs/daemon.py: the daemon a Spark job uses
    "HETSERVE_DAEMON_USER",  # service/client_socket.py: whose socket a client trusts
    "HETSERVE_GPU_ADDRESSES", "HETSERVE_FPGA_ADDRESSES",  # spark_jobs/resources.py
    "HETSERVE_FPGA_BOARD",  # accelerators/opencl/fpga/board.py
    "HETSERVE_FPGA_BINARIES", "HETSERVE_OPENCL_CACHE_DIR",  # accelerators/opencl/program_cache
    "HETSERVE_ICD_VENDORS",  # accelerators/icd.py sets it for its own children
    "HETSERVE_KERNEL_GRID",  # tests/support/numerics.py
})
TEST_PREFIX = "HETSERVE_TEST_"  # the test suite's own knobs


def env_name(flag: str) -> str:
    """--shutdown-grace-s -> HETSERVE_SHUTDOWN_GRACE_S."""
    return ENV_PREFIX + flag.removeprefix("--").upper().replace("-", "_")


def field_env_name(field: str) -> str:
    """The variable named after the field itself (what front-end processes are handed)."""
    return ENV_PREFIX + field.upper()


def flag(field: str) -> str:
    """The flag that sets `field`, as errors name it."""
    return next(f for f, name in FLAGS.items() if name == field)


def sources(field: str) -> dict[str, Callable[[str], str]]:
    """Every variable that sets `field`, and how its value becomes the field's: the one named
    after the field, and one per flag (ours and Triton's)."""
    names: dict[str, Callable[[str], str]] = {field_env_name(field): str}
    own = flag(field)
    names[env_name(own)] = str
    names.update({env_name(alias): convert for alias, (target, convert) in ALIASES.items()
                  if target == own})
    return names


def setting_variables() -> frozenset[str]:
    return frozenset(name for field in FLAGS.values() for name in sources(field))


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One line per HETSERVE_* variable that nothing reads, with the closest known name."""
    known = setting_variables() | OTHER_VARIABLES
    lines = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known or name.startswith(TEST_PREFIX):
            continue
        # Compared without the prefix, which every name shares and would make all look close.
        close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX),
                                          sorted(k.removeprefix(ENV_PREFIX) for k in known), n=1)
        lines.append(f"environment variable {name} is not a hetserve setting; ignored"
                     + (f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""))
    return lines
