"""The simulated device: its curve file, refused by line where malformed, and batches that take
the curve's time without holding the GIL."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from accelerators.engine_factory import DeviceSpec, create_engine
from accelerators.engine_options import EngineOptions
from accelerators.safe_files import UnsafeFolderError
from accelerators.simulated_engine import BatchCurve
from tests.support.daemon import MODEL, MODELS


def test_the_curve_interpolates_and_grows_past_its_last_size() -> None:
    curve = BatchCurve.parse("# H200\n1 0.002\n\n4 0.002  # flat\n16 0.004\n", "c")
    assert curve.seconds_for(1) == 0.002 and curve.seconds_for(2) == 0.002
    assert curve.seconds_for(10) == pytest.approx(0.003)
    assert curve.seconds_for(32) == pytest.approx(0.008)


@pytest.mark.parametrize("text, message", [
    ("1 0.002\n4\n", r"h200.curve:2: '4': expected '<batch size> <seconds>'"),
    ("1 0.002\n4 fast\n", r"h200.curve:2: '4 fast': expected"),
    ("1 0.002 3\n", r"h200.curve:1: .*expected '<batch size> <seconds>'"),
    ("4 0.002\n2 0.001\n", r"h200.curve:2: .*batch size 2 must be 1 or more and above"),
    ("0 0.002\n", r"h200.curve:1: .*batch size 0"),
    ("1 -0.002\n", r"h200.curve:1: .*-0.002 seconds; expected a positive number"),
    ("1 nan\n", r"h200.curve:1: .*nan seconds"),
    ("# nothing\n", r"h200.curve: no '<batch size> <seconds>' line"),
])
def test_a_malformed_curve_is_refused_naming_the_line(text, message) -> None:
    with pytest.raises(ValueError, match=message):
        BatchCurve.parse(text, "h200.curve")


def _model(tmp_path: Path, curve: str = "1 0.02\n8 0.04\n") -> Path:
    folder = tmp_path / MODEL
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes((MODELS / MODEL / "1" / "model.onnx").read_bytes())
    (folder / "sim.curve").write_text(curve)
    return folder / "1" / "model.onnx"


def test_a_batch_takes_the_curves_time_off_the_gil(tmp_path) -> None:
    path = _model(tmp_path)
    engine = create_engine(DeviceSpec("simulated", "gpu0"), path,
                           ort_options=EngineOptions(simulated_curve="sim.curve"))
    assert (engine.device.name, engine.device.kind, engine.device.engine) == \
        ("gpu0", "gpu", "simulated")
    images = np.ones((8, 1, 28, 28), np.float32)
    ticks = []
    ticking = threading.Thread(target=lambda: [ticks.append(time.sleep(0.001)) for _ in
                                               range(20)])
    start = time.perf_counter()
    ticking.start()
    out = engine.run({"image": images}, ["logits"])
    took = time.perf_counter() - start
    ticking.join()
    assert out["logits"].shape == (8, 10) and out["logits"].dtype == np.float32
    assert 0.04 <= took < 0.2
    assert len(ticks) == 20  # another thread ran meanwhile


@pytest.mark.parametrize("name, error", [
    ("../sim.curve", "is not a file name in the model's folder"),
    ("missing.curve", "No such file"),
    ("", "names no parameters.simulated_curve"),
])
def test_the_curve_is_a_file_of_the_models_folder(tmp_path, name, error) -> None:
    with pytest.raises((ValueError, OSError), match=error):
        create_engine(DeviceSpec("simulated", "gpu0"), _model(tmp_path),
                      ort_options=EngineOptions(simulated_curve=name))


def test_a_curve_that_is_a_link_is_not_followed(tmp_path) -> None:
    path = _model(tmp_path)
    os.symlink(tmp_path / MODEL / "sim.curve", tmp_path / MODEL / "link.curve")
    with pytest.raises(UnsafeFolderError, match="is a symbolic link"):
        create_engine(DeviceSpec("simulated", "gpu0"), path,
                      ort_options=EngineOptions(simulated_curve="link.curve"))
