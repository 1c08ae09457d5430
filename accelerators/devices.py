"""Discovers OpenCL devices and ONNX Runtime providers, and classifies them fpga / gpu / cpu."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from accelerators import icd
from accelerators.engine import device_name
from accelerators.opencl.fpga.board import BoardError, for_device

if TYPE_CHECKING:
    import pyopencl as cl

log = logging.getLogger(__name__)

# FPGA vendors' OpenCL platforms (Intel FPGA SDK and its emulator, AMD/Xilinx XRT).
_FPGA_PLATFORM_MARKERS = ("fpga", "xilinx", "intel(r) fpga", "altera")


@dataclass(frozen=True)
class OpenCLDevice:
    platform: str
    name: str
    kind: str  # "fpga" | "gpu" | "cpu" | "other"
    type_bits: int
    driver_version: str
    compute_units: int
    global_mem_bytes: int
    emulated: bool = False  # an FPGA emulator: runs the kernels, never a board's speed or watts


def is_emulator(platform_name: str) -> bool:
    """Intel's FPGA Emulation Platform (and its older "Emulator" names)."""
    return "emulat" in platform_name.lower()


def classify(platform_name: str, device_name: str, type_bits: int) -> str:
    """FPGA boards report ACCELERATOR on an FPGA platform; simulators such as Oclgrind set every
    type bit at once, so a device claiming several kinds is classified by its names."""
    import pyopencl as cl

    names = f"{platform_name} {device_name}".lower()
    if any(m in names for m in _FPGA_PLATFORM_MARKERS):
        return "fpga"
    kinds = [kind for kind, bit in (("fpga", cl.device_type.ACCELERATOR),
                                    ("gpu", cl.device_type.GPU),
                                    ("cpu", cl.device_type.CPU)) if type_bits & bit]
    if len(kinds) == 1:
        return kinds[0]
    for kind in ("gpu", "cpu"):
        if kind in names:
            return kind
    return "other"


def opencl_handles() -> list[tuple[cl.Device, OpenCLDevice]]:
    """Every device of every platform with its pyopencl handle; no ICD loader or no platform
    means none. The runtimes pip installed here (accelerators.icd) come after the system's, so
    that adding them renumbers no device."""
    icd.register()
    try:
        import pyopencl as cl
        platforms = sorted(cl.get_platforms(),
                           key=lambda p: p.name.strip() in icd.BUNDLED.values())
    except Exception as e:  # pyopencl raises LogicError/RuntimeError for "no platforms"
        log.info("no OpenCL platform: %s", e)
        return []
    found = []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error as e:
            log.warning("OpenCL platform %r lists no devices: %s", platform.name, e)
            continue
        for d in devices:
            found.append((d, OpenCLDevice(
                platform=platform.name.strip(), name=d.name.strip(),
                kind=classify(platform.name, d.name, d.type), type_bits=int(d.type),
                driver_version=d.driver_version, compute_units=d.max_compute_units,
                global_mem_bytes=d.global_mem_size, emulated=is_emulator(platform.name))))
    return found


def opencl_devices() -> list[OpenCLDevice]:
    return [record for _, record in opencl_handles()]


def gpu_count() -> int:
    """NVIDIA GPUs that CUDA programs here may use: CUDA_VISIBLE_DEVICES's entries where it is
    set (CUDA renumbers them from 0), else the GPUs NVML finds; 0 without a driver."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception as e:  # no nvidia-ml-py, no driver: no NVIDIA GPU to use
        log.debug("no NVIDIA GPU: %s", e)
        return 0


def gpu_memory_used() -> dict[str, int]:
    """Bytes in use on each NVIDIA GPU (`gpu0`: ...), all processes together, from NVML; empty
    without a driver. The growth across one model's load is that model's GPU memory, as long as
    nothing else on the node allocates meanwhile."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return {f"gpu{i}": pynvml.nvmlDeviceGetMemoryInfo(
            pynvml.nvmlDeviceGetHandleByIndex(i)).used for i in range(gpu_count())}
    except Exception as e:  # no nvidia-ml-py, no driver: nothing to report
        log.debug("no GPU memory figures: %s", e)
        return {}


