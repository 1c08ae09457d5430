"""The daemon's log, the same in each of its processes: one format (text lines, or one JSON
object per line for log collectors), no third-party build notes,
and errors a client causes (a malformed HTTP request, which aiohttp logs with a traceback) cut
to one warning line each, at most a few per window, so that bad requests cannot flood the log or
fill its disk."""

from __future__ import annotations

import json
import logging
import time
import warnings

_CLIENT_ERRORS = ("aiohttp.server",)  # loggers whose errors are a client's malformed request


class ClientErrors(logging.Filter):
    """One line per record, no traceback, at most `burst` lines per `window_s`; the first line
    after a window that dropped some says how many."""

    def __init__(self, burst: int = 10, window_s: float = 10.0) -> None:
        super().__init__()
        self._burst, self._window_s = burst, window_s
        self._window_start = float("-inf")
        self._lines = 0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self._window_start >= self._window_s:
            self._window_start, self._lines = now, 0
        if self._lines >= self._burst:
            self._dropped += 1
            return False
        self._lines += 1
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            detail = " ".join(str(error).split())[:200]
            message = f"{message}: {type(error).__name__}: {detail}"
        if self._dropped:
            message += f" ({self._dropped} more such lines were not logged)"
            self._dropped = 0
        record.msg, record.args = message, None
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class JsonLines(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the process
    among the daemon's (when not the main one), and the exception's text when there is one."""

    def __init__(self, process: str = "") -> None:
        super().__init__()
        self._process = process

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                 + f".{int(record.msecs):03d}Z",
                 "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        if self._process:
            entry["process"] = self._process
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(level: str, process: str = "", log_format: str = "text") -> None:
    """This process's log at `level` in `log_format` (text or json); `process` names it among
    the daemon's processes."""
    logging.basicConfig(level=level.upper(), format=(
        f"%(asctime)s %(levelname)s {process + ' ' if process else ''}%(name)s: %(message)s"))
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLines(process))
    for name in _CLIENT_ERRORS:
        logging.getLogger(name).addFilter(ClientErrors())
    # pyopencl warns of every build whose compiler printed anything (PoCL's notes): noise that
    # would open each log; a failed build still raises.
    warnings.filterwarnings("ignore", module="pyopencl")
