#!/usr/bin/env bash
# Scores a Parquet dataset or a folder of images on a Spark-on-Kubernetes cluster through the hetserve daemon of each
# executor's node. The image holds Spark, Python 3.11+ and hetserve's Python package (no ONNX
# Runtime needed: the daemons run the models); the job's Parquet lands in object storage. The
# namespace and service account it runs under come from spark-jobs.yaml (kubectl apply -f, once).
#   K8S_API=https://api.cluster.example.com:6443 deploy/kubernetes/spark-submit.sh \
#     s3a://datasets/digits.parquet s3a://results/scored.parquet
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

exec spark-submit \
  --master "k8s://${K8S_API:?set K8S_API to the Kubernetes API server URL}" \
  --deploy-mode cluster \
  --name hetserve-score \
  --conf spark.kubernetes.namespace=spark-jobs \
  --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark \
  --conf spark.kubernetes.container.image="${SPARK_IMAGE:-registry.example.com/hetserve-spark:0.1.0}" \
  --conf spark.kubernetes.executor.podTemplateFile="$here/spark-executor-template.yaml" \
  --conf spark.executor.instances="${EXECUTORS:-8}" \
  --conf spark.executor.cores=4 \
  --conf spark.executor.memory=8g \
  --conf spark.hetserve.daemon=unix:/run/hetserve/grpc.sock \
  --conf spark.sql.shuffle.partitions=64 \
  local:///opt/hetserve/spark_jobs/score.py \
  --input "${1:?input: a Parquet dataset or an image folder}" --format "${FORMAT:-parquet}" \
  --output "${2:?output: a Parquet path}" \
  --model "${MODEL:-mnist_cnn}" --no-start-daemon --batch-size 64
