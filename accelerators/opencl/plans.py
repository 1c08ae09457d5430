"""The launch plans an OpenCL engine keeps: one per batch size for each request shape. A model
whose served dims are all fixed has one shape. A model with variable dims (-1 in config.pbtxt)
keeps the plans of its most recently used shapes, a bounded number, and frees the device buffers
of the least recently used shape when a new one comes. Constants are uploaded once and shared by
every plan, except where a shape's plan has a constant of the same name and other contents (a
Resize's tables, a folded Shape): that one is the shape's own, freed with it."""

from __future__ import annotations

from collections import ChainMap, OrderedDict
from collections.abc import Callable, Mapping

import numpy as np
import pyopencl as cl

from accelerators.opencl.executor import Executor
from accelerators.opencl.launch import Samples

DEFAULT_SHAPES = 8  # request shapes whose plans a model with variable dims keeps
# Told of plans as they come and go: ("built" | "evicted", how many).
PlanEvents = Callable[[str, int], None]


class ShapePlans:
    """The plans of one request shape, by batch size, and the constants of its own."""

    def __init__(self, samples: Samples | None) -> None:
        self.samples = samples  # None: the graph's own shapes (all dims fixed)
        self.by_batch: dict[int, Executor] = {}
        self.own: dict[str, cl.Buffer] = {}

    def release(self) -> int:
        """Frees the device buffers now, not whenever the garbage collector runs; the plans
        released."""
        for plan in self.by_batch.values():
            plan.release()
        for buffer in self.own.values():
            buffer.release()
        count = len(self.by_batch)
        self.by_batch.clear()
        self.own.clear()
        return count


class ShapeCache:
    """The plans of the `max_shapes` most recently used request shapes."""

    def __init__(self, names: list[str], max_shapes: int, report: PlanEvents) -> None:
        if max_shapes < 1:
            raise ValueError(f"max_shapes {max_shapes}: expected 1 or more request shapes")
        self._names, self.max_shapes, self._report = names, max_shapes, report
        self._shapes: OrderedDict[tuple, ShapePlans] = OrderedDict()

    def __len__(self) -> int:
        return len(self._shapes)

    def get(self, inputs: Mapping[str, np.ndarray]) -> ShapePlans:
        """The plans of the inputs' shape (after the batch axis), the least recently used
        shape's evicted to make room for a new one."""
        key = tuple(inputs[name].shape[1:] for name in self._names)
        shape = self._shapes.get(key)
        if shape is not None:
            self._shapes.move_to_end(key)
            return shape
        if len(self._shapes) >= self.max_shapes:
            released = self._shapes.popitem(last=False)[1].release()
            self._report("evicted", released)
        shape = self._shapes[key] = ShapePlans(dict(zip(self._names, key)))
        return shape


class SharedConsts:
    """Device copies of the constants of an engine's plans."""

    def __init__(self, context: cl.Context, per_shape: bool) -> None:
        """`per_shape`: plans of several request shapes, whose constants of one name may differ;
        the host array first uploaded is kept to tell (the same object as the graph's for
        float32 weights: no second copy)."""
        self._context = context
        self._buffers: dict[str, cl.Buffer] = {}
        self._arrays: dict[str, np.ndarray] | None = {} if per_shape else None

    def for_plan(self, consts: dict[str, np.ndarray], shape: ShapePlans
                 ) -> Mapping[str, cl.Buffer]:
        """The buffers of a plan's constants, uploading those not on the device yet."""
        for key, value in consts.items():
            if key not in self._buffers:
                self._buffers[key] = self._upload(value)
                if self._arrays is not None:
                    self._arrays[key] = value
            elif self._arrays is not None and key not in shape.own \
                    and not _same(self._arrays[key], value):
                shape.own[key] = self._upload(value)
        return ChainMap(shape.own, self._buffers) if shape.own else self._buffers

    def _upload(self, value: np.ndarray) -> cl.Buffer:
        return cl.Buffer(self._context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                         hostbuf=value)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
