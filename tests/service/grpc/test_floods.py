"""No single client takes the daemon away from the others: what one unprivileged TCP client floods
the daemon with (thousands of streams on one connection, streams opened and reset at once, idle
streams and connections, more calls than the TCP server serves) is bounded by grpc core and the
servicer, while the unix socket's users, on a server of their own, keep getting answers. The
floods come from a raw HTTP/2 client; each test takes a few seconds."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import subprocess
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from bench import floods
from bench.raw_h2 import RawH2
from service.core.queue_policy import callers_share
from service.local_daemon import free_port
from tests.support.daemon import MODEL, MODELS, ROOT, Daemon, image_input
from tests.support.other_user import as_nobody, needs_nobody, nobody_command

STREAMS = 16  # --max-streams-per-connection
IDLE_S = 1.0  # --stream-idle-s and --connection-idle-s
RPCS = 8  # --max-rpcs-tcp
RESETS = 500  # --max-stream-resets


@pytest.fixture(scope="module")
def short(tmp_path_factory) -> Iterator[Daemon]:
    """Few streams per connection, short idle timeouts."""
    d = Daemon(tmp_path_factory.mktemp("floods"), MODELS, "--workers", "1",
               "--max-streams-per-connection", str(STREAMS), "--stream-idle-s", str(IDLE_S),
               "--connection-idle-s", str(IDLE_S), "--max-stream-resets", str(RESETS))
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> Iterator[Daemon]:
    """Few calls and connections at once over TCP."""
    d = Daemon(tmp_path_factory.mktemp("limited"), MODELS, "--workers", "1",
               "--max-rpcs-tcp", str(RPCS))
    yield d
    assert d.stop() == 0


def socket_users(daemon: Daemon, holdout):
    """Four unix socket clients inferring meanwhile (bench/floods.py's)."""
    return floods.socket_users(daemon.socket_url, holdout[0][:1], holdout[1][:1])


def _all_right(answers: list) -> None:
    assert len(answers) >= 4, "the socket's users got no answers"
    assert [a for a, _ in answers if a is not True] == []  # (answer, latency) each


def test_thousands_of_streams_on_one_connection_are_capped(short, holdout) -> None:
    with socket_users(short, holdout) as answers, RawH2(short.url) as flood:
        assert flood.settings[SettingCodes.MAX_CONCURRENT_STREAMS] == STREAMS
        opened = [flood.open() for _ in range(2000)]
        flood.flush()
        flood.read(5.0, until=lambda: len(flood.refused) >= len(opened) - STREAMS)
        flood.read(0.5)  # the socket's users meanwhile
    assert len(flood.refused) == len(opened) - STREAMS  # REFUSED_STREAM, at once
    assert flood.goaway is None
    _all_right(answers)


@pytest.mark.parametrize("listener", ["tcp", "socket"])
def test_streams_opened_and_reset_at_speed_get_goaway(short, listener, holdout) -> None:
    """HTTP/2 rapid reset, on either listener: grpc core (1.85) sends no GOAWAY for it, so the
    door does, once the connection has reset --max-stream-resets streams beyond those it
    completed; the socket's users are answered meanwhile."""
    address = short.url if listener == "tcp" else short.socket_url
    with socket_users(short, holdout) as answers, RawH2(address) as flood:
        end, pairs = time.monotonic() + 10.0, 0
        while time.monotonic() < end and not flood.closed and flood.goaway is None:
            for _ in range(100):
                flood.reset(flood.open())
            pairs += 100
            flood.flush()
        flood.read(2.0)
    assert flood.closed and flood.goaway is not None, f"{pairs} pairs, no GOAWAY"
    assert flood.goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
    assert b"--max-stream-resets" in flood.goaway.additional_data
    assert pairs > RESETS  # the GOAWAY came once the allowance was spent, within the 10 s
    _all_right(answers)


def test_resets_count_against_the_calls_a_connection_completed(short) -> None:
    """A client that cancels calls keeps its connection while it resets no more than
    --max-stream-resets beyond the calls completed on it."""
    with RawH2(short.url) as client:
        def reset(count: int) -> None:
            for _ in range(count):
                if client.goaway is None:
                    client.reset(client.open())
            client.flush()
            client.read(0.5)

        reset(RESETS - 100)
        for _ in range(200 // STREAMS):  # within the stream cap
            calls = [client.open("/inference.GRPCInferenceService/ServerLive")
                     for _ in range(STREAMS)]
            for call in calls:
                client.send_message(call, b"", end=True)
            client.flush()
            client.read(10.0, until=lambda: all(c in client.ended for c in calls))
            assert {client.ended.get(c) for c in calls} == {"0"}
        reset(250)  # RESETS + 150 in all, within the 192 completed
        assert not client.closed and client.goaway is None
        reset(100)
        client.read(2.0)
    assert client.goaway is not None and client.goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM


def test_an_idle_stream_is_closed_naming_the_flag(short, holdout) -> None:
    request = service_pb2.ModelInferRequest(
        model_name=MODEL, inputs=[service_pb2.ModelInferRequest.InferInputTensor(
            name="image", datatype="FP32", shape=[1, 1, 28, 28])],
        raw_input_contents=[np.ascontiguousarray(holdout[0][:1], np.float32).tobytes()])

    async def idle_stream() -> tuple[grpc.aio.AioRpcError, float]:
        async with grpc.aio.insecure_channel(short.url) as channel:
            stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer()
            await stream.write(request)
            reply = await asyncio.wait_for(stream.read(), 10)
            assert not reply.error_message
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as closed:
                await asyncio.wait_for(stream.read(), IDLE_S + 5)
            return closed.value, time.monotonic() - started

    error, waited = asyncio.run(idle_stream())
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"no request for {IDLE_S:g} s" in error.details()
    assert "--stream-idle-s" in error.details()
    assert IDLE_S * 0.9 <= waited < IDLE_S + 3


@pytest.mark.parametrize("listener", ["tcp", "socket"])
def test_an_idle_connection_is_closed(short, listener) -> None:
    with RawH2(short.url if listener == "tcp" else short.socket_url) as idle:
        started = time.monotonic()
        idle.read(IDLE_S + 5)
        waited = time.monotonic() - started
    assert idle.goaway is not None and idle.closed
    assert IDLE_S * 0.5 <= waited < IDLE_S + 3


def _tcp_call(daemon: Daemon, holdout) -> InferenceServerException | None:
    with grpcclient.InferenceServerClient(daemon.url) as tcp:
        try:
            tcp.infer(MODEL, image_input(holdout[0][:1]), client_timeout=5)
        except InferenceServerException as e:
            return e
    return None


@contextlib.contextmanager
def _streams_held_by_nobody(daemon: Daemon, count: int) -> Iterator[None]:
    """`count` calls over TCP that another local user (nobody) opens and holds."""
    needs_nobody()
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from bench.raw_h2 import RawH2\n"
            f"with RawH2({daemon.url!r}) as h:\n"
            f"    [h.open() for _ in range({count})]\n"
            "    h.flush(); print('held', flush=True); sys.stdin.read()\n")
    holder = subprocess.Popen(nobody_command(code), cwd="/", stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.communicate(timeout=30)  # its stdin closed: it lets go


def test_one_caller_holds_a_share_of_max_rpcs_tcp_and_the_socket_is_served(limited,
                                                                            holdout) -> None:
    """Streams one local user holds over TCP fill its share of the TCP server's calls (three
    quarters of --max-rpcs-tcp): its next call is refused naming the flag, another local user's
    is answered; once that user holds the rest, every TCP call is refused naming the flag. The
    unix socket has a server of its own throughout."""
    share = callers_share(RPCS)
    with socket_users(limited, holdout) as answers, RawH2(limited.url) as holder:
        held: list[int] = []
        deadline = time.monotonic() + 10  # a loaded machine's
        while time.monotonic() < deadline:
            # A stream that came in after a probe in progress took the last place of the
            # share was refused: open another until the share is held.
            held = [stream for stream in held if stream not in holder.ended]
            held += [holder.open() for _ in range(share - len(held))]
            holder.flush()
            holder.read(0.05)
            if _tcp_call(limited, holdout) is not None:
                break  # they are counted
        mine = [_tcp_call(limited, holdout) for _ in range(20)]
        others = as_nobody(
            "import numpy as np, tritonclient.grpc as g\n"
            f"c = g.InferenceServerClient({limited.url!r})\n"
            "x = g.InferInput('image', [1, 1, 28, 28], 'FP32')\n"
            "x.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.float32))\n"
            "print(c.infer('mnist_cnn', [x], client_timeout=5).as_numpy('logits').shape)")
        with _streams_held_by_nobody(limited, RPCS - share):
            deadline = time.monotonic() + 10  # a loaded machine's
            while "in progress on TCP" in str(error := _tcp_call(limited, holdout)) and \
                    time.monotonic() < deadline:
                pass  # until nobody's are counted
            full = [error, *(_tcp_call(limited, holdout) for _ in range(20))]
    assert {e.status() for e in mine if e} == {"StatusCode.RESOURCE_EXHAUSTED"}
    assert all(e and f"has {share} calls in progress on TCP" in e.message() and
               "--max-rpcs-tcp" in e.message() for e in mine)
    assert others.stdout.strip() == "(1, 10)", others.stderr
    assert all(e and f"TCP has {RPCS} calls in progress" in e.message() and "--max-rpcs-tcp"
               in e.message() for e in full)
    _all_right(answers)


UPLOAD_BYTES = 1 << 20  # --max-upload-bytes-per-caller
UPLOAD_S = 1.0  # --upload-timeout-s


@pytest.fixture(scope="module")
def uploads(tmp_path_factory) -> Iterator[Daemon]:
    """Small upload budgets, and a short upload timeout."""
    d = Daemon(tmp_path_factory.mktemp("uploads"), MODELS, "--workers", "1",
               "--max-upload-bytes-per-caller", str(UPLOAD_BYTES),
               "--max-buffered-bytes", str(3 * UPLOAD_BYTES),
               "--upload-timeout-s", str(UPLOAD_S), "--http-port", str(port := free_port()))
    d.http_port = port
    yield d
    assert d.stop() == 0


def _upload(flood: RawH2, streams: int, each: int, seconds: float = 4.0) -> int:
    """Unary calls whose messages say they are 60 MiB, of which `each` bytes are sent on each,
    as the server's flow-control windows allow; the bytes sent."""
    ids = [flood.open("/inference.GRPCInferenceService/ModelInfer") for _ in range(streams)]
    left = dict.fromkeys(ids, each)
    for stream in ids:
        flood.h2.send_data(stream, b"\0" + struct.pack(">I", 60 << 20))
    end = time.monotonic() + seconds
    while any(left.values()) and time.monotonic() < end and flood.goaway is None \
            and not flood.closed:
        for stream in ids:
            room = min(left[stream], flood.h2.local_flow_control_window(stream), 1 << 14)
            if room > 0:
                flood.h2.send_data(stream, bytes(room))
                left[stream] -= room
        flood.flush()
        flood.read(0.05)
    return streams * each - sum(left.values())


def test_a_body_that_stops_arriving_ends_its_connection_naming_the_timeout(uploads,
                                                                           holdout) -> None:
    with socket_users(uploads, holdout) as answers, RawH2(uploads.url) as flood:
        _upload(flood, 1, 1000)
        start = time.monotonic()
        flood.read(UPLOAD_S + 3.0, until=lambda: flood.goaway is not None)
        waited = time.monotonic() - start
    assert flood.goaway is not None and b"--upload-timeout-s" in flood.goaway.additional_data
    assert waited <= UPLOAD_S + 2.0
    _all_right(answers)


@pytest.mark.parametrize("listener", ["tcp", "socket"])
def test_bodies_over_a_callers_budget_end_the_connection_naming_the_flag(uploads, listener,
                                                                        holdout) -> None:
    address = uploads.url if listener == "tcp" else uploads.socket_url
    with socket_users(uploads, holdout) as answers, RawH2(address) as flood:
        sent = _upload(flood, 8, 300_000)  # 2.4 MB of unfinished bodies, the budget 1 MiB
        flood.read(1.0, until=lambda: flood.goaway is not None)
    assert flood.goaway is not None, f"{sent} bytes sent, no GOAWAY"
    assert b"--max-upload-bytes-per-caller" in flood.goaway.additional_data
    assert UPLOAD_BYTES - (1 << 15) <= sent <= UPLOAD_BYTES + (1 << 15)
    _all_right(answers)


def _rest_upload(port: int, declared: int, sent: int) -> socket.socket:
    """A REST infer request whose body says `declared` bytes, of which `sent` are sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\n"
                 f"Content-Length: {declared}\r\n\r\n".encode() + b" " * sent)
    return sock


def test_rest_bodies_are_bounded_per_caller_and_in_time(uploads) -> None:
    with contextlib.ExitStack() as held:
        first = held.enter_context(_rest_upload(uploads.http_port, 2 * UPLOAD_BYTES,
                                                UPLOAD_BYTES - 1000))
        time.sleep(0.3)  # read, and charged to this caller
        second = held.enter_context(_rest_upload(uploads.http_port, 10_000, 10_000 - 1))
        over = second.recv(1000)
        start = time.monotonic()
        late = first.recv(1000)
        waited = time.monotonic() - start
    assert over.split(b" ")[1] == b"429" and b"--max-upload-bytes-per-caller" in over, over
    assert late.split(b" ")[1] == b"408" and b"--upload-timeout-s" in late, late
    assert waited <= UPLOAD_S + 2.0
