"""The daemon's doors (service/grpc/door.py): connections per peer and per listener are bounded,
a refused connection's calls get RESOURCE_EXHAUSTED naming the limit, the socket's users keep
their own share while TCP is full, and a closed connection leaves no trace."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import MODEL, MODELS, Daemon, image_input

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
        assert "from 127.0.0.1" in details and "--max-connections-per-peer" in details
        _unix_serves(daemon, holdout)  # another listener, another share
    _serves_again(daemon)


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


def test_idle_connections_fill_only_their_listener(daemon, holdout) -> None:
    """Connections that send nothing, from several addresses, up to the listener's limit: the
    next is refused at once, and the socket's users are served meanwhile."""
    with contextlib.ExitStack() as held:
        # Thrice the limit (with several front-ends, the kernel spreads them over every door),
        # twice: the second fills what the earlier tests' connections, closing meanwhile, free.
        for i in range(6 * TOTAL * daemon.workers):
            if i == 3 * TOTAL * daemon.workers:
                time.sleep(0.5)
            sock = held.enter_context(socket.socket())
            sock.bind((f"127.0.0.{2 + i // PER_PEER % 200}", 0))  # PER_PEER from each address
            sock.connect(("127.0.0.1", daemon.port))
        time.sleep(0.5)  # every one accepted or refused
        _unix_serves(daemon, holdout)
        with _channel(daemon.url) as channel:
            code, details = _live(channel)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "(--max-connections-tcp)" in details
    _serves_again(daemon)
