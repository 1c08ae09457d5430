"""A daemon every client on a shared node can trust: what a hostile local client tries (shrinking
its shared memory, naming another's region, floods, odd versions) gets a clear status, and the
daemon keeps serving everyone else. Each runs against a real daemon with one process and with two
front-ends; the cross-user cases run as `nobody` where the tests run as root."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from service.edge.shared_memory import SHM_ROOT, Limits, RegionNames
from service.errors import DeadlineExceededError, LimitError, ModelNotFoundError
from service.grpc import handlers
from service.local_daemon import DaemonProcess, free_port
from tests.support.daemon import MODEL, MODELS, ROOT, Daemon, image_input
from tests.support.metrics import scrape
from tests.support.other_user import IMAGE_BYTES, as_nobody, refused

STREAM_WINDOW = 8


@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def daemon(request, tmp_path_factory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("hostile"), MODELS, "--workers", request.param,
               "--max-shm-regions-per-client", "4", "--max-stream-inflight", str(STREAM_WINDOW))
    d.workers = int(request.param)
    yield d
    assert d.stop() == 0


@pytest.fixture
def unix(daemon: Daemon) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(daemon.socket_url) as c:
        yield c
    with grpcclient.InferenceServerClient(daemon.socket_url) as c:
        c.unregister_system_shared_memory()  # every region of this test's


@pytest.fixture
def shm(request) -> Iterator[tuple[str, int]]:
    """A POSIX shared memory object of 4 images: its key and descriptor."""
    path = SHM_ROOT / f"hetserve-test-{os.getpid()}-{request.node.name[:40]}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 4 * IMAGE_BYTES)
    yield f"/{path.name}", fd
    os.close(fd)
    path.unlink(missing_ok=True)


def _serves(daemon: Daemon, holdout) -> None:
    """The daemon is alive and answers a well-behaved client, with no front-end restarted."""
    assert daemon.process.poll() is None
    with grpcclient.InferenceServerClient(daemon.url) as c:
        logits = c.infer(MODEL, image_input(holdout[0][:2])).as_numpy("logits")
    np.testing.assert_array_equal(logits.argmax(1), holdout[1][:2])
    assert "exited with code" not in daemon.process.log_path.read_text()


def _in_region(region: str, nbytes: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("image", [nbytes // IMAGE_BYTES, 1, 28, 28], "FP32")
    tensor.set_shared_memory(region, nbytes)
    return tensor


# 1. Client memory is untrusted.
def test_a_shrunk_object_is_an_error_not_a_signal(daemon, unix, shm, holdout) -> None:
    key, fd = shm
    os.pwrite(fd, np.ascontiguousarray(holdout[0][:4]).tobytes(), 0)
    unix.register_system_shared_memory("shrinking", key, 4 * IMAGE_BYTES)
    served = unix.infer(MODEL, [_in_region("shrinking", 2 * IMAGE_BYTES)])
    np.testing.assert_array_equal(served.as_numpy("logits").argmax(1), holdout[1][:2])
    os.ftruncate(fd, IMAGE_BYTES)  # the client shrinks its object under the daemon
    refused(lambda: unix.infer(MODEL, [_in_region("shrinking", 2 * IMAGE_BYTES)]),
             "INVALID_ARGUMENT", "input 'image'", "'shrinking'", "shrank")
    logits = grpcclient.InferRequestedOutput("logits")
    logits.set_shared_memory("shrinking", 80, offset=2 * IMAGE_BYTES)
    refused(lambda: unix.infer(MODEL, image_input(holdout[0][:2]), outputs=[logits]),
             "INVALID_ARGUMENT", "output 'logits'", "'shrinking'", "shrank")
    assert os.fstat(fd).st_size == IMAGE_BYTES  # not grown by the daemon's write either
    _serves(daemon, holdout)


# 2. No client acts through the daemon with more rights than its own.
def test_tcp_without_the_token_gets_no_shared_memory(daemon, unix, shm) -> None:
    key, _ = shm
    unix.register_system_shared_memory("victim", key, IMAGE_BYTES)
    with grpcclient.InferenceServerClient(daemon.url) as tcp:
        for call in (tcp.get_system_shared_memory_status,
                     lambda: tcp.register_system_shared_memory("mine", key, IMAGE_BYTES),
                     tcp.unregister_system_shared_memory,
                     lambda: tcp.infer(MODEL, [_in_region("victim", IMAGE_BYTES)])):
            refused(call, "PERMISSION_DENIED", "needs the daemon's token")
    assert "victim" in unix.get_system_shared_memory_status().regions


def test_regions_belong_to_the_caller_that_registered_them(tmp_path, shm) -> None:
    """The unix socket's user and the token's holders over TCP (given this user's rights):
    neither sees, uses or unregisters the other's regions."""
    key, _ = shm
    (tmp_path / "token").write_text("t0ken\n")
    port, sock = free_port(), tmp_path / "grpc.sock"
    d = DaemonProcess(["--models", str(MODELS), "--port", str(port), "--socket", str(sock),
                       "--metrics-port", "0", "--token-file", str(tmp_path / "token"),
                       "--shm-uid-for-token", str(os.geteuid())],
                      f"unix:{sock}", tmp_path / "daemon.log")
    d.wait_ready()
    token = {"authorization": "Bearer t0ken"}
    try:
        with grpcclient.InferenceServerClient(f"unix:{sock}") as unix, \
                grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as tcp:
            unix.register_system_shared_memory("socket-users", key, IMAGE_BYTES)
            tcp.register_system_shared_memory("token-holders", key, IMAGE_BYTES,
                                              headers=token)
            assert list(unix.get_system_shared_memory_status().regions) == ["socket-users"]
            assert list(tcp.get_system_shared_memory_status(headers=token).regions) == \
                ["token-holders"]
            refused(lambda: tcp.infer(MODEL, [_in_region("socket-users", IMAGE_BYTES)],
                                       headers=token),
                     "INVALID_ARGUMENT", "'socket-users' is not registered by this client")
            refused(lambda: tcp.get_system_shared_memory_status("socket-users",
                                                                 headers=token),
                     "INVALID_ARGUMENT", "is not registered by this client")
            refused(lambda: tcp.register_system_shared_memory("socket-users", key, 64,
                                                               headers=token),
                     "ALREADY_EXISTS", "'socket-users' is already registered")
            tcp.unregister_system_shared_memory(headers=token)  # all of its own
            assert list(unix.get_system_shared_memory_status().regions) == ["socket-users"]
            assert not tcp.get_system_shared_memory_status(headers=token).regions
    finally:
        assert d.stop() == 0


def test_another_local_user_reads_no_region_and_unregisters_none(daemon, unix, shm,
                                                                 holdout) -> None:
    key, fd = shm
    os.pwrite(fd, np.ascontiguousarray(holdout[0][:1]).tobytes(), 0)
    unix.register_system_shared_memory("victim", key, IMAGE_BYTES)
    run = as_nobody(f"""
import tritonclient.grpc as g
from tritonclient.utils import InferenceServerException
c = g.InferenceServerClient({daemon.url!r})
image = g.InferInput("image", [1, 1, 28, 28], "FP32")
image.set_shared_memory("victim", {IMAGE_BYTES})
for call in (c.get_system_shared_memory_status,
             lambda: c.register_system_shared_memory("stolen", {key!r}, {IMAGE_BYTES}),
             lambda: c.unregister_system_shared_memory(""),
             lambda: c.infer({MODEL!r}, [image])):
    try:
        call()
        print("ALLOWED")
    except InferenceServerException as e:
        print(e.status())
try:
    g.InferenceServerClient("unix:{daemon.socket}").is_server_live()
    print("ALLOWED")
except InferenceServerException as e:
    print("socket", e.status())
""")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:4] == ["StatusCode.PERMISSION_DENIED"] * 4
    assert "ALLOWED" not in run.stdout
    assert unix.get_system_shared_memory_status().regions["victim"].key == key
    assert os.stat(daemon.socket).st_mode & 0o777 == 0o600


