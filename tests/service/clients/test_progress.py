"""Progress where no terminal is (a pipe, a CI log): plain lines per step and per tenth done."""

from __future__ import annotations

import io

from rich.console import Console

from service.clients.progress import progress_bar


def test_piped_progress_is_a_line_per_step_and_per_tenth() -> None:
    out = io.StringIO()
    with progress_bar(Console(file=out)) as bar:
        task = bar.add_task("starting", total=20)
        bar.update(task, description="shipped: onnxruntime:cpu0")
        bar.update(task, description="shipped: onnxruntime:cpu0")  # the same step: no line
        for _ in range(20):
            bar.advance(task)
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines[:2] == ["starting (0/20)", "shipped: onnxruntime:cpu0 (0/20)"]
    assert lines[2:] == [f"shipped: onnxruntime:cpu0 ({n}/20)" for n in range(2, 21, 2)]
    assert "\x1b" not in out.getvalue()  # no spinner, no cursor movement
