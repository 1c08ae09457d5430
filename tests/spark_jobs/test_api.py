"""The Python API for Spark users: mapInPandas, mapInArrow (score_dataframe's default) and
predict_batch_udf, all through a real daemon, agree with each other and with the labels."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pyspark.ml.functions import predict_batch_udf

from spark_jobs import energy
from spark_jobs.api import (
    PREDICT_RETURN_TYPE,
    make_predict_fn,
    output_schema,
    score_arrow_fn,
    score_dataframe,
    score_pandas_fn,
)
from tests.support.served import reply_devices
from tools.mnist_digits import write_parquet


def test_map_in_pandas_map_in_arrow_and_predict_batch_udf_agree(spark, daemon, holdout,
                                                                 tmp_path):
    images, labels = holdout[0][:300], holdout[1][:300]
    frame = spark.read.parquet(str(write_parquet(tmp_path / "d.parquet", images, labels)))
    frame = frame.select("id", "tensor").cache()

    pandas_energy, arrow_energy = energy.meter(spark), energy.meter(spark)
    by_pandas = frame.mapInPandas(score_pandas_fn(spark, "mnist_cnn", address=daemon.socket_url,
                                                  top_k=3, energy=pandas_energy,
                                                  energy_column=True),
                                  output_schema("bigint", energy_column=True)) \
        .toPandas().sort_values("id")
    by_arrow = frame.mapInArrow(score_arrow_fn(spark, "mnist_cnn", address=daemon.socket_url),
                                output_schema("bigint")).toPandas().sort_values("id")
    by_default = score_dataframe(spark, frame, "mnist_cnn", address=daemon.socket_url,
                                 top_k=3, energy=arrow_energy, energy_column=True) \
        .toPandas().sort_values("id")
    predict = predict_batch_udf(make_predict_fn("mnist_cnn", address=daemon.socket_url),
                                return_type=PREDICT_RETURN_TYPE, batch_size=100,
                                input_tensor_shapes=[[784]])
    arrays = spark.createDataFrame(pd.DataFrame(
        {"id": np.arange(300), "x": [x.ravel().tolist() for x in images]}),
        "id long, x array<float>")
    by_udf = arrays.withColumn("p", predict("x")).select("id", "p.label", "p.scores") \
        .toPandas().sort_values("id")

    assert by_pandas["id"].tolist() == by_arrow["id"].tolist() == by_udf["id"].tolist() \
        == list(range(300))
    assert by_pandas["label"].tolist() == by_arrow["label"].tolist() == by_udf["label"].tolist()
    for column in ("id", "label", "model_version"):
        assert by_default[column].map(str).tolist() == by_pandas[column].map(str).tolist()
    # Each batch goes to whichever listed device the router picks, so the two runs may differ
    # there; rows served by the same device rank alike.
    assert set(by_default["device"]) | set(by_pandas["device"]) <= set(reply_devices())
    same = by_default["device"].to_numpy() == by_pandas["device"].to_numpy()
    assert by_default["top_labels"].map(str)[same].tolist() == \
        by_pandas["top_labels"].map(str)[same].tolist()
    assert (by_udf["label"].to_numpy() == labels).mean() >= 0.9
    # Both paths sum what the rows cost across tasks, as each row's share says.
    for used, scored in ((pandas_energy, by_pandas), (arrow_energy, by_default)):
        summary = energy.summarize(used.value)
        assert summary["rows"] == 300 and summary["joules"] > 0
        assert summary["joules"] == pytest.approx(scored["energy_joules"].sum(), rel=1e-9)
    np.testing.assert_allclose(np.stack(by_pandas["top_scores"])[:, 0],
                               np.stack(by_udf["scores"]).max(axis=1), rtol=1e-5)
