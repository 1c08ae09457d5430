"""Numeric checks: relative error, seeds that vary by run (and reproduce), the reduced shape grid
under Oclgrind."""

from __future__ import annotations

import os

import numpy as np

# The kernel-check target runs under Oclgrind, a slow simulator: a reduced shape grid there.
SMALL_GRID = os.environ.get("HETSERVE_KERNEL_GRID") == "small"


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest absolute error relative to the largest reference magnitude."""
    return float(np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def fresh_rng(fixed: int | None = None) -> tuple[np.random.Generator, int]:
    """A generator with a new seed each run (failures print it), or `fixed` where a test's
    bound is empirical; $HETSERVE_TEST_SEED overrides both, to reproduce or explore."""
    seed = int(os.environ.get("HETSERVE_TEST_SEED")
               or (fixed if fixed is not None else int.from_bytes(os.urandom(4), "little")))
    return np.random.default_rng(seed), seed
