"""The daemon's doors: every connection to its unix socket and TCP port is accepted here first.

gRPC tells a server nothing of a unix-socket peer's uid (grpc/grpc#15511), and it bounds neither
connections per peer nor in all. So each listener is a door: an asyncio server that accepts a
connection, learns who it is from the kernel (SO_PEERCRED and SO_PEERGROUPS on the socket; over
loopback TCP the uid owning the client's socket, service/edge/socket_owner.py, as any local user
may connect from any loopback address; the address over other TCP), admits it within the door's
bounds (per peer and in all), and then forwards its bytes to the gRPC
server on a private socket (a folder only the daemon's user may enter). The forwarding socket is
bound to a random abstract address before it connects, and gRPC reports that address as the
call's peer: `Peers.identify` turns it back into who called. TLS passes through the door and
ends at gRPC, as before.

A connection over a door's bounds is refused as its server would refuse a call, naming the limit:
in HTTP/2, RESOURCE_EXHAUSTED; in HTTP/1.1 (the REST transport), 429. On a TLS port, which the door
does not decrypt, it is closed."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import secrets
import shutil
import socket
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from service.edge.resets import DATA, END_STREAM, HEADERS, RST_STREAM, ResetWatch
from service.edge.socket_owner import is_loopback, loopback_uid
from service.edge.uploads import UploadBudget

log = logging.getLogger(__name__)

_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13; Python lacks the name
_ABSTRACT = "unix-abstract:"
_REFUSAL_S = 2.0  # a refused connection gets this long to send its first request


@dataclass(frozen=True)
class Peer:
    """Who is at the other end of a connection, as the kernel says: on the unix socket its
    process's uid and groups; over TCP its address (uid None)."""

    listener: str  # "unix" or "tcp"
    address: str  # "uid 1000" on the unix socket, the peer's address over TCP
    uid: int | None = None  # the unix socket's: whose rights its calls have
    gids: tuple[int, ...] = ()
    owner: int | None = None  # over loopback TCP: the uid owning the client's socket

    @property
    def key(self) -> str:
        """What per-peer limits count: a uid wherever the kernel names one."""
        return f"uid {self.owner}" if self.owner is not None else self.address


@dataclass(frozen=True)
class Bounds:
    per_peer: int
    total: int
    total_flag: str  # the flag that sets `total`, named in refusals
    resets: int  # stream resets a connection may send beyond the streams completed on it


class Peers:
    """The live connections of this process's doors, by the abstract address gRPC reports, and
    the budget of the request bodies still arriving on them."""

    def __init__(self, uploads: UploadBudget) -> None:
        self._by_address: dict[str, Peer] = {}
        self.uploads = uploads

    def identify(self, grpc_peer: str) -> Peer | None:
        """The peer of a call (`context.peer()`); None for one that did not come through a door
        (or whose connection has closed already)."""
        return self._by_address.get(grpc_peer)

    def queue_caller(self, address: str, token: bool) -> tuple[str, bool]:
        """Whose queue places a call from `address` takes, and whether it is an unauthenticated
        TCP caller (service.core.queue_policy.RequestOptions): the uid on the unix socket, the
        token's holders where a token guards TCP (`token`), else the uid (over loopback) or the
        address the door counted, over TCP; "" for a call that came through no door."""
        peer = self._by_address.get(address)
        if peer is None:
            return "", False
        if peer.listener == "unix":
            return peer.key, False
        return ("token", False) if token else (f"tcp {peer.key}", True)

    @staticmethod
    def address_of(peername: bytes | str) -> str:
        """The address gRPC would report for a forwarded connection whose socket's peer name
        (getpeername) is `peername`: how an HTTP server behind a door finds its caller."""
        name = peername.decode(errors="replace") if isinstance(peername, bytes) else peername
        return _ABSTRACT + name.removeprefix("\0")

    def _add(self, peer: Peer) -> str:
        name = f"hetserve-{os.getpid()}-{secrets.token_hex(8)}"
        self._by_address[_ABSTRACT + name] = peer
        return name

    def _remove(self, name: str) -> None:
        self._by_address.pop(_ABSTRACT + name, None)


