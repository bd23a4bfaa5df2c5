"""numpy functions on DistTensors, dispatched by the function object (ops/__init__.py,
Note [numpy functions by identity] in ops/numpy_interop.py).

No two numpy callables run the same dt op unless they are listed aliases (a same-named
function elsewhere, such as ``np.emath.sqrt``, gets numpy's own result through the fallback);
the implemented functions against numpy on the grid of meshes, shards and placements;
numpy's other arguments and functions through the exact fallback; like-creation without
communication; numpy functions that write into a DistTensor write it in place.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from op_cases import (
    MESH_SHAPES,
    PAVG,
    PMAX,
    PSUM,
    S0,
    S1,
    Grid,
    R,
    assert_close,
    assert_grid,
    every_rank,
    make_input,
    mesh_of,
    placements,
)

import disttensor as dt
from disttensor.ops import numpy_interop

pytestmark = pytest.mark.filterwarnings("ignore:.*(invalid value|divide by zero):RuntimeWarning")
MESH_IDS = [str(s) for s in MESH_SHAPES]

# numpy callables that deliberately run the same dt op
ALIASES = [
    {np.round, np.around},
    {np.max, np.amax},
    {np.min, np.amin},
    {np.matmul, np.linalg.matmul},  # the ufunc and np.linalg's function
    {np.matrix_transpose, np.linalg.matrix_transpose},
    {np.cumsum, np.cumulative_sum},  # the array API's names (axis required for N-D)
    {np.cumprod, np.cumulative_prod},
]


def simulate_on(mesh_shape, fn, *args):
    mesh = mesh_of(mesh_shape)
    return dt.simulate(mesh.size, fn, mesh, *args)


def numpy_callables() -> dict[int, tuple[str, object]]:
    """Every public function and ufunc of np, np.linalg, np.fft and np.emath, by identity."""
    found = {}
    for prefix, module in [
        ("np", np),
        ("np.linalg", np.linalg),
        ("np.fft", np.fft),
        ("np.emath", np.emath),
    ]:
        for name in dir(module):
            if name.startswith("_"):
                continue
            obj = getattr(module, name)
            if isinstance(obj, type) or not callable(obj):
                continue
            found.setdefault(id(obj), (f"{prefix}.{name}", obj))
    return found


def test_no_two_numpy_functions_share_a_dt_op_unless_aliases():
    """The table is keyed by function objects: a dt op implements exactly the numpy callables
    listed for it. Two different callables (same name or not) on one op must be an alias."""
    callables = numpy_callables()
    by_op: dict[str, list[tuple[str, object]]] = {}
    for label, obj in callables.values():
        op = numpy_interop.implemented_by(obj)
        if op is not None:
            by_op.setdefault(op, []).append((label, obj))
    aliases = [{id(f) for f in group} for group in ALIASES]
    shared = {
        op: [label for label, _ in funcs]
        for op, funcs in by_op.items()
        if len(funcs) > 1 and not any({id(f) for _, f in funcs} <= a for a in aliases)
    }
    assert not shared, f"numpy callables sharing a dt op that are not listed aliases: {shared}"
    # the same check by name, as numpy spells it: same __name__, different objects
    by_name: dict[str, set[int]] = {}
    for _, obj in callables.values():
        if numpy_interop.implemented_by(obj) is not None:
            by_name.setdefault(obj.__name__, set()).add(id(obj))
    for name, ids in by_name.items():
        if len(ids) > 1:
            assert any(ids <= a for a in aliases), f"{name}: several numpy callables"
    # every listed alias is used, and every table key is a public numpy callable
    for group in ALIASES:
        assert len({numpy_interop.implemented_by(f) for f in group}) == 1, group
    assert all(id(f) in callables for f in numpy_interop.NUMPY_TABLE), (
        "a table key numpy does not export"
    )
    # the functions of the same name elsewhere are not dt's
    for f in (np.emath.sqrt, np.emath.log, np.emath.power, np.linalg.outer, np.linalg.trace):
        assert numpy_interop.implemented_by(f) is None, f


def test_implemented_by_covers_the_op_set():
    assert numpy_interop.implemented_by(np.exp) == "exp"
    assert numpy_interop.implemented_by(np.absolute) == "abs"
    assert numpy_interop.implemented_by(np.true_divide) == "divide"
    assert numpy_interop.implemented_by(np.sum) == "sum"
    assert numpy_interop.implemented_by(np.concat) == "concatenate"
    assert numpy_interop.implemented_by(np.emath.sqrt) is None
    assert numpy_interop.implemented_by(np.cumsum) == "cumsum"
    assert numpy_interop.implemented_by(np.linalg.norm) == "norm"
    assert numpy_interop.implemented_by(np.unwrap) is None  # the replicate fallback


# -- np.emath and friends: numpy's complex results ----------------------------------------------
EMATH = {
    "np.emath.sqrt": lambda a: np.emath.sqrt(a),
    "np.lib.scimath.log": lambda a: np.lib.scimath.log(a),
    "np.emath.log10": lambda a: np.emath.log10(a),
    "np.emath.power": lambda a: np.emath.power(a, 0.5),
    "np.emath.arccos": lambda a: np.emath.arccos(a),
}


def _emath(mesh):
    grid = Grid()
    g = np.linspace(-4.0, 3.0, 2 * mesh.size + 1 if mesh.size > 1 else 3)  # uneven, negatives
    for pl in placements(mesh, 1, np.float64):
        for name, fn in EMATH.items():
            grid.check(mesh, fn, (g,), [pl], fn, f"{name} {pl}")
    return grid.result()


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_emath_gives_numpys_complex_results(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _emath), minimum=20)


def test_emath_sqrt_of_negatives_is_complex():
    def body():
        x = dt.shard_tensor(np.array([-4.0, -1.0, 0.0, 9.0]), dt.ProcessMesh([0, 1]), [S0])
        return np.emath.sqrt(x).numpy(), np.sqrt(x).numpy()

    for emath, real in dt.simulate(2, body):
        assert emath.dtype == np.complex128
        np.testing.assert_array_equal(emath, np.emath.sqrt(np.array([-4.0, -1.0, 0.0, 9.0])))
        assert np.isnan(real[:2]).all()  # np.sqrt is dt's real sqrt, as numpy's


# -- the implemented functions against numpy ---------------------------------------------------
ONE = {  # name -> f(a) for a 2-D float array a (at least 3 columns)
    "sum(axis=0, keepdims)": lambda a: np.sum(a, 0, keepdims=True),
    "sum(dtype=f32)": lambda a: np.sum(a, dtype=np.float32),
    "mean(axis=1)": lambda a: np.mean(a, axis=1),
    "max/amax": lambda a: (np.max(a, axis=0), np.amax(a)),
    "min/amin": lambda a: (np.min(a, axis=1), np.amin(a, axis=0, keepdims=True)),
    "max(initial)": lambda a: np.max(a, initial=100.0),
    "prod": lambda a: np.prod(a, axis=1),
    "all/any": lambda a: (np.all(a > -100, axis=0), np.any(a > 3)),
    "argmax/argmin": lambda a: (np.argmax(a, axis=1), np.argmin(a)),
    "var/std": lambda a: (np.var(a, 0, None, None, 1), np.std(a, axis=1)),
    "round/around": lambda a: (np.round(a / 3, 2), np.around(a / 7, decimals=1)),
    "clip": lambda a: (np.clip(a, -1, 4), np.clip(a, min=0), np.clip(a, a_max=2)),
    "where": lambda a: np.where(a > 0, a, -a),
    "real/imag": lambda a: (np.real(a + 2j), np.imag(a * 1j)),
    "astype": lambda a: (np.astype(a, np.int32), np.astype(a, np.float64, copy=False)),
    "dot/outer": lambda a: (np.dot(a, a.T), np.outer(a[0], a[:, 0])),
    "einsum": lambda a: (np.einsum("ij,kj->ik", a, a), np.einsum("ij->j", a, optimize=True)),
    "linalg.matmul": lambda a: np.linalg.matmul(a, a.T),
    "matrix_transpose": lambda a: (np.matrix_transpose(a), np.linalg.matrix_transpose(a)),
    "reshape": lambda a: (np.reshape(a, -1), np.reshape(a, (a.shape[1], -1), order="F")),
    "transpose/swapaxes": lambda a: (np.transpose(a), np.swapaxes(a, 0, 1)),
    "expand_dims/squeeze": lambda a: np.squeeze(np.expand_dims(a, 0), 0),
    "broadcast_to": lambda a: np.broadcast_to(a[0], (2, a.shape[1])),
    "concatenate/stack": lambda a: (np.concatenate([a, a], axis=1), np.stack([a, a])),
    "split": lambda a: tuple(np.split(a, [1], axis=1)),
    "tile/repeat": lambda a: (np.tile(a, 2), np.repeat(a, 2, axis=1)),
    "ravel": lambda a: (np.ravel(a), np.ravel(a, order="F")),
    "sort": lambda a: (np.sort(a), np.sort(a, axis=0), np.sort(a, axis=None)),
    "argsort": lambda a: (np.argsort(a, axis=0, kind="stable"), np.argsort(a, axis=None)),
    "partition": lambda a: (np.partition(a, 1), np.partition(a, 0, axis=0)),
    "argpartition": lambda a: np.argpartition(a, 2, axis=1),
    "take": lambda a: (
        np.take(a, [2, 0]),
        np.take(a, [[1, -1]], axis=1),
        np.take(a, [9], 0, mode="wrap"),
    ),
    "take scalar": lambda a: (np.take(a, 1, axis=0), np.take(a, -1), np.take(a, 0, axis=1)),
    "sort kinds": lambda a: (np.sort(a, kind="stable"), np.argsort(a, axis=1, stable=True)),
    "partition kths": lambda a: np.partition(a, [0, 2], axis=1),
    "diagonal/trace": lambda a: (np.diagonal(a), np.trace(a), np.trace(a, 1)),
    "square diagonal/trace": lambda a: (
        np.diagonal(a[:3, :3]),
        np.trace(a[:3, :3]),
        np.diagonal(a[:3, :3], axis1=1, axis2=0),
    ),
    "copy": lambda a: np.copy(a),
    "cumsum": lambda a: (np.cumsum(a), np.cumprod(a, axis=1)),
    "nonzero": lambda a: np.nonzero(a > 2),
    "like": lambda a: (
        np.zeros_like(a),
        np.ones_like(a, dtype=np.int32),
        np.full_like(a, 2.5),
        np.full_like(a, [1.0, 2.0, 3.0] * (a.shape[1] // 3) + [0.0] * (a.shape[1] % 3)),
        np.empty_like(a).shape,
        np.zeros_like(a, shape=(2, 5)),
    ),
    "metadata": lambda a: (
        np.shape(a),
        np.ndim(a),
        np.size(a),
        np.size(a, 0),
        np.result_type(a, np.int8),
        np.can_cast(a, np.float32),
        np.iscomplexobj(a),
        np.isrealobj(a),
    ),
    "linalg.norm": lambda a: (np.linalg.norm(a), np.linalg.norm(a, 1, axis=0)),
    "not implemented: linalg.norm nuc": lambda a: np.linalg.norm(a, "nuc"),
    "not implemented: unwrap": lambda a: np.unwrap(a),
}


def _compare(got, want, what):
    if isinstance(got, dt.DistTensor):
        got = got.numpy()
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (what, got, want)
        for i, (a, b) in enumerate(zip(got, want)):
            _compare(a, b, f"{what}[{i}]")
    elif isinstance(want, (np.ndarray, np.generic)):
        assert_close(got, want, what)
    else:
        assert type(got) is type(want) and got == want, f"{what}: got {got!r}, numpy {want!r}"


def _functions(mesh, shape_kind):
    s = mesh.size
    shape = (2 * s + 1, s + 3) if shape_kind == "uneven" else (max(s - 1, 1) + 2, 3)
    g = np.random.default_rng(s).permutation(np.prod(shape)).reshape(shape) - 5.0
    pls = placements(mesh, 2, np.float64)
    count, failures = 0, []
    for pl, (name, fn) in itertools.product(pls, ONE.items()):
        what = f"{name} {mesh.shape} {shape} {pl}"
        try:
            with np.errstate(all="ignore"):
                want = fn(g.copy())
        except Exception:
            continue
        count += 1
        try:
            with np.errstate(all="ignore"):
                got = fn(make_input(g, mesh, pl, seed=count))
            if dt.get_rank() in mesh:
                _compare(got, want, what)
        except Exception as e:
            failures.append(f"{what}: {type(e).__name__}: {str(e)[:300]}")
    return count, failures


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
@pytest.mark.parametrize("shape_kind", ["uneven", "empty"])
def test_functions_against_numpy(mesh_shape, shape_kind):
    assert_grid(simulate_on(mesh_shape, _functions, shape_kind), minimum=100)


# -- which calls run dt ops (no fallback) and which the fallback -------------------------------
RULED = {
    "np.sum": lambda x: np.sum(x, axis=0),
    "np.amax": lambda x: np.amax(x, 1, keepdims=True),
    "np.round": lambda x: np.round(x, 1),
    "np.around": lambda x: np.around(x),
    "np.clip min=": lambda x: np.clip(x, min=0.0),
    "np.real": lambda x: np.real(x),
    "np.einsum optimize": lambda x: np.einsum("ij->i", x, optimize=True),
    "np.linalg.matmul": lambda x: np.linalg.matmul(x, x.T),
    "np.matrix_transpose": lambda x: np.matrix_transpose(x),
    "np.reshape": lambda x: np.reshape(x, (5, 7)),
    "np.ravel": lambda x: np.ravel(x),
    "np.sort": lambda x: np.sort(x),
    "np.argsort": lambda x: np.argsort(x, axis=0),
    "np.unique": lambda x: np.unique(x, return_index=True, return_inverse=True, return_counts=True),
    "np.searchsorted": lambda x: np.searchsorted(np.sort(x, axis=None), x),
    "np.take": lambda x: np.take(x, [0, 2], axis=0),
    "np.trace": lambda x: np.trace(x.T @ x),
    "np.copy": lambda x: np.copy(x),
    "np.zeros_like": lambda x: np.zeros_like(x),
    "np.cumsum": lambda x: np.cumsum(x, axis=1),
    "np.cumprod dtype=": lambda x: np.cumprod(x, axis=0, dtype=np.float32),
    "np.linalg.norm": lambda x: np.linalg.norm(x),
    "np.allclose": lambda x: np.allclose(x, x),
    "np.cov": lambda x: np.cov(x, rowvar=False),
    "np.histogram": lambda x: np.histogram(x, 4),
    "np.median": lambda x: np.median(x, axis=0),
    "np.diagonal offset": lambda x: np.diagonal(x, 1),
    "np.trace offset": lambda x: np.trace(x, -1),
    "np.flip": lambda x: np.flip(x),
    "np.roll": lambda x: np.roll(x, 2, axis=0),
    "np.pad": lambda x: np.pad(x, 1),
    "np.diff": lambda x: np.diff(x, axis=0),
    "np.tril": lambda x: np.tril(x),
    "np.take_along_axis": lambda x: np.take_along_axis(x, np.zeros((1, 5), int), 0),
    "np.tensordot": lambda x: np.tensordot(x, x, 2),
    "np.nonzero": lambda x: np.nonzero(x),
    "np.where(condition)": lambda x: np.where(x),
    "np.vstack": lambda x: np.vstack([x, x]),
}
FALLBACK = {
    "np.sum dtype=": (lambda x: np.sum(x, dtype=np.float32), "sum"),
    "np.ravel order=F": (lambda x: np.ravel(x, order="F"), "ravel"),
    "np.emath.sqrt": (lambda x: np.emath.sqrt(x), "np.lib.scimath.sqrt"),
    "np.linalg.norm nuc": (lambda x: np.linalg.norm(x, "nuc"), "np.linalg.norm"),
    "np.cumulative_sum include_initial": (
        lambda x: np.cumulative_sum(x, axis=1, include_initial=True),
        "cumulative_sum",
    ),
    "np.pad mode=edge": (lambda x: np.pad(x, 1, mode="edge"), "pad"),
}


def _routes(mesh):
    g = np.arange(35.0).reshape(7, 5)
    out = {}
    for name, fn in RULED.items():
        x = make_input(g, mesh, [S0])
        with dt.CommCounter() as cc:
            fn(x)
        out[name] = cc.fallbacks
    for name, (fn, op) in FALLBACK.items():
        x = make_input(g, mesh, [S0])
        with dt.CommCounter() as cc:
            fn(x)
        out[name] = [o for o, _ in cc.fallbacks] == [op]
    return out


def test_implemented_functions_do_not_take_the_fallback():
    got = every_rank(simulate_on((2,), _routes))
    for name in RULED:
        assert got[name] == {}, (name, got[name])
    for name in FALLBACK:
        assert got[name] is True, name


def _along_axis_moves(mesh):
    """Note [Along one axis] (take) and Note [Distributed sort] (sort: short lanes of a split
    axis are gathered over that mesh dim only, and the result keeps the input's layout)."""
    g = np.random.default_rng(1).permutation(63).reshape(7, 9).astype(float)
    x = make_input(g, mesh, [S0, S1])
    with dt.CommCounter() as cc:
        rows = np.sort(x, axis=0)
    with dt.CommCounter() as local:
        taken = np.take(make_input(g, mesh, [S0, PSUM]), [3, 1], axis=1)
    return cc.counts, rows.placements, local.counts, taken.placements, taken.numpy()


def test_along_one_axis_keeps_the_other_split():
    g = np.random.default_rng(1).permutation(63).reshape(7, 9).astype(float)
    counts, pls, local, taken_pls, taken = every_rank(simulate_on((2, 2), _along_axis_moves))
    assert counts == {"all_gather": 1} and pls == [S0, S1]  # the sort keeps the layout
    assert local == {} and taken_pls == [S0, PSUM]  # take moves elements: Partial kept
    np.testing.assert_array_equal(taken, g[:, [3, 1]])


# -- like-creation: x's mesh and placements, no communication ---------------------------------
def _likes(mesh):
    g = np.arange(35.0).reshape(7, 5)
    out = []
    layouts = (
        [[S0], [S1], [R], [PSUM], [PAVG], [PMAX]]
        if mesh.ndim == 1
        else [
            [S0, S1],
            [PSUM, S0],
            [S1, PMAX],
            [PSUM, PSUM],
        ]
    )
    for pl in layouts:
        x = make_input(g, mesh, pl)
        with dt.CommCounter() as cc:
            made = [
                dt.zeros_like(x),
                dt.ones_like(x),
                dt.full_like(x, 3, dtype=np.int16),
                dt.empty_like(x, dtype=np.float32),
                np.zeros_like(x),
                np.ones_like(x),
                np.full_like(x, -1.5),
                np.empty_like(x),
                np.copy(x),
                dt.ones_like(x, shape=(3, 2)),
                dt.zeros_like(x, requires_grad=True),
            ]
        plain = [p if not p.is_partial() else R for p in pl]
        vals = [m.numpy() for m in made if m.dtype != np.float32 and m is not made[7]]
        out.append((cc.counts, cc.fallbacks, [m.placements for m in made], plain, pl, vals))
    return out


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_like_creation_does_not_communicate(mesh_shape):
    g = np.arange(35.0).reshape(7, 5)
    for counts, fallbacks, pls, plain, pl, vals in every_rank(simulate_on(mesh_shape, _likes)):
        assert counts == {} and fallbacks == {}, (pl, counts, fallbacks)
        # Partials read as Replicate (the global value is the fill); np.copy keeps them
        assert pls[:8] == [plain] * 8 and pls[8] == pl, (pl, pls)
        want = [
            np.zeros_like(g),
            np.ones_like(g),
            np.full_like(g, 3, dtype=np.int16),
            np.zeros_like(g),
            np.ones_like(g),
            np.full_like(g, -1.5),
            g,
            np.ones((3, 2)),
            np.zeros_like(g),
        ]
        assert len(vals) == len(want)
        for got, w in zip(vals, want):
            assert_close(got, w, f"like {pl}")


def test_like_functions_on_numpy_arrays_are_numpys():
    a = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(dt.ones_like(a), np.ones_like(a))
    assert dt.full_like(a, 7, dtype=int).dtype == np.dtype(int)
    assert type(dt.zeros_like(a)) is np.ndarray


# -- numpy functions that write into a DistTensor --------------------------------------------------
WRITERS = {
    "np.copyto": lambda a: np.copyto(a, 7.0, where=a > 10),
    "np.copyto array": lambda a: np.copyto(a, np.arange(a.shape[1], dtype=float)),
    "np.put": lambda a: np.put(a, [0, 5, -1], [-1.0, -2.0]),
    "np.putmask scalar": lambda a: np.putmask(a, a > 5, 0.0),
    "np.putmask values": lambda a: np.putmask(a, a > 5, [1.0, 2.0, 3.0]),
    "np.place": lambda a: np.place(a, a < 4, [9.0, 8.0]),
    "np.fill_diagonal": lambda a: np.fill_diagonal(a, 0.5),
    "np.put_along_axis": lambda a: np.put_along_axis(a, np.zeros((a.shape[0], 1), int), 1.0, 1),
    "np.add.at": lambda a: np.add.at(a, ([0, 0, 1], [1, 1, 2]), 1.0),
    "np.multiply out=": lambda a: np.multiply(a, 2.0, out=a),
    "np.cumsum positional out": lambda a: np.cumsum(a, 1, None, a),
}


def _writers(mesh):
    g = np.arange(35.0).reshape(7, 5)
    count, failures = 0, []
    layouts = [[S0], [S1], [R], [PSUM], [PMAX]] if mesh.ndim == 1 else [[S0, S1], [PSUM, R]]
    for pl in layouts:
        for name, fn in WRITERS.items():
            want = g.copy()
            fn(want)
            x = make_input(g, mesh, pl)
            y = x  # an alias
            count += 1
            try:
                fn(y)
                if dt.get_rank() in mesh:
                    assert_close(x.numpy(), want, f"{name} {pl}")
                    assert x.placements == pl
            except Exception as e:
                failures.append(f"{name} {mesh.shape} {pl}: {type(e).__name__}: {e}")
    return count, failures


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_numpy_functions_that_write_write_the_dist_tensor(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _writers), minimum=20)


def test_writing_functions_into_numpy_arrays_take_dist_values():
    """A numpy target: the fallback gathers the DistTensor value and numpy writes the array."""

    def body():
        x = dt.shard_tensor(np.arange(6.0), dt.ProcessMesh([0, 1]), [S0])
        a, b = np.zeros(6), np.zeros(6)
        np.copyto(a, x)
        np.put(b, [1, 2], x[:2])
        return a, b

    for a, b in dt.simulate(2, body):
        np.testing.assert_array_equal(a, np.arange(6.0))
        np.testing.assert_array_equal(b, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
