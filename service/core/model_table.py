"""Served model versions by name, and the reasons of those not served (failed to load, unloaded):
what the data plane looks models up in, in the device owner (the registry) and in front-ends (a
catalog)."""

from __future__ import annotations

import re
from typing import Generic, TypeVar

from service.core.repository import check_model_name
from service.errors import ModelNotFoundError, shown

M = TypeVar("M")
# Reasons of models that are not served because nobody asked for them, not because they failed.
UNLOADED = "unloaded"
NOT_LOADED = "not loaded (model_control_mode explicit: RepositoryModelLoad loads it)"
_VERSION = re.compile(r"[0-9]{1,18}")


class ModelTable(Generic[M]):
    def __init__(self) -> None:
        self._models: dict[str, dict[int, M]] = {}
        self.failures: dict[str, str] = {}  # model name -> why it is not served

    def get(self, name: str, version: str = "") -> M:
        versions = self._models.get(name)  # served names are valid: checked only when absent
        if versions is None:
            check_model_name(name)
            reason = self.failures.get(name)
            raise ModelNotFoundError(f"model_name {name!r}: " + (
                f"not served: {reason}" if reason else
                f"no such model; serving {sorted(self._models)}"))
        if not version:
            return versions[max(versions)]
        # ASCII digits only: str.isdigit also takes '²', which int() refuses.
        if not _VERSION.fullmatch(version) or int(version) not in versions:
            raise ModelNotFoundError(f"model_version {shown(version)} of model {name!r} is not "
                                     f"served; expected one of {sorted(versions)}")
        return versions[int(version)]

    def failed(self) -> dict[str, str]:
        """The models asked for that serve no version, and why: strict readiness waits for
        them. One that failed to reload while its versions still serve is not among them."""
        return {name: reason for name, reason in self.failures.items()
                if reason not in (UNLOADED, NOT_LOADED) and name not in self._models}

    def loaded(self) -> list[M]:
        return [m for versions in self._models.values() for m in versions.values()]
