"""The daemon serving MNIST through the OpenCL engine on PoCL, chosen by the model's `devices`
parameter: the same predictions as onnxruntime, metrics labelled engine="opencl"."""

from __future__ import annotations

import shutil

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient

from tests.conftest import MODEL, MODELS, Daemon, image_input
from tests.service.test_batching import scrape


def test_daemon_serves_mnist_through_opencl(tmp_path, holdout) -> None:
    repo = tmp_path / "models"
    shutil.copytree(MODELS / MODEL, repo / MODEL)
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text() + 'parameters { key: "devices" value: { '
                                           'string_value: "opencl:cpu0, onnxruntime" } }\n')
    daemon = Daemon(tmp_path, repo)
    try:
        images = holdout[0][:64]
        ref = ort.InferenceSession(str(MODELS / MODEL / "1" / "model.onnx")).run(
            None, {"image": images})[0]
        with grpcclient.InferenceServerClient(daemon.url) as client:
            for lo, hi in ((0, 1), (1, 9), (9, 64)):
                got = client.infer(MODEL, image_input(images[lo:hi])).as_numpy("logits")
                assert np.abs(got - ref[lo:hi]).max() <= 1e-3 * np.abs(ref[lo:hi]).max()
                assert (got.argmax(1) == ref[lo:hi].argmax(1)).all()
        text = scrape(daemon.metrics_url)
        assert text["hetserve_inferences_total"] == 64
        import urllib.request
        body = urllib.request.urlopen(daemon.metrics_url).read().decode()
        assert 'device="cpu0",engine="opencl",kind="cpu"' in body.replace(
            f'model="{MODEL}",', "")
    finally:
        assert daemon.stop() == 0
