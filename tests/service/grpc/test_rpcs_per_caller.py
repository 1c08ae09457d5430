"""Requests in flight per caller (--max-rpcs-per-caller, service/edge/inflight.py): a local user
who floods gRPC streams or REST past the bound gets refusals naming the flag, while another
caller's requests are all served meanwhile."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from service.edge.inflight import ANONYMOUS, InflightLimit
from service.errors import LimitError
from service.local_daemon import free_port
from tests.support.daemon import MODEL, MODELS, Daemon, image_input
from tests.support.other_user import as_nobody

PER_CALLER = 4
FLAG = "--max-rpcs-per-caller"


def test_a_caller_holds_at_most_its_bound_and_tcp_without_a_token_shares_one() -> None:
    limit = InflightLimit(2)
    held = [limit.enter("uid 1000", False), limit.enter("uid 1000", False)]
    with pytest.raises(LimitError, match=f"from uid 1000: 2, the most {FLAG}"):
        limit.enter("uid 1000", False)
    assert limit.enter("uid 1001", False) == "uid 1001"  # another caller has its own
    assert {limit.enter(f"tcp uid {uid}", True) for uid in (1000, 1001)} == {ANONYMOUS}
    with pytest.raises(LimitError, match=ANONYMOUS):
        limit.enter("tcp uid 1002", True)
    limit.leave(held[0])
    assert limit.enter("uid 1000", False) == "uid 1000"  # a place freed is taken again
    assert limit.enter("", False) == ""  # no door: not counted


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon]:
    port = free_port()
    d = Daemon(tmp_path_factory.mktemp("per-caller"), MODELS, "--max-rpcs-per-caller",
               str(PER_CALLER), "--http-port", str(port))
    d.http_port = port
    yield d
    assert d.stop() == 0


def _served_while(flood: threading.Thread, daemon: Daemon, holdout) -> list[bool]:
    """The socket's user (root: another caller than the flood's) infers one image at a time
    until `flood` ends: whether each answer was right."""
    answers = []
    with grpcclient.InferenceServerClient(daemon.socket_url) as c:
        i = 0
        while flood.is_alive() or len(answers) < 20:
            logits = c.infer(MODEL, image_input(holdout[0][i:i + 1])).as_numpy("logits")
            answers.append(bool(logits.argmax() == holdout[1][i]))
            i = (i + 1) % 64
    return answers


def test_a_user_flooding_streams_is_refused_while_another_is_served(daemon, holdout) -> None:
    image = np.ascontiguousarray(holdout[0][:1], np.float32).tobytes()
    run: list = []
    flood = threading.Thread(target=lambda: run.append(as_nobody(f"""
import grpc
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc
def requests():
    for _ in range(2000):
        r = pb.ModelInferRequest(model_name={MODEL!r}, raw_input_contents=[{image!r}])
        r.inputs.add(name="image", datatype="FP32", shape=[1, 1, 28, 28])
        yield r
with grpc.insecure_channel({daemon.url!r}) as channel:
    replies = list(service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
        requests(), timeout=60))
errors = [r.error_message for r in replies if r.error_message]
print(len(replies), len(errors), sum({FLAG!r} in e for e in errors))
print(errors[0] if errors else "")
""")))
    flood.start()
    answers = _served_while(flood, daemon, holdout)
    flood.join()
    assert run[0].returncode == 0, run[0].stderr
    counts, first = run[0].stdout.split("\n")[:2]
    replies, errors, naming = map(int, counts.split())
    assert replies == 2000 and errors == naming > 0, run[0].stdout
    assert first.startswith("RESOURCE_EXHAUSTED: requests in flight from callers over TCP "
                            f"without a token: {PER_CALLER}, the most {FLAG}"), first
    assert all(answers) and len(answers) >= 20


def _rest_infer(port: int, body: bytes) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", f"/v2/models/{MODEL}/infer", body)
        reply = connection.getresponse()
        return reply.status, reply.read().decode()
    finally:
        connection.close()


def test_a_rest_flood_gets_429_naming_the_flag_while_the_socket_is_served(
        daemon, holdout) -> None:
    port = daemon.http_port
    body = json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32",
                                   "data": holdout[0][0].ravel().tolist()}]}).encode()
    outcomes: list[tuple[int, str]] = []

    def flood() -> None:
        with ThreadPoolExecutor(16) as pool:
            outcomes.extend(pool.map(lambda _: _rest_infer(port, body), range(800)))

    flooding = threading.Thread(target=flood)
    flooding.start()
    answers = _served_while(flooding, daemon, holdout)
    flooding.join()
    refused = [text for status, text in outcomes if status == 429]
    assert refused and all(FLAG in text for text in refused), refused[:1]
    assert {status for status, _ in outcomes} <= {200, 429}
    assert all(answers) and len(answers) >= 20
