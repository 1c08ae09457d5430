"""Whole-or-nothing Parquet output: a job writes into a staging folder next to its target and
moves it into place only when every task has finished, so that a failed or killed job leaves
the previous output (or none) and never a partial one. Paths go through Hadoop's FileSystem,
so the same code serves local folders, HDFS and object stores."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession


def _path(spark: SparkSession, path: str):  # -> (Hadoop FileSystem, Path), JVM objects
    jvm = spark._jvm
    assert jvm is not None  # a classic session's (Spark Connect has no JVM here)
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration()), hadoop_path


def delete(spark: SparkSession, path: str) -> None:
    fs, p = _path(spark, path)
    fs.delete(p, True)


def staging_path(path: str) -> str:
    """A sibling of `path` that Spark and Hive skip when reading the parent (leading dot)."""
    parent, _, name = path.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.staging-{uuid.uuid4().hex[:12]}"


def replace(spark: SparkSession, staging: str, path: str) -> None:
    """Moves a finished staging folder to `path`. The old output is set aside first and deleted
    only once the new one is in place, so a failed move leaves `path` as it was."""
    fs, target = _path(spark, path)
    _, source = _path(spark, staging)
    _, backup = _path(spark, f"{staging}.old")
    had_old = bool(fs.exists(target))
    if had_old and not fs.rename(target, backup):
        raise OSError(f"could not set {path} aside to replace it")
    if not fs.rename(source, target):
        if had_old:
            fs.rename(backup, target)
        raise OSError(f"could not move {staging} to {path}")
    if had_old:
        fs.delete(backup, True)


def write_text(spark: SparkSession, path: str, text: str) -> None:
    fs, p = _path(spark, path)
    stream = fs.create(p, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


def write_parquet(spark: SparkSession, frame: DataFrame, path: str,
                  beside: Callable[[], dict[str, str]] | None = None) -> None:
    """Writes `frame` to `path` whole, or leaves `path` as it was. `beside()`, called once the
    frame is written (so that it can describe it), gives files (name: text) that go into the
    output folder beside the part files and appear with them."""
    staging = staging_path(path)
    try:
        frame.write.parquet(staging)
        for name, text in (beside() if beside else {}).items():
            write_text(spark, f"{staging}/{name}", text)
        replace(spark, staging, path)
    finally:
        delete(spark, staging)
