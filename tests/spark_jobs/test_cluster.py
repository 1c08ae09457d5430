"""A real multi-node run: a Spark standalone master and two workers on loopback, each worker's
executors with their own node-local daemon (its own socket, through the worker's
$HETSERVE_DAEMON) and their own GPU, declared through spark_jobs/discover-gpu.sh with a fake
address ($HETSERVE_GPU_ADDRESSES). The job asks for a GPU per scoring task with stage-level
scheduling (score.py --task-resource gpu=1). The daemons' metrics show that both served and that
together they inferred every row exactly once; a probe under the same profile shows each task
held its own worker's GPU and reached that worker's daemon. Marked `cluster`: `make
test-cluster` runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.local_daemon import free_port
from tests.support.daemon import ROOT, Daemon

pytestmark = pytest.mark.cluster
BIN = Path(sys.executable).parent
ROWS, FILES = 4000, 8


def _inferred(daemon: Daemon) -> float:
    text = urllib.request.urlopen(daemon.metrics_url, timeout=10).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name == "hetserve_inferences" for s in f.samples
               if s.name.endswith("_total") and s.labels.get("model") == "mnist_cnn")


def _spark_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m", **extra}


def _start(args: list[str], log: Path, **env: str) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([BIN / "spark-class", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=_spark_env(**env))


def test_each_worker_scores_through_its_own_nodes_daemon(holdout, tmp_path):
    images = np.tile(holdout[0], (ROWS // len(holdout[0]), 1, 1, 1))
    source = tmp_path / "digits"
    source.mkdir()
    for n, part in enumerate(np.array_split(np.arange(ROWS), FILES)):
        pd.DataFrame({"id": part, "tensor": [images[i].tobytes() for i in part]}).to_parquet(
            source / f"part-{n}.parquet")
    nodes = [tmp_path / f"node{n}" for n in range(2)]
    for node in nodes:
        node.mkdir()
    daemons = [Daemon(node) for node in nodes]
    gpus = [f"node{n}-gpu" for n in range(2)]  # one fake GPU per worker
    discovery = ROOT / "spark_jobs" / "discover-gpu.sh"
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes = [_start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", str(port), "--webui-port", str(free_port())],
                        tmp_path / "master.log")]
    try:
        for n, daemon in enumerate(daemons):
            processes.append(_start(
                ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                 "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                 "--work-dir", str(tmp_path / f"work{n}")],
                tmp_path / f"worker{n}.log", HETSERVE_DAEMON=daemon.socket_url,
                HETSERVE_GPU_ADDRESSES=gpus[n], SPARK_WORKER_OPTS=(
                    "-Dspark.worker.resource.gpu.amount=1 "
                    f"-Dspark.worker.resource.gpu.discoveryScript={discovery}")))
        out = tmp_path / "scored.parquet"
        result = subprocess.run(
            [BIN / "spark-submit", "--master", master_url,
             "--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1",
             "--conf", "spark.driver.memory=512m", "--conf", "spark.ui.enabled=false",
             "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
             "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=120s",
             "--conf", "spark.sql.files.maxPartitionBytes=1m",
             "--conf", "spark.executor.resource.gpu.amount=1",
             str(ROOT / "tests" / "spark_jobs" / "cluster_job.py"), str(tmp_path / "probe.json"),
             "--input", str(source), "--output", str(out), "--no-start-daemon", "--top-k", "1",
             "--task-resource", "gpu=1"],
            env=_spark_env(HETSERVE_DAEMON=daemons[0].socket_url), capture_output=True,
            text=True, timeout=400)
        logs = "\n".join(p.read_text()[-2000:] for p in tmp_path.glob("*.log"))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + logs
        scored = pd.read_parquet(out)
        assert len(scored) == ROWS and sorted(scored["id"]) == list(range(ROWS))
        served = [_inferred(d) for d in daemons]
        assert all(s > 0 for s in served), f"one node's daemon served nothing: {served}"
        assert sum(served) == ROWS, served
        executors = list(tmp_path.glob("work*/app-*/*/stderr"))
        assert len(executors) == 2, executors  # one executor per worker
        probes = json.loads((tmp_path / "probe.json").read_text())
        assert sum(p["rows"] for p in probes) == ROWS
        owners = {gpu: daemon.socket_url for gpu, daemon in zip(gpus, daemons)}
        held = [json.loads(p["resources"]).get("gpu") for p in probes]
        assert all(h is not None and len(h) == 1 for h in held), held
        assert {h[0] for h in held} == set(gpus), held  # both workers' GPUs were used
        for gpu, probe in zip(held, probes):
            assert probe["daemon"] == owners[gpu[0]] and probe["ready"], probe
    finally:
        for p in reversed(processes):
            p.terminate()
        for p in processes:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for d in daemons:
            d.stop()
