"""One ONNX node evaluated on known inputs by ONNX's reference evaluator, at a given opset: the
node goes into a one-node model that imports that opset, since the evaluator runs a bare node at
the newest version (Unsqueeze's axes are an attribute before opset 13 and an input from it).
Shared by the OpenCL engine's folding and the FLOP counter's shape code."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator


def run_node(node: onnx.NodeProto, inputs: list[np.ndarray | None], opset: int
             ) -> list[np.ndarray]:
    """The outputs of `node` on `inputs` (None: an omitted optional input); the reference
    evaluator's own errors propagate."""
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    outputs = [f"out{i}" for i in range(len(node.output))]
    proto = helper.make_node(node.op_type, names, outputs, domain=node.domain or None)
    proto.attribute.extend(node.attribute)
    untyped = [helper.make_value_info(name, onnx.TypeProto()) for name in names if name]
    graph = helper.make_graph([proto], "node", untyped,
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    results = ReferenceEvaluator(model).run(
        None, {name: v for name, v in zip(names, inputs) if name})
    return [np.asarray(v) for v in results]
