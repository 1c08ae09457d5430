"""Server reflection, as grpcurl and similar tools use it: a real reflection client lists the
services and resolves the protocol's messages from the daemon alone."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.support.daemon import Daemon

SERVICES = {"inference.GRPCInferenceService", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"}


def test_reflection_lists_the_services_and_describes_their_messages(daemon: Daemon) -> None:
    with grpc.insecure_channel(daemon.socket_url) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert set(database.get_services()) == SERVICES
        # A separate pool, as a tool without the stubs would build it from the replies.
        pool = DescriptorPool(database)
        infer = pool.FindServiceByName("inference.GRPCInferenceService") \
            .FindMethodByName("ModelInfer")
        assert infer.input_type.full_name == "inference.ModelInferRequest"
        assert "raw_input_contents" in infer.input_type.fields_by_name
        assert pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")


def test_reflection_over_tcp_lists_the_same_services(daemon: Daemon) -> None:
    with grpc.insecure_channel(daemon.url) as channel:
        assert set(ProtoReflectionDescriptorDatabase(channel).get_services()) == SERVICES


def test_an_unknown_symbol_is_not_found(daemon: Daemon) -> None:
    with grpc.insecure_channel(daemon.socket_url) as channel:
        with pytest.raises(KeyError):
            ProtoReflectionDescriptorDatabase(channel).FindFileContainingSymbol("no.such.Thing")
