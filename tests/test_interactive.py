"""Simulated ranks at the prompt (dt.simulated), tensors that outlived their ranks, and
rank-aware output (dt.print0, dt.get_logger)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import disttensor as dt
from disttensor.interactive import Ranked

G = np.arange(35.0).reshape(7, 5)
GONE = "cannot communicate here: this world has"


@pytest.fixture
def sim():
    with dt.simulated(4) as session:
        yield session
    assert session.closed


def test_statements_run_on_every_rank(sim, capsys):
    mesh = sim.init_mesh((2, 2), dim_names=["dp", "mp"])
    x = sim.shard_tensor(G, mesh, [dt.Shard(0), dt.Shard(1)])
    assert isinstance(x, Ranked) and len(x.per_rank) == 4
    assert [t.local_shape for t in x.per_rank] == [(4, 3), (4, 2), (3, 3), (3, 2)]
    assert repr(x.local_shape) == "rank 0: (4, 3)\nrank 1: (4, 2)\nrank 2: (3, 3)\nrank 3: (3, 2)"
    assert repr(x.shape) == "(7, 5)" and len(x) == 7 and x.shape[0] == 7  # all ranks agree
    y = x.reshard(mesh, [dt.Replicate(), dt.Shard(1)])
    print(y)  # collective on the ranks; printed once, here
    out = capsys.readouterr().out
    assert out.count("DistTensor(") == 1 and "placements=[Replicate(), Shard(dim=1)]" in out
    np.testing.assert_array_equal(np.asarray(y), G)
    # operators, numpy functions and methods run on the ranks and give Ranked back
    z = np.exp(y) * 2 - x
    assert isinstance(z, Ranked)
    np.testing.assert_allclose(np.asarray(z), np.exp(G) * 2 - G)
    assert float((x + 1).sum()) == float((G + 1).sum())
    rows = [r.numpy() for r in x[:2]]  # iteration: one Ranked per row
    np.testing.assert_array_equal(np.asarray(rows[1]), G[1])
    a, b = sim.run(lambda: (1, dt.get_rank()))  # a tuple per rank unpacks
    assert int(a) == 1 and b.per_rank == [0, 1, 2, 3]
    y[0, 0] = -1.0  # a write runs on every rank too
    assert float(y[0, 0]) == -1.0
    # what the ranks print comes out after the statement, in rank order
    assert sim.run(lambda: print("rank", dt.get_rank())) is None
    assert capsys.readouterr().out == "rank 0\nrank 1\nrank 2\nrank 3\n"
    pic = sim.visualize_sharding(x, width=24, height=2)  # rank 0 prints, every rank returns
    assert capsys.readouterr().out == str(pic) + "\n"
    assert "0,2" not in str(pic) and str(pic).startswith("float64 (7, 5) on mesh dp=2 x mp=2")


def test_explain_step_by_step(sim, monkeypatch):
    monkeypatch.chdir(Path(__file__).parent.parent)  # source paths relative to the repository
    mesh = sim.init_mesh((2, 2), dim_names=["dp", "mp"])
    x = sim.shard_tensor(G, mesh, [dt.Shard(0), dt.Shard(1)])
    with sim.CommCounter() as cc, sim.explain() as report:
        y = x.reshard(mesh, [dt.Replicate(), dt.Shard(1)])  # explained: reshard
        total = float(y.sum())  # explained: float
    assert total == G.sum()
    assert report.counts.per_rank == cc.counts.per_rank == [{"all_gather": 1, "all_reduce": 1}] * 4
    text = str(report)  # each rank's bytes differ (uneven shards): rank 0's report
    assert text.endswith("(rank 0's report; every rank's: .per_rank)")
    assert text.startswith(
        f"tests/test_interactive.py:{_line('explained: reshard')}  y = x.reshard("
    )
    assert "  DistTensor.reshard\n    reshard (7, 5) float64 [S(0), S(1)] -> [R, S(1)]: " in text
    assert f":{_line('explained: float')}  total = float(y.sum())" in text


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, t in enumerate(f, 1) if t.rstrip().endswith(f"# {marker}"))


def test_errors_leave_the_session_usable(sim):
    mesh = sim.init_mesh((2, 2), dim_names=["dp", "mp"])
    x = sim.shard_tensor(G, mesh, [dt.Shard(0), dt.Shard(1)])

    def rank2_fails():
        if dt.get_rank() == 2:
            raise ZeroDivisionError("rank 2")
        return dt.barrier()  # the others wait in a collective: stopped, not hung

    with pytest.raises(ZeroDivisionError) as err:
        sim.run(rank2_fails)
    assert "(raised on simulated rank 2 of 4)" in err.value.__notes__
    with pytest.raises(ValueError, match="placements"):  # every rank raises the same
        sim.shard_tensor(G, mesh, [dt.Shard(0)])
    assert sim.run(dt.get_rank).per_rank == [0, 1, 2, 3]  # the next statement runs
    np.testing.assert_array_equal(np.asarray(x.reshard(mesh, [dt.Replicate()] * 2)), G)
    with pytest.raises(ValueError, match="differs by rank"):
        bool(sim.get_rank() > 0)
    with dt.simulated(2) as other, pytest.raises(ValueError, match="another simulated session"):
        other.run(lambda v: v, x)
    with pytest.raises(AttributeError, match="disttensor has no 'nope'"):
        sim.nope  # noqa: B018


def test_values_after_the_ranks_ended():
    """A Ranked of a closed session, and a DistTensor returned by dt.simulate, say why they
    cannot communicate, instead of failing inside MPI or waiting for ranks that are gone."""
    with dt.simulated(4) as sim:
        x = sim.shard_tensor(G, sim.init_mesh((2, 2)), [dt.Shard(0), dt.Shard(1)])
    with pytest.raises(RuntimeError, match="session of 4 ranks has been closed"):
        repr(x)
    shard = x.per_rank[1]
    assert shard.local_shape == (4, 2)  # local data and metadata still work
    made = dt.simulate(4, lambda: dt.shard_tensor(G, dt.init_mesh((4,)), [dt.Shard(1)]))[0]
    for t in (shard, made):
        with pytest.raises(ValueError, match=GONE):
            dt.simulate(1, repr, t)


def test_stale_tensor_in_a_plain_process():
    """The same outside any simulation: the process's own (MPI, one rank) world."""
    code = """
        import numpy as np, disttensor as dt
        f = lambda: dt.shard_tensor(np.ones((4, 2)), dt.ProcessMesh([0, 1]), [dt.Shard(0)])
        x = dt.simulate(2, f)[0]
        try:
            print(x)
        except ValueError as e:
            print("ValueError:", e)
    """
    out = _python(code)
    assert f"ValueError: ranks [0, 1] {GONE} 1 rank." in out and "dt.simulated(n)" in out


