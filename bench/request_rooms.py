"""The rooms one request visits inside the daemon: the order of the project's packages (and
modules) the interpreter runs in while the daemon answers one REST and one gRPC inference,
in one process (--workers 1), with consecutive steps in the same room counted once. A *return*
is an entry into a room the request had already left. docs/architecture.md records the counts.

Rooms are service's folders (service.grpc, service.core, ...) and the engines (accelerators); the
shared modules beside the rooms (errors, contract, settings) are not counted as rooms.

The daemon runs in this process's main thread, profiled (sys.setprofile: the event loop's steps;
a batch computed on a device's thread is not followed). A client thread sends warm-up requests,
then records a few; the path with the fewest steps is reported (another task of the event loop,
a metrics scrape, can interleave with one of them).

    .venv/bin/python -m bench.request_rooms [--repeat 5] [--merge service.edge=service.grpc ...]

--merge counts one room as another as well (a room split off since, in its old home), so that
paths recorded before and after a split compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.serving import model_repository
from service.local_daemon import free_port, is_ready
from service.ops.server import serve
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
MODEL = "mnist_cnn"
_PACKAGES = ("service", "accelerators")


class _Tracer:
    """The project modules the main thread runs in, in order, while `on` is set."""

    def __init__(self) -> None:
        self.on = False
        self.steps: list[str] = []
        self._modules: dict[str, str | None] = {}

    def _module(self, frame: FrameType | None) -> str | None:
        if frame is None:
            return None
        path = frame.f_code.co_filename
        if path not in self._modules:
            relative = Path(path).resolve()
            self._modules[path] = ".".join(relative.relative_to(ROOT).with_suffix("").parts) \
                if relative.is_relative_to(ROOT) and relative.relative_to(ROOT).parts[0] in \
                _PACKAGES else None
        return self._modules[path]

    def __call__(self, frame: FrameType, event: str, _arg: object) -> None:
        if not self.on or event not in ("call", "return"):
            return
        # On a return, execution goes on in the caller's frame.
        module = self._module(frame if event == "call" else frame.f_back)
        if module is not None and (not self.steps or self.steps[-1] != module):
            self.steps.append(module)


def _room(module: str) -> str | None:
    """service's rooms (service.grpc, service.core, ...) and the engines (accelerators); None
    for the shared modules beside the rooms (errors, contract, settings), which are rules, not
    stops on the way."""
    parts = module.split(".")
    if parts[0] == "accelerators":
        return "accelerators"
    return ".".join(parts[:2]) if len(parts) > 2 else None


def _collapsed(steps: list[str], room: Callable[[str], str | None]) -> list[str]:
    """`steps` as the rooms `room` names, each run of one room once."""
    rooms: list[str] = []
    for step in steps:
        named = room(step)
        if named is not None and (not rooms or rooms[-1] != named):
            rooms.append(named)
    return rooms


def _returns(rooms: list[str]) -> int:
    return sum(1 for i, room in enumerate(rooms) if room in rooms[:i])


def _client(tracer: _Tracer, settings: Settings, repeat: int,
            paths: dict[str, list[list[str]]]) -> None:
    image = np.zeros((1, 1, 28, 28), np.float32)
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{settings.grpc_port}")
    http_client = httpclient.InferenceServerClient(f"127.0.0.1:{settings.http_port}")

    def grpc_infer() -> None:
        tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        grpc_client.infer(MODEL, [tensor])

    def http_infer() -> None:
        tensor = httpclient.InferInput("image", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image, binary_data=False)
        http_client.infer(MODEL, [tensor])

    calls: dict[str, Callable[[], None]] = {"REST": http_infer, "gRPC": grpc_infer}
    try:
        for name, call in calls.items():
            for _ in range(3):  # warm: first-call imports and caches are not the path
                call()
            for _ in range(repeat):
                tracer.steps.clear()
                tracer.on = True
                call()
                tracer.on = False
                paths[name].append(list(tracer.steps))
                time.sleep(0.01)
    finally:
        grpc_client.close()
        http_client.close()
        os.kill(os.getpid(), signal.SIGINT)  # the daemon drains and returns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="requests recorded per transport")
    parser.add_argument("--merge", action="append", default=[], metavar="ROOM=INTO",
                        help="also count ROOM as INTO (e.g. service.edge=service.grpc)")
    args = parser.parse_args(argv)
    merged = dict(pair.split("=", 1) for pair in args.merge)
    with tempfile.TemporaryDirectory() as tmp:
        models = model_repository(Path(tmp) / "models", devices="onnxruntime:cpu0")
        settings = Settings(model_repository=models, unix_socket=None, grpc_port=free_port(),
                            http_port=free_port(), metrics_port=0, workers=1)
        tracer = _Tracer()
        paths: dict[str, list[list[str]]] = {"REST": [], "gRPC": []}

        def when_ready() -> None:
            while not is_ready(f"127.0.0.1:{settings.grpc_port}"):
                time.sleep(0.1)
            _client(tracer, settings, args.repeat, paths)

        threading.Thread(target=when_ready, daemon=True).start()
        sys.setprofile(tracer)
        try:
            asyncio.run(serve(settings))
        finally:
            sys.setprofile(None)
    for name, recorded in paths.items():
        steps = min(recorded, key=len)
        rooms, modules = _collapsed(steps, _room), _collapsed(steps, lambda m: m)
        print(f"{name}: {len(rooms)} rooms visited ({len(set(rooms))} distinct, "
              f"{_returns(rooms)} returns): {' -> '.join(rooms)}")
        if merged:
            old = _collapsed(rooms, lambda r: merged.get(r, r))
            print(f"  merged ({', '.join(args.merge)}): {len(old)} rooms visited "
                  f"({len(set(old))} distinct, {_returns(old)} returns)")
        print(f"  {len(modules)} module steps ({len(set(modules))} distinct modules, "
              f"{_returns(modules)} returns)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
