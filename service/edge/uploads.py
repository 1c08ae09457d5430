"""Request bodies still arriving, bounded per caller, in all and in time, in each daemon process:
a body is held whole until its last byte, so unfinished uploads (16 REST bodies stopped at 60 MiB
grew the daemon by 1 GB) would otherwise take the node's memory. gRPC's doors count the DATA
frames of streams the client has not ended (service/edge/door.py); the REST transport counts the
body it reads (service/http/transport.py). Both charge this process's one budget."""

from __future__ import annotations

from collections import Counter

from service.settings import Settings


class UploadBudget:
    def __init__(self, per_caller: int, total: int, timeout_s: float) -> None:
        self.per_caller, self.total, self.timeout_s = per_caller, total, timeout_s
        self._held: Counter[str] = Counter()
        self._all = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> UploadBudget:
        return cls(settings.max_upload_bytes_per_caller, settings.max_buffered_bytes,
                   settings.upload_timeout_s)

    def charge(self, caller: str, nbytes: int) -> str:
        """Holds `nbytes` more of `caller`'s bodies; or, beyond a bound, holds nothing and says
        which (the refusal, naming its flag)."""
        if self._held[caller] + nbytes > self.per_caller:
            return (f"{caller} has {self._held[caller] + nbytes} bytes of request bodies "
                    f"arriving, more than --max-upload-bytes-per-caller {self.per_caller}")
        if self._all + nbytes > self.total:
            return (f"{self._all + nbytes} bytes of request bodies are arriving, more than "
                    f"--max-buffered-bytes {self.total}; retry later")
        self._held[caller] += nbytes
        self._all += nbytes
        return ""

    def release(self, caller: str, nbytes: int) -> None:
        self._held[caller] -= nbytes
        self._all -= nbytes
        if not self._held[caller]:
            del self._held[caller]

    @property
    def held(self) -> int:
        return self._all
