"""Integer-array and boolean keys, their writes, and numpy.ndarray's index methods on device
shards (ops/indexing.py Note [Keys on a device], ops/mutation.py Note [Integer-array and boolean
writes on a device], ops/ndarray.py).

Every program runs twice on simulated ranks: on the host ("cpu") and on tests/fake_device.py's
stand-in for CuPy ("fake": arrays that refuse numpy as CuPy's do). The two runs must give the
same global values, placements, gradients, collectives (``dt.CommCounter``'s counts) and
accounted communication outside rules, bit for bit (the stand-in computes with numpy), and
every DistTensor a device run makes must hold a device shard. The host runs are checked against
numpy by tests/test_indexing.py, test_mutation.py and test_ndarray_surface.py; a few cases here
compare with numpy's global value directly too.
"""

from __future__ import annotations

import math
import operator

import fake_device
import numpy as np
import pytest
from op_cases import PSUM, assert_close, every_rank, make_input, mesh_of, same

import disttensor as dt

FAKE = fake_device.install()
S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
PMAX = dt.Partial("max")
MESHES = [(1,), (2,), (3,), (4,), (2, 2)]


def _both(mesh_shape, body, *args) -> list:
    """``body(mesh, *args)`` on the ranks of a mesh of that shape, once on the host and once on
    the fake device (each rank selects it first): rank 0's device result, after checking that
    every rank's device result equals its host result (collectives are counted per rank)."""

    def program(device):
        dt.set_device(device)
        return body(mesh_of(mesh_shape), *args)

    n = math.prod(mesh_shape)
    host, dev = dt.simulate(n, program, "cpu"), dt.simulate(n, program, "fake")
    for rank, (h_rank, d_rank) in enumerate(zip(host, dev)):
        assert len(h_rank) == len(d_rank)
        for h, d in zip(h_rank, d_rank):
            assert same(h, d), f"rank {rank}: host {h!r}\ndevice {d!r}"
    return dev[0]


def _shards(out) -> None:
    """Every DistTensor in ``out`` holds a shard of the selected device's array type (a
    FakeArray on the fake device)."""
    want = fake_device.FakeArray if dt.get_device() == "fake" else np.ndarray
    for o in out if isinstance(out, (list, tuple)) else (out,):
        if isinstance(o, dt.DistTensor):
            assert type(o.to_local()) is want, f"a {type(o.to_local()).__name__} shard"


def _run(label: str, fn, *args, keep: list | None = None) -> tuple:
    """``fn(*args)``'s result (a DistTensor: its global value and placements), its collectives
    and its communication outside rules; an exception as its type and message. The result is
    appended to ``keep`` (when given)."""
    try:
        with dt.CommCounter() as cc:
            out = fn(*args)
    except (IndexError, ValueError, TypeError, NotImplementedError) as e:
        return (label, type(e).__name__, str(e))
    _shards(out)
    if keep is not None:
        keep.append(out)
    value = (out.numpy(), out.placements) if isinstance(out, dt.DistTensor) else out
    return (label, value, cc.counts, cc.fallbacks)


def _replicated(a: np.ndarray, mesh) -> dt.DistTensor:
    return dt.shard_tensor(a, mesh, [R] * mesh.ndim)


def _backward(y: dt.DistTensor, x: dt.DistTensor) -> tuple:
    """The gradient of ``sum(y * c)`` (c: 1, 2, 3, ... in y's shape) in ``x``, and the
    collectives of the backward pass."""
    cot = _replicated(np.arange(1.0, y.size + 1).reshape(y.shape), y.mesh)
    loss = (y * cot).sum()
    with dt.CommCounter() as cc:
        loss.backward()
    _shards(x.grad)
    return x.grad.numpy(), x.grad.placements, cc.counts


def _shapes(mesh) -> dict[str, tuple[int, int]]:
    """Even, uneven and empty shards (fewer rows than ranks) over any mesh dim."""
    s = mesh.size
    return {"uneven": (2 * s + 1, 5), "even": (2 * s, 4), "empty": (max(s - 1, 1), 3)}


