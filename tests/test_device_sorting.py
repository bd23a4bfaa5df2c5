"""Sorting, unique and order statistics on device shards (disttensor/ops/sorting.py,
disttensor/ops/unique.py, disttensor/ops/order_stats.py; Note [Array backends]).

The device is tests/fake_device.py's stand-in for CuPy ("fake"): arrays that refuse numpy as
CuPy's do. Each program runs on simulated ranks twice, on "cpu" and on "fake" (every rank
selects the device first), and the two runs must agree call by call: the global values
(bit for bit, since the stand-in computes with numpy; where numpy itself leaves a choice,
which of -0.0 and 0.0 represents a tie, up to the sign of a zero), the placements, the
collectives (kinds, numbers and bytes, by dt.CommCounter; no replicate fallback), and every
result shard is a FakeArray on the device (a numpy array on the host). The host runs are
checked against numpy by tests/test_sorting.py and tests/test_scan_stats.py; a few cases
here compare the device's global values with numpy directly too.

Meshes (1), (2), (3), (4), (2, 2); even, uneven, empty and zero-size shards; Shard of the
op's axis, of another axis, nested shards, Replicate and Partial inputs; the distributed
sort and selection forced on (as the short test lanes would be gathered) and the gathering
paths as they are; sort's gradient against the host run's.
"""

from __future__ import annotations

import fake_device
import numpy as np
import pytest
from op_cases import PSUM, S0, S1, every_rank, make_input, mesh_of, same
from test_sorting import complex_ties, ties

import disttensor as dt
from disttensor.ops import order_stats, sorting

R = dt.Replicate()
FAKE = fake_device.install()
MESHES = [(1,), (2,), (3,), (4,), (2, 2)]
METHODS = sorted(order_stats._QUANTILE_METHODS)  # every method numpy (and dt) has


def _placements(mesh) -> list[list]:
    """Shard of axis 0 (the sorted one in most calls), of axis 1, Replicate, Partial; on 2-D
    meshes split over both mesh dims, nested, and a Partial beside a split."""
    if mesh.ndim == 1:
        return [[S0], [S1], [R], [PSUM]]
    return [[S0, S1], [S0, S0], [R, S1], [PSUM, S0]]


def _shapes(mesh) -> dict[str, tuple[int, int]]:
    s = mesh.size
    return {"even": (2 * s, 3), "uneven": (2 * s + 1, 3), "empty": (max(s - 1, 1), 2)}


