"""Device faults: a device that fails mid-batch hands its batches to the next device, no request
is lost, the metrics count the failover, and a probe brings the device back."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from service.core import slow_devices
from tests.support.daemon import MODEL, MODELS, image_input
from tests.support.metrics import scrape, total
from tests.support.waiting import until


def _infer_all(url: str, images: np.ndarray) -> list[np.ndarray]:
    def call(i: int) -> np.ndarray:
        with grpcclient.InferenceServerClient(url) as c:
            return c.infer(MODEL, image_input(images[i:i + 1])).as_numpy("logits")
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(call, range(len(images))))



def test_a_failing_device_fails_over_and_comes_back(serve, holdout) -> None:
    daemon, control = serve(8, "max_queue_delay_microseconds: 2000",
                            devices="faulty:fpga0, onnxruntime:cpu0", policy="prefer",
                            # a budget no loaded machine misses, and the order pinned: this tests
                            # recovery, not spilling or a learned order (a loaded machine's noise
                            # can time fpga0's first batches far slower than cpu0's)
                            latency_budget_ms="60000", prefer_order="strict")
    images = holdout[0][:48]
    expected = ort.InferenceSession(str(MODELS / MODEL / "1" / "model.onnx"),
                                    providers=["CPUExecutionProvider"]).run(
        ["logits"], {"image": images})[0]

    control.set(fail=True)
    replies = _infer_all(daemon.url, images)
    np.testing.assert_allclose(np.concatenate(replies), expected, rtol=1e-4, atol=1e-4)
    m = scrape(daemon.metrics_url)
    assert total(m, "hetserve_failovers_total", device="fpga0") >= 1
    assert total(m, "hetserve_device_healthy", device="fpga0") == 0
    assert total(m, "hetserve_inferences_total", device="cpu0") >= 48
    assert total(m, "hetserve_requests_total", code="OK") == 48

    control.set(fail=False)  # the device recovers; a probe notices
    until(lambda: total(scrape(daemon.metrics_url), "hetserve_device_healthy",
                            device="fpga0") == 1)
    before = total(scrape(daemon.metrics_url), "hetserve_inferences_total", device="fpga0")
    _infer_all(daemon.url, images[:8])
    after = total(scrape(daemon.metrics_url), "hetserve_inferences_total", device="fpga0")
    assert after - before == 8, "the preferred device serves again once healthy"


def test_when_every_device_fails_the_request_fails_with_internal(serve, holdout) -> None:
    daemon, control = serve(8, "max_queue_delay_microseconds: 1000", devices="faulty:fpga0")
    control.set(fail=True)
    with grpcclient.InferenceServerClient(daemon.url) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.infer(MODEL, image_input(holdout[0][:1]))
        assert caught.value.status() == "StatusCode.INTERNAL"
        assert "every device failed" in caught.value.message()
        assert "simulated device fault" in caught.value.message()
        control.set(fail=False)
        assert client.infer(MODEL, image_input(holdout[0][:1])).as_numpy("logits").shape == \
            (1, 10)


def test_the_latency_policy_spreads_load_over_devices(serve, holdout) -> None:
    # A slow fpga0 and a fast cpu0: the latency policy sends most batches to cpu0, and both
    # devices get used while requests queue.
    daemon, control = serve(4, "max_queue_delay_microseconds: 1000",
                            devices="faulty:fpga0, onnxruntime:cpu0", policy="latency")
    control.set(delay_s=0.05)
    _infer_all(daemon.url, holdout[0][:96])
    m = scrape(daemon.metrics_url)
    fpga, cpu = (total(m, "hetserve_inferences_total", device=d) for d in ("fpga0", "cpu0"))
    assert fpga + cpu == 96 and cpu > fpga


@pytest.mark.parametrize("prefer_order", ["measured", "strict"])
def test_prefer_stops_sending_batches_to_a_much_slower_device_unless_the_order_is_pinned(
        serve, holdout, tmp_path, prefer_order) -> None:
    # A budget no loaded machine misses: fpga0 always fits it, only its measured speed counts.
    daemon, control = serve(8, "max_queue_delay_microseconds: 1000",
                            devices="faulty:fpga0, onnxruntime:cpu0", policy="prefer",
                            latency_budget_ms="60000", prefer_order=prefer_order)
    control.set(delay_s=0.05)

    def tried() -> bool:  # fpga0 is judged once it ran its trial batches; cpu0 is meanwhile
        _infer_all(daemon.url, holdout[0][:48])
        return total(scrape(daemon.metrics_url), "hetserve_compute_duration_seconds_count",
                     device="fpga0") >= slow_devices.TRIAL_BATCHES
    until(tried, timeout_s=60, what="fpga0's trial batches")
    before = total(scrape(daemon.metrics_url), "hetserve_inferences_total", device="fpga0")
    with grpcclient.InferenceServerClient(daemon.url) as client:
        devices = {client.infer(MODEL, image_input(holdout[0][i:i + 1])).get_response()
                   .parameters["device"].string_param for i in range(8)}
    m = scrape(daemon.metrics_url)
    served = total(m, "hetserve_inferences_total", device="fpga0") - before
    demoted = total(m, "hetserve_device_demoted", model=MODEL, device="fpga0")
    lines = re.findall(r"faulty:fpga0 is [\d.]+ times slower per sample than onnxruntime:cpu0",
                       (tmp_path / "daemon.log").read_text())
    if prefer_order == "measured":
        assert (served, demoted, devices, len(lines)) == (0, 1, {"onnxruntime:cpu0"}, 1)
    else:
        assert (served, demoted, devices, lines) == (8, 0, {"faulty:fpga0"}, [])


@pytest.mark.parametrize("seconds, prefer_order", [(0.5, "measured"), (1e-6, "measured"),
                                                   (0.5, "strict")],
                         ids=["slower", "faster", "slower_strict"])
def test_under_light_load_a_much_slower_first_device_is_found_out(
        tmp_path, holdout, seconds, prefer_order) -> None:
    """One request at a time, so that the first device alone would ever run: a simulated
    fpga0 of `seconds` per batch first, onnxruntime:cpu0 second."""
    from tests.support.daemon import Daemon
    from tests.support.served import write_model
    repo = write_model(tmp_path / "models", 8, "max_queue_delay_microseconds: 500",
                       {"devices": "simulated:fpga0, onnxruntime:cpu0", "policy": "prefer",
                        "simulated_curve": "sim.curve", "latency_budget_ms": "60000",
                        "prefer_order": prefer_order})
    (repo / MODEL / "sim.curve").write_text(f"1 {seconds}\n")
    config = repo / MODEL / "config.pbtxt"  # the example's own device list goes
    config.write_text(config.read_text().replace(
        'parameters { key: "devices" value: { string_value: "opencl:fpga0, onnxruntime" } }\n',
        ""))
    daemon = Daemon(tmp_path, repo)
    try:
        with grpcclient.InferenceServerClient(daemon.url) as client:
            devices = [client.infer(MODEL, image_input(holdout[0][i:i + 1])).get_response()
                       .parameters["device"].string_param for i in range(8)]
        demoted = total(scrape(daemon.metrics_url), "hetserve_device_demoted", model=MODEL,
                        device="fpga0")
    finally:
        assert daemon.stop() == 0
    lines = re.findall(r"simulated:fpga0 is [\d.]+ times slower per sample than "
                       r"onnxruntime:cpu0", (tmp_path / "daemon.log").read_text())
    fpga, cpu = "simulated:fpga0", "onnxruntime:cpu0"
    # Each device is tried on three batches, in turns, before it is judged.
    if prefer_order == "strict":
        assert (devices, demoted, lines) == ([fpga] * 8, 0, [])
    elif seconds > 0.1:  # fpga0 found out
        assert (devices, demoted, len(lines)) == ([fpga, cpu] * 3 + [cpu] * 2, 1, 1)
    else:  # fpga0 keeps its place
        assert (devices, demoted, lines) == ([fpga, cpu] * 3 + [fpga] * 2, 0, [])


def _unpadded_conv(repo) -> None:
    """A 3x3 convolution without padding over any height and width: 2x2 is too small."""
    from onnx import TensorProto, helper, numpy_helper

    from accelerators.onnx_models import make_model
    (repo / "conv" / "1").mkdir(parents=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2, "oh", "ow"])
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    (repo / "conv" / "1" / "model.onnx").write_bytes(make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "g", [x], [y], [w]),
        17).SerializeToString())
    (repo / "conv" / "config.pbtxt").write_text(
        'name: "conv"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1, -1, -1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, -1, -1 ] } ]\n'
        'dynamic_batching { max_queue_delay_microseconds: 500 }\n'
        'parameters { key: "devices" value: { string_value: "onnxruntime:cpu0, opencl:cpu0" } }\n')


def _reshape_by_three(repo) -> None:
    """Reshapes any height and width into 3 rows: a shape whose sample count is not a multiple
    of 3 fails on every device, a rule no size minimum expresses."""
    from onnx import TensorProto, helper, numpy_helper

    from accelerators.onnx_models import make_model
    (repo / "thirds" / "1").mkdir(parents=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, "k"])
    target = numpy_helper.from_array(np.array([0, 3, -1], np.int64), "target")
    (repo / "thirds" / "1" / "model.onnx").write_bytes(make_model(helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["r"]),
         helper.make_node("Relu", ["r"], ["y"])], "g", [x], [y], [target]),
        17).SerializeToString())
    (repo / "thirds" / "config.pbtxt").write_text(
        (repo / "conv" / "config.pbtxt").read_text().replace('"conv"', '"thirds"')
        .replace("dims: [ 2, -1, -1 ]", "dims: [ 3, -1 ]"))


@pytest.mark.parametrize("workers", ["1", "2"])  # 2: front-ends check what the owner found
def test_inputs_too_small_for_the_model_are_invalid_naming_the_minimum(tmp_path, workers) -> None:
    from tests.support.daemon import Daemon
    repo = tmp_path / "models"
    _unpadded_conv(repo)
    _reshape_by_three(repo)
    daemon = Daemon(tmp_path, repo, "--workers", workers)

    def infer(height: int, width: int, model: str = "conv") -> np.ndarray:
        tensor = grpcclient.InferInput("x", [1, 1, height, width], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 1, height, width), np.float32))
        with grpcclient.InferenceServerClient(daemon.url) as client:
            return client.infer(model, [tensor]).as_numpy("y")

    def refusal(height: int, width: int, model: str = "conv") -> tuple[str, str]:
        with pytest.raises(InferenceServerException) as e:
            infer(height, width, model)
        return e.value.status(), e.value.message()
    try:
        assert infer(3, 3).shape == (1, 2, 1, 1)  # the minimum itself runs
        short, narrow = refusal(2, 5), refusal(5, 2)
        assert infer(6, 4).shape == (1, 2, 4, 2)
        assert infer(3, 3, "thirds").shape == (1, 3, 3)
        # No minimum finds this one out: the devices refuse it, and still run what they ran.
        status, message = refusal(2, 2, "thirds")
        metrics = scrape(daemon.metrics_url)
    finally:
        assert daemon.stop() == 0
    assert short == ("StatusCode.INVALID_ARGUMENT", "input 'x': shape [1, 1, 2, 5] received, "
                     "dim 2 is 2; the model's kernels and strides need at least 3")
    assert narrow == ("StatusCode.INVALID_ARGUMENT", "input 'x': shape [1, 1, 5, 2] received, "
                      "dim 3 is 2; the model's kernels and strides need at least 3")
    assert status == "StatusCode.INVALID_ARGUMENT"
    assert "inputs {'x': [1, 1, 2, 2]}: model 'thirds' cannot run them" in message
    assert total(metrics, "hetserve_failovers_total") == 0
    assert total(metrics, "hetserve_device_healthy", model="conv") == 2
    # onnxruntime:cpu0 alone: the OpenCL engine cannot plan it at its probe size, 64 x 64
    assert total(metrics, "hetserve_device_healthy", model="thirds") == 1
