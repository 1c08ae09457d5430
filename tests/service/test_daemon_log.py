"""The daemon's JSON log lines: one object per record, the exception's text included."""

from __future__ import annotations

import json
import logging
import sys

from service.daemon_log import JsonLines


def _record(exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("service.core.registry", logging.ERROR, __file__, 1, "model %r failed",
                             ("m",), exc_info)


def test_a_record_is_one_json_object_on_one_line() -> None:
    line = JsonLines("front-end 1").format(_record())
    entry = json.loads(line)
    assert "\n" not in line and entry["time"].endswith("Z")
    assert {k: entry[k] for k in ("level", "logger", "message", "process")} == {
        "level": "ERROR", "logger": "service.core.registry", "message": "model 'm' failed",
        "process": "front-end 1"}
    assert "exception" not in entry


def test_the_exception_text_comes_along() -> None:
    try:
        raise ValueError("bad\nconfig")
    except ValueError:
        line = JsonLines().format(_record(sys.exc_info()))
    entry = json.loads(line)
    assert "\n" not in line and "process" not in entry
    assert "Traceback" in entry["exception"] and "ValueError: bad\nconfig" in entry["exception"]
