"""One candidate measured: its config in a temporary copy of the model's repository, a daemon
started on it, batch-1 load at each concurrency (the product's load client, or Triton's
perf_analyzer where installed), and watts from the daemon's own power counters."""

from __future__ import annotations

import concurrent.futures
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2

from accelerators import safe_files
from service import contract
from service.clients import perf_analyzer
from service.clients.load_client import START_AFTER_S, ClientPool, infer_request
from service.clients.tune import energy
from service.clients.tune.space import Candidate
from service.local_daemon import DaemonStartError, LocalDaemon, local_daemon

_WARM_S = 0.3  # load before the energy window opens: the first batches pay for warm-up
_GIVE_UP_FACTOR = 2  # a p99 this far over the bound ends a candidate's concurrency ramp


@dataclass(frozen=True)
class LoadPoint:
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: dict[str, int]
    watts: float | None = None  # every metered device, under this load
    sources: dict[str, str] = field(default_factory=dict)  # device -> power source
    flops_per_image: float | None = None

    @property
    def gflops_per_watt(self) -> float | None:
        if self.watts and self.flops_per_image and self.rps:
            return self.rps * self.flops_per_image / 1e9 / self.watts
        return None

    @property
    def joules_per_image(self) -> float | None:
        return self.watts / self.rps if self.watts and self.rps else None


@dataclass
class Measurement:
    candidate: Candidate
    stage: str  # shipped, devices, instances, delay, preferred, confirm
    points: list[LoadPoint] = field(default_factory=list)
    error: str = ""  # why the candidate could not be measured (load error, timeout, crash)
    seconds: float = 0.0  # wall time, daemon start to stop
    served_devices: str = ""  # what the daemon reported serving


@dataclass(frozen=True)
class LoadSettings:
    concurrencies: tuple[int, ...]
    seconds: float  # per concurrency
    clients: int  # load client processes
    perf_analyzer: str | None  # its binary, or None for the Python client
    p99_ms: float | None
    serve_args: tuple[str, ...]  # passed to each `hetserve serve` (power sources, ...)


class Workspace:
    """A temporary repository holding a copy of the model; each candidate overwrites its
    config.pbtxt there, so the user's repository is never touched."""

    def __init__(self, model_dir: Path) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="hetserve-tune-")
        self.root = Path(self._tmp.name)
        self.repository = self.root / "models"
        self.model_dir = self.repository / model_dir.name
        shutil.copytree(model_dir, self.model_dir,
                        ignore=shutil.ignore_patterns("config.pbtxt*"))
        self.runs = 0

    def close(self) -> None:
        self._tmp.cleanup()


def measure(workspace: Workspace, model: str, config_text: str, candidate: Candidate,
            stage: str, settings: LoadSettings, timeout_s: float,
            inputs: dict[str, np.ndarray]) -> Measurement:
    """Every concurrency of `settings` against a daemon serving `config_text`; a failure is
    recorded in the measurement, never raised (Ctrl-C is)."""
    started = time.monotonic()
    measurement = Measurement(candidate, stage)
    safe_files.write_file(workspace.model_dir / "config.pbtxt", config_text)
    workspace.runs += 1
    folder = workspace.root / f"run{workspace.runs}"
    try:
        with local_daemon(workspace.repository, folder, "--log-level", "WARNING",
                          *settings.serve_args, timeout_s=timeout_s) as daemon:
            measurement.served_devices = served = _served_devices(daemon, model)
            if _dropped(candidate.devices, served):  # the config as it ran: what may be written
                measurement.candidate = replace(candidate, devices=served)
            _load(daemon, model, inputs, settings, measurement)
    except DaemonStartError as e:
        measurement.error = f"daemon did not start: {_last_lines(str(e))}"
    except ModelNotServedError as e:
        measurement.error = str(e)
    except Exception as e:  # a crash, a timeout: reported, and the sweep goes on
        measurement.error = f"{type(e).__name__}: {e}"
    measurement.seconds = time.monotonic() - started
    return measurement