class Run:
    """One program's calls on this rank: per call its name, the global values of its results,
    their placements and shard types, and its collectives."""

    def __init__(self, mesh) -> None:
        self.mesh, self.records = mesh, []

    def __call__(self, what: str, fn, *args, canon=None, **kwargs):
        """``fn(*args, **kwargs)``, recorded (``canon``: the global values made canonical)."""
        with dt.CommCounter() as cc:
            out = fn(*args, **kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        values = [o.numpy() for o in outs] if dt.get_rank() in self.mesh else None
        self.records.append(
            (
                what,
                canon(values) if canon and values else values,
                [o.placements for o in outs],
                {type(o.to_local()) for o in outs},
                cc.counts,
                cc.bytes,
                cc.fallbacks,
            )
        )
        return out


def _on(device: str, mesh_shape, program, world: int | None, *args) -> list:
    """``program(mesh, run, *args)`` on ranks that select ``device`` first: every rank's
    records."""
    mesh = mesh_of(mesh_shape)

    def rank():
        dt.set_device(device)
        run = Run(mesh)
        program(mesh, run, *args)
        return run.records

    return dt.simulate(world or mesh.size, rank)


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    """``same`` (dtype, shape, values, NaNs where b's), and the signs of zeros too."""
    if not same(a, b):
        return False
    parts = (a.real, b.real, a.imag, b.imag) if a.dtype.kind == "c" else (a, b)
    return a.dtype.kind not in "fc" or all(
        np.array_equal(np.signbit(x), np.signbit(y)) for x, y in zip(parts[::2], parts[1::2])
    )


def _loose(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and values with NaNs equal, the sign of a zero aside."""
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


def _compare(host: list, dev: list, loose=()) -> int:
    """One rank's records of a program on the host and on the device: call by call the same
    values, placements and collectives, shards of the device's type (Run)."""
    assert len(host) == len(dev) > 0
    for h, d in zip(host, dev):
        what = d[0]
        assert h[0] == what
        assert d[3] == {fake_device.FakeArray} and h[3] == {np.ndarray}, (what, d[3], h[3])
        assert d[2] == h[2], (what, d[2], h[2])
        assert d[4:] == h[4:], (what, "collectives", d[4:], h[4:])
        assert d[6] == {}, (what, "fallback", d[6])
        if d[1] is None:  # a rank outside the mesh
            continue
        exact = not any(what.startswith(p) for p in loose)
        for a, b in zip(d[1], h[1]):
            assert _identical(a, b) if exact else _loose(a, b), (what, a, b)
    return len(dev)


def _assert_same_runs(mesh_shape, program, *args, loose=(), world=None) -> int:
    """The program on the host and on the device, rank by rank the same (``_compare``)."""
    host = _on("cpu", mesh_shape, program, world, *args)
    dev = _on("fake", mesh_shape, program, world, *args)
    return min(_compare(h, d, loose) for h, d in zip(host, dev))


@pytest.fixture(params=["gathering", "distributed"])
def paths(request, monkeypatch):
    """The short test lanes take the gathering paths as they are, or the distributed sort and
    selection forced on."""
    if request.param == "distributed":
        monkeypatch.setattr(sorting, "_distributes", lambda *args: True)
        monkeypatch.setattr(order_stats, "_selects", lambda *args: True)
    return request.param


# -- sort, argsort ---------------------------------------------------------------------------------
def _sorts(mesh, run):
    rng = np.random.default_rng(mesh.size)
    for kind, shape in _shapes(mesh).items():
        g = ties(shape, rng)
        for i, pl in enumerate(_placements(mesh)):
            x = make_input(g, mesh, pl, seed=i)
            for axis in (0, 1, None):
                run(f"sort {kind} {pl} axis={axis}", dt.sort, x, axis=axis)
                run(f"argsort {kind} {pl} axis={axis}", dt.argsort, x, axis=axis)
    shape = _shapes(mesh)["uneven"]
    others = {
        "int64": rng.integers(-3, 4, shape),
        "bool": rng.random(shape) < 0.5,
        "uint8": rng.integers(0, 3, shape).astype(np.uint8),
        "float32": ties(shape, rng).astype(np.float32),
        "complex128": complex_ties(shape, rng),
        "complex64": complex_ties(shape, rng).astype(np.complex64),
    }
    for name, g in others.items():
        x = make_input(g, mesh, _placements(mesh)[0])
        run(f"argsort {name} axis=0", dt.argsort, x, axis=0)
        run(f"sort {name} axis=None", dt.sort, x, axis=None)
    z = make_input(np.zeros((0, 3)), mesh, _placements(mesh)[0])
    run("sort zero-size", dt.sort, z, axis=0)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_sort_and_argsort(mesh_shape, paths):
    assert _assert_same_runs(mesh_shape, _sorts) >= 80


def _sort_numpy(mesh):
    dt.set_device("fake")
    g = ties((2 * mesh.size + 1, 4), np.random.default_rng(3))
    x = make_input(g, mesh, [S0] * mesh.ndim)
    out = [dt.sort(x, axis=0), dt.argsort(x, axis=None), dt.sort(x, axis=1)]
    assert {type(o.to_local()) for o in out} == {fake_device.FakeArray}
    return g, [o.numpy() for o in out]


@pytest.mark.parametrize("mesh_shape", [(3,), (2, 2)], ids=str)
def test_sort_on_device_is_numpys_stable_sort(mesh_shape, paths):
    mesh = mesh_of(mesh_shape)
    g, got = every_rank(dt.simulate(mesh.size, _sort_numpy, mesh))
    want = [
        np.sort(g, axis=0, kind="stable"),
        np.argsort(g, axis=None, kind="stable"),
        np.sort(g, axis=1, kind="stable"),
    ]
    for a, b in zip(got, want):
        assert _identical(a, b), (a, b)


# -- searchsorted ----------------------------------------------------------------------------------
def _searches(mesh, run):
    rng = np.random.default_rng(5)
    s = mesh.size
    v = np.array([[-9.0, -0.0, 2.0], [2.5, 4.0, np.nan]])
    for n in (3 * s + 1, max(s - 1, 1), 0):
        a = np.sort(rng.integers(-4, 5, n).astype(float))
        for pa in _placements(mesh):
            if any(p == S1 for p in pa):
                continue
            x = make_input(a, mesh, pa)
            for pv in [_placements(mesh)[0], [R] * mesh.ndim, [S1] * mesh.ndim]:
                vv = make_input(v, mesh, pv)
                for side in ("left", "right"):
                    run(f"searchsorted n={n} {pa} {pv} {side}", dt.searchsorted, x, vv, side)
            run(f"searchsorted n={n} {pa} host values", dt.searchsorted, x, [0.5, 2.0, 9.0])
            run(f"searchsorted n={n} {pa} scalar", dt.searchsorted, x, 2.0, "right")
    ints = make_input(np.array([-3, 0, 0, 2, 7, 7, 9]), mesh, [S0] * mesh.ndim)
    v = make_input(np.arange(-4, 11), mesh, [R] * mesh.ndim)
    run("searchsorted int64", dt.searchsorted, ints, v)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_searchsorted(mesh_shape):
    assert _assert_same_runs(mesh_shape, _searches) >= 45


def _mixed(mesh):
    dt.set_device("fake")
    a = make_input(np.arange(6.0), mesh, [S0])
    host = make_input(np.arange(3.0), mesh, [R]).to_device("cpu")
    with dt.CommCounter() as cc, pytest.raises(TypeError, match="different devices") as e:
        dt.searchsorted(a, host)
    with pytest.raises(TypeError, match="different devices"):
        dt.searchsorted(host, a.to_local())  # a device array among host tensors
    got = dt.searchsorted(fake_device.MODULE.asarray(np.arange(6.0)), host.to_device("fake"))
    return cc.counts, str(e.value), type(got.to_local()), got.numpy().tolist()


def test_searchsorted_refuses_host_and_device_tensors_together():
    counts, message, kind, got = every_rank(dt.simulate(2, _mixed, mesh_of((2,))))
    assert counts == {} and "(fake and numpy)" in message
    assert kind is fake_device.FakeArray and got == [0, 1, 2]


# -- unique ----------------------------------------------------------------------------------------
FLAGS = [(True, True, True), (False, False, False), (False, True, False), (False, False, True)]


def _uniques(mesh, run):
    rng = np.random.default_rng(11)
    s = mesh.size
    sets = {
        "ties": ties((2 * s + 1, 3), rng),
        "wide": (rng.permutation(6 * s) % (3 * s + 1)).reshape(3 * s, 2),  # a split result
        "empty": ties((max(s - 1, 1),), rng),
        "complex": complex_ties((2 * s + 1,), rng),
        "zero": np.zeros((0,)),
    }
    few = [[S0] * mesh.ndim, [R] * mesh.ndim]
    for name, g in sets.items():
        for i, pl in enumerate(_placements(mesh) if name in ("ties", "wide") else few):
            if g.ndim == 1 and any(p == S1 for p in pl):
                continue
            x = make_input(g, mesh, pl, seed=i)
            for flags in FLAGS if name in ("ties", "wide") else FLAGS[:2]:
                for equal_nan in (True, False) if name in ("ties", "complex") else (True,):
                    what = f"unique {flags} equal_nan={equal_nan} {name} {pl}"
                    canon = None if equal_nan else _nan_groups(flags)
                    run(what, dt.unique, x, *flags, equal_nan=equal_nan, canon=canon)


def _nan_groups(flags):
    """The inverse of equal_nan=False with the NaN items' groups masked: each NaN is a group
    of its own, which numpy's own unique (the host's whole tensors) numbers as its sort left
    the NaNs, the device in their order."""

    def canon(values: list) -> list:
        if flags[1]:
            unique, inverse = values[0], values[1 + flags[0]]
            values[1 + flags[0]] = np.where(np.isnan(unique[inverse]), -1, inverse)
        return values

    return canon


# numpy's own unique (the host's whole tensors) picks any of -0.0 and 0.0 for a group without
# return_index (and numbers the NaNs of equal_nan=False as its sort left them: _nan_groups);
# the device's takes the first occurrence (Note [Unique of split data])
UNIQUE_LOOSE = ("unique (False",)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_unique(mesh_shape, paths):
    assert _assert_same_runs(mesh_shape, _uniques, loose=UNIQUE_LOOSE) >= 60


def _unique_numpy(mesh):
    dt.set_device("fake")
    g = ties((4 * mesh.size + 1,), np.random.default_rng(2))
    x = make_input(g, mesh, [S0] * mesh.ndim)
    got = dt.unique(x, return_index=True, return_inverse=True, return_counts=True)
    assert {type(o.to_local()) for o in got} == {fake_device.FakeArray}
    return g, [o.numpy() for o in got]


@pytest.mark.parametrize("mesh_shape", [(1,), (3,)], ids=str)
def test_unique_on_device_is_numpys(mesh_shape, paths):
    mesh = mesh_of(mesh_shape)
    g, got = every_rank(dt.simulate(mesh.size, _unique_numpy, mesh))
    want = np.unique(g, return_index=True, return_inverse=True, return_counts=True)
    for a, b in zip(got, want):
        assert _identical(a, b), (a, b)


# -- median, quantile, percentile ------------------------------------------------------------------
def _orders(mesh, run, methods):
    rng = np.random.default_rng(7)
    for kind, shape in _shapes(mesh).items():
        small = rng.integers(-3, 4, shape).astype(float)
        nans = ties(shape, rng)  # NaN, infinities, -0.0 beside 0.0
        for i, pl in enumerate(_placements(mesh)):
            x = make_input(small, mesh, pl, seed=i)
            y = make_input(nans, mesh, pl, seed=i)
            for axis, keep in ((None, False), (0, True), (1, False)):
                run(f"median {kind} {pl} axis={axis}", np.median, x, axis=axis, keepdims=keep)
            run(f"median NaN {kind} {pl}", np.median, y, axis=0)
            run(f"quantile NaN {kind} {pl}", np.quantile, y, [0.1, 0.5, 0.93], axis=0)
            run(f"percentile {kind} {pl}", np.percentile, x, 37.5, axis=None)
    shape = _shapes(mesh)["uneven"]
    f32 = rng.normal(size=shape).astype(np.float32)
    ints = rng.integers(-9, 10, shape)
    for method in methods:
        for name, g in (("float32", f32), ("int64", ints)):
            x = make_input(g, mesh, _placements(mesh)[0])
            run(f"quantile {method} {name}", np.quantile, x, [0.0, 0.3, 0.77, 1.0], axis=0,
                method=method)  # fmt: skip
            run(f"quantile {method} {name} weak", np.quantile, x, 0.3, method=method)
            run(f"percentile {method} {name} 0-d", np.percentile, x, np.float64(62.5),
                axis=1, method=method)  # fmt: skip


# the host's whole lanes take numpy's partition (either of -0.0 and 0.0 at a tie), the device's
# the select (Note [Distributed selection]): with -0.0 beside 0.0, equal up to the sign of a zero
ORDER_LOOSE = ("median NaN", "quantile NaN")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_median_quantile_percentile(mesh_shape, paths):
    methods = METHODS if mesh_shape == (3,) else METHODS[::4]
    assert _assert_same_runs(mesh_shape, _orders, methods, loose=ORDER_LOOSE) >= 90


def _order_numpy(mesh):
    dt.set_device("fake")
    g = np.random.default_rng(4).normal(size=(2 * mesh.size + 1, 3))
    g[1, 1] = np.nan
    x = make_input(g, mesh, [S0] * mesh.ndim)
    got = [np.median(x, axis=0), np.quantile(x, [0.25, 0.6], axis=0, method="weibull")]
    got += [np.percentile(x, 90, method="nearest"), np.median(x[:, 0])]
    assert {type(o.to_local()) for o in got} == {fake_device.FakeArray}
    return g, [o.numpy() for o in got]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_order_statistics_on_device_are_numpys(paths):
    mesh = mesh_of((2, 2))
    g, got = every_rank(dt.simulate(mesh.size, _order_numpy, mesh))
    want = [
        np.median(g, axis=0),
        np.quantile(g, [0.25, 0.6], axis=0, method="weibull"),
        np.percentile(g, 90, method="nearest"),
        np.median(g[:, 0]),
    ]
    for a, b in zip(got, want):
        assert _identical(a, np.asarray(b)), (a, b)


def _outside(mesh, run):
    """Ranks outside the mesh run every call on empty shards of the device."""
    g = ties((7, 3), np.random.default_rng(1))
    x = make_input(g, mesh, [S0])
    run("sort outside", dt.sort, x, axis=0)
    run("argsort outside", dt.argsort, x, axis=None)
    run("unique outside", dt.unique, x, return_inverse=True, return_counts=True)
    run("searchsorted outside", dt.searchsorted, dt.sort(x, axis=None), x)
    run("median outside", np.median, make_input(np.arange(7.0), mesh, [S0]))
    run("quantile outside", np.quantile, x, [0.5, 0.7], axis=0)


def test_ranks_outside_the_mesh(paths):
    assert _assert_same_runs((3,), _outside, world=4) == 6


# -- gradients -------------------------------------------------------------------------------------
def _sort_grads(mesh, run):
    rng = np.random.default_rng(3)
    s = mesh.size
    g = ties((2 * s + 1, 3), rng)
    g = np.where(np.isfinite(g), g, 2.0)  # ties and signed zeros; finite gradients
    w = rng.standard_normal(g.shape)

    def grad(x, cot, axis):
        (dt.sort(x, axis=axis) * cot).sum().backward()
        return x.grad

    for i, pl in enumerate(_placements(mesh)):
        for axis in (0, 1, None):
            x = make_input(g, mesh, pl, seed=i).requires_grad_()
            cot = make_input(w if axis is not None else w.ravel(), mesh, [R] * mesh.ndim)
            run(f"sort grad {pl} axis={axis}", grad, x, cot, axis)
    m = make_input(g, mesh, _placements(mesh)[0]).requires_grad_()
    loss = np.median(m)
    with pytest.raises(NotImplementedError, match="median has no gradient"):
        loss.backward()


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (2, 2)], ids=str)
def test_sort_gradient_equals_the_hosts(mesh_shape, paths):
    assert _assert_same_runs(mesh_shape, _sort_grads) == 12


