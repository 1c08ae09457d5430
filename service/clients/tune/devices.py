"""The candidate devices: those asked for, or every engine and device of this node that can load
the model (the check `hetserve devices --models` and the daemon's loading make)."""

from __future__ import annotations

from pathlib import Path

from accelerators.devices import inventory
from accelerators.engine_factory import DeviceSpec, can_run, device_specs


def candidates(model_path: Path, requested: list[str] | None) -> list[DeviceSpec]:
    """ValueError names a device that is unknown or cannot run the model, or says that none
    of this node's can."""
    if requested:
        specs = [DeviceSpec.parse(text) for text in requested]
        for spec in specs:
            if (answer := can_run(spec, model_path)) != "yes":
                raise ValueError(f"device {spec} cannot run the model: "
                                 f"{answer.removeprefix('no: ')}")
        return specs
    answers = {spec: can_run(spec, model_path) for spec in device_specs(inventory())}
    found = [spec for spec, answer in answers.items() if answer == "yes"]
    if not found:
        raise ValueError("no device of this node can run the model: " + "; ".join(
            f"{spec}: {answer.removeprefix('no: ')}" for spec, answer in answers.items()))
    return found
