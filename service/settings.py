"""Daemon settings: declared once, typed, overridable by `HETSERVE_*` environment variables (named
in service/setting_names.py)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerators.power.select import DEFAULT_MODEL_WATTS
from service.contract import default_socket
from service.setting_names import ENV_PREFIX, env_name, field_env_name, flag, sources

__all__ = ["ENV_PREFIX", "LOG_FORMATS", "LOG_LEVELS", "Settings"]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")


@dataclass(frozen=True)
class Settings:
    model_repository: Path = field(
        default=Path("models"), metadata={"doc": "Triton-layout model repository to serve"})
    grpc_host: str = field(
        default="127.0.0.1", metadata={"doc": "TCP address for gRPC; loopback unless exposed"})
    grpc_port: int = field(
        default=8001, metadata={"doc": "TCP port for gRPC; 0 disables TCP"})
    http_port: int = field(
        default=0, metadata={"doc": "TCP port for KServe V2 over HTTP/REST, on --host with the "
                                    "same TLS and token; 0 disables it (Triton's 8000 is the "
                                    "usual choice)"})
    unix_socket: Path | None = field(
        default_factory=default_socket,
        metadata={"doc": "unix socket for node-local clients; empty disables it"})
    socket_group: str = field(
        default="", metadata={"doc": "group (name or id) whose members may also connect to the "
                                     "unix socket; empty: the daemon's user alone"})
    tls_cert: Path | None = field(
        default=None, metadata={"doc": "PEM certificate chain for gRPC over TCP (with --tls-key); "
                                       "required, with a token, when the host is not loopback"})
    tls_key: Path | None = field(
        default=None, metadata={"doc": "PEM private key of --tls-cert"})
    token_file: Path | None = field(
        default=None, metadata={"doc": "file holding the bearer token that gRPC calls over TCP "
                                       "must send as 'authorization: Bearer <token>' (the unix "
                                       "socket and health checks need none)"})
    admin_token_file: Path | None = field(
        default=None, metadata={"doc": "file holding a bearer token whose holders may load and "
                                       "unload models (RepositoryModelLoad / Unload) from "
                                       "anywhere, sent as 'authorization: Bearer <token>'; root "
                                       "and the daemon's user may over the unix socket without "
                                       "it"})
    metrics_host: str = field(
        default="127.0.0.1", metadata={"doc": "address of the Prometheus /metrics endpoint"})
    metrics_port: int = field(
        default=8002, metadata={"doc": "port of the Prometheus /metrics endpoint; 0 disables it"})
    health_port: int = field(
        default=0, metadata={"doc": "plaintext port on --metrics-host serving only grpc.health.v1, "
                                    "for probes that send neither TLS nor a token (Kubernetes "
                                    "grpc probes); 0 disables it"})
    model_control_mode: str = field(
        default="none", metadata={"doc": "none: the repository's models load at start and stay; "
                                         "poll: changes in the repository load, reload and "
                                         "unload models; explicit: only --load-model at start, "
                                         "then RepositoryModelLoad / Unload"})
    repository_poll_secs: float = field(
        default=15.0, metadata={"doc": "seconds between scans of the repository in poll mode"})
    load_model: str = field(
        default="", metadata={"doc": "models to load at start in explicit mode, comma-separated "
                                     "or the flag repeated; '*': all"})
    strict_readiness: bool = field(
        default=False, metadata={"doc": "the daemon is ready (ServerReady, /v2/health/ready, "
                                         "grpc.health.v1) only while every model it was asked "
                                         "to load serves, none failed; off: ready once loading "
                                         "is done, whatever failed (Triton's default is on)"})
    exit_on_error: bool = field(
        default=False, metadata={"doc": "exit (status 2, one line naming the models and why) when "
                                        "a model fails to load at start (Triton's default is "
                                        "on); off: serve the others"})
    workers: int = field(
        default=0, metadata={"doc": "front-end processes doing gRPC, decoding and replies, "
                                    "sharing the port; the devices stay in one process that "
                                    "batches across them. 0: half the CPUs, at most 8, so 1 "
                                    "(a single process) up to 3 CPUs"})
    max_message_bytes: int = field(
        default=64 << 20, metadata={"doc": "largest gRPC message accepted or sent"})
    max_queue_size: int = field(
        default=4096,
        metadata={"doc": "queued samples per model and priority level before "
                         "RESOURCE_EXHAUSTED, "
                         "unless config.pbtxt sets max_queue_size"})
    max_shm_regions: int = field(
        default=1024, metadata={"doc": "system shared memory regions registered at once by all "
                                       "clients (each holds a descriptor) before "
                                       "RESOURCE_EXHAUSTED"})
    max_shm_regions_per_client: int = field(
        default=256, metadata={"doc": "the same for one client: the unix socket's users, or "
                                      "the token's holders over TCP"})
    max_connections_per_peer: int = field(
        default=64, metadata={"doc": "connections open at once from one peer (a uid on the unix "
                                     "socket and over loopback TCP, whatever loopback address "
                                     "it uses; an address over other TCP), per listener and "
                                     "front-end process; beyond them a new one is refused "
                                     "(RESOURCE_EXHAUSTED naming the flag)"})
    shm_uid_for_token: int = field(
        default=-1, metadata={"doc": "system shared memory over TCP: token holders may use the "
                                     "objects this uid could open; -1: none (the unix socket's "
                                     "callers use their own uid's rights)"})
    max_stream_inflight: int = field(
        default=256, metadata={"doc": "requests of one ModelStreamInfer stream read ahead of "
                                      "their replies; a client that reads no replies stops "
                                      "being read"})
    stream_idle_s: float = field(
        default=300.0, metadata={"doc": "a ModelStreamInfer stream with no request for this long "
                                        "and no reply pending is closed UNAVAILABLE"})
    max_rpcs_tcp: int = field(
        default=512, metadata={"doc": "calls (a stream is one) in progress at once over TCP, per "
                                      "front-end process, before RESOURCE_EXHAUSTED, three "
                                      "quarters of them at most from one caller; the unix "
                                      "socket has its own server and limit"})
    max_rpcs_socket: int = field(
        default=1024, metadata={"doc": "the same for the unix socket"})
    max_rpcs_per_caller: int = field(
        default=512, metadata={"doc": "inference requests one caller (a uid on the socket, the "
                                      "token's holders, every caller over TCP without a token "
                                      "together) may have in flight at once, per process, over "
                                      "gRPC calls, streams and REST; beyond them a request is "
                                      "refused RESOURCE_EXHAUSTED (REST 429) naming the flag"})
    max_connections_tcp: int = field(
        default=512, metadata={"doc": "TCP connections open at once, per front-end process; "
                                      "beyond them a new one is refused (RESOURCE_EXHAUSTED "
                                      "naming the flag; closed, with TLS)"})
    max_connections_socket: int = field(
        default=512, metadata={"doc": "the same for the unix socket"})
    max_streams_per_connection: int = field(
        default=512, metadata={"doc": "calls in progress at once on one connection (HTTP/2 "
                                      "MAX_CONCURRENT_STREAMS), as many as a listener's calls "
                                      "by default so that one channel may carry them all (a "
                                      "client's queued streams would wait ahead of the daemon's "
                                      "priorities); further streams wait in the client"})
    max_stream_resets: int = field(
        default=1000, metadata={"doc": "streams a plaintext connection may reset beyond those "
                                       "the daemon completed on it; beyond them it gets GOAWAY "
                                       "and is closed (HTTP/2 rapid reset)"})
    max_upload_bytes_per_caller: int = field(
        default=64 << 20, metadata={"doc": "bytes of request bodies still arriving that one "
                                           "caller (a uid on the socket or over loopback TCP, "
                                           "else an address) may have the daemon hold, per "
                                           "process; beyond them its connection is ended "
                                           "(GOAWAY on gRPC, 429 on REST) naming the flag"})
    max_buffered_bytes: int = field(
        default=256 << 20, metadata={"doc": "the same for every caller together, per process"})
    upload_timeout_s: float = field(
        default=30.0, metadata={"doc": "a request body still arriving after this long ends its "
                                       "connection (GOAWAY on gRPC, 408 on REST) naming the "
                                       "flag; 0: no limit"})
    connection_idle_s: float = field(
        default=300.0, metadata={"doc": "a connection with no call in progress for this long is "
                                        "closed (GOAWAY; clients reconnect when they next call)"})
    connection_age_s: float = field(
        default=3600.0, metadata={"doc": "a connection this old is asked to close (GOAWAY): no "
                                         "new calls on it, and --connection-age-grace-s for those "
                                         "in progress"})
    connection_age_grace_s: float = field(
        default=60.0, metadata={"doc": "how long calls in progress on a connection past "
                                       "--connection-age-s may go on before they are cancelled"})
    min_ping_interval_s: float = field(
        default=60.0, metadata={"doc": "shortest interval between a client's pings with nothing "
                                       "sent by the daemon in between (two hours while the "
                                       "client has no call in progress); the third ping sooner "
                                       "closes the connection (GOAWAY ENHANCE_YOUR_CALM, "
                                       "too_many_pings)"})
    intra_op_threads: int = field(
        default=0, metadata={"doc": "ONNX Runtime threads per engine instance; 0: ONNX "
                                    "Runtime's choice, or the cores split between a device's "
                                    "instances"})
    shutdown_grace_s: float = field(
        default=10.0,
        metadata={"doc": "seconds requests in flight get to finish after SIGTERM"})
    engine_modules: str = field(
        default="",
        metadata={"doc": "comma-separated Python modules to import at start-up that register "
                         "extra engines (accelerators.engine_factory.register_engine)"})
    log_level: str = field(default="INFO", metadata={"doc": "Python logging level, one of "
                                                            + ", ".join(LOG_LEVELS)})
    log_format: str = field(
        default="text", metadata={"doc": "text: one line per record; json: one JSON object per "
                                         "line (time, level, logger, message, exception)"})
    power_sources: str = field(
        default="", metadata={"doc": "power source per device or kind, e.g. "
                                     "'gpu0=nvml:0,cpu=rapl,fpga0=hwmon:/sys/class/hwmon/hwmon3'"
                                     "; unset ones are found automatically, else estimated"})
    power_model: str = field(
        default=DEFAULT_MODEL_WATTS,
        metadata={"doc": "idle:busy watts per device or kind for the estimate used where no "
                         "sensor can be read; the CPU's, unless set, scale with its CPU count "
                         "(10 W + 1 W per CPU idle, 20 W + 3 W per CPU busy)"})
    power_budget_w: float | None = field(
        default=None, metadata={"doc": "the node's power budget in watts: above it batches go to "
                                       "the devices with the fewest joules per inference, then "
                                       "low priority levels are held back, then all "
                                       "(docs/observability.md); unset: none"})
    response_energy: bool = field(
        default=True, metadata={"doc": "each response carries its request's joules, their power "
                                       "source, the attribution method and the FLOPs as "
                                       "parameters (docs/observability.md)"})
    access_log: bool = field(
        default=False, metadata={"doc": "one log line per gRPC call and REST request: "
                                        "transport, method, model, status, duration, caller "
                                        "(docs/observability.md)"})

    def __post_init__(self) -> None:
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level: {self.log_level!r} is not one of {list(LOG_LEVELS)}")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format: {self.log_format!r} is not one of "
                             f"{list(LOG_FORMATS)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, /,
                 **overrides: str | None) -> Settings:
        """Defaults, then the variables that set each field (setting_names.sources), then
        explicit overrides (command-line flags): flag > variable > default. Values are strings,
        parsed alike; a ValueError names the flag and the variable. An empty socket path
        disables the socket."""
        environ = os.environ if environ is None else environ
        origins = {f.name: env_name(flag(f.name)) for f in dataclasses.fields(cls)}
        try:
            raw = {f.name: _variable(f.name, environ, origins) for f in dataclasses.fields(cls)}
            for name, value in overrides.items():
                if value is not None:
                    raw[name], origins[name] = value, env_name(flag(name))
            return cls(**{f.name: _parse(f, value)
                          for f in dataclasses.fields(cls) if (value := raw[f.name]) is not None})
        except ValueError as e:  # "<field>: why"
            name, _, reason = str(e).partition(": ")
            raise ValueError(f"{flag(name)} ({origins[name]}): {reason}") from None

    def to_env(self) -> dict[str, str]:
        """The `HETSERVE_<FIELD>` variables that from_env reads back as these settings (how
        front-end processes get theirs)."""
        return {field_env_name(f.name): "" if getattr(self, f.name) is None
                else str(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def docs(cls) -> dict[str, str]:
        return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls)}


def _variable(name: str, environ: Mapping[str, str], origins: dict[str, str]) -> str | None:
    """The value the environment gives field `name`, if any; `origins` learns which variable
    gave it. Two variables that disagree are an error: neither would be right to ignore."""
    given: dict[str, str] = {}
    for var, convert in sources(name).items():
        if var in environ:
            origins[name] = var  # an error converting it names this variable
            try:
                given[var] = convert(environ[var])
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
    if len(set(given.values())) > 1:
        raise ValueError(f"{name}: " + " and ".join(f"{var}={value!r}" for var, value in
                                                     sorted(given.items())) + " disagree")
    return next(iter(given.values()), None)


def _parse(f: dataclasses.Field, raw: str) -> Any:  # a value of f's type
    kind = str(f.type)
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{f.name}: {raw!r} is not an integer") from None
    if kind == "float | None" and not raw:
        return None
    if kind in ("float", "float | None"):
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{f.name}: {raw!r} is not a number") from None
    if kind.startswith("Path"):
        return Path(raw) if raw else None
    if kind == "bool":
        if raw.lower() not in _BOOLS:
            raise ValueError(f"{f.name}: {raw!r} is not one of {sorted(_BOOLS)}")
        return _BOOLS[raw.lower()]
    return raw


_BOOLS = {"true": True, "1": True, "on": True, "false": False, "0": False, "off": False}
