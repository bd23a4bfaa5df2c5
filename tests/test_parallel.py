"""dt.DataParallel: fused, overlapped gradient all-reduces and gradient merge.

Training with ``dt.DataParallel`` must equal the single-process run on the whole (k times
larger) batch, checked against an independent numpy model (tests/dp_cases.py, with
tests/numpy_models.py), on 1 to 4 ranks and on a 2x2 dp x mp mesh with tensor parallelism,
for every option (fusion, overlap, bucket caps, k_steps, avg) and the edge cases; and it must
communicate as promised (dt.CommCounter): one all-reduce per bucket per step, none during the
first k-1 micro-steps, nothing extra for tensor parallelism. Most runs are on simulated ranks;
a representative part runs under mpiexec (the real non-blocking, in-place all-reduce).
"""

from __future__ import annotations

import gc
import logging
import warnings

import numpy as np
import pytest
from dp_cases import (
    DP_DP,
    DP_MP,
    EXTRA,
    GRID,
    MP_DP,
    MPI_CASES,
    SMALL,
    Checks,
    Config,
    caps,
    case_dp_edges,
    case_dp_errors,
    case_dp_grid,
    case_dp_layout,
    check_errors,
    dp_mesh,
    run_grid,
    train,
)
from mpirun import run
from op_cases import assert_grid, every_rank

import disttensor as dt


# -- equivalence with the single-process numpy run (and the collectives, per step) -------------
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_equals_single_process_on_a_dp_mesh(world):
    """A global micro-batch of 10 rows (uneven on 3 and 4 ranks; 3 rows: an empty shard on
    4): losses every pass, gradients every step and final parameters equal the numpy run
    on the whole batch; SGD and Adam; every option of GRID."""
    assert_grid(dt.simulate(world, case_dp_grid, world, GRID), minimum=500)


@pytest.mark.parametrize("layout", [DP_MP, MP_DP], ids=["dp-x-mp", "mp-x-dp"])
def test_equals_single_process_with_tensor_parallelism(layout):
    """2x2 dp x mp: fc1 column-, fc2 row-parallel over "mp", data-parallel over "dp" (the
    outer or the inner mesh dim)."""
    assert_grid(dt.simulate(4, run_grid, layout, GRID), minimum=500)


def test_equals_single_process_over_two_dp_dims():
    """``dim=["dp", "dp2"]``: both dims of a 2x2 mesh data-parallel (the batch nested-split)."""
    assert_grid(dt.simulate(4, run_grid, DP_DP, GRID[:5]), minimum=250)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_edge_cases(world):
    """A layer unused in some passes and steps (no gradient, no crash; new to the layout:
    left to the optimizer, then bucketed); steps after fewer than k passes (the mean over
    those); zero_grad (optimizer's or module's) dropping accumulation without collectives;
    fc1.weight Shard(0) over dp (ZeRO-style) left out of the buckets and still trained."""
    assert_grid(dt.simulate(world, case_dp_edges, world), minimum=500)


# -- collectives --------------------------------------------------------------------------------
def comm_of(layout, cfg) -> list[dict]:
    """Per step: the collectives of each pass's forward and backward, of step() and their
    all-reduce bytes; and the bucket count."""
    rec = train(layout, cfg)
    out = []
    for s in rec["steps"]:
        out.append(
            {
                "fwd": [c.counts for c in s["fwd"]],
                "bwd": [c.counts for c in s["bwd"]],
                "step": s["act"].counts,
                "bytes": sum(
                    c.bytes.get("all_reduce", 0) for c in [*s["fwd"], *s["bwd"], s["act"]]
                ),
                "buckets": len(s["buckets"]["buckets"]),
                "gradients": [b["gradients"] for b in s["buckets"]["buckets"]],
            }
        )
    return out


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_gradient_merge_communicates_once_per_k_passes(fuse):
    small = caps(*SMALL)
    one = every_rank(dt.simulate(3, comm_of, dp_mesh(3), Config(k=1, fuse=fuse, **small)))
    four = every_rank(dt.simulate(3, comm_of, dp_mesh(3), Config(k=4, fuse=fuse, **small)))
    nb = one[0]["buckets"]
    # SMALL caps (100 B first, 500 B): [fc2.bias] [fc2.weight, fc1.bias] [fc1.weight]
    assert nb == (3 if fuse else 4)
    for s in one:
        assert s["bwd"] == [{"all_reduce": nb}] and s["step"] == {}  # overlap: in backward
    for s in four:
        assert s["fwd"] == [{}] * 4
        assert s["bwd"][:3] == [{}] * 3  # micro-steps 1..3: no collective at all
        assert s["bwd"][3] == {"all_reduce": nb} and s["step"] == {}
        assert s["bytes"] == one[0]["bytes"]  # 4 passes move what one step without merge does
    assert one[0]["bytes"] == 880  # every gradient once (the MLP: 110 float64)
    if not fuse:
        assert one[0]["gradients"] == [1, 1, 1, 1]  # one all-reduce per gradient


