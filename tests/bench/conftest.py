"""bench/ is a folder of scripts, not a package: its modules import each other by name."""

from __future__ import annotations

import sys

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
