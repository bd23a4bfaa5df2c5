"""bench/collectives.py --quick under mpiexec: every variant's sum is checked before and after
the timing, and the table prints. No timing is asserted (docs/performance.md has the numbers).
"""

from __future__ import annotations

import pytest
from mpirun import found, run

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not found(), reason="mpiexec not found (pip install mpich)"),
]


@pytest.mark.parametrize("extra", [[], ["--alternatives"]], ids=["dt", "alternatives"])
def test_collectives_benchmark_runs(extra):
    code, out = run(2, ["bench/collectives.py", "--quick", *extra], timeout=120)
    assert code == 0, out
    rows = ["raw", "comm", "comm, no check", "reshard", "reshard, no check"]
    if extra:
        rows += ["check+data", "icheck+data", "folded", "envelope"]
    for row in rows:
        assert any(line.split("  ")[0] == row for line in out.splitlines()), (row, out)
    assert "goal reshard (check on) <= 2 x raw:" in out, out