def test_tensor_parallel_all_reduces_stay_on_2x2():
    """On dp x mp the forward keeps its mp all-reduce (the same as without DataParallel) and
    backward + step add one all-reduce per bucket (fusion off: per gradient)."""

    def plain():
        mesh = DP_MP.mesh()
        model = dt.nn.MLP(6, 8, dtype=np.float64, seed=3)
        plan = {"fc1": dt.nn.ColwiseParallel("mp"), "fc2": dt.nn.RowwiseParallel("mp")}
        dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(plan))
        opt = dt.optim.SGD(model.parameters(), lr=0.1)
        pls = DP_MP.batch_placements()
        x = dt.shard_tensor(np.ones((10, 6)), mesh, pls)
        with dt.CommCounter() as fwd:
            loss = dt.nn.MSELoss()(model(x), x)
        with dt.CommCounter() as rest:
            loss.backward()
            opt.step()
        return fwd.counts, rest.counts

    fwd, rest = every_rank(dt.simulate(4, plain))
    # the step reduces the four dp-Partial gradients together (Note [Gradients reduced at the
    # step]); DataParallel does so in backward, fused or one by one
    assert fwd == {"all_reduce": 1} and rest == {"all_reduce": 1}
    for cfg, nb in ((Config(k=2), 1), (Config(k=2, fuse=False, overlap=False), 4)):
        for s in every_rank(dt.simulate(4, comm_of, DP_MP, cfg)):
            assert s["buckets"] == nb
            assert s["fwd"] == [fwd, fwd]
            assert s["bwd"][0] == {}
            assert s["bwd"][1] == ({"all_reduce": nb} if cfg.overlap else {})
            assert s["step"] == ({} if cfg.overlap else {"all_reduce": nb})


# -- bucket layout ------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3])
def test_bucket_layout(world):
    """Caps (the first bucket's own), backward order, one dtype per bucket (float32 and
    float64 layers), reductions started during backward, gradients Replicate views of one
    buffer per bucket."""
    assert_grid(dt.simulate(world, case_dp_layout, world), minimum=400)


def test_dim_by_index_or_list():
    """``dim`` by name, index (negative too) or a list: the same buckets over "dp" only."""

    def body():
        mesh = DP_MP.mesh()
        out = []
        for dim in ("dp", 0, -2, ["dp"], ("dp",)):
            model = dt.shard_layer(dt.nn.Linear(4, 2, dtype=np.float64, seed=1), mesh)
            dp_model = dt.DataParallel(model, mesh, dim=dim)
            x = dt.shard_tensor(np.ones((6, 4)), mesh, DP_MP.batch_placements())
            dp_model(x).sum().backward()
            dp_model.finish_gradients()
            out.append((dp_model.buckets, model.weight.grad.placements))
        return out

    got = every_rank(dt.simulate(4, body))
    assert all(g == got[0] for g in got)
    assert got[0][0]["buckets"][0]["dims"] == ["dp"] and got[0][1] == [dt.Replicate()] * 2


