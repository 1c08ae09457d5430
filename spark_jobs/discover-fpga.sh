#!/bin/sh
# Spark resource discovery for `fpga` (see spark_jobs/resources.py): prints {"name": "fpga", ...}.
exec "${PYSPARK_PYTHON:-python3}" -m spark_jobs.resources fpga