# -- under mpiexec: the MPI backend stages device buffers through host memory -------------------
def case_mpi() -> int:
    """Every family on the MPI backend, distributed paths forced on: each rank runs the
    programs on the host and on the device and compares its records."""
    sorting._distributes = lambda *args: True
    order_stats._selects = lambda *args: True
    mesh = mesh_of((dt.get_world_size(),))
    count = 0
    programs = [
        (_sorts, (), ()),
        (_searches, (), ()),
        (_uniques, (), UNIQUE_LOOSE),
        (_orders, (METHODS[::3],), ORDER_LOOSE),
        (_sort_grads, (), ()),
    ]
    for program, args, loose in programs:
        records = []
        for device in ("cpu", "fake"):
            dt.set_device(device)
            run = Run(mesh)
            with np.errstate(all="ignore"):
                program(mesh, run, *args)
            records.append(run.records)
        count += _compare(*records, loose)
    return count


@pytest.mark.mpi
def test_under_mpiexec():
    from mpirun import run

    code, out = run(2, ["tests/test_device_sorting.py"], timeout=300)
    assert code == 0 and "device sorting: OK" in out, out


if __name__ == "__main__":  # mpiexec -n 2 python tests/test_device_sorting.py
    count = case_mpi()
    dt.barrier()
    if dt.get_rank() == 0:
        print(f"device sorting: OK ({count} calls on {dt.get_world_size()} ranks)")