class Door:
    """One listener of the daemon (the unix socket, or the TCP port), in front of the gRPC server
    that listens on `inner`."""

    def __init__(self, listener: str, inner: Path, bounds: Bounds, peers: Peers,
                 tls: bool = False, http2: bool = True) -> None:
        self.listener, self.inner, self.bounds, self._peers = listener, inner, bounds, peers
        self.tls = tls
        self.http2 = http2  # gRPC's; else HTTP/1.1 (the REST transport)
        self._open: Counter[str] = Counter()  # by peer
        self._total = 0
        self._connections: set[_Connection] = set()  # admitted and open
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task | None = None

    @property
    def backlog(self) -> int:
        """Connections the kernel queues before the door admits or refuses them: as many as the
        door may hold, so that a burst is answered (admitted, or refused with a reason) rather
        than dropped by a full queue."""
        return max(128, self.bounds.total)

    async def open_unix(self, path: Path) -> None:
        self._server = await asyncio.get_running_loop().create_unix_server(
            lambda: _Connection(self), str(path), backlog=self.backlog)
        self._start_sweeping()

    async def open_tcp(self, host: str, port: int, reuse_port: bool) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Connection(self), host, port, reuse_port=reuse_port or None,
            backlog=self.backlog)
        self._start_sweeping()

    def _start_sweeping(self) -> None:
        timeout_s = self._peers.uploads.timeout_s
        if self.http2 and not self.tls and timeout_s:
            self._sweeper = asyncio.create_task(self._sweep(timeout_s), name="door-uploads")

    async def _sweep(self, timeout_s: float) -> None:
        """Ends the connections whose oldest body still arriving began `timeout_s` ago."""
        while True:
            await asyncio.sleep(min(1.0, timeout_s / 4))
            late = time.monotonic() - timeout_s
            for connection in list(self._connections):
                since = connection.arriving_since()
                if since is not None and since < late:
                    connection.go_away(f"a request body was still arriving after {timeout_s:g} "
                                       "s (--upload-timeout-s)")

    def close(self) -> None:
        """Accepts no more connections; those open stay until gRPC closes them."""
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()

    def _admit(self, sock: socket.socket) -> tuple[Peer | None, str]:
        """Who `sock` is, or why it is refused."""
        peer = self._identify(sock)
        if self._total >= self.bounds.total:
            return None, (f"{self._total} connections are open on the daemon's "
                          f"{self.listener} listener, its limit ({self.bounds.total_flag})")
        if self._open[peer.key] >= self.bounds.per_peer:
            return None, (f"{self._open[peer.key]} connections are open from {peer.key}, the "
                          "limit per peer (--max-connections-per-peer); close some or share one "
                          "channel")
        self._open[peer.key] += 1
        self._total += 1
        return peer, ""

    def _identify(self, sock: socket.socket) -> Peer:
        if self.listener != "unix":
            host = sock.getpeername()[0]
            return Peer(self.listener, host,
                        owner=loopback_uid(sock) if is_loopback(host) else None)
        _, uid, gid = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return Peer("unix", f"uid {uid}", uid, tuple(sorted({gid, *_peer_groups(sock)})))

    def _closed(self, peer: Peer, connection: _Connection) -> None:
        self._connections.discard(connection)
        self._total -= 1
        self._open[peer.key] -= 1
        if not self._open[peer.key]:
            del self._open[peer.key]


def _peer_groups(sock: socket.socket) -> list[int]:
    """The supplementary groups of the peer's process when it connected."""
    size = 4 * 64
    while True:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, size)
        except OSError as e:
            if e.errno != errno.ERANGE or size > 4 * 65536:  # ERANGE: more groups than room
                return []
            size *= 4
            continue
        return list(struct.unpack(f"{len(raw) // 4}I", raw))