def test_ctrl_c_stops_the_statement_not_the_session():
    code = """
        import os, signal, threading, time
        import disttensor as dt
        sim = dt.simulated(4)
        def slow():
            if dt.get_rank() == 0:
                time.sleep(1.0)
            dt.barrier()
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            sim.run(slow)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted")
        print(sim.run(dt.get_rank).per_rank)
        sim.close()
    """
    assert _python(code).splitlines() == ["interrupted", "[0, 1, 2, 3]"]


def _python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# -- rank-aware output ---------------------------------------------------------------------------
def test_print0_formats_everywhere_prints_once(capsys):
    def show():
        mesh = dt.init_mesh((2, 2))
        x = dt.shard_tensor(G, mesh, [dt.Shard(0), dt.Shard(1)])
        dt.print0("x:", x, sep="\n")  # str(x) is collective: every rank formats
        dt.print0("from rank", dt.get_rank(), rank=3)
        dt.print0("error", file=sys.stderr, end="!\n")

    dt.simulate(4, show)
    out, err = capsys.readouterr()
    assert out.count("DistTensor(") == 1 and "x:\nDistTensor([[ 0.," in out
    assert out.count("from rank") == 1 and "from rank 3\n" in out and err == "error!\n"


def test_logger_tags_each_rank(capsys):
    log = dt.get_logger("disttensor.test_interactive")
    assert dt.get_logger("disttensor.test_interactive") is log and len(log.handlers) == 1
    dt.simulate(2, lambda: log.info("shard %d", dt.get_rank() * 10))
    lines = sorted(capsys.readouterr().err.splitlines())
    want = [f"[rank {r}] INFO disttensor.test_interactive: shard {r * 10}" for r in (0, 1)]
    assert lines == want
    name, fmt = "disttensor.test_interactive", "%(rank)s|%(message)s"
    dt.get_logger(name, level=logging.WARNING, ranks=[1], fmt=fmt)
    dt.simulate(2, lambda: (log.info("hidden"), log.warning("seen on %d", dt.get_rank())))
    assert capsys.readouterr().err == "1|seen on 1\n"
