"""A timer that wakes the event loop at its deadline to the microsecond. asyncio's own timers end
in epoll's timeout, which counts whole milliseconds (a 500 µs wait takes 1.1 ms); a Linux
timerfd becomes readable at its deadline instead, and the loop watches it like a socket: no
thread, one system call to arm it. (os.timerfd_create is Python 3.13's; this is the same call
through ctypes.)"""

from __future__ import annotations

import asyncio
import ctypes
import os
from collections.abc import Callable

_CLOCK_MONOTONIC = 1  # time.monotonic(), which is asyncio's loop.time()
_TFD_CLOEXEC, _TFD_NONBLOCK, _TFD_TIMER_ABSTIME = 0o2000000, 0o4000, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)


class PreciseTimer:
    """Calls `on_deadline` in the event loop when loop.time() reaches the armed deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_deadline: Callable[[], None]) -> None:
        self._fd = _libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_CLOEXEC | _TFD_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._loop, self._on_deadline = loop, on_deadline
        self._spec = _Itimerspec()  # reused: building one costs more than the system call
        self._pointer = ctypes.byref(self._spec)
        self._armed = False
        loop.add_reader(self._fd, self._fired)

    def arm(self, deadline: float) -> None:
        """At `deadline` (loop.time()); a deadline already past fires at once."""
        seconds = max(deadline, 1e-9)  # zero would disarm it
        self._spec.it_value.tv_sec = int(seconds)
        self._spec.it_value.tv_nsec = int(seconds % 1 * 1e9) or 1
        self._set()
        self._armed = True

    def disarm(self) -> None:
        if self._armed:  # else it fired already: nothing to undo
            self._spec.it_value.tv_sec = self._spec.it_value.tv_nsec = 0
            self._set()
            self._armed = False

    def _set(self) -> None:
        if _libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, self._pointer, None) < 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiry count: reading it makes the fd quiet again
        except BlockingIOError:  # disarmed or re-armed after it became readable
            return
        self._armed = False
        self._on_deadline()

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
