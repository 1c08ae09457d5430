"""The LoadGen part of `python -m bench`: the sample library, the daemon under test (a running
one at --address, or one started here on free ports), and each scenario with a progress line."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from bench import ROOT
from bench.loadgen_run import ScenarioSettings, run_scenario
from bench.loadgen_sut import SampleLibrary
from bench.models import MNIST, build, write_repository
from service.clients.progress import progress_bar
from service.local_daemon import local_daemon


def library(model: str, samples: int, folder: Path) -> SampleLibrary:
    if model == MNIST:
        from tools import mnist_digits

        images, labels = mnist_digits.holdout_split()
        return SampleLibrary("the 1,000 held-out MNIST digits", images, labels)
    return SampleLibrary(f"{samples} synthetic ImageNet-shaped tensors",
                         build([model], folder)[0].images(samples))


@contextlib.contextmanager
def daemon_address(model: str, explicit: str | None, folder: Path) -> Iterator[str]:
    """`explicit`, or a daemon started here: the repository's example model as configured,
    or the architecture with a 2 ms batching window on ONNX Runtime's best device."""
    if explicit:
        yield explicit
        return
    if model == MNIST:
        repository = ROOT / "models"
    else:
        repository = write_repository(folder / "models", build([model], folder), "onnxruntime",
                                      max_batch=64, queue_delay_us=2000)
    with local_daemon(repository, folder) as daemon:
        yield daemon.address


def run_loadgen(args: argparse.Namespace, out: Path, console: Console) -> list[dict]:
    mnist = args.loadgen_model == MNIST
    settings = ScenarioSettings(
        seconds=args.loadgen_seconds, server_qps=args.server_qps,
        server_latency_ms=args.server_latency_ms, offline_qps=args.offline_qps,
        expected_latency_ms=5.0 if mnist else 200.0, max_batch=128 if mnist else 32)
    runs = []
    with tempfile.TemporaryDirectory(prefix="hetserve-loadgen-") as tmp, \
            daemon_address(args.loadgen_model, args.address, Path(tmp)) as address:
        samples = library(args.loadgen_model, args.samples, Path(tmp))
        plan = [(s, False) for s in args.scenarios]
        if args.accuracy and samples.labels is not None:
            plan.append(("Offline", True))
        with progress_bar(console) as bar:
            for scenario, accuracy_mode in plan:
                name = f"{scenario}-accuracy" if accuracy_mode else scenario
                task = bar.add_task(f"LoadGen {name} ({args.loadgen_model})", total=None)
                runs.append(run_scenario(address, args.loadgen_model, samples, scenario,
                                         settings, out / name, accuracy_mode,
                                         lambda n, task=task: bar.advance(task, n)))
                bar.update(task, total=runs[-1]["samples"])
    return runs
