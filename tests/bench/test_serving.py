"""Pieces of bench/serving.py: server CPU over a process tree (from a /proc written here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.serving import process_tree_cpu_s

TICK = os.sysconf("SC_CLK_TCK")


def _stat(proc: Path, pid: int, ppid: int, utime: int, stime: int, cutime: int = 0,
          cstime: int = 0, name: str = "python3") -> None:
    (proc / str(pid)).mkdir(parents=True)
    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime ...; a comm may hold spaces and parentheses
    fields = ["S", ppid, 1, 1, 0, -1, 0, 0, 0, 0, 0, utime, stime, cutime, cstime, 20, 0, 1]
    (proc / str(pid) / "stat").write_text(f"{pid} ({name}) " + " ".join(map(str, fields)))


def test_server_cpu_counts_the_process_its_descendants_and_their_reaped_children(
        tmp_path: Path) -> None:
    _stat(tmp_path, 100, 1, 10 * TICK, 2 * TICK, cutime=3 * TICK)  # the server
    _stat(tmp_path, 101, 100, 4 * TICK, 1 * TICK, name="worker (1) x")  # a child
    _stat(tmp_path, 102, 101, 1 * TICK, 0, cstime=1 * TICK)  # a grandchild
    _stat(tmp_path, 200, 1, 50 * TICK, 50 * TICK)  # another program
    _stat(tmp_path, 201, 200, 5 * TICK, 5 * TICK)  # and its child
    assert process_tree_cpu_s(100, tmp_path) == pytest.approx(10 + 2 + 3 + 4 + 1 + 1 + 1)
    assert process_tree_cpu_s(101, tmp_path) == pytest.approx(4 + 1 + 1 + 1)
    assert process_tree_cpu_s(999, tmp_path) == 0.0  # gone


def test_server_cpu_of_this_process_is_read_from_the_real_proc() -> None:
    assert process_tree_cpu_s(os.getpid()) > 0

