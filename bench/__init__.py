"""hetserve's benchmarks. `python -m bench --help` (from the repository root) runs LoadGen's
scenarios against the daemon, the images/s-by-batch table and the older benches, and writes a
Markdown report with plots; the modules beside this one also run alone as scripts."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