def onnxruntime_providers() -> list[dict[str, str]]:
    from accelerators.onnxruntime_engine import providers

    kinds = {"CUDAExecutionProvider": "gpu", "TensorrtExecutionProvider": "gpu",
             "ROCMExecutionProvider": "gpu", "MIGraphXExecutionProvider": "gpu",
             "CPUExecutionProvider": "cpu"}
    try:
        names = providers()
    except ImportError as e:
        log.warning("%s", e)
        return []
    return [{"provider": p, "kind": kinds.get(p, "other")} for p in names]


def inventory() -> dict[str, Any]:
    """Every device, each with the `id` a model's `devices` parameter names it by
    (`opencl:fpga0`); an FPGA with the board profile its pipeline is sized by (`board`: the
    profile's name and typical watts, an estimate; None where none is chosen)."""
    found: dict[str, Any] = {"opencl": [asdict(d) for d in opencl_devices()],
                             "onnxruntime": onnxruntime_providers()}
    seen: dict[str, int] = {}
    for d in found["opencl"]:
        seen[d["kind"]] = index = seen.get(d["kind"], -1) + 1
        d["id"] = f"opencl:{device_name(d['kind'], index)}"
        if d["kind"] == "fpga":
            d["board"] = _board(d["emulated"], d["name"])
    providers: dict[str, list[str]] = {}  # by kind
    for p in found["onnxruntime"]:
        providers.setdefault(p["kind"], []).append(p["provider"])
    devices = [("gpu", i) for i in range(gpu_count())] if "gpu" in providers else []
    devices += [("cpu", 0)] if "cpu" in providers else []
    found["onnxruntime_devices"] = [
        {"id": f"onnxruntime:{device_name(kind, i)}", "kind": kind, "providers": providers[kind]}
        for kind, i in devices]
    return found


def device_ids(found: dict[str, Any]) -> list[str]:
    """The ids of an inventory's devices, OpenCL's first."""
    return [d["id"] for d in (*found["opencl"], *found["onnxruntime_devices"])]


def _board(emulated: bool, name: str) -> dict[str, Any] | None:
    try:
        board = for_device(None, emulated, name)
    except BoardError:
        return None
    return {"profile": board.name, "typical_w": board.power_w, "source": "estimate"}


def format_table(found: dict[str, Any]) -> str:
    lines = [f"{'ID':<18} {'KIND':<6} {'DEVICE':<40} PLATFORM / DETAILS"]
    for d in found["opencl"]:
        detail = (f"{d['platform']}; driver {d['driver_version']}; {d['compute_units']} CUs; "
                  f"{d['global_mem_bytes'] / 2**30:.1f} GiB")
        if d["kind"] == "fpga":
            board = d.get("board")
            detail += "; no board profile: set HETSERVE_FPGA_BOARD" if board is None else (
                f"; board profile {board['profile']}" + (
                    f" (typical {board['typical_w']:g} W: an estimate)"
                    if board["typical_w"] else ""))
        kind = f"{d['kind']}*" if d["emulated"] else d["kind"]
        lines.append(f"{d['id']:<18} {kind:<6} {d['name'][:40]:<40} {detail}")
    for d in found["onnxruntime_devices"]:
        lines.append(f"{d['id']:<18} {d['kind']:<6} {', '.join(d['providers']):<40} "
                     "ONNX Runtime")
    if len(lines) == 1:
        lines.append("(no OpenCL device and no ONNX Runtime provider found)")
    others = [p["provider"] for p in found["onnxruntime"] if p["kind"] == "other"]
    if others:
        lines.append(f"ONNX Runtime also lists {', '.join(others)}: no device of this node")
    if any(d["emulated"] for d in found["opencl"]):
        lines.append("* emulated: runs the FPGA kernels on the CPU; its speed and power say "
                     "nothing about a board (`hetserve fpga plan` estimates one)")
    if "models" in found:
        lines += ["", f"{'DEVICE':<20} {'MODEL':<24} CAN RUN"]
        lines += [f"{spec:<20} {model:<24} {answer}" for spec, models in found["models"].items()
                  for model, answer in models.items()]
        lines.append("(whether a device is too slow for a model to take its traffic is learned "
                     "from the batches a daemon serves, each device tried even under light "
                     "load unless prefer_order is strict: hetserve_device_demoted and the "
                     "daemon's log, not known here)")
    return "\n".join(lines)
