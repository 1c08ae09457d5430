"""A daemon's /metrics read as the tests compare them: samples by name and labels."""

from __future__ import annotations

import re
import urllib.parse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[str, float]:
    """Every sample of the daemon's /metrics, keyed by name and labels as exposed."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {key: float(value) for key, value in
            re.findall(r"^(\w+(?:\{[^}]*\})?) (\S+)$", text, re.MULTILINE)}


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    return sum(v for k, v in samples.items() if k.split("{")[0] == name and all(
        f'{label}="{value}"' in k for label, value in labels.items()))


def samples(text: str) -> Series:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(series: Series, name: str, **labels: str) -> float:
    found = [v for (n, ls), v in series.items() if n == name and set(labels.items()) <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


Series = dict[tuple[str, frozenset], float]
