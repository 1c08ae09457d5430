"""Device discovery on the real OpenCL stack (PoCL here) and the classification rules."""

from __future__ import annotations

import json
import subprocess
import sys

import pyopencl as cl
import pytest

from accelerators.devices import classify

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