# 3. Bounded everything.
def test_names_and_error_messages_are_bounded(daemon, unix, shm) -> None:
    key, _ = shm
    message = refused(lambda: unix.register_system_shared_memory("n" * 20000, key, 64),
                       "INVALID_ARGUMENT", "expected 1 to 255 letters")
    assert len(message) < 500
    unix.register_system_shared_memory("secret-name", key, IMAGE_BYTES)
    message = refused(lambda: unix.infer(MODEL, [_in_region("x" * 5000, IMAGE_BYTES)]),
                       "INVALID_ARGUMENT", "is not registered")
    assert "secret-name" not in message and len(message) < 500


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_a_compressed_request_is_refused_before_it_is_inflated(daemon, unix, holdout,
                                                               algorithm) -> None:
    """grpc core would inflate it whole, and the loop copy and parse what it grew to: a few KB
    could hold every caller. The same request uncompressed is answered. grpc core's own line
    for each refusal stays out of the daemon's log (a flood of them would fill it)."""
    inputs = image_input(holdout[0][:1])
    for _ in range(3):
        refused(lambda: unix.infer(MODEL, inputs, compression_algorithm=algorithm),
                "UNIMPLEMENTED", f"Compression algorithm '{algorithm}' is disabled")
    assert unix.infer(MODEL, inputs).as_numpy("logits").shape == (1, 10)
    assert daemon.process.log_path is not None
    assert "Compression algorithm" not in daemon.process.log_path.read_text()


