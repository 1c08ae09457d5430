"""The references for bench/spark_scoring.py: ONNX Runtime inside Spark's Python workers, the way
FIELD_NOTES found fastest (one intra-op thread per task, one session per reused worker), in a
predict_batch_udf and in mapInArrow. The mapInArrow reference decodes and writes its rows with
the daemon path's own Arrow code, so that the two differ only in where the model runs. A module
of its own so that workers import it, keeping the session cache, instead of unpickling it per
task."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from spark_jobs.client import Inference
from spark_jobs.decoding import decode_tensors
from spark_jobs.interface import ModelInterface
from spark_jobs.results import output_batch, softmax


@functools.cache
def _session(path: str, provider: str = "CPUExecutionProvider"):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=[provider])


def make_predict_fn(path: str, input_name: str, dims: tuple[int, ...]):
    def make():
        session = _session(path)

        def predict(inputs: np.ndarray) -> dict[str, np.ndarray]:
            logits = session.run(None, {input_name: inputs.reshape(len(inputs), *dims)})[0]
            scores = softmax(logits)  # the post-processing the daemon path does
            return {"label": scores.argmax(axis=1).astype(np.int32), "scores": scores}

        return predict

    return make


def score_arrow(batches: Iterator[pa.RecordBatch], path: str, model: ModelInterface,
                batch_size: int, top_k: int, provider: str = "CPUExecutionProvider"
                ) -> Iterator[pa.RecordBatch]:
    """For mapInArrow with spark_jobs.results.output_schema: the model run in this worker in
    batches of `batch_size`, the output as the daemon path writes it."""
    session = _session(path, provider)
    for batch in batches:
        samples, good, errors = decode_tensors(batch, model)
        if errors:
            raise ValueError(next(iter(errors.values())))
        logits = np.concatenate([session.run(None, {model.input_name: samples[i:i + batch_size]})[0]
                                 for i in range(0, len(samples), batch_size)] or
                                [np.empty((0, 1), np.float32)])
        device = "gpu0" if provider.startswith("CUDA") else "cpu0"
        yield output_batch(batch, Inference(logits, "1", np.full(len(samples), device, object)),
                           good, errors, top_k)
