"""The rule the daemon and its clients share: the Spark client's full requests are exactly the
batch sizes the daemon's engines run, so the daemon pads none of them."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from service import contract
from service.core.model_settings import parse_buckets
from spark_jobs.interface import ModelInterface
from tests.support.daemon import MODEL, MODELS


def _config(max_batch_size: int, preferred: tuple[int, ...]) -> model_config_pb2.ModelConfig:
    return model_config_pb2.ModelConfig(name="m", max_batch_size=max_batch_size,
                                        dynamic_batching={"preferred_batch_size": preferred})


def _cases() -> list[tuple[int, tuple[int, ...]]]:
    example = text_format.Parse((MODELS / MODEL / "config.pbtxt").read_text(),
                                model_config_pb2.ModelConfig())
    return [(example.max_batch_size, tuple(example.dynamic_batching.preferred_batch_size)),
            (1, ()), (3, ()), (100, ()), (128, ()), (128, (48, 16)), (100, (100,)), (7, (2, 5))]


@pytest.mark.parametrize("max_batch_size, preferred", _cases())
def test_full_client_requests_are_never_padded(max_batch_size, preferred) -> None:
    buckets = parse_buckets(_config(max_batch_size, preferred))
    client = ModelInterface("m", "x", "FP32", (1,), "y", max_batch_size,
                            preferred_batch_sizes=preferred)
    assert client.batch_buckets == buckets.sizes  # one rule, both sides
    for wanted in (None, *range(1, max_batch_size + 1)):
        rows = client.request_batch(wanted)
        if wanted is not None and wanted < min(buckets.sizes):
            continue  # asked for less than any bucket: padded, as the caller chose
        assert buckets.plan(rows) == [(rows, rows)], (wanted, rows)


def test_the_bucket_rule() -> None:
    assert contract.batch_buckets(1) == (1,)
    assert contract.batch_buckets(3) == (1, 2, 3)
    assert contract.batch_buckets(100) == (1, 2, 4, 8, 16, 32, 64, 100)
    assert contract.batch_buckets(128) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert contract.batch_buckets(128, (48, 16, 48)) == (16, 48)


def test_a_unix_address_spreads_over_every_front_end_socket_beside_it(tmp_path) -> None:
    own = tmp_path / "grpc.sock"
    for path in (own, contract.worker_socket(own, 1), contract.worker_socket(own, 2)):
        path.touch()
    assert contract.front_end_addresses(f"unix:{own}") == [
        f"unix:{own}", f"unix:{own}.1", f"unix:{own}.2"]
    assert contract.front_end_addresses("127.0.0.1:8001") == ["127.0.0.1:8001"]