def default_dim():
    """``dim`` left out: the only dim of a 1-D mesh whatever its name, "dp" on a mesh with
    more dims; with no "dp" there, a ValueError naming the dims (and explicit dims work)."""
    out = {}
    for names, shape in ((("data",), (4,)), (("dp", "mp"), (2, 2)), (("mp", "dp"), (2, 2))):
        mesh = dt.ProcessMesh(np.arange(4).reshape(shape), list(names))
        model = dt.shard_layer(dt.nn.Linear(4, 2, dtype=np.float64, seed=1), mesh)
        with dt.CommCounter() as cc:
            dp_model = dt.DataParallel(model, mesh)
        pls = [dt.Shard(0) if n in ("data", "dp") else dt.Replicate() for n in names]
        dp_model(dt.shard_tensor(np.ones((8, 4)), mesh, pls)).sum().backward()
        dp_model.finish_gradients()
        out[names] = (cc.counts, dp_model.extra_repr(), dp_model.buckets["buckets"][0]["dims"])

    def refused(mesh, **kwargs):
        model = dt.shard_layer(dt.nn.Linear(4, 2, dtype=np.float64, seed=1), mesh)
        with dt.CommCounter() as cc:
            try:
                dt.DataParallel(model, mesh, **kwargs)
            except ValueError as e:
                return str(e), cc.counts
        return "no error", cc.counts

    data_model = dt.ProcessMesh(np.arange(4).reshape(2, 2), ["data", "model"])
    out["no dp"] = refused(data_model)
    out["dp on data"] = refused(dt.ProcessMesh(np.arange(4), ["data"]), dim="dp")
    out["dp on data_model"] = refused(data_model, dim="dp")
    model = dt.shard_layer(dt.nn.Linear(4, 2, dtype=np.float64, seed=1), data_model)
    out["explicit"] = dt.DataParallel(model, data_model, dim="data").extra_repr()
    return out


def test_dim_defaults_to_the_only_dim_or_dp():
    got = every_rank(dt.simulate(4, default_dim))
    tail = "overlap=True, k_steps=1, fuse=True"
    assert got[("data",)] == ({}, f"dim=['data'], {tail}", ["data"])
    assert got[("dp", "mp")] == ({}, f"dim=['dp'], {tail}", ["dp"])
    assert got[("mp", "dp")] == ({}, f"dim=['dp'], {tail}", ["dp"])
    assert got["no dp"] == (
        "DataParallel: which dim of the 2-D mesh ProcessMesh(shape=(2, 2), process_ids=[0, 1, "
        "2, 3], dim_names=['data', 'model']) is data-parallel? dim= defaults to the only dim of "
        "a 1-D mesh, else to 'dp', which this mesh lacks; pass dim= one of ['data', 'model'] (or "
        "a list of them)",
        {},
    )
    assert got["dp on data"] == (
        "DataParallel: dim='dp' is not a dim of the mesh: its dim_names are ['data']; pass dim= "
        "one of them (or leave dim= out: a 1-D mesh's only dim)",
        {},
    )
    assert got["dp on data_model"] == (
        "DataParallel: dim='dp' is not a dim of the mesh: its dim_names are ['data', 'model']; "
        "pass dim= one of them",
        {},
    )
    assert got["explicit"] == f"dim=['data'], {tail}"


# -- a batch that is not split ------------------------------------------------------------------
def forwards(layout, batches: list[str], calls: int = 3):
    """One wrapper per entry of ``batches`` on ``layout``, each called ``calls`` times with
    that batch: "numpy" (a plain array), "replicate" (a Replicate DistTensor), "split" (the
    layout's batch placements), "dp only" (Shard(0) over "dp", Replicate elsewhere)."""
    mesh = layout.mesh()
    out = []
    for kind in batches:
        model = dt.shard_layer(dt.nn.Linear(4, 2, dtype=np.float64, seed=1), mesh)
        dp_model = dt.DataParallel(model, mesh, dim=layout.dim)
        a = np.ones((8, 4))
        x = {
            "numpy": a,
            "replicate": dt.shard_tensor(a, mesh, [dt.Replicate()] * mesh.ndim),
            "split": dt.shard_tensor(a, mesh, layout.batch_placements()),
            "dp only": dt.shard_tensor(
                a, mesh, [dt.Shard(0) if n == "dp" else dt.Replicate() for n in layout.names]
            ),
        }[kind]
        for _ in range(calls):
            y = dp_model(x)  # the warning's line
        out.append(y.placements)
        dp_model.unwrap()
    return out


