"""The one writer of files on a user's behalf: a link planted under a target's name is replaced,
never written through; a folder that is a link is refused; root refuses another user's folder
unless forced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from accelerators.safe_files import (
    UnsafeFolderError,
    folder,
    make_folder,
    open_at,
    open_log,
    read_at,
    write_file,
)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


def test_a_link_under_the_target_s_name_is_replaced_not_followed(tmp_path: Path,
                                                                  victim: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").symlink_to(victim)
    (out / "results.json").symlink_to(tmp_path / "never-made")
    write_file(out / "report.md", "# report\n")
    write_file(out / "results.json", b"{}")
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "never-made").exists()
    assert not (out / "report.md").is_symlink() and (out / "report.md").read_text() == "# report\n"
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "results.json"]  # no leftovers


def test_logs_and_reads_never_go_through_a_link(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "daemon.log").symlink_to(victim)
    with pytest.raises(UnsafeFolderError, match="daemon.log is a symbolic link"):
        open_log(tmp_path / "daemon.log")
    with folder(tmp_path) as fd, pytest.raises(UnsafeFolderError):
        read_at(fd, "daemon.log")
    os.close(open_log(tmp_path / "fresh.log"))
    assert (tmp_path / "fresh.log").stat().st_mode & 0o777 == 0o600
    assert victim.read_text() == "precious\n"
    with folder(tmp_path) as fd:
        os.close(open_at(fd, "fresh.log", os.O_RDONLY))


def test_a_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafeFolderError, match="link is a symbolic link"):
        write_file(tmp_path / "link" / "report.md", "x")
    assert not (tmp_path / "real" / "report.md").exists()


def test_root_refuses_another_user_s_folder_unless_forced(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to give the folder to a second local user (nobody)")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UnsafeFolderError) as refused:
        write_file(theirs / "report.md", "x", flag="--force")
    assert all(word in str(refused.value) for word in (str(theirs), "nobody", "--force"))
    assert not (theirs / "report.md").exists()
    with pytest.raises(UnsafeFolderError):
        make_folder(theirs / "out" / "deeper")  # nor a folder made in theirs
    assert not (theirs / "out").exists()
    write_file(theirs / "report.md", "x", force=True)
    assert (theirs / "report.md").read_text() == "x"
