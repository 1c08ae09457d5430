"""Model control without restarts (Triton's --model-control-mode): explicit loads and unloads by
those allowed, the repository followed in poll mode, and version swaps under load that fail no
request, with one process and with front-end processes."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.daemon import MODEL, Daemon, example_repository, image_input
from tests.support.other_user import NOBODY, calls_as_nobody, needs_nobody
from tests.support.waiting import until

TOKEN = "admin-s3cret"


def refused(call: Callable[[], object], status: str, *phrases: str) -> str:
    with pytest.raises(InferenceServerException) as refused:
        call()
    assert refused.value.status() == f"StatusCode.{status}", refused.value
    for phrase in phrases:
        assert phrase in refused.value.message(), refused.value.message()
    return refused.value.message()


def _index(client: grpcclient.InferenceServerClient) -> dict[str, tuple[str, str]]:
    """version (or "" for a model's failure) -> (state, reason)."""
    return {m.version: (m.state, m.reason)
            for m in client.get_model_repository_index().models if m.name == MODEL}


def _versions(client: grpcclient.InferenceServerClient) -> list[str]:
    return list(client.get_model_metadata(MODEL).versions)


def _add_version(repo: Path, version: int, broken: bool = False) -> None:
    folder = repo / MODEL / str(version)
    folder.mkdir()
    if broken:
        (folder / "model.onnx").write_bytes(b"not an ONNX graph")
    else:
        shutil.copy(repo / MODEL / "1" / "model.onnx", folder / "model.onnx")



def _classifies(client: grpcclient.InferenceServerClient, holdout) -> str:
    """The version that served a correct answer."""
    images, labels = holdout
    reply = client.infer(MODEL, image_input(images[:1]))
    assert reply.as_numpy("logits").argmax() == labels[0]
    return reply.get_response().model_version


def test_without_model_control_loads_are_refused(daemon) -> None:
    with grpcclient.InferenceServerClient(daemon.socket_url) as client:
        refused(lambda: client.load_model(MODEL), "UNAVAILABLE",
                 "explicit model load / unload is not allowed", "--model-control-mode explicit")
        refused(lambda: client.unload_model(MODEL), "UNAVAILABLE")
        assert client.is_model_ready(MODEL)


def test_explicit_mode_loads_reloads_and_unloads_for_those_allowed(tmp_path, holdout) -> None:
    repo = example_repository(tmp_path, "onnxruntime:cpu0")
    (tmp_path / "admin.token").write_text(TOKEN + "\n")
    d = Daemon(tmp_path, repo, "--model-control-mode", "explicit",
               "--admin-token-file", str(tmp_path / "admin.token"))
    try:
        with grpcclient.InferenceServerClient(d.socket_url) as local, \
                grpcclient.InferenceServerClient(d.url) as tcp:
            assert _index(local)[""][0] == "UNAVAILABLE" and "not loaded" in _index(local)[""][1]
            refused(lambda: _classifies(tcp, holdout), "NOT_FOUND", "not loaded")
            for headers in ({}, {"authorization": "Bearer wrong"}):
                refused(lambda: tcp.load_model(MODEL, headers=headers), "PERMISSION_DENIED",
                         "root and the daemon's user over the unix socket", "admin token")
            tcp.load_model(MODEL, headers={"authorization": f"Bearer {TOKEN}"})
            assert _classifies(tcp, holdout) == "1"

            _add_version(repo, 2, broken=True)  # fails to load: version 1 serves on
            reason = refused(lambda: local.load_model(MODEL), "UNAVAILABLE", "version 2")
            assert _classifies(tcp, holdout) == "1"
            index = _index(local)
            assert index["1"] == ("READY", "") and index[""][0] == "UNAVAILABLE"
            assert index[""][1] == f"{reason} (versions [1] still serve)"
            assert f"model {MODEL!r} not loaded: " in (tmp_path / "daemon.log").read_text()

            shutil.copy(repo / MODEL / "1" / "model.onnx", repo / MODEL / "2" / "model.onnx")
            local.load_model(MODEL)  # a reload: version 2 replaces version 1
            assert _versions(tcp) == ["2"] and _classifies(tcp, holdout) == "2"
            assert _index(local) == {"2": ("READY", "")}
            refused(lambda: local.load_model(MODEL, config="{}"), "INVALID_ARGUMENT",
                     "parameters ['config']")
            refused(lambda: local.load_model("../etc"), "NOT_FOUND")
            refused(lambda: local.load_model("absent"), "NOT_FOUND", "no such folder")

            local.unload_model(MODEL)
            refused(lambda: _classifies(tcp, holdout), "NOT_FOUND", "unloaded")
            assert _index(local) == {"": ("UNAVAILABLE", "unloaded")}
    finally:
        assert d.stop() == 0


def test_other_socket_users_may_not_load() -> None:
    """nobody reaches the socket (--socket-group) and may infer, but not load or unload."""
    needs_nobody()
    folder = Path(tempfile.mkdtemp(prefix="hetserve-control-"))
    folder.chmod(0o755)
    repo = example_repository(folder, "onnxruntime:cpu0")
    d = Daemon(folder, repo, "--model-control-mode", "explicit", "--load-model", MODEL,
               "--socket-group", str(NOBODY))
    try:
        results = calls_as_nobody(d, f"""
            c.infer({MODEL!r}, [pixels])
            c.load_model({MODEL!r})
            c.unload_model({MODEL!r})
        """)
        assert results[0] == "OK", results
        assert all(r.startswith("StatusCode.PERMISSION_DENIED") for r in results[1:]), results
    finally:
        assert d.stop() == 0
        shutil.rmtree(folder)


def test_poll_mode_follows_the_repository(tmp_path, holdout) -> None:
    repo = example_repository(tmp_path, "onnxruntime:cpu0")
    d = Daemon(tmp_path, repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.5")
    try:
        with grpcclient.InferenceServerClient(d.socket_url) as client:
            refused(lambda: client.load_model(MODEL), "UNAVAILABLE",
                     "explicit model load / unload is not allowed if polling is enabled")
            _add_version(repo, 2)
            until(lambda: _versions(client) == ["2"])
            assert _classifies(client, holdout) == "2"

            _add_version(repo, 3, broken=True)  # fails to load: version 2 serves on
            until(lambda: "" in _index(client))
            state, reason = _index(client)[""]
            assert state == "UNAVAILABLE" and "version 3" in reason, reason
            assert _versions(client) == ["2"] and _classifies(client, holdout) == "2"

            shutil.rmtree(repo / MODEL / "3")  # the failure goes with it
            until(lambda: _index(client) == {"2": ("READY", "")})
            shutil.rmtree(repo / MODEL)
            until(lambda: _index(client) == {"": ("UNAVAILABLE", "unloaded")})
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ten_version_swaps_under_load_fail_no_request(tmp_path, holdout, workers) -> None:
    """Four clients infer without pause while ten new versions replace each other; every
    request succeeds, and after each swap every front-end serves the new version."""
    repo = example_repository(tmp_path, "onnxruntime:cpu0")
    d = Daemon(tmp_path, repo, "--model-control-mode", "explicit", "--load-model", MODEL,
               "--workers", workers)
    stop, lock = threading.Event(), threading.Lock()
    served: Counter[str] = Counter()
    failures: list[Exception] = []

    def infer() -> None:
        with grpcclient.InferenceServerClient(d.url) as client:
            while not stop.is_set():
                try:
                    version = _classifies(client, holdout)
                except Exception as e:
                    with lock:
                        failures.append(e)
                    continue
                with lock:
                    served[version] += 1

    clients = [threading.Thread(target=infer) for _ in range(4)]
    try:
        for thread in clients:
            thread.start()
        with grpcclient.InferenceServerClient(d.socket_url) as admin:
            for version in range(2, 12):
                _add_version(repo, version)
                admin.load_model(MODEL)
                for _ in range(4):  # new connections: each front-end, with several
                    with grpcclient.InferenceServerClient(d.url) as fresh:
                        assert _versions(fresh) == [str(version)]
    finally:
        stop.set()
        for thread in clients:
            thread.join(30)
        assert d.stop() == 0
    assert not failures, failures[:3]
    assert served["11"] and len(served) >= 5, served
