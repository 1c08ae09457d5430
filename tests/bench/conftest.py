"""Fixtures for the benchmark tools. `python -m bench` is a package; the older benches
(serving.py and its helpers) are scripts that import each other by name, hence the path."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from bench.loadgen_sut import SampleLibrary
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))


@pytest.fixture
def digits(holdout: tuple[np.ndarray, np.ndarray]) -> SampleLibrary:
    """LoadGen's sample library of the held-out digits."""
    images, labels = holdout
    return SampleLibrary("held-out digits", images, labels)
