"""accelerators/icd.py: the folder of ICD files that makes pip-installed OpenCL runtimes visible,
written once, content-addressed, only where the user chose no loader folder and the runtime is
not installed system-wide. Run against a fake environment prefix; the real one is exercised by
test_fpga_emulator.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelerators import icd
from tests.support.daemon import MODELS

LOADER_ENV = ("OCL_ICD_VENDORS", "OPENCL_VENDOR_PATH", "HETSERVE_ICD_VENDORS",
              icd.EMULATOR_THREADS)


@pytest.fixture
def prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in LOADER_ENV:  # set first, so that what register() sets is undone after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    system = tmp_path / "etc-vendors"
    system.mkdir()
    (system / "pocl.icd").write_text("libpocl.so.2\n")
    monkeypatch.setattr(icd, "SYSTEM_VENDORS", system)
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "venv" / "lib" / icd.EMULATOR_LIBRARY).write_bytes(b"")
    return tmp_path / "venv"


def test_the_systems_icds_and_the_installed_runtime_in_one_folder(prefix, tmp_path) -> None:
    folder = icd.register(prefix, tmp_path / "state")
    assert folder is not None and folder.parent == tmp_path / "state"
    assert {p.name: p.read_text() for p in folder.iterdir()} == {
        "system-pocl.icd": "libpocl.so.2\n",
        f"zz-hetserve-{icd.EMULATOR_LIBRARY}.icd": f"{prefix / 'lib' / icd.EMULATOR_LIBRARY}\n"}
    assert os.environ["OCL_ICD_VENDORS"] == str(folder)
    assert icd.register(prefix, tmp_path / "state") == folder  # a child process reuses it
    assert folder.stat().st_mode & 0o022 == 0
    assert int(os.environ[icd.EMULATOR_THREADS]) >= 4  # not the emulator's 32 on a small node


def test_a_users_loader_folder_or_a_system_install_is_left_alone(prefix, tmp_path,
                                                                monkeypatch) -> None:
    monkeypatch.setenv("OCL_ICD_VENDORS", "/opt/my-vendors")
    assert icd.register(prefix, tmp_path / "state") is None
    monkeypatch.delenv("OCL_ICD_VENDORS")
    (icd.SYSTEM_VENDORS / "intel-fpga.icd").write_text(f"/opt/intel/{icd.EMULATOR_LIBRARY}\n")
    assert icd.register(prefix, tmp_path / "state") is None
    assert "OCL_ICD_VENDORS" not in os.environ


def test_nothing_installed_adds_nothing(prefix, tmp_path) -> None:
    (prefix / "lib" / icd.EMULATOR_LIBRARY).unlink()
    assert icd.register(prefix, tmp_path / "state") is None


def test_a_folder_someone_else_planted_is_not_used(prefix, tmp_path, monkeypatch,
                                                  caplog) -> None:
    state = tmp_path / "state"
    folder = icd.register(prefix, state)
    folder.chmod(0o777)  # writable by others: not ours to trust
    for name in ("OCL_ICD_VENDORS", "HETSERVE_ICD_VENDORS"):
        monkeypatch.delenv(name)  # a new process tree
    assert icd.register(prefix, state) is None  # the system's devices alone
    assert "OCL_ICD_VENDORS" not in os.environ
    assert "is not a folder of this user's" in caplog.text


@pytest.mark.parametrize("planted", ["icd folder", "library folder"])
def test_the_daemon_refuses_at_start_an_icd_folder_or_library_folder_others_may_write(
        tmp_path: Path, planted: str) -> None:
    """A .icd file planted there, or a library swapped beside one it names, would load into a
    daemon that may run as root."""
    vendors, libraries = tmp_path / "vendors", tmp_path / "lib"
    for folder in (vendors, libraries):
        folder.mkdir()
        folder.chmod(0o755)
    (vendors / "planted.icd").write_text(f"{libraries / 'libplanted.so'}\n")
    shared = vendors if planted == "icd folder" else libraries
    shared.chmod(0o777)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETSERVE_")}
    done = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--models", str(MODELS), "--port", "0",
         "--socket", str(tmp_path / "grpc.sock"), "--metrics-port", "0"],
        env=env | {"OCL_ICD_VENDORS": str(vendors)}, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    expected = ("the OpenCL ICD folder ($OCL_ICD_VENDORS)" if planted == "icd folder" else
                f"the OpenCL library that {vendors / 'planted.icd'} names")
    assert expected in done.stderr and f"{shared} belongs to" in done.stderr
    assert "mode 0777" in done.stderr
