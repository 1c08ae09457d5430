"""What a served model accepts and returns, and the checks every request passes before queueing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2

from service import contract
from service.errors import ConfigError, InvalidInputError

_Group = model_config_pb2.ModelInstanceGroup
_GROUP_KINDS = {"cpu": _Group.KIND_CPU, "gpu": _Group.KIND_GPU}


class Shaped(Protocol):
    """What validation reads of an input: an array, or a tensor still in shared memory."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # protocol name, e.g. "FP32"
    dims: tuple[int, ...]  # per sample (no batch axis); -1 is any size

    def matches(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == len(self.dims) and all(
            d == -1 or d == s for d, s in zip(self.dims, shape))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    version: int
    max_batch_size: int  # 0: the model has no batch axis and requests are never merged
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    config: model_config_pb2.ModelConfig
    # An output's class labels, from its label_filename: what `classification` replies name.
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    # input -> {axis of the request's shape: the least size the model's kernels and strides
    # allow} (accelerators/input_minimums.py), for variable dims whose least size is above 1.
    minimums: dict[str, dict[int, int]] = field(default_factory=dict, compare=False)

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelConfig, version: int,
                    labels: dict[str, tuple[str, ...]] | None = None,
                    minimums: dict[str, dict[int, int]] | None = None) -> ModelSpec:
        def specs(items) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(t.name, contract.wire_from_config(t.data_type), tuple(t.dims))
                         for t in items)
        if not config.input or not config.output:
            raise ConfigError(f"model {config.name!r}: config.pbtxt must list input and output")
        for t in config.input:  # requests of any other datatype are refused (service/grpc/codec)
            if contract.numpy_dtype(contract.wire_from_config(t.data_type)) is None:
                raise ConfigError(f"model {config.name!r}: input {t.name!r} is "
                                  f"{model_config_pb2.DataType.Name(t.data_type)}; expected one "
                                  f"of {contract.wire_names()}")
        return cls(config.name, version, config.max_batch_size,
                   specs(config.input), specs(config.output), config, labels or {},
                   minimums or {})

    def served_dims(self) -> dict[str, tuple[int, ...]]:
        """Each input's dims after its batch axis as served (-1: any size): with a batch axis
        the config's dims, without one the config's dims after the first."""
        return {t.name: t.dims if self.max_batch_size > 0 else t.dims[1:] for t in self.inputs}

    def instances(self, kind: str) -> int:
        """Engine instances per device of `kind` ("cpu", "gpu", "fpga"; "" while unknown): the
        count of the first instance_group of that kind (KIND_AUTO: any kind), else 1."""
        wanted = _GROUP_KINDS.get(kind)
        for group in self.config.instance_group:
            if group.count < 0:
                raise ConfigError(f"model {self.name!r}: instance_group count {group.count} "
                                  "is negative; expected 1 or more engine instances")
            if group.kind in (_Group.KIND_AUTO, wanted):
                return max(1, group.count)  # Triton reads an unset count as 1
        return 1

    def gpus(self, node_gpus: int) -> list[int]:
        """The GPUs the model's instances run on, as Triton reads instance_group: the `gpus` of
        its KIND_GPU (or KIND_AUTO) groups, every GPU of the node where no group lists any."""
        listed = []
        for i, group in enumerate(self.config.instance_group):
            for gpu in group.gpus:
                if not 0 <= gpu < node_gpus:
                    raise ConfigError(
                        f"model {self.name!r}: instance_group[{i}].gpus: GPU {gpu} is not on "
                        f"this node; accepted GPU indexes: {list(range(node_gpus))}")
                if group.kind in (_Group.KIND_GPU, _Group.KIND_AUTO) and gpu not in listed:
                    listed.append(gpu)
        return listed or list(range(node_gpus))

    def shape_with_batch(self, spec: TensorSpec) -> list[int]:
        """The shape clients see in metadata: -1 leads when the model batches."""
        return ([-1] if self.max_batch_size > 0 else []) + list(spec.dims)

    def validate(self, inputs: Mapping[str, Shaped]) -> int:
        """Checks names, datatypes and shapes (its bytes may not have been read yet); returns
        the request's batch size."""
        expected = [s.name for s in self.inputs]
        for name in inputs:
            if name not in expected:
                raise InvalidInputError(f"inputs: unknown input {name!r} for model "
                                        f"{self.name!r}; expected {expected}")
        batch_sizes = set()
        for spec in self.inputs:
            if spec.name not in inputs:
                raise InvalidInputError(f"inputs: input {spec.name!r} is missing; model "
                                        f"{self.name!r} expects {expected}")
            array = inputs[spec.name]
            received = contract.wire_dtype(array.dtype)
            if received != spec.datatype:
                raise InvalidInputError(f"input {spec.name!r}: datatype {received} received, "
                                        f"{spec.datatype} expected")
            shape = array.shape
            if self.max_batch_size > 0:
                if not spec.matches(shape[1:]) or len(shape) == 0:
                    raise InvalidInputError(
                        f"input {spec.name!r}: shape {list(shape)} received, "
                        f"{self.shape_with_batch(spec)} expected")
                batch_sizes.add(shape[0])
            elif not spec.matches(shape):
                raise InvalidInputError(f"input {spec.name!r}: shape {list(shape)} received, "
                                        f"{list(spec.dims)} expected")
            for axis, least in self.minimums.get(spec.name, {}).items():
                if shape[axis] < least:
                    raise InvalidInputError(
                        f"input {spec.name!r}: shape {list(shape)} received, dim {axis} is "
                        f"{shape[axis]}; the model's kernels and strides need at least {least}")
        if self.max_batch_size == 0:
            return 1
        if len(batch_sizes) > 1:
            raise InvalidInputError(f"inputs: batch sizes {sorted(batch_sizes)} differ between "
                                    "inputs; every input must have the same first dimension")
        batch = batch_sizes.pop()
        if not 1 <= batch <= self.max_batch_size:
            raise InvalidInputError(f"inputs: batch size {batch} received, expected 1 to "
                                    f"max_batch_size {self.max_batch_size} of model {self.name!r}")
        return batch

    def check_outputs(self, names: list[str]) -> list[str]:
        """The requested outputs, all of them when none is named."""
        known = [s.name for s in self.outputs]
        for name in names:
            if name not in known:
                raise InvalidInputError(f"outputs: unknown output {name!r} for model "
                                        f"{self.name!r}; expected one of {known}")
        return names or known
