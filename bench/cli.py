"""`python -m bench`: LoadGen scenarios against the daemon, the images/s-by-batch table, and the
older benches, written as a Markdown report with PNG figures (and results.json) to --out.

    python -m bench run [--out bench-report]       # LoadGen scenarios + batch table, one report
    python -m bench run --also serving efficiency spark opencl   # and the older benches
    python -m bench loadgen --scenarios Server Offline --server-qps 150
    python -m bench table --models mnist_cnn resnet50 --batches 1 8 32
    python -m bench serving -- --seconds 2         # python -m bench.serving with its own flags
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from rich.console import Console

from bench import ROOT
from bench.batch_table import BATCHES, TableSettings, run_table
from bench.loadgen_run import SCENARIOS
from bench.models import MNIST, NAMES, build
from bench.report import write_report
from bench.scenarios import run_loadgen
from bench.summary import print_summary
from service.clients.progress import progress_bar

# The benches that keep their own command line; `python -m bench NAME -- FLAGS` runs them.
SCRIPTS = {"serving": "bench.serving", "efficiency": "bench.efficiency",
           "spark": "bench.spark_scoring", "opencl": "bench.opencl_engine",
           "request-path": "bench.request_path", "backpressure": "bench.queue_backpressure"}


def _positive(kind: type):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
        return value
    return parse


def _device_spec(text: str):
    from accelerators.engine_factory import DeviceSpec

    try:
        return DeviceSpec.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", type=Path, default=Path("bench-report"),
                        help="folder for report.md, its PNGs, results.json and LoadGen's logs "
                             "(default: bench-report)")
    common.add_argument("--json", action="store_true",
                        help="print the results as JSON on stdout instead of the summary")

    loadgen = argparse.ArgumentParser(add_help=False)
    g = loadgen.add_argument_group("LoadGen")
    g.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    g.add_argument("--loadgen-model", choices=NAMES, default=MNIST,
                   help="mnist_cnn: the held-out digits (labelled); the others: synthetic "
                        "ImageNet-shaped tensors (default: mnist_cnn)")
    g.add_argument("--address", help="a running daemon to test (host:port or unix:PATH); "
                                     "default: start one on free ports")
    g.add_argument("--loadgen-seconds", type=_positive(float), default=10.0,
                   help="LoadGen's minimum duration per scenario (default: 10)")
    g.add_argument("--server-qps", type=_positive(float), default=100.0,
                   help="Server scenario's target queries/s (default: 100)")
    g.add_argument("--server-latency-ms", type=_positive(float), default=15.0,
                   help="Server bound on the 99th percentile latency (default: 15, MLPerf's "
                        "ResNet-50 bound)")
    g.add_argument("--offline-qps", type=float, default=0.0,
                   help="Offline expected samples/s; 0: calibrated by a 1 s Offline run")
    g.add_argument("--samples", type=_positive(int), default=64,
                   help="synthetic samples in the library for ImageNet-shaped models")
    g.add_argument("--accuracy", action="store_true",
                   help="also an AccuracyOnly run (Offline), checked against the labels")

    table = argparse.ArgumentParser(add_help=False)
    g = table.add_argument_group("batch table")
    g.add_argument("--models", nargs="+", choices=NAMES, default=list(NAMES))
    g.add_argument("--devices", nargs="+", metavar="SPEC", type=_device_spec,
                   help="engine:device specs, e.g. onnxruntime:cpu0 opencl:gpu0 (default: "
                        "every device `hetserve devices` finds)")
    g.add_argument("--batches", nargs="+", type=_positive(int), default=list(BATCHES))
    g.add_argument("--seconds", type=_positive(float), default=1.0, help="per point (default: 1)")
    g.add_argument("--max-batch-s", type=_positive(float), default=2.0,
                   help="skip batch sizes expected to take longer per batch (default: 2)")
    g.add_argument("--no-daemon", action="store_true", help="in-process only")
    g.add_argument("--power-sources", default="", help="as `hetserve serve --power-sources`")
    g.add_argument("--power-model", default=TableSettings.power_model,
                   help="as `hetserve serve --power-model` (default: %(default)s)")

    parser = argparse.ArgumentParser(prog="python -m bench",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", parents=[common, loadgen, table],
                              help="LoadGen scenarios and the batch table, one report")
    run.add_argument("--also", nargs="+", choices=SCRIPTS, default=[],
                     help="then these benches with their default flags, in the same report")
    commands.add_parser("loadgen", parents=[common, loadgen], help="LoadGen scenarios only")
    commands.add_parser("table", parents=[common, table], help="the batch table only")
    for name, module in SCRIPTS.items():
        sub = commands.add_parser(name, parents=[common], help=f"python -m {module} with its "
                                  "own flags after --, its output kept in the report")
        sub.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    results: dict = {"meta": _meta(argv)}
    if args.command in ("run", "loadgen"):
        results["loadgen"] = run_loadgen(args, args.out / "loadgen", console)
    if args.command in ("run", "table"):
        results["batch_table"] = _table(args, console)
    if args.command in SCRIPTS:
        results["benches"] = [_script(args.command, args.args, console)]
    if args.command == "run" and args.also:
        results["benches"] = [_script(name, [], console) for name in args.also]
    results["meta"]["finished"] = _now()
    results["meta"]["load average at the end"] = _load()
    report = write_report(results, args.out)
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    else:
        print_summary(results, Console(width=None if sys.stdout.isatty() else 130))
    console.print(f"report: {report}")
    return max((b["returncode"] != 0 for b in results.get("benches", [])), default=0)


def _table(args: argparse.Namespace, console: Console) -> list[dict]:
    from accelerators.devices import inventory
    from accelerators.engine_factory import device_specs

    specs = args.devices or device_specs(inventory())
    settings = TableSettings(tuple(args.batches), args.seconds, args.max_batch_s,
                             args.power_sources, args.power_model, not args.no_daemon)
    with tempfile.TemporaryDirectory(prefix="hetserve-models-") as tmp:
        models = build(args.models, Path(tmp))
        total = len(specs) * len(models) * len(settings.batches) * (1 + settings.daemon)
        with progress_bar(console) as bar:
            task = bar.add_task("batch table", total=total)
            points = run_table(models, specs, settings, lambda: bar.advance(task))
    return [p.as_dict() for p in points]


def _script(name: str, argv: list[str], console: Console) -> dict:
    argv = argv[1:] if argv[:1] == ["--"] else argv
    module = SCRIPTS[name]
    command = [sys.executable, "-m", module, *argv]
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          cwd=ROOT) as process, console.status(module):
        for line in process.stdout:
            console.print(line.rstrip(), markup=False, highlight=False)
            lines.append(line)
    return {"name": module, "command": shlex.join(
        ["python", "-m", module, *argv]), "returncode": process.returncode,
        "output": "".join(lines)}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"


def _cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def _meta(argv: list[str] | None) -> dict:
    versions = []
    for package in ("hetserve", "onnxruntime", "onnxruntime-gpu", "mlcommons-loadgen"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            pass
    return {"command": shlex.join(["python", "-m", "bench", *(
        sys.argv[1:] if argv is None else argv)]), "started": _now(),
        "host": f"{platform.node()}, {os.cpu_count()} cores, {_cpu()}",
        "versions": ", ".join(versions), "load average at the start": _load()}
