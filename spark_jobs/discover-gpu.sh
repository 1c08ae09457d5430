#!/bin/sh
# Spark resource discovery for `gpu` (see spark_jobs/resources.py): prints {"name": "gpu", ...}.
exec "${PYSPARK_PYTHON:-python3}" -m spark_jobs.resources gpu
