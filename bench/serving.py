"""Serving benchmark: batch-1 MNIST requests, closed loop at several concurrencies, an open-loop
Poisson rate sweep, and streaming, against
  echo      a bare grpc.aio server with the same protocol and stubs (the ceiling),
  daemon    `hetserve serve` on the example model (dynamic batching on) on ONNX Runtime,
  waitidle  the same with the window kept while every instance is idle
            (`queue_delay_when_idle: true`),
  unbatched the same daemon and model with dynamic_batching removed,
  nocompute the daemon with an engine that computes nothing (bench/null_engine.py): the serving
            core's own cost, as when the model runs on an accelerator instead of these cores,
  nocompute2 the same with --workers 2 (two front-end processes and the device owner),
and, for scale, the model itself in this process (ONNX Runtime, batch 1 and batch 16).
Every target is driven by the same client in the same run; figures are ratios to echo. The
client is --clients processes (service/clients/load_client.py: each its own event loop and
channel; a load point's concurrency, rate or stream window is split among them and their raw
latencies merged), so that on a large node the Python client is not the bottleneck. Besides
req/s and latency, each load point reports the server's CPU time per answered request (from
/proc: the server process and its children; its main process alone, the device owner with
--workers), the server cores it kept busy and the req/s per server core, and the client's CPU
per request; the table ends with the bound that the model's own CPU time puts on the daemon, and
at concurrency 1 what each target adds to echo's latency and the model's own time. Where
Triton's perf_analyzer is installed (on PATH or PERF_ANALYZER), it drives every target at the
same concurrencies too (a C++ client); otherwise a note says so.

    .venv/bin/python -m bench.serving [--seconds 3] [--clients N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from accelerators import safe_files
from service.clients import load_client, perf_analyzer
from service.clients.load_client import ClientPool
from service.local_daemon import free_port, serve_command

ROOT = Path(__file__).resolve().parent.parent
MODEL = "mnist_cnn"


def infer_request(image: np.ndarray):
    """A batch-1 request of the example model (request_path.py's too)."""
    return load_client.infer_request(MODEL, {"image": np.asarray(image, np.float32)})


# --- running it -------------------------------------------------------------------------------


def model_repository(folder: Path, batching: bool = True, **parameters: str) -> Path:
    """A copy of the example model's repository, without dynamic batching or with parameters
    (e.g. other devices)."""
    shutil.copytree(ROOT / "models" / MODEL, folder / MODEL)
    config = folder / MODEL / "config.pbtxt"
    text = config.read_text()
    if not batching:
        text = re.sub(r"dynamic_batching \{.*\}\n", "", text)
    text += "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
                    for k, v in parameters.items())
    safe_files.write_file(config, text, flag=None)
    return folder


def server_command(kind: str, port: int, tmp: Path, threads: int) -> list[str]:
    """The command line of one target's server: the one place to add a server option to."""
    if kind == "echo":
        return [sys.executable, "-m", "bench.echo_server", str(port)]
    # On ONNX Runtime, the engine the in-process figure measures: the example lists an FPGA first,
    # and where that is Intel's emulator its time says nothing about serving.
    models = {"daemon": lambda: model_repository(tmp / kind, devices="onnxruntime"),
              "waitidle": lambda: model_repository(tmp / kind, devices="onnxruntime",
                                                   queue_delay_when_idle="true"),
              "unbatched": lambda: model_repository(tmp / kind, batching=False,
                                                    devices="onnxruntime"),
              "nocompute": lambda: model_repository(tmp / kind, devices="null:cpu0"),
              "nocompute2": lambda: model_repository(tmp / kind, devices="null:cpu0")}[kind]()
    args = [*serve_command("--models", str(models)),
            "--port", str(port), "--socket", "", "--metrics-port", "0",
            "--intra-op-threads", str(threads), "--log-level", "WARNING"]
    if kind.startswith("nocompute"):
        args += ["--engine-modules", "bench.null_engine"]
    if kind == "nocompute2":  # the others: HETSERVE_WORKERS, else the daemon's default
        args += ["--workers", "2"]
    return args


def _start(kind: str, port: int, tmp: Path, threads: int) -> subprocess.Popen:
    return subprocess.Popen(server_command(kind, port, tmp, threads), cwd=ROOT)


def process_tree_cpu_s(pid: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user + system) of a process and all its descendants: the live ones' own, and
    the children they have reaped (counted in cutime/cstime), from /proc."""
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent pid, CPU seconds)
    for path in proc.glob("[0-9]*/stat"):
        try:
            fields = _stat(path)
        except OSError:  # the process ended meanwhile
            continue
        stats[int(path.parent.name)] = (int(fields[1]), sum(map(int, fields[11:15])))
    tree, todo = set(), [pid]
    while todo:
        tree.add(current := todo.pop())
        todo += [child for child, (parent, _) in stats.items() if parent == current]
    return sum(stats[p][1] for p in tree if p in stats) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) of one process alone, not its children."""
    fields = _stat(Path(f"/proc/{pid}/stat"))
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stat(path: Path) -> list[str]:
    """The fields of a /proc/<pid>/stat after the command name (which may hold spaces)."""
    return path.read_text().rsplit(")", 1)[1].split()


