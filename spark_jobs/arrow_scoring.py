"""Scoring over Arrow record batches (mapInArrow), the default executor path: each batch's
samples (spark_jobs.decoding) go through the task's Scorer and come back as the output rows
(spark_jobs.results). No pandas, and no Python per row except for images, which need resizing
one by one.

While one batch's requests run, the next batch is read and decoded, so that a task keeps the
daemon busy across Spark's batch boundaries."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from spark_jobs.decoding import decode_images, decode_tensors
from spark_jobs.options import ScoreOptions
from spark_jobs.results import output_batch
from spark_jobs.scorer import Scorer


def score_batches(batches: Iterator[pa.RecordBatch], options: ScoreOptions
                  ) -> Iterator[pa.RecordBatch]:
    """For mapInArrow (schema: results.output_schema): scores each batch through this node's
    daemon, a batch's requests running while the next is decoded and sent."""
    decode = decode_images if options.images else decode_tensors
    scorer = Scorer(options)
    running: deque[tuple[pa.RecordBatch, np.ndarray, dict[int, str], Future]] = deque()
    with ThreadPoolExecutor(2) as pool:  # two batches' calls at most
        for batch in batches:
            if batch.num_rows == 0:
                continue
            scorer.locate()
            samples, good, errors = decode(batch, options.model)
            if errors and not options.keep_errors:
                raise ValueError(next(iter(errors.values())))
            running.append((batch, good, errors, pool.submit(scorer.infer, samples)))
            if len(running) > 1:
                yield _finish(*running.popleft(), scorer)
        while running:
            yield _finish(*running.popleft(), scorer)


def _finish(batch: pa.RecordBatch, good: np.ndarray, errors: dict[int, str], call: Future,
            scorer: Scorer) -> pa.RecordBatch:
    result = call.result()
    scorer.account(result)
    o = scorer.options
    return output_batch(batch, result, good, errors, o.top_k, o.keep_errors, o.energy_column,
                        o.model.outputs if o.raw else ())
