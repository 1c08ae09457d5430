"""Scoring through the node-local hetserve daemon from your own Spark code.

    from spark_jobs.api import score_dataframe, score_arrow_fn, make_predict_fn

    scored = score_dataframe(spark, df, "mnist_cnn")            # mapInArrow, output schema set
    scored = df.mapInArrow(score_arrow_fn(spark, "mnist_cnn"), output_schema("bigint"))
    scored = df.mapInPandas(score_pandas_fn(spark, "mnist_cnn"), output_schema("bigint"))
    udf = predict_batch_udf(make_predict_fn("mnist_cnn"), return_type=PREDICT_RETURN_TYPE,
                            batch_size=1024, input_tensor_shapes=[[784]])
    df.withColumn("pred", udf("tensor"))

    from spark_jobs import energy                               # what scoring cost
    meter = energy.meter(spark)
    scored = score_dataframe(spark, df, "mnist_cnn", energy=meter, energy_column=True)
    summary = energy.write_parquet(spark, scored, "out.parquet", meter)  # and its JSON inside

`df` has `id` and `tensor` (raw bytes or an array of numbers per row), or is what
`spark.read.format("image")` gives (`images=True`). Each executor talks to its own node's daemon;
a daemon reached over TCP with TLS takes `credentials=Credentials(root_certificates=CA_PEM,
token_file=TOKEN)`, files present on every node.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark import SparkConf
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import ArrayType, FloatType, IntegerType, StructField, StructType

from spark_jobs.arrow_scoring import score_batches
from spark_jobs.client import infer
from spark_jobs.credentials import NO_CREDENTIALS, Credentials
from spark_jobs.daemon import ADDRESS_CONF, NoDaemonError, NodeDaemon, resolve_address
from spark_jobs.interface import ModelInterface
from spark_jobs.options import ScoreOptions
from spark_jobs.pandas_scoring import score_frames
from spark_jobs.results import output_schema, raw_columns, softmax

if TYPE_CHECKING:
    from pyspark.resource import ResourceProfile

log = logging.getLogger(__name__)
__all__ = ["PREDICT_RETURN_TYPE", "Credentials", "image_columns", "make_predict_fn",
           "node_daemon", "output_schema", "score_arrow_fn", "score_dataframe", "score_options",
           "score_pandas_fn", "score_with", "stop_started_daemons"]

PREDICT_RETURN_TYPE = StructType([StructField("label", IntegerType()),
                                  StructField("scores", ArrayType(FloatType()))])


STARTER_CONF = "spark.hetserve.starter"  # names the job in the daemons it starts
# Spark's own log level; WARN unless the job is submitted with `--conf spark.log.level=INFO`.
LOG_LEVEL_CONF = "spark.log.level"


def node_daemon(spark: SparkSession, address: str | None = None,
                model_repository: str | None = None) -> NodeDaemon:
    """`address` (else the conf spark.hetserve.daemon, else each node's own setting); with a
    model repository, nodes where none answers get a daemon started by the job, owned by
    spark.hetserve.starter (job_session sets it), else the Spark application id."""
    return NodeDaemon(address or spark.conf.get(ADDRESS_CONF, None), model_repository,
                      spark.conf.get(STARTER_CONF, None) or spark.sparkContext.applicationId)


def score_options(spark: SparkSession, model: str, *, address: str | None = None,
                  model_repository: str | None = None,
                  credentials: Credentials = NO_CREDENTIALS, **options) -> ScoreOptions:
    """Reads the model's interface through the driver's daemon; `options` are ScoreOptions'
    (batch_size, inflight, priority, top_k, keep_errors, images, retry, energy: an
    accumulator from spark_jobs.energy.meter that sums what the replies say the rows cost,
    energy_column: each row's share of the joules in `energy_joules`, output_mode: "labels"
    or "raw", every output tensor as an array column)."""
    daemon = node_daemon(spark, address, model_repository)
    interface = ModelInterface.fetch(daemon.locate(credentials), model, credentials)
    return ScoreOptions(daemon, interface, credentials=credentials, **options)


def stop_started_daemons(spark: SparkSession, address: str | None = None) -> int:
    """Stops the daemons this application started, on the driver's host and on every
    executor's (a task per core, twice over, to reach each); returns how many. A daemon that
    a job started also stops by itself when its executor's JVM ends."""
    daemon = node_daemon(spark, address)
    stopped = 0
    master = spark.sparkContext.master or ""
    if not master.startswith("local"):  # else the driver's is the only host
        tasks = 2 * spark.sparkContext.defaultParallelism
        stopped = spark.sparkContext.parallelize(range(tasks), tasks) \
            .mapPartitions(functools.partial(_stop_started, daemon=daemon)).sum()
    stopped = int(daemon.stop_started()) + int(stopped)
    log.info("stopped %d daemon(s) that %s started", stopped, daemon.starter)
    return stopped


@contextlib.contextmanager
def job_session(app_name: str, address: str | None,
                model_repository: str | None = None) -> Iterator[SparkSession]:
    """A job's Spark session and log. Given both an address and a model repository, the
    daemon of the driver's host starts (where none answers) while Spark does, so that the job
    waits for the slower of the two instead of both. On the way out it stops the daemons the
    job started (a failure there is logged, never hiding the job's own error) and then the
    session."""
    # force: pyspark may have configured the root logger already.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        force=True)
    starter = f"{app_name}-{uuid.uuid4().hex[:16]}"
    if address and model_repository:
        # A failure here resurfaces, with its reason, when the job asks for the daemon.
        threading.Thread(target=_quietly, args=(NodeDaemon(address, model_repository, starter)
                                                .ensure,), daemon=True).start()
    builder = SparkSession.builder.appName(app_name).config(STARTER_CONF, starter)
    if not SparkConf().contains(LOG_LEVEL_CONF):  # Spark's INFO lines would bury the job's own
        builder = builder.config(LOG_LEVEL_CONF, "WARN")
    spark = builder.getOrCreate()
    try:
        yield spark
    except NoDaemonError as e:  # the job's own words, not a traceback
        raise SystemExit(f"{app_name}: {e}") from None
    finally:
        try:
            stop_started_daemons(spark, address)
        except Exception:
            log.exception("could not stop the daemons this job started; each stops by itself "
                          "when its executor's JVM ends")
        finally:
            spark.stop()


def _quietly(call: Callable[[], object]) -> None:
    try:
        call()
    except Exception as e:
        log.info("starting the daemon early failed (%s); the job will ask again", e)


def _stop_started(_: Iterator[int], daemon: NodeDaemon) -> Iterator[int]:
    yield int(daemon.stop_started())


def image_columns(frame: DataFrame) -> DataFrame:
    """The columns scoring reads from a `spark.read.format("image")` frame, id = file path."""
    return frame.selectExpr("image.origin AS id", "image.height", "image.width",
                            "image.nChannels", "image.data")


def score_dataframe(spark: SparkSession, frame: DataFrame, model: str, *,
                    profile: ResourceProfile | None = None, pandas: bool = False,
                    **options) -> DataFrame:
    """`frame` scored with mapInArrow (mapInPandas with `pandas`); `profile`, a pyspark
    ResourceProfile, asks for an accelerator per task (stage-level scheduling, Spark 4);
    other options as score_options."""
    return score_with(frame, score_options(spark, model, **options), profile, pandas)


def score_with(frame: DataFrame, options: ScoreOptions, profile: ResourceProfile | None = None,
               pandas: bool = False) -> DataFrame:
    """score_dataframe with the options made once (a stream's micro-batches share them)."""
    if options.images and "image" in frame.columns:
        frame = image_columns(frame)
    schema = output_schema(frame.schema["id"].dataType.simpleString(), options.keep_errors,
                           options.energy_column,
                           raw_columns(options.model) if options.raw else None)
    scorer = functools.partial(score_frames if pandas else score_batches, options=options)
    mapper = frame.mapInPandas if pandas else frame.mapInArrow
    return mapper(scorer, schema, profile=profile) if profile is not None \
        else mapper(scorer, schema)


def score_arrow_fn(spark: SparkSession, model: str, **options
                   ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A function for mapInArrow, with output_schema(id type) as its schema."""
    return functools.partial(score_batches, options=score_options(spark, model, **options))


def score_pandas_fn(spark: SparkSession, model: str, **options) -> Callable:
    """A function for mapInPandas, with output_schema(id type) as its schema."""
    return functools.partial(score_frames, options=score_options(spark, model, **options))


def make_predict_fn(model: str, *, address: str | None = None, batch_size: int | None = None,
                    inflight: int = 2, priority: int | None = None,
                    credentials: Credentials = NO_CREDENTIALS
                    ) -> Callable[[], Callable[[np.ndarray], dict[str, np.ndarray]]]:
    """The `make_predict_fn` argument of pyspark.ml.functions.predict_batch_udf: on each
    executor it returns a function from a batch of flat tensors to labels and softmax scores
    (return type PREDICT_RETURN_TYPE), inferred by this node's daemon at `address` (default:
    the node's $HETSERVE_DAEMON, else the user's socket). It collects no energy:
    predict_batch_udf keeps the function from task to task, and an accumulator captured in it
    would count only in the first task of each Python worker."""

    def make() -> Callable[[np.ndarray], dict[str, np.ndarray]]:
        target = resolve_address(address)
        interface = ModelInterface.fetch(target, model, credentials)
        level = interface.level(priority)

        def predict(inputs: np.ndarray) -> dict[str, np.ndarray]:
            samples = inputs.reshape(len(inputs), *interface.input_dims)
            scores = softmax(infer(target, interface, samples, batch_size, inflight, level,
                                   credentials=credentials).logits)
            return {"label": scores.argmax(axis=1).astype(np.int32), "scores": scores}

        return predict

    return make
