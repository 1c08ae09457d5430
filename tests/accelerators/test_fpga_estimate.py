"""The hardware model (accelerators/opencl/fpga/estimate.py, `hetserve fpga plan`) against
PipeCNN's published AlexNet figures, configured as PipeCNN was on those boards (8-bit weights
and activations in DDR): 150 ms at batch 1 on the DE1-SoC with 68 DSPs, 15 ms an image at batch
16 on the DE5-Net with 228 DSPs, each within 30%; the search over VEC x LANE; board profiles
refused naming the field; and the command's output labelled an estimate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from accelerators.opencl.fpga import board as boards
from accelerators.opencl.fpga.estimate import plan, resources, search
from tools.cnn_architectures import alexnet as alexnet_model

# PipeCNN's README: board -> (ms an image, batch, DSPs)
PIPECNN = {"de1soc": (150.0, 1, 68), "de5net": (15.0, 16, 228)}


@pytest.fixture(scope="module")
def alexnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("caffenet") / "caffenet.onnx"
    onnx.save(alexnet_model(caffe=True), str(path))
    return path


@pytest.mark.parametrize("name", list(PIPECNN))
def test_the_model_reproduces_pipecnn_within_30_percent(alexnet, name) -> None:
    ms, batch, dsps = PIPECNN[name]
    e = plan(alexnet, boards.load(name), "int8", batch, activation_bytes=1)
    assert not e.misfit
    assert abs(e.seconds / batch * 1e3 / ms - 1) <= 0.3, e.seconds / batch * 1e3
    assert abs(e.dsps / dsps - 1) <= 0.3, e.dsps
    assert len(e.passes) == 8 and set(e.on_host.values()) == {"op LRN has no FPGA kernel"}
    bounds = [p.bound for p in e.passes]
    assert bounds[:5] == ["compute"] * 5  # the convolutions
    if batch == 1:  # one image: the fully connected layers wait on their weights
        assert bounds[5:] == ["memory"] * 3


def test_the_search_finds_the_fastest_array_that_fits(alexnet) -> None:
    board = boards.load("de1soc")
    found = search(alexnet, board, "int8", 1, activation_bytes=1)
    assert found and all(not e.misfit for e in found)
    best = found[0]
    assert best.seconds <= min(e.seconds for e in found)
    assert best.dsps <= board.dsp_blocks and best.ram_blocks <= board.ram_blocks
    too_big = board.with_array(16, 32)
    assert resources(too_big, "int8")[0] > board.dsp_blocks  # never among the candidates
    assert (16, 32) not in {(e.board.vec, e.board.lane) for e in found}


def test_a_profile_with_a_missing_or_wrong_field_is_refused_naming_it(tmp_path) -> None:
    text = (Path(__file__).parents[2] / "kernels" / "boards" / "de5net.toml").read_text()
    missing = tmp_path / "missing.toml"
    missing.write_text("\n".join(line for line in text.splitlines()
                                 if not line.startswith("dsp_blocks")))
    with pytest.raises(boards.BoardError, match="field 'dsp_blocks' is missing"):
        boards.load(str(missing))
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(text.replace("lane = 32", "lane = 24"))
    with pytest.raises(boards.BoardError, match="field 'lane' is 24; expected a power of two"):
        boards.load(str(wrong))
    with pytest.raises(boards.BoardError, match="board 'de6' is unknown"):
        boards.load("de6")


def test_hetserve_fpga_plan_prints_an_estimate_per_layer(alexnet) -> None:
    run = subprocess.run([sys.executable, "-m", "service", "fpga", "plan", str(alexnet),
                          "--board", "de5anet", "--batch", "4"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert out.startswith("ESTIMATE (a model of the board, not a measurement)")
    assert "conv" in out and "compute" in out and "GOP/s per W" in out
    assert "not known to the model: the clock after place and route" in out
    bad = subprocess.run([sys.executable, "-m", "service", "fpga", "plan", str(alexnet),
                          "--board", "de5anet", "--batch", "0"], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and "--batch 0" in bad.stderr