def metered(pid: int, run: Callable[[], dict]) -> dict:
    """A load point, with the server's and the clients' CPU time per answered request: unlike
    throughput on a shared machine, they do not depend on how much CPU each side was given. The
    server's cores busy and req/s per server core say how far its processes scale; the main
    process's own CPU is the device owner's where front-end processes serve gRPC (--workers)."""
    server, main, wall = process_tree_cpu_s(pid), process_cpu_s(pid), time.monotonic()
    result = run()
    server, wall = process_tree_cpu_s(pid) - server, time.monotonic() - wall
    main = process_cpu_s(pid) - main
    answered = max(result["requests"], 1)
    client_s = result.pop("client_cpu_s", 0.0)
    return result | {"server_cpu_us": 1e6 * server / answered,
                     "main_cpu_us": 1e6 * main / answered,
                     "client_cpu_us": 1e6 * client_s / answered,
                     "server_cores": server / wall,
                     "rps_per_server_core": result["requests"] / server if server else 0.0}


def bench_targets(pool: ClientPool, pids: dict[str, int], args: argparse.Namespace) -> dict:
    """Every load point runs on each target in turn, so that drift on a shared machine hits
    all targets alike."""
    pool.wait_ready()
    for target in pids:
        pool.run(target, "closed", 16, 1.0)  # warm-up
    results: dict = {t: {"closed": [], "poisson": []} for t in pids}
    for c in args.concurrency:
        for t, pid in pids.items():
            results[t]["closed"].append(metered(
                pid, lambda: pool.run(t, "closed", c, args.seconds)))
    for rate in args.rates:
        for t, pid in pids.items():
            results[t]["poisson"].append(metered(
                pid, lambda: pool.run(t, "poisson", rate, args.seconds)) | {"offered": rate})
    if args.stream_window:
        for t, pid in pids.items():
            results[t]["stream"] = metered(
                pid, lambda: pool.run(t, "stream", args.stream_window, args.seconds)) | {
                "window": args.stream_window}
    return results


def bench_perf_analyzer(binary: str, ports: dict[str, int], pids: dict[str, int],
                        args: argparse.Namespace) -> dict:
    """perf_analyzer at each concurrency (and streaming at the stream window), target by target
    at each point like the Python client."""
    loads = [(c, False) for c in args.concurrency]
    loads += [(args.stream_window, True)] if args.stream_window else []
    results: dict = {t: [] for t in ports}
    for load, stream in loads:
        for t, port in ports.items():
            def run() -> dict:  # answered requests: its rate over the whole run
                started = time.monotonic()
                r = perf_analyzer.run(binary, MODEL, f"127.0.0.1:{port}", load, args.seconds,
                                      stream)
                return r | {"requests": round(r["rps"] * (time.monotonic() - started))}
            results[t].append(metered(pids[t], run) | {"load": load, "stream": stream})
    return results


