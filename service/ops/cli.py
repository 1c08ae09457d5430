"""The `hetserve` command."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path

# Read once, when grpc is first imported (below), unless set already. grpc core writes a line
# of its own for some refusals, one per call and unbounded (a compressed request: "Compression
# algorithm 'gzip' is disabled"): a flood of them would fill the log. The daemon forks only to
# exec (spawned processes), and grpc's fork handlers can crash such a child before its exec
# (grpc/grpc#43055).
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from service import daemon_log
from service.clients.tune.command import add_arguments as add_tune_arguments
from service.ops.fpga_command import add_arguments as add_fpga_arguments
from service.ops.fpga_command import run as run_fpga
from service.setting_names import (
    ALIASES,
    FLAGS,
    env_name,
    field_env_name,
    flag,
    unknown_variables,
)
from service.settings import ENV_PREFIX, Settings

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
        description="Serve a model repository over gRPC. Every flag can also be set by an "
                    f"environment variable named after it: {ENV_PREFIX}, then the flag's name "
                    f"upper-cased with dashes as underscores (--port: {env_name('--port')}, "
                    f"--grpc-port: {env_name('--grpc-port')}); the older {ENV_PREFIX}<FIELD> "
                    f"names still work ({field_env_name('unix_socket')} for --socket). A flag "
                    "wins over a variable; two variables for one setting must agree. Triton's "
                    "flag names are accepted beside ours (--http-port and --metrics-port are "
                    "the same in both); switches take true or false (alone: true).")
    _add_serve_flags(serve)

    devices = commands.add_parser(
        "devices", help="list the devices by the ids a model's `devices` parameter takes "
                        "(opencl:fpga0, onnxruntime:cpu0), with their platforms")
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
    defaults = Settings()
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
                    "batch-1 load, prints them ranked and writes the best config.pbtxt into its "
                    "report folder (the model's with --write). Exit status 2 for bad input or "
                    "when no candidate meets the p99 bound.")
    add_tune_arguments(tune)
    return parser


def _add_serve_flags(serve: argparse.ArgumentParser) -> None:
    """One option per setting, Triton's same-meaning names as its aliases; each flag's help is
    the field's doc."""
    docs, defaults = Settings.docs(), Settings()
    kinds = {f.name: str(f.type) for f in dataclasses.fields(Settings)}
    for option, name in FLAGS.items():
        same = [alias for alias, (target, convert) in ALIASES.items()
                if target == option and convert is str]
        switch = kinds[name] == "bool"
        serve.add_argument(option, *same, dest=name, metavar="true|false" if switch else
                           name.upper(), nargs="?" if switch else None,
                           const="true" if switch else None,
                           action="append" if name in _REPEATABLE else "store",
                           help=f"{docs[name]} (default: {getattr(defaults, name)})")
    serve.add_argument("--log-verbose", metavar="N", dest="log_verbose",
                       help="Triton's name: 0 is --log-level INFO, 1 or more DEBUG")


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


def _overrides(args: argparse.Namespace) -> dict[str, str | None]:
    """The settings the flags give, as strings; --log-verbose becomes --log-level."""
    given = {name: _joined(getattr(args, name)) for name in FLAGS.values()}
    if args.log_verbose is not None:
        if given["log_level"] is not None:
            raise ValueError("--log-verbose: give it or --log-level, not both")
        try:
            given["log_level"] = ALIASES["--log-verbose"][1](args.log_verbose)
        except ValueError as e:
            raise ValueError(f"--log-verbose: {e}") from None
    return given


def _named_by_flag(message: str) -> str:
    """A start-up error that opens with a settings field ("workers: ...") opens with its flag,
    the name the user knows."""
    name, colon, rest = message.partition(": ")
    return f"{flag(name)}: {rest}" if colon and name in FLAGS.values() else message


def _serve(args: argparse.Namespace) -> int:
    from service.ops.server import StartupError, serve

    try:
        settings = Settings.from_env(**_overrides(args))
    except ValueError as e:  # one line naming the flag (and its variable)
        print(f"hetserve serve: {e}", file=sys.stderr)
        return 2
    daemon_log.configure(settings.log_level, log_format=settings.log_format)
    for line in unknown_variables(os.environ):
        logging.getLogger("service.settings").warning("%s", line)
    try:
        asyncio.run(serve(settings))
    except StartupError as e:
        print(f"hetserve: {_named_by_flag(str(e))}", file=sys.stderr)
        return 2
    # Drained and stopped: a repeated SIGTERM while the interpreter exits must not turn the
    # clean exit into a kill.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return 0
