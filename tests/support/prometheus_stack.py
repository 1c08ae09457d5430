"""A real daemon under steady load, scraped by a real Prometheus server with the project's rules.

Prometheus and promtool come from Debian's `prometheus` package, unpacked by tools/system-deps.sh
into .tools/prometheus (or found on PATH)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml

from service.local_daemon import free_port
from tests.support.daemon import MODEL, ROOT, Daemon, image_input

RULES = ROOT / "deploy" / "prometheus" / "rules.yml"


ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"


TRITON = ROOT / "deploy" / "prometheus" / "triton.yml"


def prometheus_tool(name: str) -> str:
    local = ROOT / ".tools" / "prometheus" / "usr" / "bin" / name
    found = str(local) if local.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: run tools/system-deps.sh (it unpacks Debian's "
                    f"prometheus package into {local.parent.parent.parent})")
    return found


def recording_rules() -> set[str]:
    return {rule["record"] for path in (RULES, TRITON)
            for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "record" in rule}


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


class Load:
    """Batches of 4 digits sent back to back from one thread until stopped."""

    def __init__(self, url: str, images: np.ndarray) -> None:
        self._client = grpcclient.InferenceServerClient(url)
        self._inputs = image_input(images[:4])
        self._stop = threading.Event()
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._client.infer(MODEL, self._inputs)
            self.sent += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()


class Prometheus:
    def __init__(self, tmp: Path, target: str, interval: str = "1s",
                 scrape_configs: list[dict] | None = None) -> None:
        """Scrapes `target` as job hetserve, or what `scrape_configs` say, with the project's
        recording (Triton's names too) and alerting rules."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        tmp.mkdir(parents=True, exist_ok=True)
        config = tmp / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(RULES), str(ALERTS), str(TRITON)],
            "scrape_configs": scrape_configs or [
                {"job_name": "hetserve", "static_configs": [{"targets": [target]}]}]}))
        self._log = open(tmp / "prometheus.log", "wb")
        self._process = subprocess.Popen(
            [prometheus_tool("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(f"{self.url}/-/ready")
                return
            except OSError as e:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"prometheus did not start; see {tmp}/prometheus.log") from e
                time.sleep(0.2)

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        return self.api(f"query?{urllib.parse.urlencode(params)}")["result"]

    def api(self, path: str) -> dict:
        body = json.loads(scrape(f"{self.url}/api/v1/{path}"))
        assert body["status"] == "success", body
        return body["data"]

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(20)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


@dataclass
class Stack:
    daemon: Daemon
    load: Load
    prometheus: Prometheus
    before: str  # the daemon's own /metrics before Prometheus started, under load
    rule_names: set[str]
