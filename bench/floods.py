"""Floods against the daemon from unprivileged TCP clients, while four unix socket users
infer: streams opened and reset at full speed, 40,000 idle ModelStreamInfer streams, 20,000 idle
connections, request bodies that never finish (gRPC and REST, from 8 callers: uids of their own
where this runs as root), requests decoded at the daemon's caps (JSON and typed contents), the
same values as binary tensors (what their bytes cost without a decode), and gzip bodies and
messages (REST, gRPC) that inflate a thousandfold; as a reference for the body floods, two
processes that only keep a CPU busy (what sharing the machine costs the users, without the
daemon's part). For each: the share of the socket users' requests answered right (target >=
99%), their latency against a reference with no flood in the same run, the daemon's resident
memory growth (target <= 200 MB) and open descriptors against its limit (target <= 80%), and
both again once the flood's connections have closed (no trace). Each attacker runs in a process
of its own, so that its Python does not slow the users' client.

    .venv/bin/python -m bench.floods [--seconds 8] [--workers 1] [--floods upload ...]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from bench import body_floods
from bench.raw_h2 import RawH2
from service.local_daemon import DaemonProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
MODEL = "mnist_cnn"
ATTACKS = ("none", "busy", "rapid-reset", "idle-streams", "idle-connections", "upload",
           "decode", "binary", "gzip")
BODIES = ("upload", "decode", "binary", "gzip")  # bench/body_floods.py's
UPLOAD_TIMEOUT_S = 4  # --upload-timeout-s: short enough to act within a flood
UPLOAD_CALLERS = 8
BUSY = 2  # as many CPUs as a body flood keeps busy: its client's, and the daemon's work


def attack(kind: str, host: str, port: int, seconds: float) -> str:
    """Runs one flood against HOST:PORT for `seconds`; what it did, in a line."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    end = time.monotonic() + seconds
    with contextlib.ExitStack() as held:
        if kind == "none":  # the reference
            time.sleep(seconds)
            return "nothing (the reference)"
        if kind == "busy":  # what a body flood's CPU alone costs, without the daemon's part
            while time.monotonic() < end:
                pass
            return f"{BUSY} processes kept a CPU busy each, no connection"
        if kind == "rapid-reset":
            pairs = goaways = 0
            while time.monotonic() < end:
                flood = held.enter_context(RawH2(f"{host}:{port}"))
                while time.monotonic() < end and not flood.closed and flood.goaway is None:
                    for _ in range(100):
                        flood.reset(flood.open())
                    pairs += 100
                    flood.flush()
                goaways += flood.goaway is not None
            return f"{pairs} streams opened and reset, {goaways} GOAWAY"
        if kind == "idle-streams":
            opened = refused = 0
            for address in _addresses(hard // 2):
                if opened >= 40_000 or time.monotonic() > end:
                    break
                try:
                    flood = held.enter_context(RawH2(f"{host}:{port}", bind=address))
                    streams = [flood.open() for _ in range(1000)]
                    flood.flush()
                    flood.read(0.2)
                except OSError:
                    refused += 1
                    continue
                opened += len(streams) - len(flood.refused) - len(flood.ended)
            time.sleep(max(end - time.monotonic(), 0))
            return f"{opened} idle streams held, {refused} connections refused"
        if kind == "idle-connections":
            held_count = 0
            for address in _addresses(min(20_000, hard - 200)):
                sock = held.enter_context(socket.socket())
                sock.bind((address, 0))
                try:
                    sock.connect((host, port))
                except OSError:
                    continue
                held_count += 1
            time.sleep(max(end - time.monotonic(), 0))
            return f"{held_count} connections opened and held idle"
    raise ValueError(f"no attack {kind!r}")


def _addresses(count: int) -> Iterator[str]:
    """Loopback source addresses, a few connections from each (per-peer bounds count them)."""
    for i in range(count):
        yield f"127.0.{(i // 16) // 250}.{2 + (i // 16) % 250}"


class Daemon:
    def __init__(self, tmp: Path, workers: int) -> None:
        self.port, self.http_port = free_port(), free_port()
        self.socket = tmp / "grpc.sock"
        self.process = DaemonProcess(
            ["--models", str(ROOT / "models"), "--port", str(self.port), "--socket",
             str(self.socket), "--metrics-port", "0", "--workers", str(workers),
             "--http-port", str(self.http_port), "--upload-timeout-s", str(UPLOAD_TIMEOUT_S)],
            f"unix:{self.socket}", tmp / "daemon.log")
        self.process.wait_ready()

    def pids(self) -> list[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [self.process.pid, *map(int, children.read_text().split())]

    def rss_mb(self) -> float:
        return sum(_status(pid, "VmRSS") for pid in self.pids()) / 1024

    def descriptors(self) -> tuple[int, int]:
        """The most descriptors one of its processes holds, and that process's limit."""
        counts = [(len(list(Path(f"/proc/{pid}/fd").iterdir())), _fd_limit(pid))
                  for pid in self.pids()]
        return max(counts)


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _fd_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    return 0


@contextlib.contextmanager
def socket_users(socket_url: str, images: np.ndarray, labels: np.ndarray) -> Iterator[list]:
    """Four users of the unix socket `socket_url`, one request each at a time (raw binary
    tensors), cycling through `images`: for each, True for a right answer (else the error) and
    its latency in seconds."""
    stop, answers = threading.Event(), []

    def user() -> None:
        with grpcclient.InferenceServerClient(socket_url) as client:
            i = 0
            while not stop.is_set():
                tensor = grpcclient.InferInput("image", [1, 1, 28, 28], "FP32")
                tensor.set_data_from_numpy(images[i:i + 1].astype(np.float32))
                start = time.perf_counter()
                try:
                    logits = client.infer(MODEL, [tensor], client_timeout=5).as_numpy("logits")
                    answers.append((bool(logits.argmax() == labels[i]),
                                    time.perf_counter() - start))
                except InferenceServerException as e:
                    answers.append((e, time.perf_counter() - start))
                i = (i + 1) % len(images)

    users = [threading.Thread(target=user, daemon=True) for _ in range(4)]
    for u in users:
        u.start()
    try:
        yield answers
    finally:
        stop.set()
        for u in users:
            u.join(timeout=10)
    assert not any(u.is_alive() for u in users)


def run(seconds: float, workers: int, floods: tuple[str, ...] = ATTACKS) -> list[dict]:
    from tools import mnist_digits
    images, labels = mnist_digits.holdout_split()
    images, labels = images[:64].astype(np.float32), labels[:64]
    rows = []
    with tempfile.TemporaryDirectory(prefix="hetserve-floods-") as tmp:
        daemon = Daemon(Path(tmp), workers)
        try:
            for kind in ("none", *(f for f in floods if f != "none")):
                time.sleep(1.0)
                base_rss, (base_fds, limit) = daemon.rss_mb(), daemon.descriptors()
                peak_rss, peak_fds = base_rss, base_fds
                with socket_users(f"unix:{daemon.socket}", images, labels) as answers:
                    attackers = [subprocess.Popen(
                        [*user, sys.executable, "-m", "bench.floods", "--attack", kind, "--port",
                         str(daemon.port), "--http-port", str(daemon.http_port), "--seconds",
                         str(seconds)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
                        for user in _attackers(kind)]
                    while any(a.poll() is None for a in attackers):
                        peak_rss = max(peak_rss, daemon.rss_mb())
                        peak_fds = max(peak_fds, daemon.descriptors()[0])
                        time.sleep(0.2)
                    outputs = [a.communicate()[0].strip() for a in attackers]
                done = body_floods.summary(outputs) if kind in BODIES else outputs[0]
                time.sleep(2.0)  # the flood's connections close
                ok = sum(a is True for a, _ in answers)
                latencies_ms = [1000 * s for a, s in answers if a is True] or [float("nan")]
                rows.append({
                    "attack": kind, "did": done, "users_ok": ok, "users_total": len(answers),
                    "ok_share": ok / max(len(answers), 1),
                    "p50_ms": float(np.percentile(latencies_ms, 50)),
                    "p99_ms": float(np.percentile(latencies_ms, 99)),
                    "rss_growth_mb": peak_rss - base_rss, "fds_peak": peak_fds,
                    "fd_limit": limit, "fds_after": daemon.descriptors()[0],
                    "fds_before": base_fds, "rss_after_growth_mb": daemon.rss_mb() - base_rss,
                    "errors": sorted({str(a)[:120] for a, _ in answers if a is not True})[:3]})
        finally:
            daemon.process.stop()
    return rows


def _attackers(kind: str) -> list[list[str]]:
    """How to run each attacker process: the upload flood's callers as uids of their own where
    this runs as root (setpriv), so that they are several callers; else as this user."""
    if kind == "busy":
        return [[]] * BUSY
    if kind != "upload":
        return [[]]
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return [[]] * UPLOAD_CALLERS
    return [["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            for uid in range(60001, 60001 + UPLOAD_CALLERS)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="each flood's length")
    parser.add_argument("--workers", type=int, default=1, help="the daemon's --workers")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--floods", nargs="+", choices=ATTACKS[1:], default=ATTACKS[1:],
                        help="which floods (all by default); the reference always runs")
    parser.add_argument("--attack", choices=ATTACKS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--http-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack in BODIES:  # an attacker's own process
        print(json.dumps(body_floods.attack(args.attack, "127.0.0.1", args.port, args.http_port,
                                            args.seconds)))
        return 0
    if args.attack:
        print(attack(args.attack, "127.0.0.1", args.port, args.seconds))
        return 0
    rows = run(args.seconds, args.workers, tuple(args.floods))
    print(f"{'flood':18} {'users OK':>14} {'p50/p99 ms':>12} {'RSS +MB':>8} "
          f"{'fds peak/limit':>16} {'after: fds, RSS +MB':>20}  what the attacker did")
    for r in rows:
        print(f"{r['attack']:18} {r['ok_share']:>8.2%} ({r['users_total']:>4}) "
              f"{r['p50_ms']:>5.1f}/{r['p99_ms']:<6.1f} "
              f"{r['rss_growth_mb']:>8.1f} {r['fds_peak']:>7}/{r['fd_limit']:<7} "
              f"{r['fds_after']:>7} (was {r['fds_before']}), {r['rss_after_growth_mb']:+.1f}  "
              f"{r['did']}")
        for error in r["errors"]:
            print(f"{'':18} error: {error}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
