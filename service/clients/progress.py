"""The progress display of `hetserve tune` and every long benchmark (rich, on stderr): a live bar
on a terminal; elsewhere (piped, a CI log) plain lines, so that a long wait still says what it is
doing without a spinner's frames."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

_STEPS = 10  # lines per task where only its count advances: one per tenth done


def progress_bar(console: Console) -> Progress:
    if console.is_terminal:
        return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console)
    return _Lines(console)


class _Lines(Progress):
    """One line per new task or step, and per tenth of a task's total done."""

    def __init__(self, console: Console) -> None:
        super().__init__(console=console, disable=True)  # no live display: lines instead
        self._started = time.monotonic()
        self._shown: dict[TaskID, int] = {}  # tenths of the total already shown

    def add_task(self, description: str, *args, **kwargs) -> TaskID:
        task = super().add_task(description, *args, **kwargs)
        self._line(task)
        return task

    def update(self, task_id: TaskID, *, description: str | None = None,
               **kwargs) -> None:
        changed = description is not None and description != self._tasks[task_id].description
        super().update(task_id, description=description, **kwargs)
        if changed:
            self._line(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        task = self._tasks[task_id]
        if task.total:
            tenths = int(_STEPS * task.completed / task.total)
            if tenths > self._shown.get(task_id, 0):
                self._shown[task_id] = tenths
                self._line(task_id)

    def _line(self, task_id: TaskID) -> None:
        task = self._tasks[task_id]
        done = f" ({task.completed:g}/{task.total:g})" if task.total else ""
        self.console.print(f"[{time.monotonic() - self._started:6.1f} s] {task.description}{done}",
                           markup=False, highlight=False)