def warned(world: int, *args) -> tuple[list, list]:
    """What ``forwards`` returned on each simulated rank, and every warning any rank gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # each rank's own, not one per warning text
        got = dt.simulate(world, forwards, *args)
    return got, [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_an_unsplit_batch_warns_once_per_wrapper():
    """A numpy batch (or a Replicate DistTensor) runs, every rank computing the whole batch:
    one RuntimeWarning per wrapper and rank, naming dt.shard_tensor, from the caller's line;
    a batch Shard over "dp" gives none, and nothing does on one rank."""
    got, caught = warned(2, dp_mesh(2), ["numpy", "replicate", "split", "numpy"])
    assert every_rank(got) == [[dt.Replicate()], [dt.Replicate()], [dt.Shard(0)], [dt.Replicate()]]
    tail = (
        ", so every rank computes the whole batch and data parallelism does nothing; split it "
        "with dt.shard_tensor(x, mesh, [dt.Shard(0)])"
    )
    numpy_msg = "DataParallel: the batch is a numpy array, not split over ['dp']" + tail
    rep_msg = "DataParallel: no argument is Shard over ['dp'] (the batch is not split)" + tail
    assert sorted(str(w.message) for w in caught) == sorted([numpy_msg] * 4 + [rep_msg] * 2)
    with open(__file__) as f:
        line = next(i for i, t in enumerate(f, 1) if "# the warning's line" in t)
    assert {(w.filename, w.lineno) for w in caught} == {(__file__, line)}
    assert warned(1, dp_mesh(1), ["numpy", "replicate"])[1] == []


def test_an_unsplit_batch_on_2d_meshes():
    """dp x mp: a batch Shard(0) over "dp" and Replicate over "mp" is split; with both dims
    data-parallel, a batch split over "dp" only warns about "dp2"."""
    got, caught = warned(4, DP_MP, ["split", "numpy"])
    assert every_rank(got) == [[dt.Shard(0), dt.Replicate()], [dt.Replicate()] * 2]
    assert [str(w.message) for w in caught] == [
        "DataParallel: the batch is a numpy array, not split over ['dp'], so every rank "
        "computes the whole batch and data parallelism does nothing; split it with "
        "dt.shard_tensor(x, mesh, [dt.Shard(0), dt.Replicate()])"
    ] * 4
    got, caught = warned(4, DP_DP, ["split", "dp only"])
    assert every_rank(got) == [[dt.Shard(0), dt.Shard(0)], [dt.Shard(0), dt.Replicate()]]
    assert [str(w.message) for w in caught] == [
        "DataParallel: no argument is Shard over ['dp2'] (the batch is not split), so every "
        "rank computes the whole batch and data parallelism does nothing; split it with "
        "dt.shard_tensor(x, mesh, [dt.Shard(0), dt.Shard(0)])"
    ] * 4


# -- errors and the log line --------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3])
def test_errors_on_every_rank_before_any_collective(world):
    """Wrong types, unknown dim, bad sizes and k_steps, no parameter on the mesh, the same
    model twice: the same ValueError/TypeError on every rank, no collective first."""
    checks = Checks()
    check_errors(checks, world, every_rank(dt.simulate(world, case_dp_errors, world)))
    assert_grid([checks.result()], minimum=40)


def test_info_log_line_once_per_rank(caplog):
    """'N gradient all-reduces fused into M buckets (a MiB, ...) over dp', once, however
    many steps: on each simulated rank (each thread logs its own)."""

    def body():
        mesh = dp_mesh(2).mesh()
        model = dt.nn.Sequential(
            dt.nn.Linear(128, 1024, dtype=np.float64, seed=1),  # bias 8 KiB, weight 1 MiB
            dt.nn.GELU(),
            dt.nn.Linear(1024, 64, dtype=np.float64, seed=2),  # bias 512 B, weight 0.5 MiB
        )
        dt.shard_layer(model, mesh)
        dp_model = dt.DataParallel(model, mesh, first_bucket_size_mb=0.25, bucket_size_mb=1.0)
        opt = dt.optim.SGD(dp_model.parameters(), lr=0.1)
        for _ in range(3):
            x = dt.shard_tensor(np.ones((4, 128)), mesh, [dt.Shard(0)])
            y = dt.shard_tensor(np.zeros((4, 64)), mesh, [dt.Shard(0)])
            dt.nn.MSELoss()(dp_model(x), y).backward()
            opt.step()
            opt.zero_grad()
        return dp_model.buckets

    with caplog.at_level(logging.INFO, logger="disttensor"):
        layout = every_rank(dt.simulate(2, body))
        # a layer used from the second step on: the layout is rebuilt, and not logged again
        dt.simulate(2, train, dp_mesh(2), Config(model="extra", schedule=EXTRA))
    logged = [r for r in caplog.records if "gradient all-reduces fused" in r.getMessage()]
    threads = sorted(r.threadName for r in logged)
    assert threads == ["dt-rank-0", "dt-rank-0", "dt-rank-1", "dt-rank-1"], logged
    for r, tail in zip(
        logged, ["3 buckets (0.0 MiB, 0.5 MiB, 1.0 MiB)"] * 2 + ["1 bucket (0.0 MiB)"] * 2
    ):
        assert r.levelno == logging.INFO
        msg = r.getMessage()
        assert msg.endswith(f"4 gradient all-reduces fused into {tail} over dp"), msg
    # first cap 0.25 MiB: 2.bias alone; then 2.weight + 0.bias (0.51 MiB), 0.weight (1 MiB)
    assert [b["gradients"] for b in layout["buckets"]] == [1, 2, 1]


# -- arguments of other types, a dropped wrapper -------------------------------------------------
def construct(kwargs: dict):
    """DataParallel(**kwargs) around a Linear on 2 ranks; one backward and finish."""
    mesh = dp_mesh(2).mesh()
    model = dt.shard_layer(dt.nn.Linear(4, 2, dtype=np.float64, seed=1), mesh)
    try:
        dp_model = dt.DataParallel(model, mesh, **kwargs)
    except Exception as e:
        return type(e).__name__, str(e)
    x = dt.shard_tensor(np.ones((4, 4)), mesh, [dt.Shard(0)])
    y = dt.shard_tensor(np.zeros((4, 2)), mesh, [dt.Shard(0)])
    dt.nn.MSELoss()(dp_model(x), y).backward()
    dp_model.finish_gradients()
    return "ok", [b["gradients"] for b in dp_model.buckets["buckets"]]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"bucket_size_mb": float("inf")}, id="inf-cap"),
        pytest.param({"first_bucket_size_mb": float("inf")}, id="inf-1st"),
        pytest.param({"dim": np.int64(0)}, id="np-dim"),
        pytest.param({"k_steps": np.int64(2)}, id="np-k_steps"),
        pytest.param({"bucket_size_mb": 1e300}, id="huge-cap"),
        pytest.param({"dim": 0, "k_steps": 2}, id="int-dim"),
    ],
)
def test_valid_arguments_of_other_types(kwargs):
    """Positive sizes (an infinite cap: no cap) and integer dims and k_steps, numpy ones
    included, are accepted: the model's two gradients in one bucket."""
    assert every_rank(dt.simulate(2, construct, kwargs)) == ("ok", [2])


