"""bench/dp.py --quick under mpiexec: its float64 agreement check runs and can fail.

No timing is asserted. torch is optional: with it the check covers torch on one process and
DDP too; ``--no-torch`` runs the path of a machine without it either way.
"""

from __future__ import annotations

import pytest
from mpirun import found, run

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not found(), reason="mpiexec not found (pip install mpich)"),
]


@pytest.mark.parametrize("extra", [[], ["--no-torch"]], ids=["default", "no-torch"])
def test_dp_benchmark_runs(extra):
    """The check (every data-parallel variant and k=4 gradient merge against dt on one
    process: losses and final parameters) passes, then every table prints."""
    code, out = run(2, ["bench/dp.py", "--quick", *extra], timeout=120)
    assert code == 0, out
    check = [line for line in out.splitlines() if line.startswith("agreement check")]
    assert check and "(float64, 3 SGD steps" in check[0], out
    assert "agree with dt 1 process" in check[0], out
    for variant in ("dt, no wrapper", "dt DP fuse=False", "dt DP fused+overlap k=4"):
        assert variant in check[0], out
    for line in ("fused speed-up", "(b) step time", "(c) gradient merge", "(d) overlap"):
        assert line in out, out
    if extra:
        assert "torch not installed" in out, out


def test_dp_benchmark_check_fails_on_a_wrong_variant():
    """A learning rate off by 1e-7 in one variant must fail the check: exit non-zero, say
    what differed, and time nothing."""
    code, out = run(
        2, ["bench/dp.py", "--quick", "--no-torch", "--plant", "dt DP fused"], timeout=120
    )
    assert code != 0, out
    assert "agreement check FAILED" in out and "dt DP fused:" in out, out
    assert "(b) step time" not in out, out
