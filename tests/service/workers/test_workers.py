"""Several front-end processes behind one address (`--workers`): they answer on one port and a
socket each, batches form across them, one statistics answer and one /metrics cover them all,
and faults stay contained: a killed front-end comes back and only its own requests fail, a killed
device owner answers UNAVAILABLE and leaves no process behind, a taken port is a clear error."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import shared_memory
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from accelerators.engine_options import TOLERANCE
from service.local_daemon import DaemonProcess, free_port
from service.ops.server import default_workers
from spark_jobs import client as spark_client
from spark_jobs.interface import ModelInterface
from tests.support.daemon import MODEL, MODELS, ROOT, Daemon, image_input, self_signed
from tests.support.metrics import scrape, total
from tests.support.waiting import until


def frontends(owner: int) -> dict[int, int]:
    """Front-end index -> PID of the daemon process `owner`'s front-ends alive now."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == owner and b"service.workers.frontend_process" in argv:
            found[int(argv[argv.index(b"service.workers.frontend_process") + 1])] = int(entry.name)
    return found



def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def infer(address: str, images, timeout_s: float = 60.0):
    with grpcclient.InferenceServerClient(address) as c:
        return c.infer(MODEL, image_input(images), client_timeout=timeout_s).as_numpy("logits")


def infer_within(address: str, images, queue_timeout_us: int):
    with grpcclient.InferenceServerClient(address) as c:
        return c.infer(MODEL, image_input(images), timeout=queue_timeout_us, client_timeout=60)


def answers(address: str, images) -> bool:
    try:
        return infer(address, images).shape == (len(images), 10)
    except InferenceServerException:
        return False


def test_default_is_one_process_up_to_three_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    for cpus, workers in ((1, 1), (2, 1), (3, 1), (4, 2), (16, 8), (64, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _, n=cpus: set(range(n)))
        assert default_workers() == workers


def test_two_workers_batch_together_and_answer_as_one_daemon(serve, holdout) -> None:
    # A batch leaves only with two requests (or after 10 s), even to an idle device: each
    # front-end below has one request in flight at a time, so every batch of two holds one from
    # each front-end.
    daemon, _ = serve(8, "preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 10000000",
                      "--workers", "2", queue_delay_when_idle="true")
    assert sorted(frontends(daemon.process.pid)) == [0, 1]
    sockets = [daemon.socket_url, f"unix:{daemon.socket}.1"]
    images = holdout[0]

    def serially(address: str) -> list:
        return [infer(address, images[i:i + 1]).shape for i in range(4)]

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(serially, sockets)) == [[(1, 10)] * 4] * 2
    assert infer(daemon.url, images[:3]).shape == (3, 10)  # and over the shared TCP port

    with grpcclient.InferenceServerClient(daemon.url) as c:
        stats = c.get_inference_statistics(MODEL).model_stats[0]
    assert stats.inference_count == 11 and stats.inference_stats.success.count == 9
    assert stats.execution_count < 9  # batches of two, across the two processes
    assert any(b.batch_size == 2 for b in stats.batch_stats)
    samples = scrape(daemon.metrics_url)  # one endpoint: the front-ends' requests included
    assert total(samples, "hetserve_requests_total", model=MODEL, code="OK") == 9
    assert total(samples, "hetserve_request_duration_seconds_count", model=MODEL) == 9
    assert total(samples, "hetserve_inferences_total", model=MODEL) == 11
    assert total(samples, "hetserve_pending_requests", model=MODEL, version="1") == 0


def test_queue_limits_and_deadlines_hold_across_workers(serve, holdout) -> None:
    # One sample per batch, 2 s each; the queue holds 3 samples, whichever front-end sent them.
    daemon, control = serve(1, "max_queue_delay_microseconds: 0 default_queue_policy { "
                            "max_queue_size: 3 allow_timeout_override: true }", "--workers", "2",
                            devices="faulty:cpu1")
    control.set(delay_s=2.0)
    image = holdout[0][:1]
    sockets = [daemon.socket_url, f"unix:{daemon.socket}.1"]
    with ThreadPoolExecutor(4) as pool:
        running = pool.submit(infer, sockets[0], image)
        time.sleep(0.5)  # taken by the device: the queue is empty again
        queued = [pool.submit(infer, address, image) for address in sockets]
        # One running, one queued at each front-end: the owner sums the front-ends' gauges.
        until(lambda: total(scrape(daemon.metrics_url), "hetserve_pending_requests",
                            model=MODEL) == 3, what="one running, one queued at each front-end")
        late = pool.submit(infer_within, sockets[1], image, 1_000_000)  # 1 s in the queue
        until(lambda: total(scrape(daemon.metrics_url), "hetserve_pending_requests",
                            model=MODEL) == 4, what="the late request queued")
        with pytest.raises(InferenceServerException) as full:
            infer(sockets[0], image)
        assert full.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "max_queue_size is 3" in full.value.message()
        with pytest.raises(InferenceServerException) as expired:
            late.result(timeout=60)
        assert expired.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert all(f.result(timeout=60).shape == (1, 10) for f in [running, *queued])
    samples = scrape(daemon.metrics_url)
    assert total(samples, "hetserve_requests_expired_total", model=MODEL) == 1  # in the queue
    assert total(samples, "hetserve_pending_requests", model=MODEL) == 0


