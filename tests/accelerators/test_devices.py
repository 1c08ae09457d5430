"""Device discovery on the real OpenCL stack (PoCL here) and the classification rules."""

from __future__ import annotations

import json
import subprocess
import sys

import pyopencl as cl
import pytest

from accelerators.devices import classify, format_table
from accelerators.engine_factory import DeviceSpec, create_engine, device_specs
from accelerators.opencl.device import NoSuchDeviceError, find_device
from tests.support.daemon import MODEL, MODELS

T = cl.device_type


@pytest.mark.parametrize("platform, device, bits, kind", [
    ("Intel(R) FPGA SDK for OpenCL(TM)", "pac_a10 : Intel PAC", T.ACCELERATOR, "fpga"),
    ("Intel(R) FPGA Emulation Platform for OpenCL(TM)", "Intel FPGA Emulation Device",
     T.ACCELERATOR, "fpga"),
    ("Xilinx", "xilinx_u250_gen3x16_xdma_shell_4_1", T.ACCELERATOR, "fpga"),
    ("NVIDIA CUDA", "NVIDIA H100", T.GPU, "gpu"),
    ("Portable Computing Language", "pthread-skylake-avx512", T.CPU, "cpu"),
    # Oclgrind sets every type bit: its names decide.
    ("Oclgrind", "Oclgrind Simulator", T.ALL, "other"),
    ("Oclgrind", "Oclgrind CPU Simulator", T.CPU | T.GPU | T.ACCELERATOR, "cpu"),
])
def test_classification(platform, device, bits, kind) -> None:
    assert classify(platform, device, bits) == kind


def test_devices_command_lists_pocl_and_onnxruntime() -> None:
    listed = json.loads(subprocess.run(
        [sys.executable, "-m", "service", "devices", "--json"],
        capture_output=True, text=True, check=True).stdout)
    pocl = [d for d in listed["opencl"] if d["platform"] == "Portable Computing Language"]
    assert pocl and all(d["kind"] == "cpu" and d["compute_units"] >= 1 for d in pocl)
    assert {"provider": "CPUExecutionProvider", "kind": "cpu"} in listed["onnxruntime"]
    table = subprocess.run([sys.executable, "-m", "service", "devices"],
                           capture_output=True, text=True, check=True).stdout
    assert "Portable Computing Language" in table and "CPUExecutionProvider" in table
    # Each row opens with the id a model's `devices` parameter takes.
    ids = [d["id"] for d in listed["opencl"]] + [d["id"] for d in listed["onnxruntime_devices"]]
    assert "onnxruntime:cpu0" in ids and pocl[0]["id"].startswith("opencl:cpu")
    rows = [line.split()[0] for line in table.splitlines()[1:len(ids) + 1]]
    assert rows == ids and [str(s) for s in device_specs(listed)] == ids


def test_a_device_this_node_lacks_is_refused_naming_those_it_has() -> None:
    with pytest.raises(NoSuchDeviceError, match=r"no such device: opencl:cpu9; this node has "
                                                r"opencl:cpu0.*\(`hetserve devices`"):
        find_device("cpu9")
    with pytest.raises(ValueError, match=r"no such device: onnxruntime:gpu9; this node has "):
        create_engine(DeviceSpec("onnxruntime", "gpu9"), MODELS / MODEL / "1" / "model.onnx")


def test_the_models_table_says_slow_devices_are_learned_from_traffic_not_here() -> None:
    table = format_table({"opencl": [], "onnxruntime": [], "onnxruntime_devices": [],
                          "models": {"opencl:cpu0": {"mnist_cnn": "yes"}}})
    assert table.splitlines()[-2].split() == ["opencl:cpu0", "mnist_cnn", "yes"]
    assert "learned from the batches a daemon serves, each device tried even under light " \
        "load unless prefer_order is strict: hetserve_device_demoted and the daemon's log, " \
        "not known here" in table.splitlines()[-1]