class ModelNotServedError(RuntimeError):
    """The daemon runs but the model failed to load; the message is the daemon's reason."""


def _served_devices(daemon: LocalDaemon, model: str) -> str:
    client = grpcclient.InferenceServerClient(daemon.tcp_address)
    try:
        if not client.is_model_ready(model):
            index = client.get_model_repository_index(as_json=True).get("models", [])
            reason = next((m.get("reason", "") for m in index if m.get("name") == model), "")
            raise ModelNotServedError(f"the model did not load: {reason or 'no reason given'}")
        config = client.get_model_config(model, as_json=True)["config"]
        return config.get("parameters", {}).get("devices", {}).get("string_value", "")
    finally:
        client.close()


def _dropped(listed: str, served: str) -> list[str]:
    """The devices named in `listed` that the daemon dropped at load (it could not run the
    model there, or the device failed its warm-up)."""
    running = {d.strip() for d in served.split(",")}
    return [d for d in (d.strip() for d in listed.split(",")) if ":" in d and d not in running]


def _load(daemon: LocalDaemon, model: str, inputs: dict[str, np.ndarray],
          settings: LoadSettings, measurement: Measurement) -> None:
    pool = None
    if not settings.perf_analyzer:
        pool = ClientPool(settings.clients, {"daemon": daemon.address},
                          infer_request(model, inputs))
    try:
        if pool:
            pool.wait_ready()
        with concurrent.futures.ThreadPoolExecutor(1) as runner:
            for concurrency in settings.concurrencies:
                point = _load_point(daemon, model, concurrency, settings, pool, runner)
                measurement.points.append(point)
                if point.errors or (settings.p99_ms and
                                    point.p99_ms > _GIVE_UP_FACTOR * settings.p99_ms):
                    break  # more callers only queue longer
    finally:
        if pool:
            pool.close()


def _load_point(daemon: LocalDaemon, model: str, concurrency: int, settings: LoadSettings,
                pool: ClientPool | None,
                runner: concurrent.futures.ThreadPoolExecutor) -> LoadPoint:
    start = time.monotonic()
    if pool:
        load = runner.submit(pool.run, "daemon", "closed", concurrency, settings.seconds)
    else:
        assert settings.perf_analyzer  # without a pool, perf_analyzer runs the load (_load)
        load = runner.submit(perf_analyzer.run, settings.perf_analyzer, model,
                             daemon.tcp_address, concurrency, settings.seconds)
    begins = start + (START_AFTER_S if pool else 0.0)  # when the callers start
    window = energy.watch(daemon.metrics_url, begins + _WARM_S, begins + settings.seconds)
    result = load.result()
    errors = result.get("errors", {})
    return LoadPoint(concurrency, result["rps"], result["p50_ms"], result["p99_ms"], errors,
                     window.watts if window else None, window.sources if window else {},
                     window.flops_per_inference if window else None)


def request_inputs(config: model_config_pb2.ModelConfig) -> dict[str, np.ndarray]:
    """One sample for every input of the model (batch axis 1 where it batches): values in
    [0, 1), the range of normalized images."""
    rng = np.random.default_rng(0)
    inputs = {}
    for tensor in config.input:
        wire = contract.wire_from_config(tensor.data_type)
        dtype = contract.numpy_dtype(wire)
        if dtype is None or dtype.kind not in "fiub":
            raise ValueError(f"input {tensor.name!r} is {wire}: hetserve tune sends numeric "
                             "tensors only")
        shape = ([1] if config.max_batch_size > 0 else []) + [max(d, 1) for d in tensor.dims]
        inputs[tensor.name] = (rng.random(shape) if dtype.kind == "f"
                               else np.zeros(shape)).astype(dtype)
    return inputs


def _last_lines(text: str, count: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-count:])
