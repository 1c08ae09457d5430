"""A launch plan for one batch size on one device: buffers allocated by the planner, kernels
with their arguments bound once, and a run that enqueues the input copies, every kernel and the
output copies on the in-order queue, waiting only for the outputs (no host round trip between
layers). On an FPGA the pipeline's stages run on queues of their own, and the nodes it does not
cover are computed on the host in between (the one round trip they need). Kernel events are
kept so runs can be profiled per launch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from accelerators.opencl.device import OpenCLDevice
from accelerators.opencl.fpga import host
from accelerators.opencl.launch import HOST, Dyn, Launch, Lowered, Ref
from accelerators.opencl.planner import plan_buffers


@dataclass(frozen=True)
class LaunchTime:
    kernel: str
    node: str
    seconds: float
    flops: int


class Executor:
    def __init__(self, dev: OpenCLDevice, program: cl.Program, lowered: Lowered,
                 consts: Mapping[str, cl.Buffer], concurrent_stages: bool = False) -> None:
        """`concurrent_stages`: the stages of a pipelined chain are joined by channels or pipes
        and must run at the same time; otherwise each waits for the one before."""
        self._queue = dev.queue
        self._concurrent = concurrent_stages
        self._stage_queues = {
            la.stage: cl.CommandQueue(dev.context, dev.device,
                                      properties=cl.command_queue_properties.PROFILING_ENABLE)
            for la in lowered.launches if la.stage}
        self.buffers, self.sum_bytes = plan_buffers(lowered)
        # Kept here: a kernel's arguments do not keep their buffers alive.
        self._slots = slots = [cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, max(size, 4))
                               for size in self.buffers.slot_bytes]

        def buffer(ref: Ref) -> cl.Buffer:
            slot = self.buffers.slot_of.get(ref.name)
            return slots[slot] if slot is not None else consts[ref.name]

        self._dtype = lowered.dtype  # of the input and output buffers
        self._inputs = {name: buffer(Ref(d.storage)) for name, d in lowered.inputs.items()}
        self._outputs = {name: (buffer(Ref(d.storage)), d.shape)
                         for name, d in lowered.outputs.items()}
        self.launches = lowered.launches
        self._buffer = buffer
        self._kernels: list[tuple[cl.Kernel | None, Launch]] = []
        for launch in lowered.launches:
            if launch.kernel == HOST:
                self._kernels.append((None, launch))
                continue
            kernel = cl.Kernel(program, launch.kernel)
            kernel.set_args(*[buffer(a) if isinstance(a, Ref) else a for a in launch.args])
            self._kernels.append((kernel, launch))
        self._events: list[cl.Event] = []
        self._timed: list[Launch] = []  # the launches of _events

    def release(self) -> None:
        """Frees the plan's buffers (an evicted shape's); it must not run again."""
        self._kernels.clear()
        for slot in self._slots:
            slot.release()

    def output_shape(self, name: str) -> tuple[int, ...]:
        return self._outputs[name][1]

    @property
    def peak_bytes(self) -> int:
        return self.buffers.peak_bytes

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        results: dict[str, np.ndarray] = {name: np.empty(self._outputs[name][1], self._dtype)
                                          for name in outputs}
        held = self.enqueue(inputs, results)
        self._queue.finish()
        del held
        return as_float32(results)

    def enqueue(self, inputs: dict[str, np.ndarray],
                results: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Enqueues one run, reading outputs into `results` (contiguous arrays of the buffers'
        type: float32, or float16 for fp16 models, whose inputs are converted here); they are
        filled once the queue finishes. Returns the host arrays that must live until then."""
        q = self._queue
        held = []
        for name, buf in self._inputs.items():
            array: np.ndarray = np.ascontiguousarray(inputs[name], self._dtype)
            held.append(array)
            cl.enqueue_copy(q, buf, array, is_blocking=False)
        self._events, self._timed = [], []
        chain: list[cl.Event] = []  # the pipelined stages enqueued since the last main launch
        for k, launch in self._kernels:
            if k is None:
                self._on_host(launch)
                chain = []
                continue
            if not launch.stage:
                # The main queue goes on once a chain before has drained.
                self._events.append(cl.enqueue_nd_range_kernel(
                    q, k, launch.global_size, launch.local_size, wait_for=chain or None))
                self._timed.append(launch)
                chain = []
                continue
            if launch.stage == 1:  # the stages start after the work (and any chain) before them
                chain = [cl.enqueue_marker(q, wait_for=chain or None)]
            stage_queue = self._stage_queues[launch.stage]
            event = cl.enqueue_nd_range_kernel(
                stage_queue, k, launch.global_size, launch.local_size,
                wait_for=chain[:1] if self._concurrent else chain[-1:])
            stage_queue.flush()
            chain.append(event)
            self._events.append(event)
            self._timed.append(launch)
        # A read that waits on the other queues' events holds the GIL in pyopencl while the FPGA
        # emulator runs those stages (a Python thread beside it ran at 2% of its speed, starving
        # the daemon's event loop and other devices' instance threads): wait for them here, with
        # the GIL released, since the run waits for its outputs anyway.
        if chain:
            q.flush()  # the chain's first stage waits on a marker in this queue
            cl.wait_for_events(chain)
        for name, array in results.items():
            cl.enqueue_copy(q, array, self._outputs[name][0], is_blocking=False)
        return held

    def _on_host(self, launch: Launch) -> None:
        """Waits for the device, reads the step's inputs, computes it and writes its outputs."""
        step = launch.host
        assert step is not None  # HOST launches carry their step
        self._queue.finish()
        for queue in self._stage_queues.values():
            queue.finish()
        values = []
        for value in step.inputs:
            if isinstance(value, Dyn):
                array: np.ndarray = np.empty(value.shape, self._dtype)
                cl.enqueue_copy(self._queue, array, self._buffer(Ref(value.storage)))
                value = array.astype(np.float32)
            values.append(value)
        for out, result in zip(step.outputs, host.run(step.node, values, step.opset)):
            cl.enqueue_copy(self._queue, self._buffer(Ref(out.storage)),
                            np.ascontiguousarray(result.reshape(out.shape), self._dtype))

    def profile(self) -> list[LaunchTime]:
        """Device time of each launch of the last run, from its profiling event."""
        return [LaunchTime(launch.kernel, launch.node,
                           (e.profile.end - e.profile.start) * 1e-9, launch.flops)
                for e, launch in zip(self._events, self._timed)]


def as_float32(results: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs as the engine returns them: FP32 on the wire, whatever the buffers held."""
    return {name: r.astype(np.float32, copy=False) for name, r in results.items()}
