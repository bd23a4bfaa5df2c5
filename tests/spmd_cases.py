"""SPMD test cases: each ``case_*(world)`` runs on every rank of a world of that size.

The same functions run on simulated ranks (tests/test_spmd_sim.py, large grids) and under
``mpiexec`` (tests/mpi_runner.py, smaller grids). Oracle: numpy on the global value, and
tests/oracle.py (independent of spec.py and reshard.py) for each rank's box and the number of
collectives: the inputs are built and the outputs checked without the code under test.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from oracle import coord_of, local_box, reshard_count, reshard_kinds

import disttensor as dt

S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
PARTIALS = [dt.Partial(t) for t in ("sum", "avg", "max", "min")]
DTYPES = [np.float32, np.float64, np.int64, np.bool_]


def meshes(world: int, shapes=((1,), (2,), (3,), (4,), (2, 2), (2, 3), (3, 2))):
    """Meshes over the first ranks of the world (the others stay outside the mesh)."""
    for shape in shapes:
        n = math.prod(shape)
        if n <= world:
            yield dt.ProcessMesh(np.arange(n).reshape(shape), [f"m{i}" for i in range(len(shape))])


def shapes_for(k: int, ndim: int = 2) -> list[tuple[int, ...]]:
    """Even, two uneven, fewer elements than ranks (empty shards), and zero-size."""
    if ndim == 1:
        return [(k * 2,), (k * 3 + 1,), (k * 3 + 2,), (max(k - 1, 1),), (0,)]
    return [(k * 2, 4), (k * 3 + 1, 5), (k * 3 + 2, k + 1), (1, 2), (0, 3)]


def global_value(shape, dtype, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.normal(0, 3, shape).astype(dtype)


def split_partial(v: np.ndarray, op: str, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """k asymmetric local values whose ``op`` reduction is v (no wrong rule passes by luck)."""
    if k == 1:
        return [v.copy()]
    shape, boolean = v.shape, v.dtype == np.bool_
    owner = rng.integers(0, k, shape)  # which rank holds the exact value (max/min/bool)
    if boolean:
        noise = [rng.random(shape) < 0.5 for _ in range(k)]
        if op == "min":  # logical and: the others may only add True
            return [np.where(owner == i, v, v | noise[i]) for i in range(k)]
        return [np.where(owner == i, v, v & noise[i]) for i in range(k)]  # or: only remove
    integer = np.issubdtype(v.dtype, np.integer)

    def noise():
        return rng.integers(1, 6, shape) if integer else rng.uniform(0.5, 2.0, shape)

    if op in ("sum", "avg"):
        target = v * k if op == "avg" else v
        parts = [(noise() * rng.choice([-1, 1], shape)).astype(v.dtype) for _ in range(k - 1)]
        parts.append((target - sum(parts)).astype(v.dtype))
        return parts
    sign = -1 if op == "max" else 1
    return [np.where(owner == i, v, v + sign * noise()).astype(v.dtype) for i in range(k)]


def make_source(
    g: np.ndarray, mesh: dt.ProcessMesh, placements, seed: int = 1, split=split_partial
) -> dt.DistTensor:
    """A DistTensor of global value g whose Partial mesh dims hold asymmetric ``split``s.

    Each rank's shard is cut by tests/oracle.py, not by the library's layout code.
    """
    coord = coord_of(mesh.mesh, dt.get_rank())
    v = g
    if coord is not None:
        for m, p in enumerate(placements):  # outermost first: Note [Partial order]
            if p.is_partial():
                rng = np.random.default_rng([seed, m, *coord[:m]])
                v = split(v, p.reduce_type, mesh.shape[m], rng)[coord[m]]
    box = local_box(g.shape, mesh.shape, tuple(placements), coord)
    return dt.dtensor_from_local(v[box].copy(), mesh, placements, global_shape=g.shape)


def assert_value(got: np.ndarray, want: np.ndarray, exact: bool, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, got.dtype)
    if exact or want.dtype.kind in "biu":
        assert np.array_equal(got, want), what
    else:
        tol = {np.float16: 5e-3, np.float32: 1e-4}.get(want.dtype.type, 1e-10)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 8, err_msg=what)


def check_reshard(g, mesh, src, dst, counts: bool = True) -> None:
    """Reshard g from src to dst on mesh; check the shard, the global value and collectives."""
    rank = dt.get_rank()
    x = make_source(g, mesh, src)
    what = f"{mesh.shape} {g.shape} {g.dtype} {src} -> {dst}"
    with dt.CommCounter() as cc:
        y = dt.reshard(x, mesh, dst)
    assert y.placements == list(dt.DistSpec.make(mesh, dst, g.shape, g.dtype).placements), what
    coord = coord_of(mesh.mesh, rank)
    if coord is None:
        assert cc.total == 0 and y.local_shape == (0,) * y.ndim, what
        return
    exact = not any(p.is_partial() for p in list(src) + list(dst))
    box = local_box(g.shape, mesh.shape, tuple(dst), coord)
    assert y.local_shape == g[box].shape, what
    if not any(p.is_partial() for p in dst):  # the shard itself, no communication involved
        assert_value(y.to_local(), g[box], exact, what)
    assert_value(y.numpy(), g, exact, what)
    if counts:
        key = (mesh.shape, tuple(src), tuple(dst))
        want = reshard_count(*key, g.ndim)  # the planner takes the minimum, everywhere
        assert cc.total == want, (what, cc.counts, want)
        kinds = reshard_kinds(*key, g.ndim)  # no ordering constraint: the 1-D table, per dim
        if kinds is not None:
            assert cc.counts == kinds, (what, cc.counts, kinds)


def placements_1d(dtype, ndim=2):
    opts = [dt.Shard(d) for d in range(ndim)] + [R] + PARTIALS
    if np.dtype(dtype).kind not in "fc":
        opts = [p for p in opts if p != dt.Partial("avg")]
    return [[p] for p in opts]


def placements_nd(mesh_ndim, dtype, ndim=2):
    opts = [dt.Shard(d) for d in range(ndim)] + [R, dt.Partial("sum"), dt.Partial("max")]
    return [list(p) for p in itertools.product(opts, repeat=mesh_ndim)]


def case_reshard_grid(
    world: int,
    dtypes=DTYPES,
    nd_dtypes=(np.float64, np.int64),
    mesh_shapes=((1,), (2,), (3,), (4,), (2, 2), (2, 3), (3, 2)),
    nd_shapes: int = 5,
) -> int:
    """Every (source, target) placement pair on every mesh that fits, for awkward shapes."""
    n = 0
    for mesh in meshes(world, mesh_shapes):
        k = max(mesh.shape)
        for dtype in dtypes if mesh.ndim == 1 else nd_dtypes:
            grid = placements_1d(dtype) if mesh.ndim == 1 else placements_nd(mesh.ndim, dtype)
            for shape in shapes_for(k)[: 5 if mesh.ndim == 1 else nd_shapes]:
                g = global_value(shape, dtype, seed=n)
                for src, dst in itertools.product(grid, grid):
                    check_reshard(g, mesh, src, dst)
                    n += 1
    return n


def case_reshard_other_ndims(world: int) -> int:
    """1-D, 3-D and 0-d tensors, nested shards of one axis, three-dim meshes."""
    n = 0
    for mesh in meshes(world, ((2,), (3,), (2, 2))):
        k = max(mesh.shape)
        for shape in shapes_for(k, ndim=1) + [(2, k + 1, 3), (k * 2 + 1, 1, 2)]:
            g = global_value(shape, np.float64, seed=n)
            opts = [dt.Shard(d) for d in range(len(shape))] + [R, dt.Partial("sum")]
            grid = [list(p) for p in itertools.product(opts, repeat=mesh.ndim)]
            for src, dst in itertools.product(grid, grid):
                check_reshard(g, mesh, src, dst)
                n += 1
        g = np.float64(3.5) * np.ones(())
        for src, dst in itertools.product([[R] * mesh.ndim, [dt.Partial()] * mesh.ndim], repeat=2):
            check_reshard(g, mesh, src, dst)
    if world >= 8:
        mesh = dt.ProcessMesh(np.arange(8).reshape(2, 2, 2))
        g = global_value((9, 5), np.float64)
        for src, dst in [
            ([S0, S0, S0], [S1, S1, S1]),
            ([S0, dt.Partial(), S1], [R, S0, S0]),
            ([dt.Partial("max"), dt.Partial(), S0], [S1, R, S0]),
        ]:
            check_reshard(g, mesh, src, dst)
    return n


def case_nd_collective_counts(world: int) -> None:
    """Canonical N-D plans use exactly the collectives one would write by hand."""
    if world < 4:
        return
    mesh = dt.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"])
    g = global_value((9, 6), np.float32)
    cases = [
        ([S0, S1], [R, S1], {"all_gather": 1}),
        ([S0, S1], [S0, R], {"all_gather": 1}),
        ([S0, S1], [R, R], {"all_gather": 2}),
        ([dt.Partial(), S1], [R, S1], {"all_reduce": 1}),
        ([dt.Partial(), dt.Partial()], [R, R], {"all_reduce": 2}),
        ([dt.Partial(), R], [S0, R], {"reduce_scatter": 1}),
        ([S0, R], [S0, S1], {}),
        ([R, R], [dt.Partial(), S0], {}),
        ([S0, S0], [S0, R], {"all_gather": 1}),
        ([S0, S1], [S1, S0], {"all_gather": 1, "all_to_all": 1}),
    ]
    for src, dst, want in cases:
        x = make_source(g, mesh, src)
        with dt.CommCounter() as cc:
            y = dt.reshard(x, mesh, dst)
        if dt.get_rank() in mesh:
            assert cc.counts == want, (src, dst, cc.counts)
            assert_value(y.numpy(), g, False, f"{src} -> {dst}")


def case_cross_mesh(world: int) -> int:
    """Moving a tensor to another mesh (send/recv), Partial on either side."""
    rank, n = dt.get_rank(), 0
    pairs = []
    if world >= 2:
        pairs.append((dt.ProcessMesh([0]), dt.ProcessMesh([1])))
        pairs.append((dt.ProcessMesh([0, 1]), dt.ProcessMesh([1, 0])))
    if world >= 3:
        pairs.append((dt.ProcessMesh([0, 1]), dt.ProcessMesh([2])))
        pairs.append((dt.ProcessMesh([0, 1, 2]), dt.ProcessMesh([2, 0])))
    if world >= 4:
        pairs.append((dt.ProcessMesh([0, 1]), dt.ProcessMesh([2, 3])))
        pairs.append((dt.ProcessMesh([[0, 1], [2, 3]]), dt.ProcessMesh([3, 2, 1, 0])))
        pairs.append((dt.ProcessMesh([3, 1, 2]), dt.ProcessMesh([[0, 2], [1, 3]])))
    for a, b in pairs:
        for shape in [(7, 3), (2, 5), (1, 1)]:
            g = global_value(shape, np.float64, seed=n)
            for src in [[S0], [S1], [R], [dt.Partial()], [dt.Partial("max")]]:
                src = (src * a.ndim)[: a.ndim]
                for dst in [[S0], [S1], [R], [dt.Partial()]]:
                    dst = (dst * b.ndim)[: b.ndim]
                    x = make_source(g, a, src)
                    y = dt.reshard(x, b, dst)
                    if rank in b:
                        assert_value(y.numpy(), g, False, f"{a} {src} -> {b} {dst}")
                    else:
                        assert y.local_shape == (0,) * y.ndim
                    n += 1
    return n


def case_print(world: int) -> None:
    """print shows the global value like numpy; above the threshold only shown items move."""
    mesh = next(m for m in meshes(world, ((4,), (3,), (2,), (1,))))
    for shape, placements in [
        ((5, 3), [S0]),
        ((200, 300), [S1]),
        ((40, 30, 20), [dt.Partial()]),
        ((2000,), [S0]),
        ((0, 4), [S1]),
    ]:
        g = global_value(shape, np.float64)
        x = make_source(g, mesh, placements)
        with dt.CommCounter() as cc:
            text = repr(x)
        if dt.get_rank() not in mesh:
            assert "<not on this rank>" in text
            continue
        want = np.array2string(g, separator=", ", prefix="DistTensor(")
        body = text[len("DistTensor(") : text.index(", shape=")]
        assert body == want, (body, want)
        assert f"placements={x.placements}" in text and f"shape={shape}" in text
        assert str(x) == text
        if g.size > 1000:  # summarized: only the shown corners travel
            assert cc.total_bytes < 64 * 1024, cc.bytes
        assert np.array_equal(np.asarray(x), x.numpy())
    for mesh in meshes(world, ((2, 2), (2, 3))):
        for placements in ([dt.Partial("max"), S1], [S0, dt.Partial()], [R, S0], [S1, S1]):
            g = global_value((300, 7, 5), np.float64)
            x = make_source(g, mesh, placements)
            text = repr(x)
            if dt.get_rank() in mesh:
                body = text[len("DistTensor(") : text.index(", shape=")]
                assert body == np.array2string(g, separator=", ", prefix="DistTensor(")


def case_random_global_view(world: int) -> None:
    """rand/randn with a seed: the same global values on every mesh and placement."""
    ref_u = (
        dt.rand((7, 5), seed=11, mesh=dt.ProcessMesh([0])).to_local()
        if dt.get_rank() == 0
        else None
    )
    for mesh in meshes(world, ((2,), (3,), (2, 2))):
        for placements in itertools.product([S0, S1, R], repeat=mesh.ndim):
            u = dt.rand((7, 5), seed=11, mesh=mesh, placements=list(placements))
            z = dt.randn((7, 5), seed=11, mesh=mesh, placements=list(placements))
            if dt.get_rank() in mesh:
                uu = u.numpy()
                assert np.array_equal(z.numpy(), dt.randn((7, 5), seed=11, mesh=mesh).numpy())
                if ref_u is not None:
                    assert np.array_equal(uu, ref_u)


def case_dtensor_from_local(world: int) -> None:
    """Global shape from uneven pieces, on 1-D and 2-D meshes."""
    for mesh in meshes(world, ((2,), (3,), (4,), (2, 2))):
        g = global_value((2 * mesh.size + 1, 3), np.float32)
        for placements in itertools.product([S0, S1, R], repeat=mesh.ndim):
            coord = coord_of(mesh.mesh, dt.get_rank())
            if coord is None:
                continue
            box = local_box(g.shape, mesh.shape, placements, coord)
            x = dt.dtensor_from_local(g[box], mesh, list(placements))
            assert x.shape == g.shape and x.dtype == g.dtype
            assert np.array_equal(x.numpy(), g)


def case_comm_layer(world: int) -> None:
    """Every collective of the communicator interface, uneven counts, awkward dtypes."""
    from disttensor import comm

    w = comm.world()
    rank, n = w.rank, w.size
    counts = [(i % 3) for i in range(n)]  # uneven, with empty contributions
    for dtype in (np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_):
        mine = global_value((n, 5), dtype, seed=3)  # row i is rank i's contribution
        want = {"sum": mine.sum(0), "max": mine.max(0), "min": mine.min(0)}
        if dtype == np.bool_:
            want["sum"] = mine.any(0)
        for op, ref in want.items():
            out = np.empty(5, dtype)
            w.allreduce(mine[rank].copy(), out, op)
            assert_value(out, ref.astype(dtype), False, f"allreduce {op} {dtype}")
            work = w.iallreduce(mine[rank].copy(), out2 := np.empty(5, dtype), op)
            work.wait()
            assert work.is_completed() and np.array_equal(out, out2)
        if dtype not in (np.bool_,) and np.dtype(dtype).kind == "f":
            out = np.empty(5, dtype)
            w.allreduce(mine[rank].copy(), out, "avg")
            assert_value(out, (mine.astype(np.float64).mean(0)).astype(dtype), False, "avg")
        # all-gather with uneven counts
        send = np.full(counts[rank], rank, dtype)
        out = np.empty(sum(counts), dtype)
        w.allgather(send, out, counts)
        assert np.array_equal(
            out, np.concatenate([np.full(c, i, dtype) for i, c in enumerate(counts)])
        )
        work = w.iallgather(send, out2 := np.empty_like(out), counts)  # non-blocking
        work.wait()
        assert work.is_completed() and np.array_equal(out, out2)
        for bc in ([700] * n, [700 + (i % 2) for i in range(n)]):  # past the envelope: MPI's
            bsend = np.full(bc[rank], rank, dtype)  # own call, equal and uneven parts
            outs = [np.empty(sum(bc), dtype) for _ in range(2)]
            works = [w.iallgather(bsend, o, bc) for o in outs]  # two in flight
            for work in works:
                work.wait()
            want_big = np.concatenate([np.full(c, i, dtype) for i, c in enumerate(bc)])
            assert all(np.array_equal(o, want_big) for o in outs)
        # reduce-scatter with uneven counts
        full = global_value((n, sum(counts)), dtype, seed=4)
        out = np.empty(counts[rank], dtype)
        w.reduce_scatter(full[rank].copy(), out, counts, "max")
        start = sum(counts[:rank])
        assert np.array_equal(out, full.max(0)[start : start + counts[rank]])
        work = w.ireduce_scatter(full[rank].copy(), out2 := np.empty_like(out), counts, "max")
        work.wait()
        assert work.is_completed() and np.array_equal(out, out2)
        big = global_value((n, 3000), dtype, seed=5)  # past the envelope: MPI's own call
        bigc = [3000 // n + (1 if i < 3000 % n else 0) for i in range(n)]
        out3 = np.empty(bigc[rank], dtype)
        w.ireduce_scatter(big[rank].copy(), out3, bigc, "max").wait()
        s3 = sum(bigc[:rank])
        assert np.array_equal(out3, big.max(0)[s3 : s3 + bigc[rank]])
        # all-to-all: rank i sends (i + j) % 3 + 1 copies of 10 * i + j to rank j
        sc = [(rank + j) % 3 + 1 for j in range(n)]
        send = np.concatenate([np.full(c, 10 * rank + j, dtype) for j, c in enumerate(sc)])
        rc = [(i + rank) % 3 + 1 for i in range(n)]
        out = np.empty(sum(rc), dtype)
        w.alltoall(send, sc, out, rc)
        want_a2a = np.concatenate([np.full(c, 10 * i + rank, dtype) for i, c in enumerate(rc)])
        assert np.array_equal(out, want_a2a)
        # broadcast from the last rank, send/recv around a ring
        buf = mine[n - 1].copy() if rank == n - 1 else np.empty(5, dtype)
        w.broadcast(buf, root=n - 1)
        assert np.array_equal(buf, mine[n - 1])
        if n > 1:
            out = np.empty(5, dtype)
            recv = w.irecv(out, (rank - 1) % n, tag=3)
            w.isend(mine[rank].copy(), (rank + 1) % n, tag=3).wait()
            recv.wait()
            assert np.array_equal(out, mine[(rank - 1) % n])
            got = np.empty(5, dtype)  # the same ring in one call per rank
            w.sendrecv(mine[rank].copy(), (rank + 1) % n, got, (rank - 1) % n, tag=4)
            assert np.array_equal(got, mine[(rank - 1) % n])
            # a chain, as a halo's: the first rank only receives, the last only sends; each
            # call counted as its send
            first, last = rank == 0, rank == n - 1
            got = None if last else np.empty(5, dtype)
            with dt.CommCounter() as cc:
                w.sendrecv(None if first else mine[rank].copy(), None if first else rank - 1,
                           got, None if last else rank + 1, tag=5)  # fmt: skip
            assert cc.counts == ({} if first else {"send": 1}), cc.counts
            assert last or np.array_equal(got, mine[rank + 1])
    # sub-communicators along a mesh dim are cached, collective over members only
    if n >= 4:
        mesh = dt.ProcessMesh([[0, 1], [2, 3]])
        if rank < 4:
            g = comm.group(mesh.group_ranks(1, rank))
            assert g is comm.group(mesh.group_ranks(1, rank)) and g.size == 2
            out = np.empty(1, np.int64)
            g.allreduce(np.array([rank]), out, "sum")
            assert out[0] == sum(mesh.group_ranks(1, rank))
    w.barrier()


def case_planned_moves(world: int) -> int:
    """A move made again and again with new values of one spec, as an iterative program's
    loop makes it (Note [Planned moves] in disttensor/reshard.py): every repetition gives the
    placements, shard, global value and collectives ``check_reshard`` wants, on meshes of 2,
    3 and 4 ranks and (2, 2), even, uneven and empty shards, every reduce op and awkward
    dtypes. Under MPI the moves whose collective rides in the check's envelope are planned
    after their first execution, so the later repetitions take the planned path (asserted);
    simulated ranks take the general one."""
    from disttensor import comm
    from disttensor.reshard import move

    mpi = comm.world().backend == "mpi"
    checks = 0
    for mesh in meshes(world, ((2,), (3,), (4,), (2, 2))):
        k = mesh.shape[0]
        moves = []  # (src, dst, shape, whether the move is planned under MPI)
        for op in ("sum", "avg", "max", "min"):
            for shape in ((), (3,), (k + 1, 2)):
                moves.append(([dt.Partial(op)], [R], shape, True))
        for shape in ((k * 2,), (k * 3 + 1,), (max(k - 1, 1),), (0,)):
            moves.append(([S0], [R], shape, True))
        moves.append(([S0], [R], (k + 1, 2), False))  # not a vector: the general path
        if mesh.ndim == 2:  # a step on either mesh dim: a group of its own
            moves = [(src + [R], dst + [R], shape, p) for src, dst, shape, p in moves[::2]]
            moves.append(([R, S0], [R, R], (5,), True))
            moves.append(([R, dt.Partial("max")], [R, R], (2,), True))
        for dtype in (np.float64, np.float32, np.int64, np.bool_, np.float16, np.complex128):
            for src, dst, shape, planned in moves:
                ops = {p.reduce_type for p in src if p.is_partial()}
                if ("avg" in ops and np.dtype(dtype).kind not in "fc") or (
                    ops & {"max", "min"} and dtype == np.complex128
                ):
                    continue
                for seed in range(3):
                    g = global_value(shape, dtype, seed=seed)
                    check_reshard(g, mesh, src, dst)
                    checks += 1
                spec = dt.DistSpec.make(mesh, src, shape, dtype)
                how = move(spec, dt.DistSpec.make(mesh, dst, shape, dtype))
                if mpi and dt.get_rank() in mesh and planned:
                    assert how.direct, (mesh.shape, src, shape, dtype, how.direct)
                elif not mpi:
                    assert not how.direct, (mesh.shape, src, shape, dtype)
        if mpi:  # planned moves with the check off (a process-wide setting: MPI only)
            from disttensor.comm import agree

            before = agree.set_checks(False)
            try:
                for src, dst, shape, _ in moves[:2] + moves[-2:]:
                    check_reshard(global_value(shape, np.float64, seed=7), mesh, src, dst)
                    checks += 1
            finally:
                agree.set_checks(*before)
    if mpi and world > 1:  # a move first made in debug mode, on a group that has no
        # envelope yet (its ranks in another order), is planned at a later execution
        from disttensor.comm import agree

        mesh = dt.ProcessMesh(list(range(world))[::-1])
        src, dst = [dt.Partial()], [R]
        before = agree.set_checks(True, True)
        try:
            check_reshard(global_value((7,), np.float64), mesh, src, dst)
        finally:
            agree.set_checks(*before)
        for seed in range(2):
            check_reshard(global_value((7,), np.float64, seed=seed), mesh, src, dst)
        spec, whole = (dt.DistSpec.make(mesh, p, (7,), np.float64) for p in (src, dst))
        assert move(spec, whole).direct
        checks += 3
    return checks


ALL = [
    case_comm_layer,
    case_planned_moves,
    case_reshard_grid,
    case_reshard_other_ndims,
    case_nd_collective_counts,
    case_cross_mesh,
    case_print,
    case_random_global_view,
    case_dtensor_from_local,
]
