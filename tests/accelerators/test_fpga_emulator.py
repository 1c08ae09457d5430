"""The FPGA path on Intel's FPGA Emulation Platform: listed as an emulated fpga beside PoCL with no
set-up, its binary written by `hetserve fpga build` and served from HETSERVE_FPGA_BINARIES,
binaries it must refuse (another device's, one lacking kernels, one built for another storage)
and an emulator whose library is gone, each refused at load with the next device serving, and
a board that fails under load failing over without losing a request. The kernels themselves run
on fpga0 in every OpenCL test (conftest.py's devices under test)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from importlib import resources
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pyopencl as cl
import pytest
import tritonclient.grpc as grpcclient

from accelerators.opencl.device import open_device
from accelerators.opencl.engine import OpenCLEngine
from accelerators.opencl.fpga_build import EMULATOR_BINARY
from accelerators.opencl.program_cache import (
    BadBinaryError,
    MissingKernelsError,
    ProgramCache,
    kernel_source,
)
from service import contract
from tests.accelerators.conftest import NO_EMULATOR, emulated_fpga
from tests.conftest import MODEL, MODELS, Daemon, example_repository, image_input
from tests.service.conftest import scrape, total
from tests.service.faulty_engine import CONTROL_ENV

pytestmark = pytest.mark.skipif(emulated_fpga() is None, reason=NO_EMULATOR)
MNIST = MODELS / MODEL / "1" / "model.onnx"
# Loader variables a parent may have set; the commands below must find the emulator without them.
LOADER_ENV = ("OCL_ICD_VENDORS", "OPENCL_VENDOR_PATH", "HETSERVE_ICD_VENDORS")


def _hetserve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in LOADER_ENV}
    return subprocess.run([sys.executable, "-m", "service", *args], capture_output=True,
                          text=True, env={**clean, **(env or {})}, timeout=300)


def _reference(images: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(MNIST), providers=["CPUExecutionProvider"])
    return session.run(None, {"image": images})[0]


def test_the_emulator_is_an_emulated_fpga_beside_pocl_with_nothing_set() -> None:
    listed = _hetserve("devices", "--json")
    assert listed.returncode == 0, listed.stderr
    devices = json.loads(listed.stdout)["opencl"]
    fpgas = [d for d in devices if d["kind"] == "fpga"]
    assert [d["emulated"] for d in fpgas] == [True]
    assert "Emulation" in fpgas[0]["platform"]
    pocl = [d for d in devices if d["platform"] == "Portable Computing Language"]
    assert pocl and pocl[0] is next(d for d in devices if d["kind"] == "cpu")  # still cpu0
    table = _hetserve("devices").stdout
    assert "fpga*" in table and "emulated: runs the FPGA kernels on the CPU" in table


def test_a_loader_folder_the_user_chose_is_left_alone(tmp_path) -> None:
    shutil.copy("/etc/OpenCL/vendors/pocl.icd", tmp_path)
    listed = _hetserve("devices", "--json", env={"OCL_ICD_VENDORS": str(tmp_path)})
    kinds = [d["kind"] for d in json.loads(listed.stdout)["opencl"]]
    assert kinds == ["cpu"]


def test_a_built_binary_is_served_from_hetserve_fpga_binaries(tmp_path, monkeypatch,
                                                              holdout) -> None:
    repo = example_repository(tmp_path, "opencl:fpga0")
    built = _hetserve("fpga", "build", str(repo / MODEL), "--out", str(tmp_path / "binaries"))
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "binaries" / EMULATOR_BINARY).stat().st_size > 0
    assert "conv_local" in built.stdout and "HETSERVE_FPGA_BINARIES" in built.stdout
    monkeypatch.setenv("HETSERVE_FPGA_BINARIES", str(tmp_path / "binaries"))
    daemon = Daemon(tmp_path, repo)
    try:
        images = holdout[0][:9]
        with grpcclient.InferenceServerClient(daemon.url) as client:
            for lo, hi in ((0, 1), (1, 9)):
                reply = client.infer(MODEL, image_input(images[lo:hi]))
                got, ref = reply.as_numpy("logits"), _reference(images[lo:hi])
                assert np.abs(got - ref).max() <= 1e-3 * np.abs(ref).max()
                parameters = reply.get_response().parameters
                assert parameters[contract.DEVICE_PARAMETER].string_param == "fpga0 (emulated)"
        samples = scrape(daemon.metrics_url)
        assert total(samples, "hetserve_inferences_total", device="fpga0", kind="fpga-emulator",
                     engine="opencl") == 9
        assert total(samples, "hetserve_inferences_total", kind="fpga") == 0  # never a board
    finally:
        assert daemon.stop() == 0
    log = (tmp_path / "daemon.log").read_text()
    assert f"loaded FPGA binary {tmp_path / 'binaries' / EMULATOR_BINARY}" in log


def test_for_a_board_the_source_and_the_compiler_lines_are_given(tmp_path) -> None:
    built = _hetserve("fpga", "build", str(MODELS / MODEL), "--out", str(tmp_path),
                      "--device", "fpga1", "--pipelined")
    assert built.returncode == 0, built.stderr
    assert "__kernel" in (tmp_path / "hetserve.cl").read_text()
    assert not (tmp_path / EMULATOR_BINARY).exists()
    aoc, vpp = [line.strip() for line in built.stdout.splitlines() if line.startswith("  ")]
    assert aoc.startswith("aoc -board=<board> ") and "-DPIPELINED -DINTEL_CHANNELS" in aoc
    assert vpp.startswith("v++ -c -t hw") and "-DPIPELINED -DXILINX_PIPES" in vpp
    for line in (aoc, vpp):
        assert "-DTS=32 -DWPT=8" in line  # the tiles the engine plans an FPGA's launches by
    assert "pipe_conv_mac" in built.stdout
    refused = _hetserve("fpga", "build", str(MODELS / MODEL), "--out", str(tmp_path),
                        "--device", "gpu0")
    assert refused.returncode == 2 and "'gpu0' is not an FPGA's name" in refused.stderr


def _binary(tmp_path: Path, device: str, options: str = "", files: tuple[str, ...] = ()) -> Path:
    """A program binary built by `device` (all kernels, or those of `files`) as a board's."""
    dev = open_device(device)
    source = "".join(resources.files("kernels").joinpath(f).read_text()
                     for f in files) if files else kernel_source()
    folder = tmp_path / f"{device}-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    binary = cl.Program(dev.context, source).build(options).binaries[0]
    (folder / EMULATOR_BINARY).write_bytes(binary)
    return folder


