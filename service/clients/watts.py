"""How every power figure is shown: with where it came from, and the `model` estimate (configured
idle/busy watts blended by measured busy time) never as a measurement."""

from __future__ import annotations


def source_label(source: str) -> str:
    return "model estimate" if source == "model" else source


def watts_label(watts: float | None, source: str) -> str:
    if watts is None:
        return "-"
    return f"{watts:.1f} ({source_label(source)})"