def test_a_stream_whose_replies_are_not_read_stops_being_read(daemon) -> None:
    """Bad requests, each answered at once, that the client never reads: the daemon reads a
    window of them ahead, then gRPC's flow control holds the client's writes."""
    sent = [0]
    padding = "p" * 4000

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        for i in range(20000):
            sent[0] = i
            yield service_pb2.ModelInferRequest(model_name="no-such-model", id=padding)

    # No BDP probing: the client's receive window stays at HTTP/2's 64 KiB.
    with grpc.insecure_channel(daemon.socket_url, [("grpc.http2.bdp_probe", 0)]) as channel:
        replies = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            requests(), timeout=60)
        # Nothing is read meanwhile: the buffers on the way fill, then the daemon stops reading.
        counts = [0]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (len(counts) < 3 or counts[-1] != counts[-3]):
            time.sleep(1)
            counts.append(sent[0])
        replies.cancel()
    # The window, plus what the socket's and gRPC's buffers hold (hundreds of KiB).
    assert counts[-1] == counts[-3], f"still reading after 30 s: {counts}"
    assert STREAM_WINDOW <= counts[-1] < 5000, f"{counts[-1]} requests read, no reply read"


# 4. Strict parsing; never UNKNOWN.
@pytest.mark.parametrize("version", ["²", "9" * 5000, "-1", " 1"])
def test_odd_model_versions_are_not_found(daemon, version) -> None:
    with grpc.insecure_channel(daemon.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert not stub.ModelReady(service_pb2.ModelReadyRequest(
            name=MODEL, version=version)).ready
        for method, message in (
                (stub.ModelMetadata, service_pb2.ModelMetadataRequest),
                (stub.ModelConfig, service_pb2.ModelConfigRequest),
                (stub.ModelStatistics, service_pb2.ModelStatisticsRequest)):
            with pytest.raises(grpc.RpcError) as caught:
                method(message(name=MODEL, version=version))
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert "model_version" in caught.value.details()
            assert len(caught.value.details()) < 500
        request = service_pb2.ModelInferRequest(model_name=MODEL, model_version=version)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        reply = next(stub.ModelStreamInfer(iter([request]), timeout=30))
        assert reply.error_message.startswith("NOT_FOUND: model_version")
    assert "Traceback" not in daemon.process.log_path.read_text()


class _Broken:
    """A servicer with bugs: what it raises reaches no client as UNKNOWN."""

    async def ServerLive(self, request, context):
        raise RuntimeError("a bug")

    async def ModelStreamInfer(self, requests, context):
        async for _ in requests:
            yield service_pb2.ModelStreamInferResponse()
            raise KeyError("another bug")

    async def ModelMetadata(self, request, context):
        raise ModelNotFoundError("model_name 'x': no such model")


def test_an_unexpected_exception_answers_internal_in_one_log_line(caplog) -> None:
    asyncio.run(_call_the_broken_servicer())
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in errors] == ["ServerLive failed: RuntimeError: a bug",
                                                "ModelStreamInfer failed: KeyError: 'another bug'"]
    assert not any(r.exc_info for r in errors)


async def _call_the_broken_servicer() -> None:
    server = grpc.aio.server()
    handlers.add_to_server(_Broken(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                await stub.ServerLive(service_pb2.ServerLiveRequest())
            assert caught.value.code() == grpc.StatusCode.INTERNAL
            with pytest.raises(grpc.RpcError) as caught:
                await stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="x"))
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            stream = stub.ModelStreamInfer()
            await stream.write(service_pb2.ModelInferRequest())
            await stream.read()
            with pytest.raises(grpc.RpcError) as caught:
                await stream.read()
            assert caught.value.code() == grpc.StatusCode.INTERNAL
    finally:
        await server.stop(0)


class _Late:
    """Fails each call with the daemon's own DEADLINE_EXCEEDED (its queue's timer fires at the
    call's gRPC deadline), or answers it."""

    async def ModelInfer(self, request, context):
        raise DeadlineExceededError("model 'm': the request's deadline passed in the queue")

    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def ModelStreamInfer(self, requests, context):
        yield service_pb2.ModelStreamInferResponse()


class _Context:
    def __init__(self, remaining_s: float | None) -> None:
        self.remaining_s, self.sent = remaining_s, []

    def time_remaining(self) -> float | None:
        return self.remaining_s

    def done(self) -> bool:
        return False

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.sent.append(code)
        raise grpc.aio.AbortError(details)

    async def write(self, reply) -> None:  # as grpc's, once the call has ended in its core
        raise RuntimeError('Failed "execute_batch": (SendMessageOperation,)')


def _handler(method: str):
    """The handler `add_to_server` gives `method` of the _Late servicer."""
    class Server:
        def add_generic_rpc_handlers(self, generic) -> None:
            self.generic = generic[0]
    server = Server()
    handlers.add_to_server(_Late(), server)
    details = SimpleNamespace(method=f"/{handlers.SERVICE.full_name}/{method}",
                              invocation_metadata=())
    found = server.generic.service(details)
    return found.stream_stream or found.unary_unary


