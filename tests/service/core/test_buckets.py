"""Batch buckets: fixed batch sizes from config.pbtxt, padding that never reaches a reply, and a
daemon whose engines see only bucket shapes after READY, each bucket warmed on every instance
first (a recording engine, computing with real ONNX Runtime, stands in for a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from service.core.buckets import Buckets
from service.core.model_settings import parse_buckets
from service.errors import ConfigError


def _config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse('name: "m"\n' + text, model_config_pb2.ModelConfig())


def test_buckets_are_the_preferred_sizes_else_powers_of_two_and_the_maximum() -> None:
    # max_batch_size itself too: a client's full request of 20 rows is one unpadded run.
    assert parse_buckets(_config("max_batch_size: 20")).sizes == (1, 2, 4, 8, 16, 20)
    assert parse_buckets(_config(
        "max_batch_size: 64 dynamic_batching { preferred_batch_size: [8, 2] }")).sizes == (2, 8)
    assert parse_buckets(_config("max_batch_size: 0")) is None


def test_a_preferred_size_above_max_batch_size_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"preferred_batch_size 16 .* accepted values are "
                                          r"1 to 8"):
        parse_buckets(_config(
            "max_batch_size: 8 dynamic_batching { preferred_batch_size: [4, 16] }"))


def test_batches_are_padded_up_and_split_and_replies_lose_the_padding() -> None:
    buckets = Buckets((2, 4))
    assert buckets.plan(1) == [(1, 2)]
    assert buckets.plan(4) == [(4, 4)]
    assert buckets.plan(11) == [(4, 4), (4, 4), (3, 4)]
    seen = []

    def run(inputs, outputs):
        seen.append(inputs["x"].shape)
        return {"y": inputs["x"] * 2}

    x = np.arange(11 * 3, dtype=np.float32).reshape(11, 3) + 1
    result, padding = buckets.run(run, {"x": x}, ["y"], 11)
    assert seen == [(4, 3)] * 3 and padding == 1
    np.testing.assert_array_equal(result["y"], x * 2)

    given = []
    Buckets((4,)).run(lambda inputs, outputs: given.append(inputs["x"].copy()) or inputs,
                      {"x": x[:2]}, ["x"], 2)
    np.testing.assert_array_equal(given[0], np.concatenate([x[:2], np.zeros((2, 3))]))