def model_ceiling(image: np.ndarray, threads: int, seconds: float) -> dict:
    """Images per second of ONNX Runtime alone, no serving around it."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(ROOT / "models" / MODEL / "1" / "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    rates = {}
    for batch in (1, 16):
        x = {"image": np.repeat(image, batch, axis=0)}
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            session.run(["logits"], x)
            runs += 1
        rates[f"batch_{batch}_img_per_s"] = runs * batch / (time.perf_counter() - start)
    return rates


def _table(results: dict) -> str:
    echo = results["echo"]
    lines = ["| target | load | req/s | x echo | p50 ms | p99 ms | server CPU µs/req | x echo "
             "| server cores | req/s per server core | main process CPU µs/req "
             "| client CPU µs/req | errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for target, runs in results.items():
        if target in ("args", "onnxruntime", "perf_analyzer"):
            continue
        rows = [(f"concurrency {c}", r, e) for c, r, e in
                zip(results["args"]["concurrency"], runs["closed"], echo["closed"], strict=True)]
        rows += [(f"Poisson {r['offered']:.0f}/s", r, e)
                 for r, e in zip(runs["poisson"], echo["poisson"], strict=True)]
        if "stream" in runs:
            rows.append((f"stream, window {runs['stream']['window']}", runs["stream"],
                         echo["stream"]))
        for load, r, e in rows:
            lines.append(_row(target, load, r, e) + f" {r['main_cpu_us']:.0f} | "
                         f"{r['client_cpu_us']:.0f} | " + (
                ", ".join(f"{n} {k}" for k, n in r["errors"].items()) or "0") + " |")
    ceiling = results["onnxruntime"]
    model_us = 1e6 / ceiling["batch_16_img_per_s"]
    lines.append(f"\nONNX Runtime alone, same run: {ceiling['batch_1_img_per_s']:.0f} img/s at "
                 f"batch 1, {ceiling['batch_16_img_per_s']:.0f} at batch 16 ({model_us:.0f} µs "
                 "of one core per image)")
    if 1 in results["args"]["concurrency"]:  # the latency an idle server adds to one request
        at_1 = results["args"]["concurrency"].index(1)
        model_1_ms = 1e3 / ceiling["batch_1_img_per_s"]
        for target, runs in results.items():
            if target not in ("args", "onnxruntime", "perf_analyzer", "echo"):
                p50 = runs["closed"][at_1]["p50_ms"]
                excess = p50 - echo["closed"][at_1]["p50_ms"] - model_1_ms
                lines.append(f"Concurrency 1, {target}: p50 {p50:.2f} ms = echo's p50 + the model "
                             f"in-process at batch 1 ({model_1_ms:.2f} ms) + {excess:.2f} ms")
    # Client and server share the machine's cores: where echo saturates them, a daemon that
    # added nothing but the model's own CPU time to echo's would reach this share of echo.
    for c, e in zip(results["args"]["concurrency"], echo["closed"], strict=True):
        both = e["client_cpu_us"] + e["server_cpu_us"]
        bound = both / (both + model_us)
        lines.append(f"Bound at concurrency {c}: echo + model alone = {bound:.2f}× echo (echo's "
                     f"client + server CPU {both:.0f} µs per request)")
    return "\n".join(lines)


def _row(target: str, load: str, r: dict, e: dict) -> str:
    """A row's columns up to req/s per server core (each ratio to echo's same load point)."""
    return (f"| {target} | {load} | {r['rps']:.0f} | {r['rps'] / e['rps']:.2f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['server_cpu_us']:.0f} | "
            f"{r['server_cpu_us'] / e['server_cpu_us']:.2f} | {r['server_cores']:.2f} | "
            f"{r['rps_per_server_core']:.0f} |")


def _perf_analyzer_table(results: dict) -> str:
    if "perf_analyzer" not in results:
        return "\n\nperf_analyzer: " + results["args"]["perf_analyzer_note"]
    runs = results["perf_analyzer"]
    lines = ["\n\nTriton's perf_analyzer, same run (server CPU from /proc over each whole run):\n",
             "| target | load | req/s | x echo | p50 ms | p99 ms | server CPU µs/req | x echo "
             "| server cores | req/s per server core |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for target, points in runs.items():
        for r, e in zip(points, runs["echo"], strict=True):
            load = f"{'stream, window' if r['stream'] else 'concurrency'} {r['load']}"
            lines.append(_row(target, load, r, e))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 16, 64])
    parser.add_argument("--rates", type=float, nargs="*", default=[500, 1000, 2000, 3000],
                        help="open-loop Poisson arrival rates, requests per second")
    parser.add_argument("--stream-window", type=int, default=64,
                        help="requests in flight on the streaming run; 0 skips it")
    parser.add_argument("--targets", nargs="+",
                        default=["echo", "daemon", "nocompute", "unbatched"])
    parser.add_argument("--clients", type=int, default=max(1, (os.cpu_count() or 1) // 4),
                        help="client processes sharing each load point (default: a quarter "
                             "of the cores, at least 1)")
    parser.add_argument("--perf-analyzer", default=perf_analyzer.find(), metavar="PATH",
                        help="Triton's perf_analyzer binary (default: $PERF_ANALYZER, else "
                             "perf_analyzer on PATH); '' skips it")
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="the daemons' ONNX Runtime threads per engine instance (default: "
                             "0, the daemon's choice), and the in-process reference's (0: 1)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    if "echo" not in args.targets:
        parser.error("--targets: echo is the reference every figure is a ratio to")
    from tools import mnist_digits
    image = mnist_digits.holdout_split()[0][:1]
    note = "" if args.perf_analyzer else ("not installed (on PATH or PERF_ANALYZER); skipped. "
                                          "docs/serving.md says how to get it")
    results: dict = {"args": {**vars(args), "json": str(args.json), "perf_analyzer_note": note}}
    results["onnxruntime"] = model_ceiling(image, args.intra_op_threads or 1, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        ports = {target: free_port() for target in args.targets}
        processes = {t: _start(t, p, Path(tmp), args.intra_op_threads) for t, p in ports.items()}
        pids = {t: p.pid for t, p in processes.items()}
        pool = ClientPool(args.clients, {t: f"127.0.0.1:{p}" for t, p in ports.items()},
                          infer_request(image))
        try:
            results |= bench_targets(pool, pids, args)
            if args.perf_analyzer:
                results["perf_analyzer"] = bench_perf_analyzer(args.perf_analyzer, ports, pids,
                                                               args)
        finally:
            pool.close()
            for process in processes.values():
                process.terminate()
                process.wait(30)
    print(f"{args.clients} client process(es)\n" + _table(results)
          + _perf_analyzer_table(results))
    if args.json:
        safe_files.write_file(args.json, json.dumps(results, indent=2), flag=None)


if __name__ == "__main__":
    main()
