"""bench/dp.py --quick under mpiexec: its float64 agreement check and the float32 sharding
check of table (e) run and can fail.

No timing is asserted. torch is optional: with it the check covers torch on one process and
DDP too; ``--no-torch`` runs the path of a machine without it either way.
"""

from __future__ import annotations

import re

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
    assert_sharding_table(out)


SHARDED = (
    "DP (plain)",
    "DP + ShardingStage1",
    "DP + ShardingStage2",
    "DP + ShardingStage3",
    "DP + ShardingStage3 (small groups)",
)


def assert_sharding_table(out: str) -> None:
    """Table (e): its check passed, each variant has a row in the time table and in the
    memory table, and the model state of every stage is its ideal share of plain's."""
    lines = out.splitlines()
    check = [line for line in lines if line.startswith("sharding check")]
    assert check and "(float32, 3 AdamW steps" in check[0], out
    assert "agree with plain DataParallel" in check[0], out
    assert "(e) sharded data parallelism" in out and "(e) memory per rank" in out, out
    for variant in SHARDED:
        rows = [line for line in lines if re.match(re.escape(variant) + r"\s+\d", line)]
        assert len(rows) == 2, (variant, out)  # the time row, the memory row
    times = [line for line in lines if line.startswith("step time / plain DataParallel")]
    assert times and all(f"stage {s} " in times[0] for s in (1, 2, 3)), out
    memory = [line for line in lines if line.startswith("model state / plain DataParallel")]
    assert memory and memory[0].count(": met)") == 4 and "NOT met" not in memory[0], out


def test_dp_benchmark_only_sharding():
    """``--only e`` runs the sharding check and table (e) alone; on 4 ranks, where the
    reduce-scatter may sum in another order than the all-reduce (within the tolerance)."""
    code, out = run(4, ["bench/dp.py", "--quick", "--only", "e"], timeout=120)
    assert code == 0, out
    assert "agreement check" not in out and "(b) step time" not in out, out
    assert_sharding_table(out)


def test_dp_benchmark_check_fails_on_a_wrong_variant():
    """A learning rate off by 1e-7 in one variant must fail the check: exit non-zero, say
    what differed, and time nothing."""
    code, out = run(
        2, ["bench/dp.py", "--quick", "--no-torch", "--plant", "dt DP fused"], timeout=120
    )
    assert code != 0, out
    assert "agreement check FAILED" in out and "dt DP fused:" in out, out
    assert "(b) step time" not in out, out


def test_dp_benchmark_sharding_check_fails_on_a_wrong_stage():
    """A learning rate off by 1 % in one sharded variant must fail the sharding check: exit
    non-zero, say what differed, and time nothing."""
    code, out = run(
        2,
        ["bench/dp.py", "--quick", "--only", "e", "--plant", "DP + ShardingStage2"],
        timeout=120,
    )
    assert code != 0, out
    assert "sharding check FAILED" in out and "DP + ShardingStage2:" in out, out
    assert "(e) sharded" not in out, out


def test_dp_benchmark_sharding_gpt():
    """``--only e --model gpt``: table (e) on the GPT of demos/gpt_dp_mp.py, its check at
    the MLP's float32 tolerance, every row in both tables."""
    code, out = run(2, ["bench/dp.py", "--quick", "--only", "e", "--model", "gpt"], timeout=120)
    assert code == 0, out
    check = [line for line in out.splitlines() if line.startswith("sharding check")]
    assert check and "GPT demo model" in check[0] and "tolerance 1e-05" in check[0], out
    assert "(e) sharded data parallelism: GPT of demos/gpt_dp_mp.py" in out, out
    assert_sharding_table(out)
