"""The daemon's doors (service/edge/door.py): connections per peer and per listener are bounded,
a refused connection's calls get RESOURCE_EXHAUSTED naming the limit, the socket's users keep
their own share while TCP is full, a local user's loopback aliases count as that user, and a
closed connection leaves no trace."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.support.daemon import MODEL, MODELS, Daemon, image_input
from tests.support.other_user import as_nobody

PER_PEER, TOTAL = 3, 8


@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def daemon(request, tmp_path_factory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("doors"), MODELS, "--workers", request.param,
               "--max-connections-per-peer", str(PER_PEER), "--max-connections-tcp", str(TOTAL))
    d.workers = int(request.param)
    time.sleep(1.0)  # until the door has seen the start-up readiness probe's connection close
    yield d
    assert d.stop() == 0


def _channel(target: str) -> grpc.Channel:
    """A channel with a connection of its own (channels share one by default)."""
    return grpc.insecure_channel(target, [("grpc.use_local_subchannel_pool", 1)])


def _live(channel: grpc.Channel) -> tuple[grpc.StatusCode, str]:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    try:
        stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def _unix_serves(daemon: Daemon, holdout) -> None:
    with grpcclient.InferenceServerClient(daemon.socket_url) as c:
        logits = c.infer(MODEL, image_input(holdout[0][:2])).as_numpy("logits")
    assert (logits.argmax(1) == holdout[1][:2]).all()


def test_connections_per_peer_are_bounded_and_the_refusal_names_the_limit(
        daemon, holdout) -> None:
    # With several front-ends each has its own door: a peer may hold PER_PEER at each.
    limit = PER_PEER * daemon.workers
    with contextlib.ExitStack() as held:
        channels = [held.enter_context(_channel(daemon.url)) for _ in range(limit + 1)]
        codes = [_live(c) for c in channels]
        refused = [c for c in codes if c[0] != grpc.StatusCode.OK]
        assert len(refused) >= 1 and len(codes) - len(refused) >= PER_PEER, codes
        code, details = refused[0]
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
        assert f"from uid {os.getuid()}" in details and "--max-connections-per-peer" in details
        _unix_serves(daemon, holdout)  # another listener, another share
    _serves_again(daemon)


def _refused_soon(daemon: Daemon) -> tuple[grpc.StatusCode, str]:
    """A new connection's call, once the door has admitted or refused the idle connections
    just made (a busy machine takes a while to accept them all)."""
    deadline = time.monotonic() + 10
    while True:
        with _channel(daemon.url) as channel:
            code, details = _live(channel)
        if code != grpc.StatusCode.OK or time.monotonic() > deadline:
            return code, details
        time.sleep(0.2)


def _serves_again(daemon: Daemon) -> None:
    """Connections closed are counted no more, once the door has seen them close."""
    deadline = time.monotonic() + 10
    while True:
        with _channel(daemon.url) as channel:
            code = _live(channel)[0]
        if code == grpc.StatusCode.OK or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert code == grpc.StatusCode.OK


def _connect_from_aliases(held: contextlib.ExitStack, count: int, port: int) -> None:
    """`count` idle connections from loopback aliases, PER_PEER from each address."""
    for i in range(count):
        sock = held.enter_context(socket.socket())
        sock.bind((f"127.0.0.{2 + i // PER_PEER % 200}", 0))
        sock.connect(("127.0.0.1", port))


def test_a_local_users_loopback_aliases_count_as_that_user(daemon, holdout) -> None:
    """Idle connections from 127.0.0.2, .3, ... are one uid's (the kernel says whose): beyond
    PER_PEER they are refused, and another local user's first TCP call is served."""
    with contextlib.ExitStack() as held:
        _connect_from_aliases(held, 6 * TOTAL * daemon.workers, daemon.port)
        code, details = _refused_soon(daemon)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert f"from uid {os.getuid()}" in details, details
        run = as_nobody(f"""
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
channel = grpc.insecure_channel("127.0.0.1:{daemon.port}")
stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
print(stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live)
""")
        assert run.returncode == 0 and run.stdout.strip() == "True", run.stderr
        _unix_serves(daemon, holdout)
    _serves_again(daemon)


@pytest.fixture(scope="module")
def roomy(tmp_path_factory) -> Iterator[Daemon]:
    """A daemon whose TCP listener, not a peer's share, is what fills."""
    d = Daemon(tmp_path_factory.mktemp("roomy"), MODELS, "--workers", "1",
               "--max-connections-per-peer", "1000", "--max-connections-tcp", str(TOTAL))
    time.sleep(1.0)
    yield d
    assert d.stop() == 0


def test_idle_connections_fill_only_their_listener(roomy, holdout) -> None:
    """Connections that send nothing, up to the listener's limit: the next is refused at once,
    and the socket's users are served meanwhile."""
    with contextlib.ExitStack() as held:
        _connect_from_aliases(held, 3 * TOTAL, roomy.port)
        _unix_serves(roomy, holdout)
        code, details = _refused_soon(roomy)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "(--max-connections-tcp)" in details
    _serves_again(roomy)