class _Connection(asyncio.Protocol):
    """A client's connection, forwarded to the door's gRPC server and back."""

    def __init__(self, door: Door) -> None:
        self._door = door
        self._client: asyncio.Transport | None = None
        self._upstream: asyncio.Transport | None = None
        self._peer: Peer | None = None
        self._name = ""
        # Plaintext HTTP/2 only: TLS passes through undecrypted.
        self.resets = ResetWatch(door.bounds.resets) if door.http2 and not door.tls else None
        self._arriving: dict[int, int] = {}  # stream -> its request's bytes so far
        self._arriving_since: dict[int, float] = {}  # stream -> when they began

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._client = transport
        try:
            self._peer, refusal = self._door._admit(transport.get_extra_info("socket"))
        except OSError:  # gone already (getpeername: not connected)
            transport.close()
            return
        if self._peer is None:
            log.warning("connection refused: %s", refusal)
            if self._door.tls:
                transport.close()
            else:
                transport.set_protocol((_Refusal if self._door.http2 else _HttpRefusal)(
                    transport, refusal))
            return
        self._name = self._door._peers._add(self._peer)
        self._door._connections.add(self)
        transport.pause_reading()  # until the upstream connection is there
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.bind("\0" + self._name)
            await loop.sock_connect(sock, str(self._door.inner))
            self._upstream, _ = await loop.create_unix_connection(
                lambda: _Upstream(self), sock=sock)
        except OSError as e:
            sock.close()
            log.warning("cannot reach the gRPC server behind the %s door: %s",
                        self._door.listener, e)
            assert self._client is not None
            self._client.close()
            return
        assert self._client is not None
        if self._client.is_closing():
            self._upstream.close()
        else:
            self._client.resume_reading()

    def data_received(self, data: bytes) -> None:
        assert self._upstream is not None
        if self.resets is not None:
            frames = self.resets.from_client(data)
            refusal = self.resets.reset_refusal() if self.resets.over else self._uploads(frames)
            if refusal:
                self.go_away(refusal)
                return
        self._upstream.write(data)

    def _uploads(self, frames: list[tuple[int, int, int, int]]) -> str:
        """Charges the request bodies still arriving on this connection (DATA of streams the
        client has not ended) to its caller's budget; the refusal where one is over."""
        assert self._peer is not None
        budget = self._door._peers.uploads
        for kind, flags, stream, length in frames:
            if kind == DATA and length:
                refusal = budget.charge(self._peer.key, length)
                if refusal:
                    return refusal
                self._arriving[stream] = self._arriving.get(stream, 0) + length
                self._arriving_since.setdefault(stream, time.monotonic())
            if kind in (DATA, HEADERS) and flags & END_STREAM or kind == RST_STREAM:
                budget.release(self._peer.key, self._arriving.pop(stream, 0))
                self._arriving_since.pop(stream, None)
        return ""

    def arriving_since(self) -> float | None:
        """time.monotonic() when the oldest body still arriving began; None without one."""
        return min(self._arriving_since.values(), default=None)

    def go_away(self, reason: str) -> None:
        """No more of this client's frames reach gRPC, and it gets GOAWAY saying why (rapid
        reset, a body over its budget or too slow)."""
        assert self._client is not None and self._upstream is not None and self.resets
        log.warning("connection from %s closed: %s", self._peer.key if self._peer else "?",
                    reason)
        self._upstream.close()
        frame = self.resets.goaway(reason)
        if frame is not None:
            self._client.write(frame)
        self._client.close()

    # The client reads slowly: stop reading what gRPC sends it until it catches up.
    def pause_writing(self) -> None:
        if self._upstream is not None:
            self._upstream.pause_reading()

    def resume_writing(self) -> None:
        if self._upstream is not None:
            self._upstream.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peer is None:
            return
        if self._upstream is not None:
            self._upstream.close()
        self._door._peers.uploads.release(self._peer.key, sum(self._arriving.values()))
        self._arriving.clear()
        self._arriving_since.clear()
        self._door._peers._remove(self._name)
        self._door._closed(self._peer, self)
        self._peer = None

    def upstream_lost(self) -> None:
        assert self._client is not None
        self._client.close()


class _Upstream(asyncio.Protocol):
    """The door's side of a forwarded connection: what gRPC sends goes to the client."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    def data_received(self, data: bytes) -> None:
        assert self._connection._client is not None
        if self._connection.resets is not None:
            self._connection.resets.from_server(data)
        self._connection._client.write(data)

    # gRPC sends faster than the door can pass on: stop reading the client's requests.
    def pause_writing(self) -> None:
        assert self._connection._client is not None
        self._connection._client.pause_reading()

    def resume_writing(self) -> None:
        assert self._connection._client is not None
        self._connection._client.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connection.upstream_lost()


class _Refusal(asyncio.Protocol):
    """Refuses a connection in HTTP/2: each call it opens gets RESOURCE_EXHAUSTED with `message`,
    then GOAWAY."""

    def __init__(self, transport: asyncio.Transport, message: str) -> None:
        self._transport, self._message = transport, message
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding="utf-8"))
        self._h2.initiate_connection()
        transport.write(self._h2.data_to_send())
        self._timer = asyncio.get_running_loop().call_later(_REFUSAL_S, transport.close)

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.H2Error:
            self._transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self._h2.send_headers(event.stream_id, [
                    (":status", "200"), ("content-type", "application/grpc"),
                    ("grpc-status", "8"), ("grpc-message", _percent_encoded(self._message))],
                    end_stream=True)
                self._h2.close_connection(last_stream_id=event.stream_id)
                self._transport.write(self._h2.data_to_send())
                self._transport.close()
                return
        self._transport.write(self._h2.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()


class _HttpRefusal(asyncio.Protocol):
    """Refuses an HTTP/1.1 connection: 429 with `message` as KServe V2's error body."""

    def __init__(self, transport: asyncio.Transport, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        transport.write(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        transport.close()


def _percent_encoded(text: str) -> str:
    """grpc-message as the gRPC spec wants it: printable ASCII but '%' as is."""
    return "".join(c if " " <= c <= "~" and c != "%" else
                   "".join(f"%{b:02X}" for b in c.encode()) for c in text)


@contextlib.contextmanager
def private_folder() -> Iterator[Path]:
    """A folder for the gRPC servers' own sockets that only this user may enter (mkdtemp makes
    it 0700): a caller who could connect there would pass no door."""
    folder = Path(tempfile.mkdtemp(prefix="hetserve-door-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
