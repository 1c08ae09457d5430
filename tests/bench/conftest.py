"""Fixtures for the benchmark tools."""

from __future__ import annotations

import numpy as np
import pytest

from bench.loadgen_sut import SampleLibrary


@pytest.fixture
def digits(holdout: tuple[np.ndarray, np.ndarray]) -> SampleLibrary:
    """LoadGen's sample library of the held-out digits."""
    images, labels = holdout
    return SampleLibrary("held-out digits", images, labels)
