"""The spark fixture: a local Spark session for the session's tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_jobs import staging
from tests.support.spark import SPARK_CONF


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers use this test's environment
    builder = SparkSession.builder.master("local[2]").appName("hetserve-tests")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    yield session
    session.stop()
    staging.unlink_orphans()  # the regions its stopped Python workers kept (docs/spark.md)