def test_binaries_the_board_cannot_use_are_refused_naming_file_and_kernels(tmp_path) -> None:
    def load(folder: Path) -> OpenCLEngine:
        return OpenCLEngine(MNIST, "fpga0", ProgramCache(tmp_path / "cache", folder))

    foreign = _binary(tmp_path, "cpu0")  # PoCL's binary
    with pytest.raises(BadBinaryError, match=f"refuses the binary {foreign / EMULATOR_BINARY}"):
        load(foreign)
    partial = _binary(tmp_path, "fpga0", files=("common.cl", "elementwise.cl"))
    with pytest.raises(MissingKernelsError, match=rf"from {partial / EMULATOR_BINARY}\) lacks "
                                                  r"kernels \['conv_local', 'gemm_local', "):
        load(partial)
    half = _binary(tmp_path, "fpga0", "-DHALF_STORAGE -DTS=32 -DWPT=8")
    with pytest.raises(MissingKernelsError, match=r"lacks kernels \['storage_fp32'\]"):
        load(half)  # an fp16 build for an fp32 model: refused, not read as floats


def test_a_bad_binary_or_a_missing_emulator_leaves_the_next_device_serving(
        tmp_path, monkeypatch, holdout) -> None:
    """A foreign binary; then the emulator's library gone (its ICD names a missing file)."""
    repo = example_repository(tmp_path, "opencl:fpga0, onnxruntime:cpu0")
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    shutil.copy("/etc/OpenCL/vendors/pocl.icd", vendors)
    (vendors / "emulator.icd").write_text(f"{tmp_path / 'gone' / 'libintelocl_emu.so'}\n")
    cases = {"refuses the binary": {"HETSERVE_FPGA_BINARIES": str(_binary(tmp_path, "cpu0"))},
             "'fpga0' does not exist": {"OCL_ICD_VENDORS": str(vendors)}}
    for cause, env in cases.items():
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            run = tmp_path / cause.split()[0].strip("'")
            run.mkdir()
            daemon = Daemon(run, repo)
            try:
                with grpcclient.InferenceServerClient(daemon.url) as client:
                    reply = client.infer(MODEL, image_input(holdout[0][:4]))
                assert reply.get_response().parameters[
                    contract.DEVICE_PARAMETER].string_param == "cpu0"
            finally:
                assert daemon.stop() == 0
            lines = [line for line in (run / "daemon.log").read_text().splitlines()
                     if "cannot run on opencl:fpga0" in line]
            assert len(lines) == 1 and cause in lines[0], lines


