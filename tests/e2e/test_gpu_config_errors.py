"""Bad GPU settings in config.pbtxt fail only their own model, with a message naming the field
and the accepted values; the other models keep serving (a real daemon and client)."""

from __future__ import annotations

import shutil

import tritonclient.grpc as grpcclient

from accelerators.devices import gpu_count
from accelerators.onnxruntime_engine import providers
from tests.support.daemon import MODEL, MODELS, Daemon, image_input

BAD = {
    "bad_option": ('parameters { key: "cudnn_conv_algo_serch" value: { string_value: "1" } }',
                   ["parameters.cudnn_conv_algo_serch", "accepted: ['cudnn_conv_algo_search'"]),
    "bad_value": ('parameters { key: "arena_extend_strategy" value: { string_value: "7" } }',
                  ["parameters.arena_extend_strategy: '7' is unknown",
                   "'kNextPowerOfTwo', 'kSameAsRequested'"]),
    "bad_gpu": (f"instance_group [ {{ kind: KIND_GPU gpus: [ {gpu_count() + 3} ] }} ]",
                [f"instance_group[0].gpus: GPU {gpu_count() + 3} is not on this node",
                 f"accepted GPU indexes: {list(range(gpu_count()))}"]),
    "bad_warmup": ('model_warmup [ { name: "w" batch_size: 1 inputs { key: "image" value: { '
                   'data_type: TYPE_FP32 dims: [ 28, 28 ] zero_data: true } } } ]',
                   ["model_warmup[0] ('w'): inputs['image'].dims [28, 28]",
                    "expected [1, 28, 28]"]),
}
TENSORRT = ('optimization { execution_accelerators { gpu_execution_accelerator: [ '
            '{ name: "tensorrt" } ] } }')


def test_bad_gpu_settings_fail_only_their_model(tmp_path, holdout) -> None:
    models = tmp_path / "models"
    shutil.copytree(MODELS / MODEL, models / MODEL)
    cases = dict(BAD)
    if "TensorrtExecutionProvider" not in providers():
        cases["no_tensorrt"] = (TENSORRT, ["TensorrtExecutionProvider is missing"])
    config = (MODELS / MODEL / "config.pbtxt").read_text()
    for name, (extra, _) in cases.items():
        shutil.copytree(MODELS / MODEL / "1", models / name / "1")
        shutil.copy(MODELS / MODEL / "labels.txt", models / name)
        (models / name / "config.pbtxt").write_text(
            config.replace(f'name: "{MODEL}"', f'name: "{name}"').replace(
                "instance_group [ { kind: KIND_CPU count: 2 } ]\n", "") + extra + "\n")
    daemon = Daemon(tmp_path, models)
    try:
        with grpcclient.InferenceServerClient(daemon.url) as client:
            images = holdout[0][:2]
            assert client.infer(MODEL, image_input(images)).as_numpy("logits").shape == (2, 10)
            index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)
                     ["models"]}
            for name, (_, messages) in cases.items():
                assert not client.is_model_ready(name)
                for message in messages:
                    assert message in index[name]["reason"], (name, index[name]["reason"])
    finally:
        assert daemon.stop() == 0
