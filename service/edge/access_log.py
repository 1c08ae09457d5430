"""The access log (--access-log on): one line per gRPC call and REST request, with its transport,
method or endpoint, model, status, duration and caller as the daemon identifies it (a uid, an
address, whether the token guarded it), never request data. Off by default; when on, never rate
limited: an operator asked for every line. Model names a client sent are quoted and cut to a
bound, so that a line stays short whatever the client sends."""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType

import grpc

from service.edge.door import Peers
from service.settings import Settings

log = logging.getLogger("hetserve.access")
_MODEL_CHARS = 100  # of a model name as a client sent it


class AccessLog:
    def __init__(self, peers: Peers | None = None, token: bool = False) -> None:
        """Logs calls where `peers` (who connected) is given, and is off without; `token`: TCP
        and REST callers passed the daemon's token."""
        self._peers, self._token = peers, token
        self.on = peers is not None
        if self.on:  # its lines pass whatever --log-level says of the others
            log.setLevel(logging.INFO)

    @classmethod
    def of(cls, settings: Settings, peers: Peers) -> AccessLog:
        return cls(peers if settings.access_log else None, bool(settings.token_file))

    def grpc(self, method: str, context: grpc.aio.ServicerContext) -> GrpcCall:
        """Times a gRPC call; the line is written when the `with` block ends."""
        return GrpcCall(self, method, context)

    def rest(self, endpoint: str, model: str, status: int, started: float, peer: str) -> None:
        """A REST request answered with HTTP `status`; `started`: time.perf_counter()."""
        if self.on:
            self.write("rest", endpoint, model, str(status), started, peer)

    def write(self, transport: str, method: str, model: str, status: str, started: float,
              peer: str) -> None:
        log.info("%s %s model=%s status=%s duration_ms=%.3f caller=%r", transport, method,
                 _quoted(model), status, (time.perf_counter() - started) * 1e3,
                 self._caller(peer))

    def _caller(self, peer: str) -> str:
        """uid N on the unix socket; over TCP the uid owning the client's socket (loopback) or
        its address, and whether the token was required."""
        assert self._peers is not None
        found = self._peers.identify(peer)
        if found is None:
            return "unknown"
        if found.listener == "unix":
            return found.address
        return found.key + (" with the token" if self._token else "")


OFF = AccessLog()


def _quoted(model: str) -> str:
    """A model name as a client sent it: quoted, cut to a bound ("..." after the quote says so)."""
    if not model:
        return "-"
    return repr(model[:_MODEL_CHARS]) + ("..." if len(model) > _MODEL_CHARS else "")


class GrpcCall:
    """One gRPC call being timed; `model` is set once its request names one, `status` where the
    call ends without an error to say it."""

    def __init__(self, access: AccessLog, method: str, context: grpc.aio.ServicerContext) -> None:
        self._access, self._method, self._context = access, method, context
        self._started = time.perf_counter()
        self.model = ""
        self.status = "OK"

    def __enter__(self) -> GrpcCall:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if not self._access.on:
            return
        code = self._context.code()  # set where the call was aborted with a status
        if error is None:
            status = self.status
        elif isinstance(code, grpc.StatusCode):
            status = code.name
        else:  # the client left, or its deadline passed: gRPC ends the call
            status = "CANCELLED" if isinstance(error, asyncio.CancelledError) else "UNKNOWN"
        self._access.write("grpc", self._method, self.model, status, self._started,
                           self._context.peer())