def _control(path: Path, **values) -> None:
    path.write_text(json.dumps(values))


def test_a_board_that_fails_under_load_fails_over_without_losing_a_request(
        tmp_path, monkeypatch, holdout) -> None:
    """The real emulated fpga0 with a fault injected (tests/service/faulty_engine.py): it fails
    every batch from some point while four clients send; each request still gets its right
    answer, from the next device."""
    control = tmp_path / "control.json"
    _control(control)
    monkeypatch.setenv(CONTROL_ENV, str(control))
    repo = example_repository(tmp_path, "faulty-opencl:fpga0, onnxruntime:cpu0")
    daemon = Daemon(tmp_path, repo, "--engine-modules", "tests.service.faulty_engine")
    images = holdout[0][:8]
    ref = _reference(images)
    answers: list[str] = []
    errors: list[Exception] = []

    def client_loop(offset: int) -> None:
        with grpcclient.InferenceServerClient(daemon.url) as client:
            for i in range(40):
                k = (offset + i) % 8
                try:
                    reply = client.infer(MODEL, image_input(images[k:k + 1]))
                    assert np.abs(reply.as_numpy("logits") - ref[k:k + 1]).max() <= 1e-3 * \
                        np.abs(ref[k]).max()
                    answers.append(reply.get_response().parameters[
                        contract.DEVICE_PARAMETER].string_param)
                except Exception as e:  # counted: the test asserts there are none
                    errors.append(e)
                if i == 10 and offset == 0:
                    _control(control, fail=True)

    try:
        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        samples = scrape(daemon.metrics_url)
    finally:
        assert daemon.stop() == 0
    assert errors == [] and len(answers) == 160
    assert "fpga0 (emulated)" in answers and "cpu0" in answers
    assert total(samples, "hetserve_failovers_total", device="fpga0") >= 1


def test_a_board_that_fails_its_warm_up_is_dropped_and_the_next_device_serves(
        tmp_path, monkeypatch, holdout) -> None:
    control = tmp_path / "control.json"
    _control(control, fail=True)
    monkeypatch.setenv(CONTROL_ENV, str(control))
    repo = example_repository(tmp_path, "faulty-opencl:fpga0, onnxruntime:cpu0")
    daemon = Daemon(tmp_path, repo, "--engine-modules", "tests.service.faulty_engine")
    try:
        with grpcclient.InferenceServerClient(daemon.url) as client:
            config = client.get_model_config(MODEL).config
            reply = client.infer(MODEL, image_input(holdout[0][:2]))
        assert config.parameters["devices"].string_value == "onnxruntime:cpu0"
        assert reply.get_response().parameters[contract.DEVICE_PARAMETER].string_param == "cpu0"
    finally:
        assert daemon.stop() == 0
    lines = [line for line in (tmp_path / "daemon.log").read_text().splitlines()
             if "failed its warm-up and is dropped" in line]
    assert len(lines) == 1 and "opencl:fpga0" in lines[0] and "simulated" in lines[0]