@pytest.mark.parametrize("method", ["ModelInfer", "ServerLive"])
def test_a_call_past_its_deadline_ends_without_sending(method) -> None:
    """Past the call's gRPC deadline gRPC ends it DEADLINE_EXCEEDED itself; a status or reply
    sent then races that end, and grpc logged the loser with a traceback, once per such call."""
    late = _Context(remaining_s=0.0)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(_handler(method)(b"", late))
    assert late.sent == []
    in_time = _Context(remaining_s=1.0)  # e.g. a queue timeout shorter than the deadline
    if method == "ModelInfer":
        with pytest.raises(grpc.aio.AbortError):
            asyncio.run(_handler(method)(b"", in_time))
        assert in_time.sent == [grpc.StatusCode.DEADLINE_EXCEEDED]
    else:
        assert asyncio.run(_handler(method)(b"", in_time)).live


def test_a_stream_whose_call_has_ended_stops_without_an_error(caplog) -> None:
    """A reply that can no longer be written (the client gone, or the deadline passed) ends the
    stream: no status is sent, and nothing is logged as a failure."""
    ended = _Context(remaining_s=1.0)
    with pytest.raises(asyncio.CancelledError):  # as grpc ends a call its client has left
        asyncio.run(_handler("ModelStreamInfer")(None, ended))
    assert ended.sent == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# 5. The socket folder is ours or we refuse.
def _start(socket: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service", "serve", "--models", str(MODELS), "--port",
         str(free_port()), "--socket", str(socket), "--metrics-port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_socket_folder_made_by_another_user_is_refused(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to give the folder to another user")
    tmp_path.chmod(0o755)
    folder, victim = tmp_path / "hetserve-0", tmp_path / "root-owned"
    victim.write_text("precious\n")
    folder.mkdir(mode=0o700)
    (folder / "grpc.sock.lock").symlink_to(victim)
    os.chown(folder, 65534, 65534)
    run = _start(folder / "grpc.sock")
    assert run.returncode == 2
    assert f"socket folder '{folder}' belongs to uid 65534" in run.stderr
    assert victim.read_text() == "precious\n"


def test_a_socket_folder_others_may_write_is_refused(tmp_path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    run = _start(folder / "grpc.sock")
    assert run.returncode == 2
    assert "has mode 0777: group or others may write there" in run.stderr
    assert not (folder / "grpc.sock.lock").exists()


# 6. Bounded regions.
def test_regions_are_capped_per_client_and_metrics_keep_answering(daemon, unix, shm) -> None:
    key, _ = shm
    for i in range(4):
        unix.register_system_shared_memory(f"r{i}", key, 64)
    refused(lambda: unix.register_system_shared_memory("r4", key, 64), "RESOURCE_EXHAUSTED",
             "4 regions are registered by this client", "--max-shm-regions-per-client")
    assert scrape(daemon.metrics_url)
    unix.unregister_system_shared_memory("r0")
    unix.register_system_shared_memory("r4", key, 64)


def test_region_names_have_one_owner_within_both_limits() -> None:
    names = RegionNames(Limits(total=3, per_caller=2))
    names.reserve("a", "unix")
    names.reserve("b", "unix")
    with pytest.raises(LimitError, match="--max-shm-regions-per-client"):
        names.reserve("c", "unix")
    names.reserve("c", "token")
    with pytest.raises(LimitError, match="--max-shm-regions\\)"):
        names.reserve("d", "token")
    assert names.release("", "token") == ["c"]
    assert names.release("a", "token") == []  # another caller's: left alone
    assert names.release("a", "unix") == ["a"]


# 7. One owner of region names with --workers N.
def test_one_name_is_registered_once_whichever_front_end_is_asked(daemon, shm) -> None:
    if daemon.workers < 2:
        pytest.skip("one process: one table")
    key, _ = shm
    sockets = [daemon.socket_url, f"unix:{daemon.socket}.1"]
    clients = [grpcclient.InferenceServerClient(s) for s in sockets]
    try:
        for round_ in range(40):
            outcomes: list[str] = []
            start = threading.Barrier(2)

            def register(c: grpcclient.InferenceServerClient) -> None:
                start.wait()
                try:
                    c.register_system_shared_memory(f"race{round_}", key, 64)
                    outcomes.append("OK")
                except InferenceServerException as e:
                    outcomes.append(e.status())
            threads = [threading.Thread(target=register, args=(c,)) for c in clients]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(outcomes) == ["OK", "StatusCode.ALREADY_EXISTS"], outcomes
            clients[round_ % 2].unregister_system_shared_memory(f"race{round_}")
    finally:
        for c in clients:
            c.close()
