"""What `hetserve tune` writes for a user never follows a link: links planted as its config.pbtxt,
config.pbtxt.orig, report.md and results.json are replaced, their targets untouched; and
root refuses a model or report folder another user owns unless --force. The writers are called
directly with an empty sweep: a sweep itself takes seconds per candidate (test_tune.py)."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from accelerators import safe_files
from accelerators.safe_files import UnsafeFolderError
from service.clients.tune import report, session
from service.clients.tune.measure import Measurement
from service.clients.tune.space import Candidate
from service.clients.tune.sweep import SweepResult
from service.ops.cli import main
from tests.support.daemon import MODEL, MODELS

NOBODY = 65534


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "repository" / MODEL
    shutil.copytree(MODELS / MODEL, folder)
    return folder


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the model's folder (root's, when the tests run as root)."""
    path = tmp_path / "root-owned"
    path.write_text("precious\n")
    return path


def _plan(model_dir: Path, report_dir: Path, force: bool = False) -> session.Plan:
    return session.Plan(
        model=MODEL, model_dir=model_dir, config=None,
        shipped_text=(model_dir / "config.pbtxt").read_text(), devices=[],
        objective="throughput", p99_ms=None, budget_s=1.0, concurrencies=(1,), seconds=1.0,
        clients=1, perf_analyzer=None, serve_args=(), report_dir=report_dir, write=True,
        force=force, command="hetserve tune", started="2026-01-01 00:00", host="test")


def _write_everything(plan: session.Plan) -> None:
    """What a finished `tune --write` writes: the config (in the report and the model's
    folder), its backup and the report."""
    shipped = Measurement(Candidate("onnxruntime:cpu0", 1, None, ()), "shipped")
    safe_files.make_folder(plan.report_dir, plan.force)
    with safe_files.folder(plan.report_dir, plan.force) as folder:
        session._write_config(plan, shipped, "# tuned\n", folder)
    info = report.RunInfo(MODEL, plan.model_dir, "throughput", None, 1.0, "hetserve tune",
                          plan.started, plan.host, "test", [], (1,), 1.0)
    session._finish(plan, info, SweepResult(), Console(file=io.StringIO()))


def test_links_planted_as_its_outputs_are_replaced_and_their_targets_untouched(
        model_dir: Path, tmp_path: Path, victim: Path) -> None:
    shipped = (model_dir / "config.pbtxt").read_text()
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    planted = {report_dir / "config.pbtxt": victim,
               model_dir / "config.pbtxt.orig": tmp_path / "made-through-orig",
               report_dir / "report.md": victim,
               report_dir / "results.json": tmp_path / "made-through-results"}
    for link, target in planted.items():
        link.symlink_to(target)
    _write_everything(_plan(model_dir, report_dir))
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "made-through-orig").exists()
    assert not (tmp_path / "made-through-results").exists()
    assert not any(link.is_symlink() for link in planted)
    assert (model_dir / "config.pbtxt.orig").read_text() == shipped  # a link is no backup
    assert (model_dir / "config.pbtxt").read_text() == "# tuned\n" + shipped
    assert (report_dir / "report.md").read_text() and (report_dir / "results.json").read_text()


def test_a_model_folder_or_config_that_is_a_link_is_refused_before_the_sweep(
        model_dir: Path, tmp_path: Path, victim: Path, capsys: pytest.CaptureFixture) -> None:
    link = tmp_path / "linked-model"
    link.symlink_to(model_dir)
    assert main(["tune", str(link), "--report", str(tmp_path / "report")]) == 2
    assert f"{link} is a symbolic link" in capsys.readouterr().err
    (model_dir / "config.pbtxt").unlink()
    (model_dir / "config.pbtxt").symlink_to(victim)
    assert main(["tune", str(model_dir), "--report", str(tmp_path / "report")]) == 2
    assert "config.pbtxt is a symbolic link" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


def test_root_refuses_folders_another_user_owns_unless_forced(
        model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to give the folders to a second local user (nobody)")
    os.chown(model_dir, NOBODY, NOBODY)
    report_dir = tmp_path / "report"
    assert main(["tune", str(model_dir), "--report", str(report_dir), "--write"]) == 2
    err = capsys.readouterr().err
    assert all(word in err for word in (str(model_dir), "nobody (uid 65534)", "--force"))
    assert not report_dir.exists() and not (model_dir / "config.pbtxt.orig").exists()

    theirs = tmp_path / "their-reports"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    os.chown(model_dir, 0, 0)
    assert main(["tune", str(model_dir), "--report", str(theirs / "mnist")]) == 2
    assert f"--report: {theirs} belongs to nobody" in capsys.readouterr().err

    os.chown(model_dir, NOBODY, NOBODY)  # given away mid-sweep: refused where it is written
    with pytest.raises(UnsafeFolderError, match="--force"):
        _write_everything(_plan(model_dir, tmp_path / "root-report"))
    _write_everything(_plan(model_dir, theirs, force=True))
    assert (theirs / "config.pbtxt").is_file() and (theirs / "report.md").is_file()
