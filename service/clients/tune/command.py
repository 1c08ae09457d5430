"""`hetserve tune MODEL_DIR`: the command line, its checks, and what it writes.

Exit status: 0 with a config written; 2 for bad input (a model that does not load, a device or
objective it does not know, a bound no candidate meets), with the points measured so far
printed; 130 when interrupted (Ctrl-C or SIGTERM), after stopping every process it started."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import signal
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path

from service.clients.tune.rank import OBJECTIVES

DEFAULT_CONCURRENCIES = (1, 8, 16, 32, 64)
_MIN_SECONDS = 1.0
# Two power samples (one a second) must fall inside the energy window: the load's seconds less
# its 0.3 s warm-up, so at least 2.2 s.
_MIN_ENERGY_SECONDS = 2.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR", type=Path,
                        help="the model's folder in a Triton repository (config.pbtxt and "
                             "version folders); nothing is written there but config.pbtxt "
                             "with --write: the tuned config goes to the report folder")
    parser.add_argument("--objective", choices=OBJECTIVES, default="throughput",
                        help="most req/s, lowest p99, or fewest joules per image, each at the "
                             "candidate's best concurrency (default: throughput)")
    parser.add_argument("--p99-ms", type=float, metavar="MS",
                        help="only load points with a p99 latency of at most MS milliseconds count")
    parser.add_argument("--devices", nargs="+", metavar="SPEC",
                        help="candidate devices, e.g. onnxruntime:cpu0 opencl:cpu0 (default: "
                             "every engine and device of this node that can load the model, as "
                             "`hetserve devices --models` says)")
    parser.add_argument("--budget-s", type=float, default=300.0, metavar="SECONDS",
                        help="time for the sweep; candidates that would not fit are skipped "
                             "and listed (default: 300)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=DEFAULT_CONCURRENCIES,
                        metavar="N", help="batch-1 callers in flight, ascending; a candidate "
                        "stops at the first concurrency whose p99 is over twice the bound "
                        f"(default: {' '.join(map(str, DEFAULT_CONCURRENCIES))})")
    parser.add_argument("--seconds", type=float, default=2.5,
                        help="measurement per concurrency; watts need at least "
                             f"{_MIN_ENERGY_SECONDS:g} (default: 2.5)")
    parser.add_argument("--clients", type=int, default=1, metavar="N",
                        help="load client processes (default: 1)")
    parser.add_argument("--perf-analyzer", metavar="PATH",
                        help="drive load with Triton's perf_analyzer at PATH (default: on PATH "
                             "or $PERF_ANALYZER where installed, else hetserve's load client; "
                             "'' forces the load client)")
    parser.add_argument("--report", type=Path, metavar="DIR",
                        help="folder for report.md, front.png and results.json (default: "
                             "./hetserve-tune-MODEL)")
    parser.add_argument("--write", action="store_true",
                        help="also replace config.pbtxt with the winner, keeping the original "
                             "as config.pbtxt.orig")
    parser.add_argument("--force", action="store_true",
                        help="run as root, write into the model's or the report's folder even "
                             "where another user owns it (refused otherwise: that user could "
                             "have planted links there; docs/security.md)")
    parser.add_argument("--power-sources", metavar="MAP",
                        help="passed to each daemon (hetserve serve --power-sources)")
    parser.add_argument("--power-model", metavar="MAP",
                        help="passed to each daemon (hetserve serve --power-model)")
    parser.add_argument("--engine-modules", metavar="MODULES",
                        help="modules registering more engines, imported here and by each "
                             "daemon (hetserve serve --engine-modules)")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from rich.console import Console

    from accelerators.safe_files import UnsafeFolderError
    from service.clients.tune import session
    from service.clients.tune.session import BadInputError

    # a file or pipe gets the table's full width; a terminal its own
    console = Console(width=None if sys.stdout.isatty() else 220)
    progress_console = Console(stderr=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        plan = _check(args, argv)
        return session.run(plan, console, progress_console)
    except (BadInputError, UnsafeFolderError) as e:  # the latter: a folder swapped mid-sweep
        print(f"hetserve tune: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hetserve tune: interrupted; every daemon it started is stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends a sweep as Ctrl-C does: daemons stopped, table shown


def _check(args: argparse.Namespace, argv: list[str]):
    """The session's plan from the arguments; BadInputError says what is wrong."""
    from service.clients import perf_analyzer
    from service.clients.tune import devices
    from service.clients.tune.session import BadInputError, Plan
    from service.core.repository import ModelRepository
    from service.errors import ConfigError
    from service.settings import Settings

    if args.p99_ms is not None and args.p99_ms <= 0:
        raise BadInputError(f"--p99-ms {args.p99_ms:g}: expected a positive bound")
    if args.budget_s <= 0:
        raise BadInputError(f"--budget-s {args.budget_s:g}: expected a positive number")
    if not args.concurrency or any(c < 1 for c in args.concurrency):
        raise BadInputError(f"--concurrency {args.concurrency}: expected 1 or more callers")
    least = _MIN_ENERGY_SECONDS if args.objective == "energy" else _MIN_SECONDS
    if args.seconds < least:
        raise BadInputError(f"--seconds {args.seconds:g}: expected at least {least:g} for "
                            f"objective {args.objective}")
    if args.clients < 1:
        raise BadInputError(f"--clients {args.clients}: expected 1 or more")
    # Made absolute without resolving links: a folder that is a link is refused where it is
    # written (accelerators/safe_files.py), not silently replaced by what it points to.
    model_dir = Path(os.path.abspath(args.model_dir))
    report_dir = Path(os.path.abspath(args.report or f"hetserve-tune-{model_dir.name}"))
    shipped_text = _shipped_config(model_dir, args.force)
    try:
        entry = ModelRepository(model_dir.parent).load(model_dir.name)
    except (ConfigError, Exception) as e:  # any reason the repository gives is the message
        raise BadInputError(f"the model in {args.model_dir} does not load: {e}") from e
    modules = args.engine_modules or Settings.from_env().engine_modules
    for module in filter(None, (m.strip() for m in modules.split(","))):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise BadInputError(f"--engine-modules: cannot import {module!r}: {e}") from e
    try:
        candidates = devices.candidates(entry.versions[max(entry.versions)], args.devices)
    except ValueError as e:
        raise BadInputError(str(e)) from e
    binary = perf_analyzer.find() if args.perf_analyzer is None else args.perf_analyzer
    serve_args = [*(["--power-sources", args.power_sources] if args.power_sources else []),
                  *(["--power-model", args.power_model] if args.power_model else []),
                  *(["--engine-modules", args.engine_modules] if args.engine_modules else [])]
    _check_report(report_dir, args.force)  # last: a refused run leaves no folder behind
    return Plan(
        model=entry.name, model_dir=model_dir, config=entry.config,
        shipped_text=shipped_text, devices=candidates,
        objective=args.objective, p99_ms=args.p99_ms, budget_s=args.budget_s,
        concurrencies=tuple(sorted(set(args.concurrency))), seconds=args.seconds,
        clients=args.clients, perf_analyzer=binary or None, serve_args=tuple(serve_args),
        report_dir=report_dir, write=args.write, force=args.force,
        command=shlex.join(["hetserve", *argv]),
        started=datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), host=socket.gethostname())


def _shipped_config(model_dir: Path, force: bool) -> str:
    """The model's config.pbtxt, read without following a link, once tune may write beside it
    (before any sweep, so that a refusal costs nothing)."""
    from accelerators import safe_files
    from service.clients.tune.session import BadInputError

    try:
        with safe_files.folder(model_dir, force) as fd:
            return safe_files.read_at(fd, "config.pbtxt").decode()
    except safe_files.UnsafeFolderError as e:
        raise BadInputError(str(e)) from e
    except (OSError, UnicodeDecodeError) as e:
        raise BadInputError(f"{model_dir}: not a model folder (config.pbtxt: {e})") from e


def _check_report(folder: Path, force: bool) -> None:
    """That the report may go to `folder` (made there now, before the sweep)."""
    from accelerators import safe_files
    from service.clients.tune.session import BadInputError

    try:
        safe_files.make_folder(folder, force)
    except safe_files.UnsafeFolderError as e:
        raise BadInputError(f"--report: {e}") from e
    except OSError as e:
        raise BadInputError(f"--report {folder}: {e.strerror}") from e