def _values(shape) -> np.ndarray:
    """Integer-valued floats: Partial splits sum exactly, alike on every replica."""
    return np.round(8 * np.random.default_rng(sum(shape)).normal(size=shape))


def _layouts(mesh) -> list[list]:
    rest = [R] * (mesh.ndim - 1)
    out = [[S0, *rest], [S1, *rest], [R] * mesh.ndim, [PSUM, *rest]]
    if mesh.ndim == 2:
        out += [[S0, S1], [S0, S0], [S1, PSUM]]
    return out


# -- x[key]: Note [Gathers by index] ---------------------------------------------------------------
def _gather_keys(shape, mesh) -> dict:
    n, d = shape
    g = _values(shape)
    keys = {
        "rows": lambda: np.array([n - 1, 0, n - 1, -1]),  # repeated and negative
        "rows 2-D": lambda: np.array([[0, n - 1], [n // 2, n // 2]]),
        "list": lambda: [n - 1, 0],
        "pick": lambda: (np.arange(n), np.arange(n) % d),
        "mask": lambda: g[:, 0] > 0,
        "mask 2-D": lambda: g > 0,
        "none": lambda: np.array([], dtype=np.int64),
        "rows, all columns": lambda: (np.array([n - 1, 0]), slice(None)),
        "DistTensor ids": lambda: dt.shard_tensor(
            np.array([0, n - 1, 1 % n, 0]), mesh, [S0] + [R] * (mesh.ndim - 1)
        ),
        "DistTensor mask": lambda: _replicated(g[:, 1] >= 0, mesh),
    }
    return keys


def _gathers(mesh, shape_names) -> list:
    out = []
    for name in shape_names:
        shape = _shapes(mesh)[name]
        g = _values(shape)
        keys = _gather_keys(shape, mesh)
        for pl in _layouts(mesh):
            for label, make in keys.items():
                x = make_input(g, mesh, pl)
                x.requires_grad = True
                y: list = []
                got = _run(f"{name} {label} {pl}", operator.getitem, x, make(), keep=y)
                out.append((got, _backward(y[0], x)))
    return out


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_gathers_by_index_on_device_equal_the_host(mesh_shape):
    shapes = ("uneven", "even", "empty")
    dev = _both(mesh_shape, _gathers, shapes)
    mesh = mesh_of(mesh_shape)
    shape = _shapes(mesh)["uneven"]
    g = _values(shape)
    for ((what, (value, _), _, fallbacks), _), label in zip(dev, _gather_keys(shape, mesh)):
        if "DistTensor" not in label:  # numpy's own value (the first layout: Shard(0))
            assert_close(value, g[_gather_keys(shape, mesh)[label]()], what, exact=True)
            assert fallbacks == {}, (what, fallbacks)


# -- x[key] of an unsplit x: Note [Lookups in unsplit tensors] -------------------------------------
def _unsplit_keys(g) -> dict:
    rows, cols = g[:, 0] > 0, g[0] > 0
    k = min(rows.sum(), cols.sum())
    rows2, cols2 = rows & (np.cumsum(rows) <= k), cols & (np.cumsum(cols) <= k)
    return {
        "columns by array": (slice(None), np.array([4, 0, 4, -1])),
        "rows and columns": (np.array([1, 3, 3]), np.array([0, 4, 2])),
        "mask among slices": (slice(2, 9), cols),
        "rows reversed": (np.array([[-1, 0], [2, 2]]), slice(None, None, -1)),
        "mask 2-D": g > 0,
        "none": (slice(None), np.array([], dtype=np.int64)),
        "empty list": [],
        "True": True,
        "False among slices": (np.False_, slice(1, 3)),
        "0-d True with arrays": (np.array([0, 2]), np.array(True), np.array([1, 1])),
        "mask and array": (rows, 2),
        "two masks": (rows2, cols2),
        "numpy int with array": (np.int64(1), np.array([0, 3])),
        "range": (range(1, 4), slice(None, None, 2)),
    }


def _unsplit_layouts(mesh) -> list[list]:
    n = mesh.ndim
    out = [[R] * n, [PSUM, *[R] * (n - 1)], [PMAX, *[R] * (n - 1)]]
    if mesh.size == 1:
        out.append([S1] * n)  # a split over one rank is no split
    if n == 2:
        out += [[R, PSUM]]
    return out


def _unsplit(mesh) -> list:
    g = _values((7, 5))
    out = []
    for pl in _unsplit_layouts(mesh):
        for label, key in _unsplit_keys(g).items():
            x = make_input(g, mesh, pl)
            grads = PMAX not in pl
            x.requires_grad = grads
            y: list = []
            got = _run(f"{label} {pl}", operator.getitem, x, key, keep=y)
            out.append((got, _backward(y[0], x) if grads else None))
        for bad in (np.array([0, 7]), (slice(None), [5]), np.ones(3, bool)):
            out.append(_run(f"bad key {bad}", operator.getitem, make_input(g, mesh, pl), bad))
    return out


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_unsplit_lookups_on_device_equal_the_host(mesh_shape):
    dev = _both(mesh_shape, _unsplit)
    g = _values((7, 5))
    replicated = [r for r in dev if len(r) == 2][: len(_unsplit_keys(g))]  # the first layout
    for (what, value, counts, fallbacks), _ in replicated:
        key = _unsplit_keys(g)[what.rsplit(" [", 1)[0]]
        assert_close(value[0], g[key], what, exact=True)  # numpy's own value (Replicate)
        assert counts == {} and fallbacks == {}, (what, counts, fallbacks)
    errors = [r for r in dev if len(r) == 3]
    assert errors and all(r[1] == "IndexError" for r in errors), errors


IDS_LAYOUTS = {  # mesh ndim -> (table placements, ids placements)
    1: [([R], [S0]), ([R], [S1]), ([R], [R]), ([PSUM], [R])],
    2: [([R, R], [S0, S1]), ([R, R], [S0, S0]), ([R, PSUM], [S1, R])],
}
IDS = {
    "uneven": np.array([[3, 0, 6], [6, 6, 1], [-1, 2, 5], [0, 0, 0], [4, 3, 2]]),
    "empty shards": np.array([[2, 5]]),  # one row, two columns: empty shards from 2 ranks up
}


def _split_ids(mesh) -> list:
    table = _values((7, 4))
    out = []
    for tpl, ipl in IDS_LAYOUTS[mesh.ndim]:
        for label, ids in IDS.items():
            w = make_input(table, mesh, tpl)
            w.requires_grad = True
            i = dt.shard_tensor(ids, mesh, ipl)
            y: list = []
            got = _run(f"{label} {tpl} {ipl}", operator.getitem, w, i, keep=y)
            out.append((got, _backward(y[0], w)))
        bad = dt.shard_tensor(np.array([[1, 7], [0, -8]]), mesh, [R] * mesh.ndim)
        table_t = make_input(table, mesh, tpl)
        out.append(_run("ids out of bounds", operator.getitem, table_t, (bad, Ellipsis)))
    return out


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_split_ids_look_up_an_unsplit_table_on_device(mesh_shape):
    """``wte[ids]`` with device ids: looked up on the device, no communication; an index out
    of bounds raises numpy's IndexError (CuPy would wrap it around)."""
    dev = _both(mesh_shape, _split_ids)
    (_, (value, _), counts, _), _ = dev[0]
    assert_close(value, _values((7, 4))[IDS["uneven"]], "wte[ids]", exact=True)
    assert counts == {}
    assert dev[len(IDS)][1:] == ("IndexError", "index 7 is out of bounds for axis 0 with size 7")


# -- x[key] = value and in-place operators through such keys ---------------------------------------
def _write_cases(shape, mesh) -> dict:
    """Writes through integer-array and boolean keys, each a function of the target."""
    n, d = shape
    g = _values(shape)
    rest = [R] * (mesh.ndim - 1)

    def dist(a, pl):
        return make_input(np.asarray(a), mesh, pl)

    def inplace_mask(x):
        x[g > 0] += 1

    def inplace_rows(x):
        x[np.array([n - 1, 0])] -= dist(g[:2], [S1, *rest])

    def inplace_repeated(x):
        x[[0, 0, n - 1]] *= 3  # numpy: each row once

    return {
        "rows repeated, host rows": lambda x: x.__setitem__(
            np.array([n - 1, 0, n - 1, -1]), np.arange(4.0)[:, None] * np.ones(d)
        ),
        "mask, scalar": lambda x: x.__setitem__(g > 0, -1.0),
        "mask 2-D, host values": lambda x: x.__setitem__(g < 0, np.arange((g < 0).sum())),
        "pick, broadcast row": lambda x: x.__setitem__((np.arange(n), np.arange(n) % d), 2.5),
        "rows, DistTensor value": lambda x: x.__setitem__(
            np.array([0, n - 1]), dist(np.arange(2.0 * d).reshape(2, d), [S0, *rest])
        ),
        "rows, device array value": lambda x: x.__setitem__(
            [n - 1], dist(np.full((1, d), 4.0), [R] * mesh.ndim).to_local()
        ),
        "DistTensor mask, scalar": lambda x: x.__setitem__(
            dist(g > 1, [R if p.is_partial() else p for p in x.placements]), 9.0
        ),
        "DistTensor mask elsewhere, 0-d": lambda x: x.__setitem__(
            dist(g > 1, [R] * mesh.ndim), np.array(7.0)
        ),
        "DistTensor ids, scalar": lambda x: x.__setitem__(
            dist(np.array([0, -1]), [S0, *rest]), 1.5
        ),
        "columns by array": lambda x: x.__setitem__((slice(None), [d - 1, 0]), 6.0),
        "x[mask] += 1": inplace_mask,
        "x[rows] -= y": inplace_rows,
        "x[repeated] *= 3": inplace_repeated,
        "index out of bounds": lambda x: x.__setitem__(np.array([0, n]), 1.0),
        "mask of another shape": lambda x: x.__setitem__(np.ones(n + 1, bool), 1.0),
    }


def _writes(mesh, shape_names) -> list:
    out = []
    for name in shape_names:
        shape = _shapes(mesh)[name]
        cases = _write_cases(shape, mesh)
        for pl in _layouts(mesh):
            for label, write in cases.items():
                x = make_input(_values(shape), mesh, pl)
                got = _run(f"{name} {label} {pl}", write, x)
                _shards(x)
                out.append((got, x.numpy(), x.placements))
    z = _replicated(np.array(5.0), mesh)  # a 0-d target: x[True] names it
    out.append(_run("0-d target", lambda: z.__setitem__(True, 7.0)))
    out.append(_run("0-d target, x[True] += 1", lambda: z.__setitem__(np.True_, z[True] + 1)))
    out.append((z.numpy(), z.placements))
    return out


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_writes_through_array_keys_on_device_equal_the_host(mesh_shape):
    shapes = ("uneven", "even", "empty")
    dev = _both(mesh_shape, _writes, shapes)
    assert dev[-1] == (np.array(8.0), [R] * len(mesh_shape))
    # numpy's own values, on the first layout (Shard(0)) of the uneven shape
    shape = _shapes(mesh_of(mesh_shape))["uneven"]
    n = shape[0]
    g = _values(shape)
    written = {r[0][0]: r[1] for r in dev[:-3]}
    first = f"{[S0] + [R] * (len(mesh_shape) - 1)}"
    want = g.copy()
    want[np.array([n - 1, 0, n - 1, -1])] = np.arange(4.0)[:, None]  # the last of repeats
    assert_close(written[f"uneven rows repeated, host rows {first}"], want, "repeats", exact=True)
    want = g.copy()
    want[g > 0] += 1
    assert_close(written[f"uneven x[mask] += 1 {first}"], want, "x[mask] += 1", exact=True)
    errors = [r[0] for r in dev[:-3] if len(r[0]) == 3]
    assert len(errors) == 2 * 3 * len(_layouts(mesh_of(mesh_shape))), errors
    assert {e[1] for e in errors} == {"IndexError"}, errors


# -- numpy.ndarray's methods (ops/ndarray.py) ------------------------------------------------------
def _method_cases(mesh, g: np.ndarray, pl: list) -> dict:
    """numpy.ndarray's index methods on ``g`` placed as ``pl``: each a function of nothing."""

    def x():
        return make_input(g, mesh, pl)

    def written(write):
        def run():
            t = x()
            write(t)
            return t

        return run

    ids = dt.shard_tensor(np.array([2, 0, -1]), mesh, [S0] + [R] * (mesh.ndim - 1))
    vals = dt.shard_tensor(np.array([7.0, 8.0]), mesh, [R] * mesh.ndim)
    return {
        "take axis 0": lambda: x().take([0, -1, 1], axis=0),
        "take 2-D indices axis 1": lambda: x().take(np.array([[0, 4], [-5, 3]]), axis=1),
        "take flat, wrap": lambda: x().take(np.array([[0, 99], [-99, 3]]), mode="wrap"),
        "take clip": lambda: x().take([0, 40, -5], axis=0, mode="clip"),
        "take DistTensor indices": lambda: np.take(x(), ids, axis=1),
        "take out of bounds": lambda: x().take([0, 40], axis=0),
        "put": written(lambda t: t.put([0, 5, 14, -1, 5], [1.0, 2.0])),
        "put DistTensors": written(lambda t: t.put(ids, vals)),
        "put wrap": written(lambda t: np.put(t, [100, -100], 5.0, mode="wrap")),
        "put clip": written(lambda t: t.put([-3, 1000], [1.0, 3.0], mode="clip")),
        "flat[list] =": written(lambda t: t.flat.__setitem__([1, 3], 4.0)),
        "flat[mask] =": written(lambda t: t.flat.__setitem__(g.ravel() > 0, 0.0)),
        "flat[slice] =": written(lambda t: t.flat.__setitem__(slice(2, 9, 3), -2.0)),
        "flat[list]": lambda: x().flat[[0, -1, 4]],
        "resize larger": written(lambda t: t.resize((g.shape[0] + 2, 5))),
        "resize smaller 3-D": written(lambda t: t.resize((2, 2, 2))),
        "partition": lambda: np.partition(x(), 2, axis=1),
        "partition kth list": lambda: np.partition(x(), [1, -1], axis=0),
        "partition no kth": lambda: np.partition(x(), np.array([], int), axis=0),
        "partition flat": lambda: np.partition(x(), 4, axis=None),
        "argpartition": lambda: np.argpartition(x(), 3, axis=None),
        "argpartition kth list": lambda: x().argpartition([0, 2], axis=1),
        "argpartition no kth": lambda: np.argpartition(x(), np.array([], int), axis=1),
        "kth out of bounds": lambda: np.partition(x(), 9, axis=1),
        "boolean kth": lambda: np.partition(x(), True, axis=1),
        "kth as a float": lambda: np.argpartition(x(), 1.0, axis=1),
        "x.partition in place": written(lambda t: t.partition(3, axis=0)),
        "view as int64": lambda: x().view(np.int64),
        # ops/sorting.py's, lightly: the entry points that delegate to it
        "x.sort in place": written(lambda t: t.sort(axis=0)),
        "np.sort": lambda: np.sort(x(), axis=1),
        "argsort": lambda: x().argsort(axis=0),
    }


def _methods(mesh) -> list:
    out = []
    g = _values(_shapes(mesh)["uneven"])
    for pl in _layouts(mesh)[:4] + ([[S0, S1]] if mesh.ndim == 2 else []):
        cases = _method_cases(mesh, g, pl)
        out += [_run(f"{label} {pl}", case) for label, case in cases.items()]
    return out


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_ndarray_methods_on_device_equal_the_host(mesh_shape):
    dev = _both(mesh_shape, _methods)
    g = _values(_shapes(mesh_of(mesh_shape))["uneven"])
    by_label = {r[0]: r for r in dev}
    assert_close(by_label[f"take axis 0 {[S0] + [R] * (len(mesh_shape) - 1)}"][1][0],
                 g.take([0, -1, 1], axis=0), "take", exact=True)  # fmt: skip
    want = g.copy()
    want.put([0, 5, 14, -1, 5], [1.0, 2.0])
    assert_close(
        by_label[f"put {[S0] + [R] * (len(mesh_shape) - 1)}"][1][0], want, "put", exact=True
    )
    errors = {r[1] for r in dev if len(r) == 3}
    assert {"IndexError", "ValueError", "TypeError"} <= errors, errors


# -- what stays on the host, and what never mixes -------------------------------------------------
@pytest.mark.parametrize(
    "name,call",
    [
        ("getfield", lambda x: x.getfield(np.float64)),
        ("setfield", lambda x: x.setfield(1.0, np.float64)),
        ("byteswap", lambda x: x.byteswap()),
    ],
)
def test_bit_level_methods_stay_host_only(name, call):
    """CuPy's ndarray has no getfield, setfield or byteswap: NotImplementedError naming the
    method and the GPU on device shards; the host keeps numpy's."""

    def program(device):
        dt.set_device(device)
        x = dt.shard_tensor(_values((5, 4)), dt.ProcessMesh([0, 1]), [S0])
        if device == "cpu":
            call(x)
            return None
        with pytest.raises(NotImplementedError, match="not implemented on GPU") as e:
            call(x)
        return str(e.value)

    assert every_rank(dt.simulate(2, program, "cpu")) is None
    assert every_rank(dt.simulate(2, program, "fake")).startswith(name)


def test_host_and_device_keys_and_values_do_not_mix():
    g = _values((6, 4))

    def program():
        mesh = dt.ProcessMesh([0, 1])
        host = dt.shard_tensor(g, mesh, [S0])
        d = host.to_device("fake")
        host_ids = dt.shard_tensor(np.array([0, 3]), mesh, [R])
        dev_ids = host_ids.to_device("fake")
        errors = []
        for call in (
            lambda: d[host_ids],
            lambda: host[dev_ids],
            lambda: host[dev_ids.to_local()],
            lambda: d.__setitem__(host_ids, 1.0),
            lambda: host.__setitem__(np.array([0, 1]), d[np.array([0, 1])]),
            lambda: host.__setitem__([0], dev_ids.to_local()[:1, None]),
            lambda: d.take(host_ids, axis=0),
            lambda: d.put([0], dt.shard_tensor(np.ones(1), mesh, [R])),
        ):
            with pytest.raises(TypeError, match="different devices") as e:
                call()
            errors.append(str(e.value))
        # a device array of the tensor's own device in a key: read as metadata
        picked = d[dev_ids.to_local()]
        return errors, type(picked.to_local()), picked.numpy()

    errors, kind, picked = every_rank(dt.simulate(2, program))
    assert kind is fake_device.FakeArray and np.array_equal(picked, g[[0, 3]])
    assert "x[key]: operands on different devices (numpy and fake)" in errors[0]


# -- keys as CuPy takes them ----------------------------------------------------------------------
def _cupy_key_check(a: np.ndarray, key, write: bool) -> None:
    """What CuPy's indexing would do differently from numpy's with ``key`` (the stand-in's
    storage ``a``): wrap an index out of bounds around, take a boolean array other than
    alone, store an element named twice by a write in undefined order."""
    parts = key if isinstance(key, tuple) else (key,)
    arrays = [k for k in parts if isinstance(k, np.ndarray) and k.ndim]
    masks = [k for k in arrays if k.dtype == np.bool_]
    assert not masks or len(arrays) == 1, "a boolean array among other arrays reached CuPy"
    if not arrays or masks:
        return
    try:
        np.broadcast_to(np.empty((), "V0"), a.shape)[key]
    except IndexError as e:
        raise AssertionError(f"an index out of bounds reached CuPy (it wraps around): {e}") from e
    if write:
        flat = np.arange(a.size).reshape(a.shape)[key].ravel()
        assert np.unique(flat).size == flat.size, "a write named an element twice on CuPy"


@pytest.fixture
def cupy_indexing(monkeypatch):
    """The stand-in's indexing checked against CuPy's differences from numpy's."""
    get, put = fake_device.FakeArray.__getitem__, fake_device.FakeArray.__setitem__

    def getitem(self, key):
        _cupy_key_check(self._a, fake_device._unwrap(key), write=False)
        return get(self, key)

    def setitem(self, key, value):
        _cupy_key_check(self._a, fake_device._unwrap(key), write=True)
        return put(self, key, value)

    monkeypatch.setattr(fake_device.FakeArray, "__getitem__", getitem)
    monkeypatch.setattr(fake_device.FakeArray, "__setitem__", setitem)


def _cupy_cases(mesh) -> list:
    g = _values((7, 5))
    out = []
    for pl in ([S0] + [R] * (mesh.ndim - 1), [R] * mesh.ndim, [PSUM] + [R] * (mesh.ndim - 1)):
        x = make_input(g, mesh, pl)
        x[np.array([6, 0, 6, -1, 0])] = np.arange(5.0)[:, None]  # repeats: the last one stays
        x[[1, 1], [2, 2]] += 10
        out.append(x.numpy())
        keys = (_unsplit_keys(g)["mask and array"], _unsplit_keys(g)["two masks"])
        out += [make_input(g, mesh, pl)[k].numpy() for k in keys]
        for bad in (np.array([0, 7]), (np.array([0]), np.array([-6]))):
            with pytest.raises(IndexError, match="out of bounds"):
                x[bad]
            with pytest.raises(IndexError, match="out of bounds"):
                x[bad] = 1.0
        ids = dt.shard_tensor(np.array([0, 9]), mesh, [R] * mesh.ndim)
        with pytest.raises(IndexError, match="index 9 is out of bounds"):
            make_input(g, mesh, [R] * mesh.ndim)[ids]
        with pytest.raises(IndexError, match="out of bounds"):
            x.take([7], axis=0)
    return out


# a mask among other entries on a split x is the replicate fallback's (dispatch.py), on host copies
@pytest.mark.filterwarnings("ignore:.*no device function:RuntimeWarning")
@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)], ids=str)
def test_keys_reach_the_device_as_cupy_takes_them(mesh_shape, cupy_indexing):
    """Note [Keys on a device]: no index out of bounds, no boolean array among others and no
    write naming an element twice ever reaches the device's indexing (CuPy would wrap,
    refuse, or store in undefined order); the values are numpy's."""
    g = _values((7, 5))
    want = g.copy()
    want[np.array([6, 0, 6, -1, 0])] = np.arange(5.0)[:, None]
    want[[1, 1], [2, 2]] += 10
    keys = (_unsplit_keys(g)["mask and array"], _unsplit_keys(g)["two masks"])
    got = _both(mesh_shape, _cupy_cases)
    for i in range(3):
        assert_close(got[3 * i], want, "writes", exact=True)
        for k, value in zip(keys, got[3 * i + 1 : 3 * i + 3]):
            assert_close(value, g[k], "lookups", exact=True)
