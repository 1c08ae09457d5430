"""A caller reaches only the memory it could reach itself: a unix-socket caller is the
uid the kernel names, and may register only an object its uid or groups could open, for the
access the region is used for; token holders over TCP get shared memory only with the rights an
operator gives them. A region's byte count is checked against the tensor before a byte is read.
The cross-user cases run as `nobody` (a --socket-group member) where the tests run as root."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from service.edge.shared_memory import SHM_ROOT
from tests.support.daemon import MODEL, MODELS, Daemon, image_input
from tests.support.other_user import IMAGE_BYTES, NOBODY, calls_as_nobody, needs_nobody, refused


@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def group_daemon(request) -> Iterator[Daemon]:
    """A daemon whose socket admits nobody's group too, in a folder nobody can reach."""
    needs_nobody()
    folder = Path(tempfile.mkdtemp(prefix="hetserve-peers-"))
    folder.chmod(0o755)
    d = Daemon(folder, MODELS, "--workers", request.param, "--socket-group", str(NOBODY))
    yield d
    assert d.stop() == 0
    shutil.rmtree(folder)


def _object(name: str, uid: int, mode: int, size: int = 4 * IMAGE_BYTES) -> Iterator[str]:
    path = SHM_ROOT / f"hetserve-test-{os.getpid()}-{name}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    os.ftruncate(fd, size)
    os.fchown(fd, uid, -1)
    os.fchmod(fd, mode)
    os.close(fd)
    yield f"/{path.name}"
    path.unlink(missing_ok=True)


@pytest.fixture
def roots_object() -> Iterator[str]:
    """A root-only object, as a root Spark client stages its tensors."""
    yield from _object("root", 0, 0o600)


@pytest.fixture
def readable_object() -> Iterator[str]:
    """Root's, readable by all, writable by root alone."""
    yield from _object("readable", 0, 0o644)


@pytest.fixture
def nobodys_object() -> Iterator[str]:
    yield from _object("nobody", NOBODY, 0o600)


def test_a_socket_caller_registers_only_objects_it_could_open(
        group_daemon, roots_object, readable_object, nobodys_object) -> None:
    results = calls_as_nobody(group_daemon, f"""
        c.register_system_shared_memory("roots", {roots_object!r}, {IMAGE_BYTES})
        c.register_system_shared_memory("readable", {readable_object!r}, {IMAGE_BYTES})
        c.infer({MODEL!r}, [image("readable", {IMAGE_BYTES})])
        c.infer({MODEL!r}, [pixels], outputs=[logits("readable")])
        c.register_system_shared_memory("own", {nobodys_object!r}, {IMAGE_BYTES})
        c.infer({MODEL!r}, [pixels], outputs=[logits("own")])
        c.unregister_system_shared_memory("")
    """)
    assert results[0].startswith("StatusCode.PERMISSION_DENIED"), results
    assert f"cannot be read by uid {NOBODY}" in results[0]
    assert "mode 0600" in results[0]
    assert results[1:3] == ["OK", "OK"], results  # root's object, readable by all: an input
    assert results[3].startswith("StatusCode.PERMISSION_DENIED"), results
    assert f"cannot be written by uid {NOBODY}" in results[3]  # but no output goes there
    assert results[4:] == ["OK"] * 3, results


def test_socket_callers_are_one_uid_each(group_daemon, readable_object) -> None:
    """Root's region is not nobody's, although both reach the same socket."""
    with grpcclient.InferenceServerClient(group_daemon.socket_url) as root:
        root.register_system_shared_memory("roots-region", readable_object, IMAGE_BYTES)
        try:
            results = calls_as_nobody(group_daemon, """
                c.get_system_shared_memory_status("roots-region")
                c.infer("mnist_cnn", [image("roots-region", 3136)])
                c.unregister_system_shared_memory("")
            """)
            assert [r.split()[0] for r in results] == [
                "StatusCode.INVALID_ARGUMENT", "StatusCode.INVALID_ARGUMENT", "OK"], results
            assert all("is not registered by this client" in r for r in results[:2])
            assert "roots-region" in root.get_system_shared_memory_status().regions
        finally:
            root.unregister_system_shared_memory("roots-region")


def test_a_byte_count_beyond_the_tensor_is_refused_before_anything_is_read(
        daemon, holdout) -> None:
    """A 2 GiB sparse region named for a 3,136-byte tensor: refused at once, the daemon's memory
    unchanged (it would have grown by the region)."""
    sparse = _object("sparse", os.geteuid(), 0o600, size=2 << 30)
    key = next(sparse)
    try:
        with grpcclient.InferenceServerClient(daemon.socket_url) as c:
            c.register_system_shared_memory("sparse", key, 2 << 30)
            before = _peak_kib(daemon)
            one_image = grpcclient.InferInput("image", [1, 1, 28, 28], "FP32")
            one_image.set_shared_memory("sparse", 2 << 30)
            for _ in range(3):
                refused(lambda: c.infer(MODEL, [one_image]), "INVALID_ARGUMENT",
                         "shared_memory_byte_size'] 2147483648 received, 3136 expected")
            assert _peak_kib(daemon) - before < 100 << 10
            served = c.infer(MODEL, image_input(holdout[0][:1]))
            assert served.as_numpy("logits").argmax() == holdout[1][0]
            c.unregister_system_shared_memory("sparse")
    finally:
        next(sparse, None)


def _peak_kib(daemon: Daemon) -> int:
    """The largest resident size of the daemon's processes so far (VmHWM), in KiB."""
    pids = [daemon.process.pid, *subprocess.run(
        ["pgrep", "-P", str(daemon.process.pid)], capture_output=True, text=True
    ).stdout.split()]
    peak = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
    return peak