def test_spark_client_spreads_over_every_socket(serve, holdout) -> None:
    daemon, _ = serve(8, "max_queue_delay_microseconds: 1000", "--workers", "2")
    images = holdout[0][:32]
    model = ModelInterface.fetch(daemon.socket_url, MODEL)
    result = spark_client.infer(daemon.socket_url, model, images, batch_size=4, inflight=4)
    assert result.logits.shape == (32, 10)
    used = {address for address, _ in spark_client._clients}
    assert {daemon.socket_url, f"unix:{daemon.socket}.1"} <= used


def test_a_client_region_registered_at_one_front_end_serves_at_every_one(serve,
                                                                          holdout) -> None:
    daemon, _ = serve(8, "max_queue_delay_microseconds: 1000", "--workers", "2")
    images = np.ascontiguousarray(holdout[0][:4], np.float32)
    memory = shared_memory.SharedMemory(create=True, size=images.nbytes)
    sockets = [daemon.socket_url, f"unix:{daemon.socket}.1"]
    try:
        memory.buf[:images.nbytes] = images.reshape(-1).view(np.uint8)
        with grpcclient.InferenceServerClient(sockets[1]) as c:
            c.register_system_shared_memory("images", "/" + memory.name, images.nbytes)
        for address in sockets:  # another connection, another process (TCP: no token here)
            with grpcclient.InferenceServerClient(address) as c:
                assert "images" in c.get_system_shared_memory_status().regions
                tensor = grpcclient.InferInput("image", list(images.shape), "FP32")
                tensor.set_shared_memory("images", images.nbytes)
                # Each answer from whichever device served it: equal within the engines'
                # fp32 tolerance (accelerators/engine_options.py).
                np.testing.assert_allclose(c.infer(MODEL, [tensor]).as_numpy("logits"),
                                           infer(address, images), rtol=TOLERANCE["fp32"],
                                           atol=TOLERANCE["fp32"])
        os.kill(frontends(daemon.process.pid)[1], signal.SIGKILL)
        until(lambda: answers(sockets[1], images[:1]),
              timeout_s=60.0, what="front-end 1 to answer again")
        with grpcclient.InferenceServerClient(sockets[1]) as c:  # started again, it knows it
            assert "images" in c.get_system_shared_memory_status().regions
        with grpcclient.InferenceServerClient(sockets[0]) as c:
            c.unregister_system_shared_memory("images")
        for address in sockets:
            with grpcclient.InferenceServerClient(address) as c:
                assert not c.get_system_shared_memory_status().regions
    finally:
        memory.close()
        memory.unlink()


def test_a_killed_frontend_comes_back_and_the_others_answer_everything(serve, holdout) -> None:
    daemon, control = serve(8, "max_queue_delay_microseconds: 2000", "--workers", "2")
    control.set(delay_s=0.05)
    victim = frontends(daemon.process.pid)[0]
    images = holdout[0][:1]
    stop = threading.Event()
    survivors: list = []
    on_victim: list[str] = []

    def load(address: str, outcomes: list) -> None:
        with grpcclient.InferenceServerClient(address) as c:
            while not stop.is_set():
                try:
                    outcomes.append(c.infer(MODEL, image_input(images), client_timeout=60)
                                    .as_numpy("logits").shape)
                except InferenceServerException as e:
                    outcomes.append(e.status())

    with ThreadPoolExecutor(6) as pool:
        calls = [pool.submit(load, f"unix:{daemon.socket}.1", survivors) for _ in range(4)]
        calls += [pool.submit(load, daemon.socket_url, on_victim) for _ in range(2)]
        try:
            until(lambda: len(survivors) > 20 and len(on_victim) > 4,
                  timeout_s=60.0, what="requests under load")
            os.kill(victim, signal.SIGKILL)
            until(lambda: frontends(daemon.process.pid).get(0, victim) != victim,
                  timeout_s=60.0, what="front-end 0 to be started again")
            until(lambda: answers(daemon.socket_url, images),
                  timeout_s=60.0, what="front-end 0 to answer again")
        finally:
            stop.set()
        for call in calls:
            call.result(timeout=60)
    assert survivors and set(survivors) == {(1, 10)}  # every request of the other worker
    assert set(on_victim) <= {(1, 10), "StatusCode.UNAVAILABLE"}
    assert not alive(victim)
    # The killed front-end's requests in flight are no longer pending anywhere.
    assert total(scrape(daemon.metrics_url), "hetserve_pending_requests", model=MODEL) == 0


