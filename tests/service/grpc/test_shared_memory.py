"""Triton's system shared memory extension through tritonclient: tensors in /dev/shm regions
instead of gRPC messages, for clients on the daemon's node (over its unix socket here; over TCP
only with the daemon's token: tests/service/grpc/test_hostile_clients.py)."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from service.edge.door import Peer
from service.edge.shared_memory import SHM_ROOT, Caller, Limits, SharedMemoryRegions, caller
from service.errors import PermissionDeniedError
from tests.support.daemon import MODEL
from tests.support.served import assert_served

REGION_BYTES = 8192


@pytest.fixture
def client(daemon):
    """A client over the daemon's unix socket, which may use shared memory."""
    with grpcclient.InferenceServerClient(daemon.socket_url) as c:
        yield c


@pytest.fixture
def region(request):
    key = f"/hetserve-test-{os.getpid()}-{request.node.name[:40]}"
    handle = shm.create_shared_memory_region("test", key, REGION_BYTES)
    yield key, handle
    shm.destroy_shared_memory_region(handle)


def refused(call, status: str, message: str) -> None:
    with pytest.raises(InferenceServerException, match=message) as refused:
        call()
    assert refused.value.status() == f"StatusCode.{status}"


def test_inputs_and_outputs_travel_through_shared_memory(client, holdout, region) -> None:
    key, handle = region
    images = holdout[0][:2]  # 6,272 bytes in, 80 bytes out
    shm.set_shared_memory_region(handle, [images])
    client.register_system_shared_memory("io", key, REGION_BYTES)
    try:
        image = grpcclient.InferInput("image", list(images.shape), "FP32")
        image.set_shared_memory("io", images.nbytes)
        logits = grpcclient.InferRequestedOutput("logits")
        logits.set_shared_memory("io", 80, offset=6400)
        result = client.infer(MODEL, [image], outputs=[logits])
        placed = result.get_output("logits").parameters
        assert (placed["shared_memory_region"].string_param,
                placed["shared_memory_offset"].int64_param) == ("io", 6400)
        assert_served(shm.get_contents_as_numpy(handle, np.float32, [2, 10], 6400),
                      result.get_response().parameters["device"].string_param, images)
        status = client.get_system_shared_memory_status().regions
        assert (status["io"].key, status["io"].byte_size) == (key, REGION_BYTES)
    finally:
        client.unregister_system_shared_memory("io")
    assert not client.get_system_shared_memory_status().regions
    assert "system_shared_memory" in client.get_server_metadata().extensions


@pytest.mark.parametrize("key, message", [
    ("/../etc/passwd", "key: '/../etc/passwd' received, expected a POSIX shared memory name"),
    ("/hetserve-no-such-region", "cannot open shared memory '/hetserve-no-such-region'")])
def test_keys_outside_dev_shm_or_missing_are_refused(client, key, message) -> None:
    refused(lambda: client.register_system_shared_memory("bad", key, 64), "INVALID_ARGUMENT",
             message)


def test_a_symbolic_link_in_dev_shm_is_not_followed(client, tmp_path) -> None:
    target = tmp_path / "not-shared-memory"
    target.write_bytes(bytes(64))
    link = SHM_ROOT / f"hetserve-test-link-{os.getpid()}"
    link.symlink_to(target)
    try:
        refused(lambda: client.register_system_shared_memory("link", f"/{link.name}", 64),
                 "INVALID_ARGUMENT", f"cannot open shared memory '/{link.name}'")
    finally:
        link.unlink()


def test_unknown_duplicate_and_too_small_regions_are_refused(client, holdout, region) -> None:
    key, _ = region
    image = grpcclient.InferInput("image", [1, 1, 28, 28], "FP32")
    image.set_shared_memory("nowhere", 3136)
    refused(lambda: client.infer(MODEL, [image]), "INVALID_ARGUMENT",
             "input 'image': shared memory region 'nowhere' is not registered")
    client.register_system_shared_memory("small", key, 1024)
    try:
        refused(lambda: client.register_system_shared_memory("small", key, 1024),
                 "ALREADY_EXISTS", "'small' is already registered")
        image.set_shared_memory("small", 3136)
        refused(lambda: client.infer(MODEL, [image]), "INVALID_ARGUMENT",
                 "byte_size 3136 received, region 'small' holds 1024 bytes")
        image.set_shared_memory("small", 1024)
        refused(lambda: client.infer(MODEL, [image]), "INVALID_ARGUMENT",
                 r"parameters\['shared_memory_byte_size'\] 1024 received, 3136 expected")
        image.set_data_from_numpy(holdout[0][:1])
        logits = grpcclient.InferRequestedOutput("logits")
        logits.set_shared_memory("small", 8)
        refused(lambda: client.infer(MODEL, [image], outputs=[logits]), "INVALID_ARGUMENT",
                 "output 'logits': shared_memory_byte_size 8 received, the output needs 40")
    finally:
        client.unregister_system_shared_memory("small")


def test_shared_memory_callers_are_socket_uids_or_the_token_s_holders_as_allowed() -> None:
    socket_user = Peer("unix", "uid 1000", 1000, (1000, 27))
    assert caller(socket_user, token=False, token_uid=-1) == Caller("uid 1000", 1000, (1000, 27))
    for address in ("127.0.0.1", "::1"):
        tcp = Peer("tcp", address)
        assert caller(tcp, token=True, token_uid=0) == Caller("token", 0, caller(
            tcp, token=True, token_uid=0).gids)
        with pytest.raises(PermissionDeniedError, match="--shm-uid-for-token"):
            caller(tcp, token=True, token_uid=-1)  # none by default
        with pytest.raises(PermissionDeniedError, match="needs the daemon's token"):
            caller(tcp, token=False, token_uid=0)
    with pytest.raises(PermissionDeniedError, match="'10.1.2.3' is not on this node"):
        caller(Peer("tcp", "10.1.2.3"), token=True, token_uid=0)
    with pytest.raises(PermissionDeniedError, match="connection has closed"):
        caller(None, token=True, token_uid=0)


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A system.posix_acl_access value: version 2, then (tag, permissions, id) entries."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_an_acl_that_denies_a_user_is_the_kernels_answer() -> None:
    """The object's mode lets every user read and write it; its ACL names uid 65534 with no
    rights, so the kernel refuses that user, and so does the daemon; another user may."""
    key = f"/hetserve-test-acl-{os.getpid()}"
    path = SHM_ROOT / key[1:]
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.fchmod(fd, 0o666)
        os.ftruncate(fd, 64)
        undefined = 0xFFFFFFFF
        try:
            os.setxattr(fd, "system.posix_acl_access", _acl(
                (0x01, 6, undefined), (0x02, 0, 65534), (0x04, 6, undefined),
                (0x10, 6, undefined), (0x20, 6, undefined)))
        except OSError as e:
            pytest.skip(f"/dev/shm takes no POSIX ACL here: {e.strerror}")
        regions = SharedMemoryRegions(Limits(8, 8))
        denied = Caller("uid 65534", 65534, (65534,))
        with pytest.raises(PermissionDeniedError, match="cannot be read by uid 65534"):
            regions.open("r", key, 0, 64, denied)
        allowed = regions.open("r", key, 0, 64, Caller("uid 1000", 1000, (1000,)))
        assert allowed.writable
    finally:
        os.close(fd)
        os.unlink(path)
