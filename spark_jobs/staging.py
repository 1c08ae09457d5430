"""The executor-side client's POSIX shared memory (Triton's system shared memory extension):
the samples of a call go into one region that the daemon on this node reads its requests'
tensors from, instead of receiving the bytes inside the messages."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

log = logging.getLogger(__name__)
# Addresses of daemons on this node, which can read the job's shared memory.
LOCAL_ADDRESSES = ("unix:", "127.", "localhost:", "[::1]:")
SHM_ROOT = Path("/dev/shm")
PREFIX = "hetserve-spark-"  # then the creating worker's pid: hetserve-spark-<pid>-<random>


class Regions:
    """This worker's POSIX shared memory regions, kept from call to call: a fresh region's
    first writes fault in and zero every page (about ten times the cost of the copy itself), a
    kept one's pages stay mapped. A call takes one at least as large as its samples (a smaller
    free one is replaced); at most `kept` of at most `kept_bytes` each wait free (a task has
    two calls running), the rest are unlinked when their call ends. A worker that ends without
    unlinking its regions (Spark stops Python workers, and with them multiprocessing's resource
    trackers, by SIGHUP to their process group) leaves them to the next one that creates a
    region on the node: see unlink_orphans."""

    def __init__(self, kept: int = 2, kept_bytes: int = 256 << 20) -> None:
        self._kept, self._kept_bytes = kept, kept_bytes
        self._free: list[shared_memory.SharedMemory] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> shared_memory.SharedMemory:
        with self._lock:
            memory = self._free.pop() if self._free else None
        if memory is not None and memory.size >= nbytes:
            return memory
        if memory is not None:
            self.drop(memory)
        unlink_orphans()
        return shared_memory.SharedMemory(f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}",
                                          create=True, size=nbytes)

    def give_back(self, memory: shared_memory.SharedMemory) -> None:
        with self._lock:
            if len(self._free) < self._kept and memory.size <= self._kept_bytes:
                self._free.append(memory)
                return
        self.drop(memory)

    @staticmethod
    def drop(memory: shared_memory.SharedMemory) -> None:
        memory.close()
        with contextlib.suppress(FileNotFoundError):  # taken for an orphan's: see unlink_orphans
            memory.unlink()

    def close(self) -> None:
        with self._lock:
            free, self._free = self._free, []
        for memory in free:
            self.drop(memory)


def unlink_orphans() -> None:
    """Unlinks this user's regions whose creating process has ended. (A process in another PID
    namespace sharing this /dev/shm would look ended: its region's next registration then fails
    and its tensors travel in the messages.)"""
    for path in SHM_ROOT.glob(f"{PREFIX}*"):
        pid = path.name.removeprefix(PREFIX).partition("-")[0]
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to unlink
            if pid.isdigit() and path.stat().st_uid == os.getuid() and not _running(int(pid)):
                path.unlink()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


regions = Regions()  # per Python worker, like the client's channels
atexit.register(regions.close)


@contextlib.contextmanager
def staged(connection: tuple[grpcclient.InferenceServerClient, dict | None], address: str,
           samples: np.ndarray, timeout_s: float) -> Iterator[str | None]:
    """The samples in a POSIX shared memory region registered with the daemon, so that each
    request names its slice instead of carrying the bytes (Triton's system shared memory). None
    where that cannot be: a daemon on another node, or one that cannot open the region (another
    user's daemon, a server without the extension); the bytes then travel in the messages.
    The region is this worker's (Regions); the daemon knows it for this call only, so that
    nothing stays registered with a daemon after a worker ends. Each call to the daemon gives
    up after `timeout_s`: a daemon that stopped answering must not hold the task."""
    if not address.startswith(LOCAL_ADDRESSES) or samples.nbytes == 0:
        yield None
        return
    client, headers = connection
    memory = regions.take(samples.nbytes)
    assert memory.buf is not None  # None only once closed
    keep = False
    try:
        np.frombuffer(memory.buf, np.uint8, samples.nbytes)[:] = samples.reshape(-1).view(np.uint8)
        try:
            client.register_system_shared_memory(memory.name, "/" + memory.name,
                                                 samples.nbytes, headers=headers,
                                                 client_timeout=timeout_s)
        except InferenceServerException as e:
            log.info("daemon at %s cannot use shared memory (%s); sending tensors in gRPC "
                     "messages", address, e.message())
            yield None
            return
        try:
            yield memory.name
        finally:
            try:
                client.unregister_system_shared_memory(memory.name, headers=headers,
                                                       client_timeout=timeout_s)
                keep = True
            except InferenceServerException:  # a daemon gone meanwhile: this name is spent
                pass
    finally:
        if keep:
            regions.give_back(memory)
        else:
            Regions.drop(memory)
