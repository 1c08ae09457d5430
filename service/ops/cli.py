"""The `hetserve` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from service import daemon_log
from service.clients.tune.command import add_arguments as add_tune_arguments
from service.ops.fpga_command import add_arguments as add_fpga_arguments
from service.ops.fpga_command import run as run_fpga
from service.settings import ENV_PREFIX, Settings

# serve's flags and the settings fields they set; each flag's help is the field's doc.
_SERVE_FLAGS = [
    ("--models", "model_repository"),
    ("--host", "grpc_host"),
    ("--port", "grpc_port"),
    ("--http-port", "http_port"),
    ("--socket", "unix_socket"),
    ("--socket-group", "socket_group"),
    ("--tls-cert", "tls_cert"),
    ("--tls-key", "tls_key"),
    ("--token-file", "token_file"),
    ("--admin-token-file", "admin_token_file"),
    ("--metrics-host", "metrics_host"),
    ("--metrics-port", "metrics_port"),
    ("--health-port", "health_port"),
    ("--model-control-mode", "model_control_mode"),
    ("--repository-poll-secs", "repository_poll_secs"),
    ("--load-model", "load_model"),
    ("--workers", "workers"),
    ("--max-message-bytes", "max_message_bytes"),
    ("--max-queue-size", "max_queue_size"),
    ("--max-shm-regions", "max_shm_regions"),
    ("--max-shm-regions-per-client", "max_shm_regions_per_client"),
    ("--shm-uid-for-token", "shm_uid_for_token"),
    ("--max-stream-inflight", "max_stream_inflight"),
    ("--max-connections-per-peer", "max_connections_per_peer"),
    ("--stream-idle-s", "stream_idle_s"),
    ("--max-rpcs-tcp", "max_rpcs_tcp"),
    ("--max-rpcs-socket", "max_rpcs_socket"),
    ("--max-connections-tcp", "max_connections_tcp"),
    ("--max-connections-socket", "max_connections_socket"),
    ("--max-streams-per-connection", "max_streams_per_connection"),
    ("--max-stream-resets", "max_stream_resets"),
    ("--max-upload-bytes-per-caller", "max_upload_bytes_per_caller"),
    ("--max-buffered-bytes", "max_buffered_bytes"),
    ("--upload-timeout-s", "upload_timeout_s"),
    ("--connection-idle-s", "connection_idle_s"),
    ("--connection-age-s", "connection_age_s"),
    ("--connection-age-grace-s", "connection_age_grace_s"),
    ("--min-ping-interval-s", "min_ping_interval_s"),
    ("--intra-op-threads", "intra_op_threads"),
    ("--shutdown-grace-s", "shutdown_grace_s"),
    ("--engine-modules", "engine_modules"),
    ("--log-level", "log_level"),
    ("--power-sources", "power_sources"),
    ("--power-model", "power_model"),
    ("--power-budget-w", "power_budget_w"),
    ("--response-energy", "response_energy"),
    ("--access-log", "access_log"),
]

_REPEATABLE = {"load_model"}  # given several times, the values join with commas


class _Version(argparse.Action):
    """--version: the package's version and the devices its engines find here, as a model's
    `devices` parameter names them."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from importlib.metadata import version

        from accelerators.devices import inventory
        from accelerators.engine_factory import device_specs

        found = ", ".join(str(spec) for spec in device_specs(inventory())) or "none"
        print(f"hetserve {version('hetserve')}; devices found: {found}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetserve", description="Online image recognition on FPGA, GPU and CPU.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the version and the devices found here, then exit")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve", help="run the accelerator daemon (KServe V2 / Triton gRPC)",
        description="Serve a model repository over gRPC. Every flag can also be set by its "
                    f"{ENV_PREFIX}<FIELD> environment variable, e.g. {ENV_PREFIX}GRPC_PORT.")
    docs, defaults = Settings.docs(), Settings()
    for flag, name in _SERVE_FLAGS:
        serve.add_argument(flag, dest=name, metavar=name.upper(),
                           action="append" if name in _REPEATABLE else "store",
                           help=f"{docs[name]} (default: {getattr(defaults, name)})")

    devices = commands.add_parser(
        "devices", help="list OpenCL devices and ONNX Runtime providers, as fpga / gpu / cpu")
    devices.add_argument("--json", action="store_true", help="print JSON instead of a table")
    devices.add_argument("--models", metavar="DIR", help="also say which models of this "
                         "repository each device can run (loads each one there)")

    health = commands.add_parser(
        "health", help="ask a daemon's grpc.health.v1 service whether it serves (exit 0 when "
                       "SERVING); for container health checks",
        description="Plaintext gRPC: the unix socket, loopback TCP or the --health-port. A unix "
                    "socket is used only in a folder of the expected user (this one, or "
                    "HETSERVE_DAEMON_USER) and with a listener running as that user.")
    health.add_argument("--address", help="unix:PATH or HOST:PORT (default: the unix socket "
                                          f"from the {ENV_PREFIX}UNIX_SOCKET setting)")
    health.add_argument("--service", default="",
                        help="the service to ask about (default: the whole server)")
    health.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="seconds to wait for the answer (default: 5)")

    top = commands.add_parser(
        "top", help="live view of one node: requests, latency, watts, GFLOP/s per watt, joules "
                    "per inference and per request",
        description="Reads a daemon's /metrics every interval and shows the rates in between, "
                    "joules per inference and per request per model and device among them. "
                    "Power figures say their source; 'model*' and 'model (est.)' mark an "
                    "estimate.")
    top.add_argument("--url", help="the daemon's metrics endpoint (default: from the "
                                   f"{ENV_PREFIX}METRICS_HOST/PORT settings, "
                                   f"http://{defaults.metrics_host}:{defaults.metrics_port}"
                                   "/metrics)")
    top.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                     help="seconds between readings (default: 2)")
    top.add_argument("--once", action="store_true", help="print one reading and exit")

    add_fpga_arguments(commands)

    tune = commands.add_parser(
        "tune", help="find the devices, instance counts, queue delay and batch sizes that serve "
                     "a model best for an objective, energy included (docs/tuning.md)",
        description="Measures candidate configs of one model through real daemons under "
                    "batch-1 load, prints them ranked and writes the best as config.pbtxt.tuned "
                    "beside the original, with a report. Exit status 2 for bad input or when no "
                    "candidate meets the p99 bound.")
    add_tune_arguments(tune)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "devices":
        return _devices(args.json, args.models)
    if args.command == "top":
        return _top(args)
    if args.command == "fpga":
        return run_fpga(args)
    if args.command == "tune":
        from service.clients.tune.command import run as tune
        return tune(args, sys.argv[1:] if argv is None else argv)
    if args.command == "health":
        from service.clients.probe import check, default_address
        return check(args.address or default_address(Settings.from_env()), args.service,
                     args.timeout)
    return _serve(args)