def dropped_wrapper():
    mesh = dp_mesh(2).mesh()
    model = dt.shard_layer(dt.nn.Linear(4, 2, dtype=np.float64, seed=1), mesh)
    dp_model = dt.DataParallel(model, mesh)
    del dp_model
    gc.collect()
    x = dt.shard_tensor(np.ones((4, 4)), mesh, [dt.Shard(0)])
    y = dt.shard_tensor(np.zeros((4, 2)), mesh, [dt.Shard(0)])
    with dt.CommCounter() as cc:
        dt.nn.MSELoss()(model(x), y).backward()
    return cc.counts, model.weight.grad.placements


def test_a_dropped_wrapper_stops():
    """A wrapper that is garbage collected stops reducing (its hooks hold it weakly)."""
    counts, placements = every_rank(dt.simulate(2, dropped_wrapper))
    assert counts == {} and placements == [dt.Partial()]


# -- under mpiexec ------------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_under_mpiexec(n):
    """The grid, the edge cases, the layout and the errors on the 1-D mesh of n ranks, and on
    4 ranks the 2x2 dp x mp mesh: MPI's non-blocking in-place all-reduce, started during
    backward. A failing check raises on its rank and ends the job (non-zero exit)."""
    code, out = run(n, ["tests/dp_cases.py"], timeout=120)
    assert code == 0, out
    assert f"{len(MPI_CASES)} passed, 0 failed" in out, out
    ran = {line.split()[1]: line for line in out.splitlines() if line.startswith("PASS ")}
    assert sorted(ran) == sorted(c.__name__ for c in MPI_CASES), out
    assert ran["case_dp_mp"].endswith(" 0 checks)") == (n != 4), out  # 2x2 needs 4 ranks
