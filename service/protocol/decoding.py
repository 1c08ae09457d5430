"""Decoding too slow for the event loop (a large JSON body, many typed values), done in a process
of its own at a lower CPU priority: a caller who sends such requests back to back no longer holds
the loop that answers every other request. Each caller has one decode in that process at a time
and waits its turn for the next (in order), so that one caller's decodes never queue ahead of
another's. The process starts at the first such request and ends with the daemon."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
from collections.abc import Callable
from typing import TypeVar

from service.errors import Status, StatusError
from service.parent_death import end_with

T = TypeVar("T")
NICENESS = 10  # the decoder yields the CPUs to the event loops and devices when they need them


class DecodePool:
    def __init__(self) -> None:
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # each caller's, while it waits

    async def run(self, caller: str, work: Callable[..., T], *args: object) -> T:
        """`work(*args)` in the decoding process, after `caller`'s earlier decodes; what it
        raises is raised here (errors pickle by their message)."""
        turn, waiting = self._turns.get(caller, (asyncio.Lock(), 0))
        self._turns[caller] = (turn, waiting + 1)
        try:
            async with turn:
                done = asyncio.wrap_future(self._submit(work, args))
                try:
                    return await asyncio.shield(done)
                except asyncio.CancelledError:
                    # The caller has gone: its turn ends with its work, so that the process
                    # never holds more than one decode of a caller, however fast it cancels.
                    await asyncio.wait([done])
                    raise
                except concurrent.futures.process.BrokenProcessPool:
                    self.close()  # the next decode starts a new process
                    raise StatusError(Status.UNAVAILABLE, "the decoding process ended; send "
                                      "the request again") from None
        finally:
            turn, waiting = self._turns[caller]
            if waiting == 1:
                del self._turns[caller]
            else:
                self._turns[caller] = (turn, waiting - 1)

    def _submit(self, work: Callable[..., T], args: tuple) -> concurrent.futures.Future[T]:
        try:
            return self._pool().submit(work, *args)
        except concurrent.futures.process.BrokenProcessPool:  # it ended while idle: a new one
            self.close()
            return self._pool().submit(work, *args)

    def _pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ProcessPoolExecutor(
                1, multiprocessing.get_context("spawn"), _started, (os.getpid(),))
        return self._executor

    def close(self) -> None:
        """Ends the process; decodes in progress fail."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _started(parent: int) -> None:
    """In the decoding process: it ends with the daemon, and gives way to it."""
    end_with(parent)
    os.nice(NICENESS)
