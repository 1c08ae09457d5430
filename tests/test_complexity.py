"""The OpenCL engine's lowering stays readable: no function of accelerators/opencl is above
radon's rank C (cyclomatic complexity 20), as its fusions once were (rank E)."""

from __future__ import annotations

from radon.complexity import cc_rank, cc_visit

from tests.support.daemon import ROOT

_MOST = 20  # the top of rank C


def test_no_function_of_the_opencl_engine_is_above_rank_c() -> None:
    above = [f"{path.relative_to(ROOT)}:{block.lineno} {block.fullname} "
             f"{cc_rank(block.complexity)} ({block.complexity})"
             for path in sorted((ROOT / "accelerators" / "opencl").rglob("*.py"))
             for block in cc_visit(path.read_text()) if block.complexity > _MOST]
    assert not above, above
