"""`hetserve health`: asks a daemon's grpc.health.v1 service whether it serves, for container
health checks and scripts. Plaintext only: the unix socket, loopback TCP or the health port."""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service import client_socket
from service.settings import Settings


def default_address(settings: Settings) -> str:
    if settings.unix_socket:
        return f"unix:{settings.unix_socket}"
    return f"127.0.0.1:{settings.health_port or settings.grpc_port}"


def check(address: str, service: str = "", timeout_s: float = 5.0) -> int:
    """Prints the status; 0 when SERVING, 1 otherwise (NOT_SERVING, unknown, unreachable, or a
    unix socket that is not the expected user's daemon's: then nothing is sent)."""
    try:
        client_socket.check(address)
    except client_socket.UntrustedDaemonError as e:
        print(f"hetserve health: {e}", file=sys.stderr)
        return 1
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as e:
            print(f"hetserve health: {address}: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{address}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1
