"""When models load, reload and unload, as Triton's --model-control-mode says: `none` loads the
repository at start and nothing after; `poll` also scans it every --repository-poll-secs and
loads, reloads or unloads what changed; `explicit` loads the --load-model models at start, then
what RepositoryModelLoad / Unload ask. The registry does the swapping (service/core/registry.py);
who may ask, service/core/control_callers.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from service.core.model_table import NOT_LOADED
from service.core.registry import ModelRegistry
from service.errors import (
    ConfigError,
    InvalidInputError,
    ModelUnavailableError,
    StartupError,
)
from service.settings import Settings

log = logging.getLogger(__name__)
MODES = ("none", "poll", "explicit")


def check_settings(settings: Settings) -> None:
    """Start-up checks (StartupError)."""
    mode, poll_s = settings.model_control_mode, settings.repository_poll_secs
    if mode not in MODES:
        raise StartupError(f"--model-control-mode: {mode!r} received, expected one of "
                           f"{list(MODES)}")
    if not poll_s > 0:
        raise StartupError(f"--repository-poll-secs: {poll_s:g} received, expected seconds "
                           "above 0")
    if settings.load_model.strip() and mode != "explicit":
        raise StartupError("--load-model: only with --model-control-mode explicit (the other "
                           "modes load every model of the repository)")


class ModelControl:
    def __init__(self, registry: ModelRegistry, settings: Settings) -> None:
        self.mode = settings.model_control_mode
        self._registry = registry
        self._poll_s = settings.repository_poll_secs
        self._named = [n.strip() for n in settings.load_model.split(",") if n.strip()]
        self._poller: asyncio.Task | None = None
        self.listeners = registry.listeners  # told at once when what serves changes

    async def start(self) -> None:
        """Loads the models the mode loads at start; in poll mode, starts watching."""
        names = self._registry.repository.names()
        if self.mode != "explicit" or "*" in self._named:
            chosen = names
        else:
            missing = sorted(set(self._named) - set(names))
            if missing:
                raise StartupError(f"--load-model: {missing} not in the model repository, which "
                                   f"holds {names}")
            chosen = self._named
            self._registry.failures.update({n: NOT_LOADED for n in names if n not in chosen})
        seen = self._scan() if self.mode == "poll" else {}  # before loading: later changes show
        await self._registry.load_all(chosen)
        if self.mode == "poll":
            self._poller = asyncio.create_task(self._poll(seen), name="repository-poll")

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)

    async def load(self, name: str, parameters: Sequence[str] = ()) -> None:
        """RepositoryModelLoad: loads or reloads model `name` (the caller checked already);
        `parameters` are the names of those the request carried."""
        self._explicit()
        if parameters:
            raise InvalidInputError(
                f"parameters {sorted(parameters)[:8]}: a configuration or files sent with the "
                "request are not supported; change the model's folder in the repository, then "
                "load it")
        await self._registry.load(name)

    async def unload(self, name: str) -> None:
        self._explicit()
        await self._registry.unload(name)

    def _explicit(self) -> None:
        if self.mode == "poll":  # Triton's words
            raise ModelUnavailableError("explicit model load / unload is not allowed if "
                                        "polling is enabled")
        if self.mode != "explicit":
            raise ModelUnavailableError(
                "explicit model load / unload is not allowed: the daemon serves with "
                "model_control_mode none; start it with --model-control-mode explicit")

    def _scan(self) -> dict[str, object]:
        """Each model folder's stamp (service/core/repository.py)."""
        repository = self._registry.repository
        return {name: repository.stamp(name) for name in repository.names()}

    async def _poll(self, seen: dict[str, object]) -> None:
        """Loads, reloads or unloads each model whose folder changed, once it looks the same on
        two scans in a row: a folder still being copied in is not loaded half-written."""
        changing: dict[str, object] = {}
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                now = await asyncio.to_thread(self._scan)
            except (ConfigError, OSError) as e:  # the repository itself gone or unreadable
                log.warning("model repository not scanned: %s", e)
                continue
            for name in sorted(seen.keys() | now.keys()):
                stamp = now.get(name)  # None: the folder is gone
                if stamp == seen.get(name):
                    changing.pop(name, None)
                elif name not in changing or changing[name] != stamp:
                    changing[name] = stamp  # changed since the last scan: look again
                else:
                    del changing[name]
                    await self._follow(name, stamp, seen)

    async def _follow(self, name: str, stamp: object, seen: dict[str, object]) -> None:
        if stamp is None:
            del seen[name]
        else:
            seen[name] = stamp
        with contextlib.suppress(Exception):  # logged and recorded by the registry
            await (self._registry.unload(name) if stamp is None else self._registry.load(name))
