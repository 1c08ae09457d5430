"""The FPGA path on Intel's FPGA Emulation Platform: listed as an emulated fpga beside PoCL with no
set-up, its binary and manifest written by `hetserve fpga build` and served from
HETSERVE_FPGA_BINARIES, binaries it must refuse (no manifest, a stale kernel source, another
device's, other array sizes, another precision) and an emulator whose library is gone, each
refused at load with the next device serving, a board that fails under load failing over without
losing a request, and the daemon ready in bounded time. The pipeline's layers are tested in
test_fpga_pipeline.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pyopencl as cl
import pytest
import tritonclient.grpc as grpcclient

from accelerators.opencl import program_cache
from accelerators.opencl.device import open_device
from accelerators.opencl.engine import OpenCLEngine
from accelerators.opencl.fpga import build as fpga_build
from accelerators.opencl.fpga.build import EMULATOR_BINARY, build
from accelerators.opencl.fpga.manifest import ManifestError, fpga_source, path_of
from accelerators.opencl.program_cache import ProgramCache, kernel_source
from service import contract
from tests.support.daemon import MODEL, MODELS, Daemon, example_repository, image_input
from tests.support.faulty_engine import CONTROL_ENV
from tests.support.metrics import scrape, total
from tests.support.opencl_devices import NO_EMULATOR, emulated_fpga

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
    manifest = json.loads(path_of(tmp_path / "binaries" / EMULATOR_BINARY).read_text())
    assert manifest["board"] == "emulator" and manifest["kernels"] == sorted(
        ["fpga_read", "fpga_conv", "fpga_pool", "fpga_write"])
    assert "fpga_conv" in built.stdout and "HETSERVE_FPGA_BINARIES" in built.stdout
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
                assert parameters[contract.DEVICE_PARAMETER].string_param == \
                    "opencl:fpga0 (emulated)"
        samples = scrape(daemon.metrics_url)
        assert total(samples, "hetserve_inferences_total", device="fpga0", kind="fpga-emulator",
                     engine="opencl") == 9
        assert total(samples, "hetserve_inferences_total", kind="fpga") == 0  # never a board
    finally:
        assert daemon.stop() == 0
    log = (tmp_path / "daemon.log").read_text()
    assert f"loaded FPGA binary {tmp_path / 'binaries' / EMULATOR_BINARY}" in log


def test_for_a_board_the_source_manifest_and_compiler_line_are_given(tmp_path) -> None:
    built = _hetserve("fpga", "build", str(MODELS / MODEL), "--out", str(tmp_path),
                      "--device", "fpga1", "--board", "de5anet")
    assert built.returncode == 0, built.stderr
    source = (tmp_path / "hetserve.cl").read_text()
    assert source == fpga_source() and "gemm_local" not in source  # the FPGA set alone
    assert not (tmp_path / EMULATOR_BINARY).exists()
    aoc, = [line.strip() for line in built.stdout.splitlines() if line.startswith("  ")]
    assert aoc.startswith("aoc -board=de5a_net_ddr4 ") and "-DVEC=16 -DLANE=32" in aoc
    assert aoc.endswith(f"-o {tmp_path / 'de5a_net_ddr4.aocx'}")
    manifest = json.loads((tmp_path / "de5a_net_ddr4.aocx.json").read_text())
    assert manifest["device"] == "de5a_net_ddr4" and manifest["parameters"]["lane"] == 32
    too_big = _hetserve("fpga", "build", str(MODELS / MODEL), "--out", str(tmp_path / "de5"),
                        "--device", "fpga1", "--board", "de5net")  # 8 x 32 in fp32
    assert too_big.returncode == 2 and "308 DSPs" in too_big.stderr
    u50 = tmp_path / "u50.toml"  # the shipped U50's 16 x 64 is sized for int8: 16 x 16 in fp32
    u50.write_text((Path(__file__).parents[2] / "kernels" / "boards" / "alveo_u50.toml")
                   .read_text().replace("lane = 64", "lane = 16"))
    xilinx = _hetserve("fpga", "build", str(MODELS / MODEL), "--out", str(tmp_path / "u50"),
                       "--device", "fpga1", "--board", str(u50))
    vpp, = [line.strip() for line in xilinx.stdout.splitlines() if line.startswith("  ")]
    assert vpp.startswith("v++ -c -t hw --platform xilinx_u50") and "-DXILINX_PIPES" in vpp
    unnamed = _hetserve("fpga", "build", str(MODELS / MODEL), "--out", str(tmp_path),
                        "--device", "fpga1")
    assert unnamed.returncode == 2 and "set HETSERVE_FPGA_BOARD" in unnamed.stderr
    refused = _hetserve("fpga", "build", str(MODELS / MODEL), "--out", str(tmp_path),
                        "--device", "gpu0")
    assert refused.returncode == 2 and "'gpu0' is not an FPGA's name" in refused.stderr


def _binary(tmp_path: Path, device: str) -> Path:
    """A folder holding a program binary built by `device` (PoCL's, of its own kernels) under
    the emulator's binary name, without a manifest."""
    dev = open_device(device)
    folder = tmp_path / f"{device}-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    binary = cl.Program(dev.context, kernel_source()).build().binaries[0]
    (folder / EMULATOR_BINARY).write_bytes(binary)
    return folder


def test_binaries_from_another_build_are_refused_naming_the_field(tmp_path,
                                                                  monkeypatch) -> None:
    """No manifest; a kernel body changed with its names kept (the stale binary that served
    wrong answers); another device's; other array sizes; another precision."""
    def load(folder: Path) -> OpenCLEngine:
        return OpenCLEngine(MNIST, "fpga0", ProgramCache(tmp_path / "cache", folder))

    with pytest.raises(ManifestError, match="has no readable manifest"):
        load(_binary(tmp_path, "cpu0"))
    with monkeypatch.context() as m:  # built from a changed body: the sums scaled
        stale = fpga_source().replace("sums[l][PIPE_DEPTH] = sums[l][0] + dot;",
                                      "sums[l][PIPE_DEPTH] = sums[l][0] + 2 * dot;")
        assert stale != fpga_source()
        for module in (fpga_build, program_cache):
            m.setattr(module, "fpga_source", lambda: stale)
        build(MNIST, tmp_path / "stale")
    with pytest.raises(ManifestError, match="built with source_sha256"):
        load(tmp_path / "stale")
    other = build(MNIST, tmp_path / "other-device")
    manifest = json.loads(other.manifest.read_text())
    other.manifest.write_text(json.dumps({**manifest, "device": "AMD EPYC"}))
    with pytest.raises(ManifestError, match='built with device "AMD EPYC"'):
        load(tmp_path / "other-device")
    build(MNIST, tmp_path / "arria10", board="de5anet")  # the DE5a-Net's 16 x 32 array
    with pytest.raises(ManifestError, match="built with options .*-DVEC=16 -DLANE=32"):
        load(tmp_path / "arria10")
    build(MNIST, tmp_path / "half", precision="fp16")
    with pytest.raises(ManifestError, match="built with options .*-DHALF_STORAGE"):
        load(tmp_path / "half")
    good = build(MNIST, tmp_path / "good")  # the build the engine would make: accepted
    assert load(good.binary.parent).program.binaries[0] == good.binary.read_bytes()


def test_a_bad_binary_or_a_missing_emulator_leaves_the_next_device_serving(
        tmp_path, monkeypatch, holdout) -> None:
    """A foreign binary; then the emulator's library gone (its ICD names a missing file)."""
    repo = example_repository(tmp_path, "opencl:fpga0, onnxruntime:cpu0")
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    shutil.copy("/etc/OpenCL/vendors/pocl.icd", vendors)
    (vendors / "emulator.icd").write_text(f"{tmp_path / 'gone' / 'libintelocl_emu.so'}\n")
    cases = {"has no readable manifest": {
        "HETSERVE_FPGA_BINARIES": str(_binary(tmp_path, "cpu0"))},
             "no such device: opencl:fpga0; this node has": {"OCL_ICD_VENDORS": str(vendors)}}
    for cause, env in cases.items():
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            run = tmp_path / cause.split()[-1].strip("'")
            run.mkdir()
            daemon = Daemon(run, repo)
            try:
                with grpcclient.InferenceServerClient(daemon.url) as client:
                    reply = client.infer(MODEL, image_input(holdout[0][:4]))
                assert reply.get_response().parameters[
                    contract.DEVICE_PARAMETER].string_param == "onnxruntime:cpu0"
            finally:
                assert daemon.stop() == 0
            lines = [line for line in (run / "daemon.log").read_text().splitlines()
                     if "cannot run on opencl:fpga0" in line]
            assert len(lines) == 1 and cause in lines[0], lines


def _control(path: Path, **values) -> None:
    path.write_text(json.dumps(values))


def test_a_board_that_fails_under_load_fails_over_without_losing_a_request(
        tmp_path, monkeypatch, holdout) -> None:
    """The real emulated fpga0 with a fault injected (tests/support/faulty_engine.py): it fails
    every batch from some point while four clients send; each request still gets its right
    answer, from the next device."""
    control = tmp_path / "control.json"
    _control(control)
    monkeypatch.setenv(CONTROL_ENV, str(control))
    repo = example_repository(tmp_path, "faulty-opencl:fpga0, onnxruntime:cpu0")
    daemon = Daemon(tmp_path, repo, "--engine-modules", "tests.support.faulty_engine")
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
    assert "opencl:fpga0 (emulated)" in answers and "onnxruntime:cpu0" in answers
    assert total(samples, "hetserve_failovers_total", device="fpga0") >= 1


def test_a_board_that_fails_its_warm_up_is_dropped_and_the_next_device_serves(
        tmp_path, monkeypatch, holdout) -> None:
    control = tmp_path / "control.json"
    _control(control, fail=True)
    monkeypatch.setenv(CONTROL_ENV, str(control))
    repo = example_repository(tmp_path, "faulty-opencl:fpga0, onnxruntime:cpu0")
    daemon = Daemon(tmp_path, repo, "--engine-modules", "tests.support.faulty_engine")
    try:
        with grpcclient.InferenceServerClient(daemon.url) as client:
            config = client.get_model_config(MODEL).config
            reply = client.infer(MODEL, image_input(holdout[0][:2]))
        assert config.parameters["devices"].string_value == "onnxruntime:cpu0"
        assert reply.get_response().parameters[contract.DEVICE_PARAMETER].string_param == \
            "onnxruntime:cpu0"
    finally:
        assert daemon.stop() == 0
    lines = [line for line in (tmp_path / "daemon.log").read_text().splitlines()
             if "failed its warm-up and is dropped" in line]
    assert len(lines) == 1 and "opencl:fpga0" in lines[0] and "simulated" in lines[0]


def test_the_daemon_is_ready_within_a_minute_each_bucket_warmed_once(tmp_path) -> None:
    """The example model on the pipeline alone: its 8 buckets (1 to 128) each run once at
    warm-up, not twice on every instance, so the emulator's slow single work-item loops
    still leave the daemon ready in well under a minute on 2 cores."""
    repo = example_repository(tmp_path, "opencl:fpga0")
    start = time.monotonic()
    daemon = Daemon(tmp_path, repo)
    try:
        ready_s = time.monotonic() - start
        samples = scrape(daemon.metrics_url)
    finally:
        assert daemon.stop() == 0
    assert ready_s < 60
    assert total(samples, "hetserve_opencl_plans_total", device="fpga0", event="built") == 8
