"""The reference for bench/spark_scoring.py: ONNX Runtime inside Spark's Python workers, the way
FIELD_NOTES found fastest (one intra-op thread per task, one session per reused worker). A module
of its own so that workers import it, keeping the session cache, instead of unpickling it
per task."""

from __future__ import annotations

import functools

import numpy as np

from spark_jobs.scoring import softmax


@functools.cache
def _session(path: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def make_predict_fn(path: str, input_name: str, dims: tuple[int, ...]):
    def make():
        session = _session(path)

        def predict(inputs: np.ndarray) -> dict[str, np.ndarray]:
            logits = session.run(None, {input_name: inputs.reshape(len(inputs), *dims)})[0]
            scores = softmax(logits)  # the post-processing the daemon path does
            return {"label": scores.argmax(axis=1).astype(np.int32), "scores": scores}

        return predict

    return make
