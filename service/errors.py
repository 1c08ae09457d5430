"""Domain errors, each carrying the gRPC status it maps to (one mapping, in the servicer)."""

from __future__ import annotations

import grpc


class HetserveError(Exception):
    """Base error; `status` is the gRPC status code a client receives."""

    status: grpc.StatusCode = grpc.StatusCode.INTERNAL


class ModelNotFoundError(HetserveError):
    status = grpc.StatusCode.NOT_FOUND


class InvalidInputError(HetserveError):
    status = grpc.StatusCode.INVALID_ARGUMENT


class AlreadyExistsError(HetserveError):
    status = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(HetserveError):
    status = grpc.StatusCode.PERMISSION_DENIED


class QueueFullError(HetserveError):
    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class LimitError(HetserveError):
    """A bound on what clients may make the daemon hold (shared memory regions, descriptors)."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceededError(HetserveError):
    """The client's deadline or the queue timeout passed before the request could run."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED


class ModelUnavailableError(HetserveError):
    status = grpc.StatusCode.UNAVAILABLE


class StreamIdleError(HetserveError):
    """A stream that sent no request for --stream-idle-s while no reply was pending."""

    status = grpc.StatusCode.UNAVAILABLE


class ConfigError(HetserveError):
    """A model repository entry that cannot be loaded (reported, never served)."""

    status = grpc.StatusCode.UNAVAILABLE


class DeviceError(HetserveError):
    """Every device that could run a batch failed."""

    status = grpc.StatusCode.INTERNAL


class StartupError(Exception):
    """The daemon cannot start as configured (a port or socket in use, a bad repository)."""


class StatusError(HetserveError):
    """An error as another process of the daemon answered it: its status and message."""

    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status


def shown(value: object, limit: int = 200) -> str:
    """Client data as an error message may quote it: its repr, cut to `limit` characters (a
    peer must not grow logs and replies with what it sends)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
