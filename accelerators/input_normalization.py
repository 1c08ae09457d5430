"""uint8 image inputs, normalised where the model runs: a quarter of fp32's bytes cross the
network, the shared memory and the host-to-device copy, and the device computes
x = (u8 / scale - mean) / std before the model's first layer. A model's config declares the
input as TYPE_UINT8 and names it in one parameter (inputs separated by ';'):

    parameters { key: "uint8_inputs" value: { string_value:
        "image scale=255 mean=0.485,0.456,0.406 std=0.229,0.224,0.225" } }

scale defaults to 255, mean to 0 and std to 1 (pixels in [0, 1]); mean and std take one value,
or one per channel (the first dim after the batch axis). ONNX Runtime runs the normalisation as
the first nodes of the graph, on the model's device (CUDA on a GPU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

_FIELDS = ("scale", "mean", "std")


@dataclass(frozen=True)
class Normalization:
    scale: float = 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)


def parse(text: str) -> dict[str, Normalization]:
    """The inputs named in `uint8_inputs`; ValueError names the part and the expectation."""
    out: dict[str, Normalization] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, *settings = part.split()
        values: dict[str, tuple[float, ...]] = {}
        for setting in settings:
            key, _, numbers = setting.partition("=")
            try:
                if key not in _FIELDS or key in values:
                    raise ValueError
                values[key] = tuple(float(v) for v in numbers.split(","))
            except ValueError:
                raise ValueError(f"parameters.uint8_inputs: {setting!r} in {part!r}; expected "
                                 "scale=N, mean=N[,N...] or std=N[,N...], each once") from None
        scale = values.get("scale", (255.0,))
        if len(scale) != 1 or scale[0] <= 0 or 0.0 in values.get("std", ()):
            raise ValueError(f"parameters.uint8_inputs: {part!r}: scale is one positive number "
                             "and std has no zero")
        out[name] = Normalization(scale[0], values.get("mean", (0.0,)), values.get("std", (1.0,)))
    return out


def normalized(model: onnx.ModelProto, inputs: dict[str, Normalization]) -> onnx.ModelProto:
    """A copy of `model` that takes each named input as uint8, normalised by its first nodes
    into the float tensor its layers read."""
    import onnx  # only where a model asks for it: the daemon's start imports this module
    from onnx import TensorProto, helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    by_name = {i.name: i for i in graph.input}
    first: list[onnx.NodeProto] = []
    for name, norm in inputs.items():
        graph_input = by_name.get(name)
        if graph_input is None or graph_input.type.tensor_type.elem_type != TensorProto.FLOAT:
            raise ValueError(f"parameters.uint8_inputs: {name!r} is not a float input of the "
                             f"graph, whose inputs are {sorted(by_name)}")
        dims = graph_input.type.tensor_type.shape.dim
        channels = max(len(norm.mean), len(norm.std))
        if channels > 1 and (len(dims) < 2 or dims[1].dim_value not in (0, channels)):
            raise ValueError(f"parameters.uint8_inputs: {name!r} has {channels} channel values, "
                             "and its dim after the batch axis is another number of channels")
        # Per channel: the values broadcast along the first dim after the batch axis.
        shape = [channels] + [1] * (len(dims) - 2) if channels > 1 else []
        p = f"{name}__uint8"
        for field, values in (("mean", norm.mean), ("std", norm.std)):
            full = np.broadcast_to(np.array(values, np.float32), (channels,)).reshape(shape)
            graph.initializer.append(numpy_helper.from_array(full, f"{p}_{field}"))
        graph.initializer.append(numpy_helper.from_array(np.array(norm.scale, np.float32),
                                                         f"{p}_scale"))
        for node in graph.node:  # the model's layers read the normalised tensor
            node.input[:] = [f"{p}_float" if i == name else i for i in node.input]
        first += [helper.make_node("Cast", [name], [f"{p}_cast"], to=TensorProto.FLOAT),
                  helper.make_node("Div", [f"{p}_cast", f"{p}_scale"], [f"{p}_unit"]),
                  helper.make_node("Sub", [f"{p}_unit", f"{p}_mean"], [f"{p}_centred"]),
                  helper.make_node("Div", [f"{p}_centred", f"{p}_std"], [f"{p}_float"])]
        graph_input.type.tensor_type.elem_type = TensorProto.UINT8
    nodes = first + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return out
