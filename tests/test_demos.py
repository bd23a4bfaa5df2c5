"""Every training demo for real under mpiexec: each checks itself against the single-process
run (losses, gradients, parameters) and exits non-zero on a mismatch."""

from __future__ import annotations

import pytest
from mpirun import run

OK = "OK: matches single process"

CASES = [
    ("simple_net_dp.py", 1, "float64"),
    ("simple_net_dp.py", 2, "float64"),
    ("simple_net_dp.py", 4, "float64"),
    ("simple_net_dp.py", 4, "float32"),
    ("simple_net_mp.py", 1, "float64"),
    ("simple_net_mp.py", 2, "float64"),
    ("simple_net_mp.py", 4, "float64"),
    ("simple_net_mp.py", 4, "float32"),
    ("mlp_dp_mp.py", 1, "float64"),
    ("mlp_dp_mp.py", 2, "float64"),
    ("mlp_dp_mp.py", 4, "float64"),
    ("mlp_dp_mp.py", 1, "float32"),
    ("mlp_dp_mp.py", 2, "float32"),
    ("mlp_dp_mp.py", 4, "float32"),
    ("gpt_dp_mp.py", 1, "float64"),
    ("gpt_dp_mp.py", 2, "float64"),
    ("gpt_dp_mp.py", 4, "float64"),
    ("gpt_dp_mp.py", 4, "float32"),
]


@pytest.mark.mpi
@pytest.mark.parametrize(
    "demo,n,dtype", CASES, ids=[f"{d.removesuffix('.py')}-{n}-{t}" for d, n, t in CASES]
)
def test_demo(demo, n, dtype):
    code, out = run(n, [f"demos/{demo}", "--dtype", dtype], timeout=180)
    assert code == 0, out
    assert OK in out, out
    assert out.count(OK) == 1, "only rank 0 prints:\n" + out
    assert "step 1/" in out or "step  1/" in out, out  # the progress lines


@pytest.mark.mpi
@pytest.mark.parametrize("mesh", ["4x1", "1x4"])
def test_mlp_demo_other_meshes(mesh):
    code, out = run(4, ["demos/mlp_dp_mp.py", "--mesh", mesh, "--steps", "3"], timeout=120)
    assert code == 0, out
    assert f"mesh {mesh}" in out and OK in out, out


@pytest.mark.mpi
def test_gpt_demo_loss_goes_down():
    code, out = run(2, ["demos/gpt_dp_mp.py", "--steps", "12"], timeout=180)
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("loss "))
    first, last = (float(v) for v in line.removeprefix("loss ").split(" -> "))
    assert last < 0.7 * first, out


@pytest.mark.mpi
@pytest.mark.parametrize("demo", ["mlp_dp_mp.py", "simple_net_mp.py"])
def test_demo_fails_loudly_on_a_mismatch(demo):
    """--perturb (hidden) adds 1e-3 to one rank's shard of a weight of the sharded model: the
    self-check must catch it, every rank must exit (no hang) and the job must fail."""
    code, out = run(2, [f"demos/{demo}", "--perturb", "--steps", "3"], timeout=120)
    assert code != 0, out
    assert "MISMATCH: the sharded run differs from the single process" in out, out
    assert OK not in out, out


@pytest.mark.mpi
def test_demo_rejects_a_mesh_that_does_not_fit():
    code, out = run(2, ["demos/mlp_dp_mp.py", "--mesh", "2x2"], timeout=60)
    assert code != 0, out
    assert "--mesh 2x2 needs 4 ranks, this run has 2" in out, out
