"""`hetserve tune` end to end on this machine's CPU (ONNX Runtime and OpenCL on PoCL): a short
sweep through real daemons, the written config served again, and bad input (exit status 2)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from service.clients import perf_analyzer
from service.clients.tune import rank
from service.ops.cli import main
from tests.support.daemon import MODEL, MODELS, Daemon
from tests.support.faulty_engine import CONTROL_ENV

# One short load point per candidate (the shortest that always holds two power samples) and a
# small budget: a tune test takes seconds per candidate, not minutes.
QUICK = ["--concurrency", "8", "--seconds", "2.5", "--clients", "1", "--perf-analyzer", ""]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A copy of the example model, served on this machine's CPU (the emulated FPGA's pipeline
    runs at an emulator's speed, which no p99 bound here allows): tune writes beside its
    config."""
    folder = tmp_path / "repository" / MODEL
    shutil.copytree(MODELS / MODEL, folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('"opencl:fpga0, onnxruntime"', '"onnxruntime"'))
    return folder


def _tune(model_dir: Path, report: Path, *flags: str) -> int:
    return main(["tune", str(model_dir), "--report", str(report), *flags])


def _best(measurement: dict, objective: str, p99_ms: float | None) -> float | None:
    """The objective's figure at the measurement's best qualifying point, from results.json."""
    values = [p[{"throughput": "rps", "latency": "p99_ms", "energy": "joules_per_image"}[
        objective]] for p in measurement["points"]
        if not p["errors"] and p["rps"] > 0 and (p99_ms is None or p["p99_ms"] <= p99_ms)]
    values = [v for v in values if v is not None]
    if not values:
        return None
    return max(values) if objective == "throughput" else min(values)


def _serve_and_infer(model_dir: Path, config: Path, tmp_path: Path) -> dict:
    """A daemon on a repository of the model with `config`; one inference; its ModelConfig."""
    repository = tmp_path / "served"
    shutil.copytree(model_dir, repository / MODEL)
    shutil.copy(config, repository / MODEL / "config.pbtxt")
    daemon = Daemon(tmp_path, repository)
    try:
        client = grpcclient.InferenceServerClient(daemon.url)
        image = grpcclient.InferInput("image", [1, 1, 28, 28], "FP32")
        image.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.float32))
        logits = client.infer(MODEL, [image]).as_numpy("logits")
        served = client.get_model_config(MODEL, as_json=True)["config"]
        client.close()
    finally:
        assert daemon.stop() == 0
    assert logits.shape == (1, 10)
    return served


