"""Scoring over pandas batches (mapInPandas): each frame's input columns become an Arrow
batch and go the Arrow path (spark_jobs.arrow_scoring), whose rows come back as a frame,
nullable integers and doubles kept nullable. A module of its own so that Arrow-path workers
never import pandas (0.6 s of each Python worker's start)."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pyarrow as pa

from spark_jobs.arrow_scoring import score_batches
from spark_jobs.decoding import IMAGE_COLUMNS, TENSOR_COLUMNS
from spark_jobs.options import ScoreOptions

# label (int) and energy_joules (double) hold nulls for malformed or unmetered rows.
_NULLABLE = {pa.int32(): pd.Int32Dtype(), pa.float64(): pd.Float64Dtype()}


def score_frames(frames: Iterator[pd.DataFrame], options: ScoreOptions
                 ) -> Iterator[pd.DataFrame]:
    """For mapInPandas: scores each batch through this node's daemon."""
    columns = list(IMAGE_COLUMNS if options.images else TENSOR_COLUMNS)
    batches = (pa.RecordBatch.from_pandas(frame[columns], preserve_index=False)
               for frame in frames)
    for scored in score_batches(batches, options):
        yield scored.to_pandas(types_mapper=_NULLABLE.get)
