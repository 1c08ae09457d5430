"""What a served model accepts and returns (the inputs/outputs part of its settings,
service/core/model_settings.py), and the checks every request passes before queueing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2

from service import contract
from service.errors import ConfigError, InvalidInputError


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
        for t in config.input:  # requests of any other datatype are refused (service.protocol)
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