def test_a_killed_device_owner_fails_requests_unavailable_and_leaves_nothing(
        tmp_path: Path, holdout, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.faulty_engine import CONTROL_ENV
    from tests.support.served import ENGINE_MODULE, Control, write_model

    control = Control(tmp_path / "control.json")
    monkeypatch.setenv(CONTROL_ENV, str(control.path))
    models = write_model(tmp_path / "models", 8, "max_queue_delay_microseconds: 1000",
                         {"devices": "faulty:cpu1"})
    daemon = Daemon(tmp_path, models, "--engine-modules", ENGINE_MODULE, "--workers", "2")
    fronts = frontends(daemon.process.pid)
    control.set(delay_s=2.0)
    with ThreadPoolExecutor(6) as pool:  # every call in flight when the owner dies
        calls = [pool.submit(infer, address, holdout[0][:1]) for address in
                 (daemon.url, daemon.socket_url, f"unix:{daemon.socket}.1") * 2]
        time.sleep(0.5)  # let them reach the owner; any order of events passes below
        os.kill(daemon.process.pid, signal.SIGKILL)
        for call in calls:
            with pytest.raises(InferenceServerException) as failed:
                call.result(timeout=60)  # never a hang
            assert failed.value.status() == "StatusCode.UNAVAILABLE"
    assert daemon.process.stop() == -signal.SIGKILL
    until(lambda: not any(alive(pid) for pid in fronts.values()),
          timeout_s=60.0, what="front-ends to end")


def test_sigterm_drains_every_worker_and_leaves_no_process(serve, holdout) -> None:
    daemon, control = serve(8, "max_queue_delay_microseconds: 1000", "--workers", "2",
                            devices="faulty:cpu1")
    fronts = frontends(daemon.process.pid)
    control.set(delay_s=0.5)
    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(infer, address, holdout[0][:1])
                 for address in (daemon.socket_url, f"unix:{daemon.socket}.1") * 2]
        time.sleep(0.3)
        assert daemon.stop() == 0
        assert all(call.result(timeout=30).shape == (1, 10) for call in calls)
    assert not any(alive(pid) for pid in fronts.values())
    assert not daemon.socket.exists() and not Path(f"{daemon.socket}.1").exists()


def _start_refused(tmp_path: Path, port: int, socket_name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service", "serve", "--models", str(MODELS), "--port", str(port),
         "--socket", str(tmp_path / socket_name), "--metrics-port", "0", "--workers", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_port_held_by_another_program_is_a_clear_error(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))
        other.listen()
        refused = _start_refused(tmp_path, port, "grpc.sock")
    assert refused.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: address in use" in refused.stderr


def test_a_port_held_by_another_daemon_with_workers_is_a_clear_error(tmp_path: Path,
                                                                    holdout) -> None:
    first = Daemon(tmp_path, MODELS, "--workers", "2")
    try:  # both share SO_REUSEPORT: only the owner's own guard can tell
        refused = _start_refused(tmp_path, first.port, "other.sock")
        assert refused.returncode == 2
        assert f"cannot listen on 127.0.0.1:{first.port}: address in use" in refused.stderr
        assert infer(first.url, holdout[0][:1]).shape == (1, 10)
    finally:
        assert first.stop() == 0


def test_tls_the_token_and_the_health_port_hold_with_workers(tmp_path: Path, holdout) -> None:
    self_signed(tmp_path / "cert.pem", tmp_path / "key.pem")
    (tmp_path / "token").write_text("s3cret\n")
    port, health_port, sock = free_port(), free_port(), tmp_path / "grpc.sock"
    daemon = DaemonProcess(
        ["--models", str(MODELS), "--port", str(port), "--socket", str(sock), "--metrics-port",
         "0", "--health-port", str(health_port), "--workers", "2", "--tls-cert",
         str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem"), "--token-file",
         str(tmp_path / "token")], f"unix:{sock}", tmp_path / "daemon.log")
    try:
        daemon.wait_ready()
        tls = dict(ssl=True, root_certificates=str(tmp_path / "cert.pem"))
        with grpcclient.InferenceServerClient(f"127.0.0.1:{port}", **tls) as c:
            reply = c.infer(MODEL, image_input(holdout[0][:1]),
                            headers={"authorization": "Bearer s3cret"})
            assert reply.as_numpy("logits").shape == (1, 10)
            with pytest.raises(InferenceServerException) as refused:
                c.infer(MODEL, image_input(holdout[0][:1]))
            assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    finally:
        assert daemon.stop() == 0
