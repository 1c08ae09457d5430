"""The daemon through unchanged tritonclient: protocol RPCs, predictions, health."""

from __future__ import annotations

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.daemon import MODEL, image_input
from tests.support.served import assert_served, reply_devices


def test_server_and_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert not client.is_model_ready("no_such_model")
    assert client.get_server_metadata().name == "hetserve"
    meta = client.get_model_metadata(MODEL)
    assert meta.versions == ["1"] and meta.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == \
        [("image", "FP32", [-1, 1, 28, 28])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == \
        [("logits", "FP32", [-1, 10])]
    config = client.get_model_config(MODEL).config
    assert config.name == MODEL and config.max_batch_size == 128
    assert config.dynamic_batching.max_queue_delay_microseconds > 0
    index = client.get_model_repository_index().models
    assert [(m.name, m.version, m.state) for m in index] == [(MODEL, "1", "READY")]


def test_predictions_equal_in_process_onnxruntime(client, holdout) -> None:
    images = holdout[0][:64]
    result = client.infer(MODEL, image_input(images))
    device = result.get_response().parameters["device"].string_param
    assert device in reply_devices()
    assert_served(result.as_numpy("logits"), device, images)
    assert result.get_response().model_version == "1"


def test_held_out_accuracy(client, holdout) -> None:
    images, labels = holdout
    predicted = np.concatenate([
        client.infer(MODEL, image_input(images[i:i + 128])).as_numpy("logits").argmax(1)
        for i in range(0, len(images), 128)])
    assert len(predicted) == 1000
    assert (predicted == labels).mean() >= 0.97


def test_unix_socket_serves_the_same_model(daemon, holdout) -> None:
    images = holdout[0][:3]
    with grpcclient.InferenceServerClient(daemon.socket_url) as local, \
            grpcclient.InferenceServerClient(daemon.url) as tcp:
        np.testing.assert_array_equal(
            local.infer(MODEL, image_input(images)).as_numpy("logits"),
            tcp.infer(MODEL, image_input(images)).as_numpy("logits"))


def test_standard_health_service(daemon) -> None:
    with grpc.insecure_channel(daemon.url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
