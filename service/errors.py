"""Domain errors, each carrying the transport-neutral status a client receives: mapped once to
gRPC (service/grpc/handlers.py) and once to HTTP (service/http/transport.py)."""

from __future__ import annotations

import enum
import logging

log = logging.getLogger(__name__)
_MAX_MESSAGE = 1024  # characters of an error's text that reach a client


class Status(enum.Enum):
    """An outcome, named and numbered as the KServe V2 protocol's gRPC codes are."""

    OK = 0
    CANCELLED = 1
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


class HetserveError(Exception):
    """Base error; `status` is what a client receives."""

    status: Status = Status.INTERNAL


class ModelNotFoundError(HetserveError):
    status = Status.NOT_FOUND


class InvalidInputError(HetserveError):
    status = Status.INVALID_ARGUMENT


class AlreadyExistsError(HetserveError):
    status = Status.ALREADY_EXISTS


class PermissionDeniedError(HetserveError):
    status = Status.PERMISSION_DENIED


class QueueFullError(HetserveError):
    status = Status.RESOURCE_EXHAUSTED


class LimitError(HetserveError):
    """A bound on what clients may make the daemon hold (shared memory regions, descriptors)."""

    status = Status.RESOURCE_EXHAUSTED


class DeadlineExceededError(HetserveError):
    """The client's deadline or the queue timeout passed before the request could run."""

    status = Status.DEADLINE_EXCEEDED


class ModelUnavailableError(HetserveError):
    status = Status.UNAVAILABLE


class StreamIdleError(HetserveError):
    """A stream that sent no request for --stream-idle-s while no reply was pending."""

    status = Status.UNAVAILABLE


class ConfigError(HetserveError):
    """A model repository entry that cannot be loaded (reported, never served)."""

    status = Status.UNAVAILABLE


class DeviceError(HetserveError):
    """Every device that could run a batch failed."""

    status = Status.INTERNAL


class StartupError(Exception):
    """The daemon cannot start as configured (a port or socket in use, a bad repository)."""


class StatusError(HetserveError):
    """An error as another process of the daemon answered it: its status and message."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


def shown(value: object, limit: int = 200) -> str:
    """Client data as an error message may quote it: its repr, cut to `limit` characters (a
    peer must not grow logs and replies with what it sends)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def status_of(error: BaseException, where: str) -> tuple[Status, str]:
    """The status and message a client gets for `error`; a bug's is logged here, in one line
    (its traceback at DEBUG)."""
    if isinstance(error, HetserveError):
        return error.status, str(error)[:_MAX_MESSAGE]
    log.error("%s failed: %s: %s", where, type(error).__name__, str(error)[:_MAX_MESSAGE])
    log.debug("%s failed", where, exc_info=error)
    return Status.INTERNAL, f"{where}: an internal error ({type(error).__name__})"
