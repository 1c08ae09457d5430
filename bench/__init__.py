"""hetserve's benchmarks. `python -m bench --help` (from the repository root) runs LoadGen's
scenarios against the daemon, the images/s-by-batch table and the older benches, and writes a
Markdown report with plots; the modules beside this one also run alone as scripts."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# tools/ holds the digits and the benchmark architectures; it is no package.
if str(ROOT / "tools") not in sys.path:
    sys.path.append(str(ROOT / "tools"))
