"""A raw HTTP/2 client (prior knowledge, no TLS) for what no gRPC client does: thousands of
streams on one connection, streams reset as soon as they open, a connection that sends nothing
(the floods of bench/floods.py and tests/service/grpc/test_floods.py)."""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Sequence

import h2.config
import h2.connection
import h2.events
from h2.errors import ErrorCodes

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


class _Unbounded(h2.connection.H2Connection):
    """Opens streams beyond the server's MAX_CONCURRENT_STREAMS, as an attacker would."""

    @property
    def open_outbound_streams(self) -> int:
        return 0


class RawH2:
    """One connection to `address` (HOST:PORT or unix:PATH); every wait is bounded."""

    def __init__(self, address: str, timeout_s: float = 5.0, bind: str | None = None) -> None:
        """`bind`: the local address to connect from (TCP)."""
        if address.startswith("unix:"):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(timeout_s)
            self.sock.connect(address[len("unix:"):])
        else:
            host, port = address.rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)), timeout=timeout_s,
                                                 source_address=(bind, 0) if bind else None)
        self.h2 = _Unbounded(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.authority = "localhost" if address.startswith("unix:") else address
        self.refused: set[int] = set()  # streams the server reset with REFUSED_STREAM
        self.ended: dict[int, str] = {}  # stream -> grpc-status of those it answered
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = False  # by the server
        self.settings: dict[int, int] = {}  # the server's, once received (and acknowledged)
        self.flush()
        self.read(timeout_s, until=lambda: bool(self.settings))

    def __enter__(self) -> RawH2:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def open(self, path: str = STREAM_INFER, headers: Sequence[tuple[str, str]] = ()) -> int:
        """A gRPC call's headers (and `headers` more), no message: the call waits for its
        requests."""
        stream = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream, [
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", self.authority), ("content-type", "application/grpc"),
            ("te", "trailers"), *headers])
        return stream

    def send_message(self, stream: int, message: bytes, end: bool = False,
                     compressed: bool = False) -> None:
        """One gRPC message (`compressed` in the call's grpc-encoding); `end` ends the call's
        requests too (a unary call's)."""
        self.h2.send_data(stream, struct.pack(">BI", compressed, len(message)) + message,
                          end_stream=end)

    def reset(self, stream: int) -> None:
        self.h2.reset_stream(stream, ErrorCodes.CANCEL)

    def flush(self) -> None:
        """Sends what is queued, reading meanwhile (a server that writes is never blocked)."""
        pending = b""
        while (pending := pending + self.h2.data_to_send()) and not self.closed:
            readable, writable, _ = select.select([self.sock], [self.sock], [], 5.0)
            if not readable and not writable:
                raise TimeoutError("the server reads nothing")
            if readable:
                self._receive()
            if writable:
                try:
                    pending = pending[self.sock.send(pending):]
                except ConnectionError:  # the server has closed: what it sent says why
                    self.read(1.0)
                    self.closed = True

    def read(self, seconds: float, until=lambda: False) -> None:
        """Reads frames for up to `seconds`, until the server closes or `until()` holds."""
        end = time.monotonic() + seconds
        while not self.closed and not until() and (left := end - time.monotonic()) > 0:
            if select.select([self.sock], [], [], min(left, 0.1))[0]:
                self._receive()
                self.flush()  # SETTINGS and PING acks

    def _receive(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionError:
            data = b""
        if not data:
            self.closed = True
            return
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.StreamReset) and \
                    event.error_code == ErrorCodes.REFUSED_STREAM:
                self.refused.add(event.stream_id)
            elif isinstance(event, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
                status = dict(event.headers).get("grpc-status")  # trailers-only replies too
                if status is not None:
                    self.ended[event.stream_id] = status
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                self.settings.update({k: v.new_value for k, v in event.changed_settings.items()})
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.goaway = event