def _devices(as_json: bool, models: str | None) -> int:
    from accelerators.devices import format_table, inventory

    found = inventory()
    if models:
        found["models"] = _model_support(found, Path(models))
    print(json.dumps(found, indent=2) if as_json else format_table(found))
    return 0


def _top(args: argparse.Namespace) -> int:
    from service.clients.top import run

    if args.interval <= 0:
        print(f"hetserve top: --interval {args.interval} must be positive", file=sys.stderr)
        return 2
    url = args.url
    if url is None:
        settings = Settings.from_env()
        url = f"http://{settings.metrics_host}:{settings.metrics_port}/metrics"
    return run(url, args.interval, args.once)


def _model_support(found: dict, root: Path) -> dict[str, dict[str, str]]:
    """device spec -> model -> "yes" or the reason it cannot run there (latest version)."""
    from accelerators.engine_factory import can_run, device_specs
    from service.core.model import ModelSpec
    from service.core.repository import ModelRepository

    repository = ModelRepository(root)
    models: dict[str, tuple[Path, dict] | Exception] = {}
    for name in repository.names():
        try:
            entry = repository.load(name)
            version = max(entry.versions)
            models[name] = (entry.versions[version],
                            ModelSpec.from_config(entry.config, version).served_dims())
        except Exception as e:  # a broken config is reported, not fatal
            models[name] = e
    return {str(spec): {name: f"no: {m}" if isinstance(m, Exception) else can_run(spec, *m)
                        for name, m in models.items()}
            for spec in device_specs(found)}


def _joined(value: str | list[str] | None) -> str | None:
    return ",".join(value) if isinstance(value, list) else value


def _serve(args: argparse.Namespace) -> int:
    from service.ops.server import StartupError, serve

    try:
        settings = Settings.from_env(**{name: _joined(getattr(args, name))
                                        for _, name in _SERVE_FLAGS})
    except ValueError as e:  # "<field>: ...": named as the flag and its variable
        field, _, reason = str(e).partition(": ")
        flag = next((f for f, name in _SERVE_FLAGS if name == field), None)
        named = f"{flag} ({ENV_PREFIX}{field.upper()}): {reason}" if flag else str(e)
        print(f"hetserve serve: {named}", file=sys.stderr)
        return 2
    daemon_log.configure(settings.log_level)
    try:
        asyncio.run(serve(settings))
    except StartupError as e:
        print(f"hetserve: {e}", file=sys.stderr)
        return 2
    # Drained and stopped: a repeated SIGTERM while the interpreter exits must not turn the
    # clean exit into a kill.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return 0