def test_a_short_sweep_over_both_engines_writes_a_config_as_good_as_the_shipped_one(
        model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    shipped_text = (model_dir / "config.pbtxt").read_bytes()
    report = tmp_path / "report"
    assert _tune(model_dir, report, "--objective", "throughput", "--p99-ms", "500",
                 "--devices", "onnxruntime:cpu0", "opencl:cpu0", "--budget-s", "30",
                 *QUICK) == 0
    results = json.loads((report / "results.json").read_text())
    measured = results["measurements"]
    shipped, engines = measured[0], {m["candidate"]["devices"] for m in measured}
    assert shipped["stage"] == "shipped" and shipped["points"]  # the comparison is honest
    assert {"onnxruntime:cpu0", "opencl:cpu0"} <= engines
    assert any(m["points"] for m in measured if m["candidate"]["devices"] == "opencl:cpu0")

    written, comparison = results["written"], results["comparison"]
    assert any(written == {"stage": m["stage"], **m["candidate"]} for m in measured)
    assert comparison["written"]["rps"] >= comparison["shipped"]["rps"]
    assert comparison["ratio"] >= 1.0
    best = [_best(m, "throughput", 500) for m in measured]
    assert max(v for v in best if v) >= best[0]

    tuned = report / "config.pbtxt"
    header = [line for line in tuned.read_text().splitlines() if line.startswith("#")]
    assert any("Objective: throughput with p99 <= 500 ms" in line for line in header)
    assert any("power sources: cpu0: model estimate" in line for line in header)
    assert (model_dir / "config.pbtxt").read_bytes() == shipped_text  # untouched without --write
    assert _names(model_dir) == _names(MODELS / MODEL)  # nothing else
    assert (report / "report.md").is_file() and (report / "front.png").is_file()
    captured = capsys.readouterr()
    assert "written:" in captured.out and "against the shipped config's" in captured.out
    assert "s] shipped: " in captured.err  # progress as plain lines where stderr is no terminal

    served = _serve_and_infer(model_dir, tuned, tmp_path)
    assert served["parameters"]["devices"]["string_value"]


def test_energy_objective_picks_fewest_joules_and_write_replaces_the_config(
        model_dir: Path, tmp_path: Path) -> None:
    original = (model_dir / "config.pbtxt").read_text()
    report = tmp_path / "report"
    assert _tune(model_dir, report, "--objective", "energy", "--devices", "onnxruntime:cpu0",
                 "--budget-s", "20", *QUICK, "--write") == 0
    results = json.loads((report / "results.json").read_text())
    shipped = results["measurements"][0]
    joules = [_best(m, "energy", None) for m in results["measurements"]]
    assert joules[0] is not None and min(j for j in joules if j) <= joules[0]
    comparison = results["comparison"]
    assert comparison["written"]["watts"] and comparison["ratio"] <= 1.0
    assert all(set(p["sources"].values()) == {"model"} for p in shipped["points"])
    assert (model_dir / "config.pbtxt.orig").read_text() == original
    written = (model_dir / "config.pbtxt").read_text()
    assert written == (report / "config.pbtxt").read_text()
    assert "J per image" in written.splitlines()[2]


def test_a_candidate_that_fails_is_reported_and_the_sweep_goes_on(
        model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    control = tmp_path / "control.json"
    # the device fails every batch, the daemon's warm-up included: the model does not load
    control.write_text(json.dumps({"fail": True}))
    monkeypatch.setenv(CONTROL_ENV, str(control))
    report = tmp_path / "report"
    assert _tune(model_dir, report, "--engine-modules", "tests.support.faulty_engine",
                 "--devices", "faulty:fpga0", "onnxruntime:cpu0", "--budget-s", "30",
                 *QUICK) == 0
    results = json.loads((report / "results.json").read_text())
    measured = results["measurements"]
    faulty = next(m for m in measured if m["candidate"]["devices"] == "faulty:fpga0")
    assert "the model did not load" in faulty["error"] and not faulty["points"]
    assert measured[-1]["stage"] != "devices" and measured[-1]["points"]  # and it went on
    assert results["written"]["devices"] == "onnxruntime:cpu0"
    assert "failed: the model did not load" in capsys.readouterr().out


@pytest.mark.skipif(not perf_analyzer.find(), reason="perf_analyzer is not installed (on PATH "
                    "or PERF_ANALYZER; docs/serving.md says how to get it)")
def test_perf_analyzer_drives_the_load_where_it_is_installed(model_dir: Path,
                                                             tmp_path: Path) -> None:
    report = tmp_path / "report"
    assert _tune(model_dir, report, "--devices", "onnxruntime:cpu0", "--budget-s", "10",
                 "--concurrency", "4", "--seconds", "2.5") == 0
    results = json.loads((report / "results.json").read_text())
    assert results["client"].startswith("perf_analyzer")
    point = results["measurements"][0]["points"][0]
    assert point["rps"] > 0 and point["p99_ms"] >= point["p50_ms"] > 0 and point["watts"]


def test_a_p99_bound_nothing_meets_is_exit_status_2_with_the_points_measured(
        model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert _tune(model_dir, tmp_path / "report", "--p99-ms", "0.001", "--budget-s", "5",
                 "--devices", "onnxruntime:cpu0", *QUICK) == 2
    captured = capsys.readouterr()
    assert "no candidate met p99 ≤ 0.001 ms" in captured.err
    assert "(shipped)" in captured.out and "no point within p99" in captured.out
    assert not (tmp_path / "report" / "config.pbtxt").exists()


@pytest.mark.parametrize("flags, message", [
    (["--devices", "nosuch:cpu0"], "engine 'nosuch' is unknown"),
    (["--devices", "onnxruntime:gpu7"], "device onnxruntime:gpu7 cannot run the model"),
    (["--p99-ms", "-1"], "--p99-ms -1: expected a positive bound"),
    (["--objective", "energy", "--seconds", "2"], "expected at least 2.5 for objective energy"),
])
def test_bad_flags_are_exit_status_2_with_a_message(
        model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str],
        message: str) -> None:
    assert _tune(model_dir, tmp_path / "report", *flags) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_objective_is_exit_status_2(model_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        _tune(model_dir, tmp_path / "report", "--objective", "cheapest")
    assert exit_.value.code == 2
    assert "invalid choice: 'cheapest'" in capsys.readouterr().err
    assert set(rank.OBJECTIVES) == {"throughput", "latency", "energy"}


def test_a_model_that_does_not_load_is_exit_status_2(model_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    (model_dir / "config.pbtxt").write_text("max_batch_size: oops\n")
    assert _tune(model_dir, tmp_path / "report") == 2
    assert "does not load" in capsys.readouterr().err

    (model_dir / "config.pbtxt").write_text((MODELS / MODEL / "config.pbtxt").read_text())
    (model_dir / "1" / "model.onnx").write_bytes(b"not an onnx graph")
    assert _tune(model_dir, tmp_path / "report") == 2
    assert "no device of this node can run the model" in capsys.readouterr().err

    assert _tune(tmp_path / "nothing-here", tmp_path / "report") == 2
    assert "not a model folder" in capsys.readouterr().err


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except OSError:  # the task ended meanwhile
                continue
            todo += children - found
            found |= children
    return found


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_sweep_stops_every_process_it_started(
        model_dir: Path, tmp_path: Path, signum: int) -> None:
    tune = subprocess.Popen(
        [sys.executable, "-m", "service", "tune", str(model_dir), "--budget-s", "120",
         "--devices", "onnxruntime:cpu0", "--report", str(tmp_path / "report"), *QUICK],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started, deadline = set(), time.monotonic() + 60
    try:
        while not any("serve" in _cmdline(pid) for pid in started):  # a daemon runs
            assert tune.poll() is None and time.monotonic() < deadline
            started |= _descendants(tune.pid)
            time.sleep(0.2)
        time.sleep(1.0)  # under load
        started |= _descendants(tune.pid)
        workspace = next(Path(arg).parent for pid in started for arg in
                         _cmdline(pid).split("\0") if arg.endswith("/models"))
        tune.send_signal(signum)
        out, err = tune.communicate(timeout=60)
    finally:
        tune.kill()
    assert tune.returncode == 130, err
    assert "interrupted; every daemon it started is stopped" in err
    assert "(shipped)" in out or "shipped" in err  # what was measured is shown
    # multiprocessing's resource tracker ends on its own once its parent has gone
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in started if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [(pid, _cmdline(pid)) for pid in alive]
    assert not workspace.exists()
    assert _names(model_dir) == _names(MODELS / MODEL)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    try:  # a zombie has ended; only its parent's wait is missing
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
