"""What one request cost, as the parameters of its reply say (service.contract): the device that
ran it, the joules attributed to it and where the power figure came from, and its FLOPs."""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import service_pb2

from service import contract


@dataclass(frozen=True)
class Cost:
    """None where the reply does not say (another KServe server, a daemon sending no energy)."""

    rows: int
    device: str | None = None
    source: str | None = None  # nvml, rapl, hwmon, xrt, opae, or `model`: an estimate
    joules: float | None = None
    flops: int | None = None

    @classmethod
    def of(cls, reply: service_pb2.ModelInferResponse, rows: int) -> Cost:
        said = reply.parameters
        metered = contract.ENERGY_PARAMETER in said
        return cls(
            rows,
            said[contract.DEVICE_PARAMETER].string_param
            if contract.DEVICE_PARAMETER in said else None,
            said[contract.POWER_SOURCE_PARAMETER].string_param if metered else None,
            said[contract.ENERGY_PARAMETER].double_param if metered else None,
            said[contract.FLOPS_PARAMETER].int64_param
            if contract.FLOPS_PARAMETER in said else None)
