"""Triton's classification extension: an output asked for with `class_count` comes back as its
top classes, "<value>:<index>:<label>" strings (BYTES) with labels from the output's
label_filename, over the unix socket and over TCP, where it is no shared memory."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.daemon import MODEL, MODELS, Daemon, image_input

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def served(request, tmp_path_factory) -> Iterator[Daemon]:
    """With --workers 2 the front-ends classify: the labels travel in their catalog."""
    d = Daemon(tmp_path_factory.mktemp("classes"), MODELS, "--workers", request.param)
    yield d
    assert d.stop() == 0


@pytest.mark.parametrize("address", ["url", "socket_url"])
def test_class_count_returns_the_top_classes_with_their_labels(served, holdout,
                                                              address) -> None:
    images, labels = holdout[0][:16], holdout[1][:16]
    with grpcclient.InferenceServerClient(getattr(served, address)) as client:
        assert "classification" in client.get_server_metadata().extensions
        logits = client.infer(MODEL, image_input(images)).as_numpy("logits")
        top = client.infer(MODEL, image_input(images), outputs=[
            grpcclient.InferRequestedOutput("logits", class_count=3)])
    output = top.get_response().outputs[0]
    assert (output.datatype, list(output.shape)) == ("BYTES", [16, 3])
    rows = [[entry.decode().split(":") for entry in row] for row in top.as_numpy("logits")]
    for row, raw in zip(rows, logits):
        values = [float(value) for value, _, _ in row]
        indexes = [int(index) for _, index, _ in row]
        assert values == sorted(values, reverse=True)
        assert [label for _, _, label in row] == [LABELS[i] for i in indexes]
        assert indexes[0] == raw.argmax()  # each run may take another device: up to its
        np.testing.assert_allclose(values, raw[indexes], rtol=1e-3, atol=1e-3)  # tolerance
    assert np.mean([int(row[0][1]) == label for row, label in zip(rows, labels)]) >= 0.9


def test_a_bad_class_count_names_the_parameter(daemon, holdout) -> None:
    request = grpcclient.InferRequestedOutput("logits", class_count=-3)
    with grpcclient.InferenceServerClient(daemon.url) as client, \
            pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, image_input(holdout[0][:1]), outputs=[request])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "output 'logits': parameters['classification']: int64_param -3 received" in \
        refused.value.message()
