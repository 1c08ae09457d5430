"""KServe V2 over HTTP/REST (--http-port): tritonclient.http and plain JSON (as curl sends it)
against a real daemon, with one process and with two front-ends: health, metadata, config,
statistics, the repository index, inference in JSON and in Triton's binary tensors,
classification, errors as the protocol's JSON with their HTTP status, the token, the body bound,
compressed bodies, load and unload by the admin token's holders, and connection bounds."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import select
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from service.local_daemon import DaemonProcess, free_port
from tests.support.daemon import MODEL, MODELS, Daemon, example_repository
from tests.support.metrics import scrape, total

ADMIN = "admin-t0ken"


@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def rest(request, tmp_path_factory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("rest")
    d = Daemon(tmp, MODELS, "--workers", request.param, "--http-port", str(port := free_port()),
               "--max-message-bytes", str(1 << 20), "--max-connections-per-peer", "16")
    d.http, d.workers = f"127.0.0.1:{port}", int(request.param)
    yield d
    assert d.stop() == 0


def _images(holdout, n: int) -> tuple[np.ndarray, np.ndarray]:
    return holdout[0][:n].astype(np.float32), holdout[1][:n]


def _post(address: str, path: str, body: bytes, headers: dict | None = None
          ) -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection(address, timeout=30)
    try:
        connection.request("POST", path, body, headers or {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_tritonclient_http_serves_metadata_and_inference(rest, holdout) -> None:
    images, labels = _images(holdout, 8)
    client = httpclient.InferenceServerClient(rest.http)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    assert not client.is_model_ready("no-such-model")
    extensions = client.get_server_metadata()["extensions"]
    # what REST offers: shared memory is gRPC's, on the unix socket
    assert "classification" in extensions and "system_shared_memory" not in extensions
    metadata = client.get_model_metadata(MODEL)
    assert metadata["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
    config = client.get_model_config(MODEL)
    assert config["max_batch_size"] == 128 and config["input"][0]["dims"] == [1, 28, 28]
    assert client.get_model_repository_index() == [
        {"name": MODEL, "version": "1", "state": "READY", "reason": ""}]

    tensor = httpclient.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)  # binary
    binary = client.infer(MODEL, [tensor])
    tensor.set_data_from_numpy(images, binary_data=False)  # JSON
    as_json = client.infer(MODEL, [tensor], outputs=[
        httpclient.InferRequestedOutput("logits", binary_data=False)])
    for reply in (binary, as_json):
        assert (reply.as_numpy("logits").argmax(1) == labels).mean() >= 0.75
        assert reply.get_response()["parameters"]["device"]
    np.testing.assert_allclose(binary.as_numpy("logits"), as_json.as_numpy("logits"),
                               rtol=1e-4, atol=1e-4)  # each may run on another device
    top = client.infer(MODEL, [tensor], outputs=[
        httpclient.InferRequestedOutput("logits", class_count=2)]).as_numpy("logits")
    assert top.shape == (8, 2)
    assert [int(row[0].decode().split(":")[1]) for row in top] == \
        list(binary.as_numpy("logits").argmax(1))
    stats = client.get_inference_statistics(MODEL)["model_stats"][0]
    assert stats["name"] == MODEL and stats["inference_count"] >= 24


def test_plain_json_as_curl_sends_it(rest, holdout) -> None:
    images, labels = _images(holdout, 2)
    body = json.dumps({"id": "r1", "inputs": [{
        "name": "image", "shape": [2, 1, 28, 28], "datatype": "FP32",
        "data": images.tolist()}]}).encode()  # nested lists, as the spec allows
    status, headers, reply = _post(rest.http, f"/v2/models/{MODEL}/infer", body)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    document = json.loads(reply)
    assert document["id"] == "r1" and document["model_name"] == MODEL
    (logits,) = document["outputs"]
    assert logits["shape"] == [2, 10] and logits["datatype"] == "FP32"
    assert list(np.array(logits["data"]).reshape(2, 10).argmax(1)) == list(labels)


@pytest.mark.parametrize("path, body, status, message", [
    (f"/v2/models/{MODEL}/infer", b"{not json", 400, "the request body: not a JSON document"),
    (f"/v2/models/{MODEL}/infer", b"[" * 100_000, 400, "not a JSON document"),
    (f"/v2/models/{MODEL}/infer", b'{"inputs": 3}', 400, "inputs: a JSON array expected"),
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{
        "name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [1.0]}]}).encode(),
     400, "inputs[0].data: 1 value received, expected 784 for shape [1, 1, 28, 28]"),
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{
        "name": "image", "shape": [1], "datatype": "FP32", "data": [1.0],
        "parameters": {"shared_memory_region": "r"}}]}).encode(),
     400, "shared memory is not offered over REST"),
    ("/v2/models/no-such-model/infer", b'{"inputs": []}', 404, "no such model"),
    ("/v2/nowhere", b"", 404, "Not Found"),
    # Integers beyond the protocol's 64 bits, wrong JSON types: each a 400 naming the field.
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{
        "name": "image", "shape": [2 ** 64, 1, 28, 28], "datatype": "FP32", "data": [1.0]}]}
     ).encode(), 400, "inputs[0].shape: [18446744073709551616, 1, 28, 28] received"),
    (f"/v2/models/{MODEL}/infer", json.dumps({"parameters": {"priority": 2 ** 70}, "inputs": []}
                                             ).encode(), 400, "parameters.priority: "),
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [], "outputs": [{
        "name": "logits", "parameters": {"classification": -2 ** 64}}]}).encode(), 400,
     "outputs[0].parameters.classification: "),
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{
        "name": "image", "shape": [1], "datatype": "FP32", "data": [1.0],
        "parameters": {"binary_data_size": 2 ** 80}}]}).encode(), 400,
     "inputs[0].parameters.binary_data_size: "),
    (f"/v2/repository/models/{MODEL}/load", b'{"parameters": [1, 2]}', 400,
     "parameters: a JSON object expected"),
    (f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [{
        "name": "image", "shape": [128, 1, 28, 28], "datatype": "FP32",
        "data": [0.123456] * (128 * 784)}]}).encode(), 400,
     "bytes of JSON received, at most 524288 parsed"),
])
def test_errors_are_json_with_their_http_status(rest, path, body, status, message) -> None:
    got, _, reply = _post(rest.http, path, body)
    assert got == status, reply
    assert message in json.loads(reply)["error"]


def test_requests_are_counted_by_route_name_and_status(rest, holdout) -> None:
    """Paths a client makes up all count as endpoint "none": the labels stay a bounded set."""
    before = scrape(rest.metrics_url)
    client = httpclient.InferenceServerClient(rest.http)
    tensor = httpclient.InferInput("image", [1, 1, 28, 28], "FP32")
    tensor.set_data_from_numpy(_images(holdout, 1)[0])
    client.infer(MODEL, [tensor])
    with pytest.raises(InferenceServerException):
        client.infer("no-such-model", [tensor])  # 404 on the infer route
    for made_up in ("/v2/x1", "/v2/x2/y"):
        assert _post(rest.http, made_up, b"{}")[0] == 404
    assert _post(rest.http, f"/v2/models/{MODEL}/infer", b"[")[0] == 400
    after = scrape(rest.metrics_url)

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)
    assert grew("hetserve_http_requests_total", endpoint="infer", status="200") == 1
    assert grew("hetserve_http_requests_total", endpoint="infer", status="404") == 1
    assert grew("hetserve_http_requests_total", endpoint="infer", status="400") == 1
    assert grew("hetserve_http_requests_total", endpoint="none", status="404") == 2
    assert grew("hetserve_http_request_duration_seconds_count", endpoint="infer") == 3
    assert not [k for k in after if "x1" in k or "x2" in k or "no-such-model" in k]


def test_a_body_over_the_message_limit_is_refused(rest) -> None:
    status, _, reply = _post(rest.http, f"/v2/models/{MODEL}/infer", b" " * (2 << 20))
    assert status == 413, reply


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_as_tritonclient_sends_them(rest, holdout, algorithm) -> None:
    images, _ = _images(holdout, 4)
    client = httpclient.InferenceServerClient(rest.http)
    for binary in (True, False):
        tensor = httpclient.InferInput("image", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images, binary_data=binary)
        plain = client.infer(MODEL, [tensor]).as_numpy("logits")
        packed = client.infer(MODEL, [tensor], request_compression_algorithm=algorithm)
        np.testing.assert_allclose(packed.as_numpy("logits"), plain, rtol=1e-4, atol=1e-4)


_JSON = json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32",
                                "data": [0.5] * 784}]}).encode()
_HEADER = json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32",
                                  "parameters": {"binary_data_size": 3136}}]}).encode()


@pytest.mark.parametrize("body, headers, status, message", [
    (_JSON, {"Content-Encoding": "gzip"}, 400, "'Content-Encoding': gzip, but the body is not"),
    (gzip.compress(_JSON)[:-9], {"Content-Encoding": "gzip"}, 400, "body ends before its gzip"),
    (gzip.compress(_JSON) + b"!", {"Content-Encoding": "gzip"}, 400, "1 bytes follow its gzip"),
    (gzip.compress(_JSON), {"Content-Encoding": "br"}, 415, "expected one of identity, gzip"),
    # 8 MB of JSON in 8 KB: refused once the inflated part passes what JSON may hold
    (gzip.compress(b" " * (8 << 20)), {"Content-Encoding": "gzip"}, 413,
     "inflates (gzip) to more than 524288 bytes, the most JSON parsed"),
    (gzip.compress(_HEADER + bytes(8 << 20)),
     {"Content-Encoding": "gzip", "Inference-Header-Content-Length": str(len(_HEADER))}, 413,
     "inflates (gzip) to more than 1048576 bytes, --max-message-bytes"),
], ids=["not-gzip", "cut", "trailing", "unknown", "json-bomb", "binary-bomb"])
def test_a_bad_compressed_body_gets_its_4xx_naming_why(rest, body, headers, status,
                                                       message) -> None:
    got, _, reply = _post(rest.http, f"/v2/models/{MODEL}/infer", body, headers)
    assert got == status, reply
    assert message in json.loads(reply)["error"]


def test_a_peer_beyond_its_connections_gets_429_naming_the_flag(rest) -> None:
    port = int(rest.http.rsplit(":", 1)[1])
    with contextlib.ExitStack() as held:
        # Past the limit at every front-end (the kernel spreads connections over them).
        socks = [held.enter_context(socket.create_connection(("127.0.0.1", port)))
                 for _ in range(16 * rest.workers + 16)]
        time.sleep(0.5)
        answers = [sock.recv(4096) if select.select([sock], [], [], 0)[0] else b""
                   for sock in socks]
    refusals = [a for a in answers if a]
    assert refusals, "no connection refused"
    assert all(a.startswith(b"HTTP/1.1 429") and b"--max-connections-per-peer" in a
               for a in refusals)


def test_the_token_guards_all_but_health_and_the_admin_token_loads(tmp_path, holdout) -> None:
    (tmp_path / "token").write_text("t0ken\n")
    (tmp_path / "admin").write_text(ADMIN + "\n")
    port, sock = free_port(), tmp_path / "grpc.sock"
    d = DaemonProcess(["--models", str(example_repository(tmp_path, "onnxruntime")),
                       "--port", "0", "--socket", str(sock), "--metrics-port", "0",
                       "--http-port", str(port), "--token-file", str(tmp_path / "token"),
                       "--model-control-mode", "explicit", "--load-model", MODEL,
                       "--admin-token-file", str(tmp_path / "admin")],
                      f"unix:{sock}", tmp_path / "daemon.log")
    d.wait_ready()
    try:
        address = f"127.0.0.1:{port}"
        plain = httpclient.InferenceServerClient(address)
        assert plain.is_server_live()  # health needs no token, as on gRPC
        with pytest.raises(InferenceServerException) as refused:
            plain.get_model_metadata(MODEL)
        assert refused.value.status() == "401" and "Bearer <token>" in refused.value.message()
        user = {"Authorization": "Bearer t0ken"}
        assert plain.get_model_metadata(MODEL, headers=user)["name"] == MODEL
        with pytest.raises(InferenceServerException) as refused:
            plain.unload_model(MODEL, headers=user)  # the token is not the admin token
        assert refused.value.status() == "403" and "admin token" in refused.value.message()
        admin = {"Authorization": f"Bearer {ADMIN}"}
        plain.unload_model(MODEL, headers=admin)
        assert not plain.is_model_ready(MODEL, headers=user)
        plain.load_model(MODEL, headers=admin)
        assert plain.is_model_ready(MODEL, headers=user)
    finally:
        assert d.stop() == 0


def test_malformed_http_is_answered_and_logged_in_a_few_lines_without_tracebacks(rest) -> None:
    log = rest.process.log_path
    before = log.stat().st_size
    host, port = rest.http.split(":")
    answers = []
    for i in range(60):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -%d\r\n\r\n" % i)
            answers.append(sock.recv(100))
    time.sleep(0.5)
    written = log.read_bytes()[before:].decode(errors="replace")
    assert all(a.split(b" ")[1] == b"400" for a in answers), answers[:3]
    assert "Traceback" not in written
    # At most 10 lines per 10 s, per process.
    assert written.count("\n") <= 10 * rest.workers, written


def test_the_admin_token_alone_guards_model_control_only_as_on_grpc(tmp_path, holdout) -> None:
    """--admin-token-file without --token-file: inference and the index are open over REST as
    over gRPC on TCP, and loading needs the admin token on both."""
    (tmp_path / "admin").write_text(ADMIN + "\n")
    port, sock = free_port(), tmp_path / "grpc.sock"
    grpc_port = free_port()
    d = DaemonProcess(["--models", str(example_repository(tmp_path, "onnxruntime")),
                       "--port", str(grpc_port), "--socket", str(sock), "--metrics-port", "0",
                       "--http-port", str(port), "--model-control-mode", "explicit",
                       "--load-model", MODEL, "--admin-token-file", str(tmp_path / "admin")],
                      f"unix:{sock}", tmp_path / "daemon.log")
    d.wait_ready()
    try:
        rest = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        tcp = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert rest.get_model_metadata(MODEL)["name"] == tcp.get_model_metadata(MODEL).name
        assert [m["name"] for m in rest.get_model_repository_index()] == \
            [m.name for m in tcp.get_model_repository_index().models]
        refusals = []
        for unload in (rest.unload_model, tcp.unload_model):
            with pytest.raises(InferenceServerException) as refused:
                unload(MODEL)
            refusals.append(refused.value.message())
        assert all("admin token" in m for m in refusals), refusals
    finally:
        assert d.stop() == 0
