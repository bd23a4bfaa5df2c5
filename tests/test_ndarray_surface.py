"""numpy.ndarray's surface on DistTensors (disttensor/ops/ndarray.py): every public attribute
works with numpy's semantics or is refused with a NotImplementedError that names it.

The value grid runs each attribute's case, one expression written once, on the numpy array
and on the DistTensor, for meshes (1), (2), (3), (4), (2, 2), uneven and empty shards and
Shard/Replicate/Partial placements; every rank checks its own result against numpy. Then:
what must not communicate (metadata, copy, fill, views), aliasing of the writing methods,
and the Python protocols (iteration, format, index, copy, containment).
"""

from __future__ import annotations

import copy
import io
import operator
import os
import pickle
import tempfile

import numpy as np
import pytest
from op_cases import (
    MESH_SHAPES,
    PMAX,
    PSUM,
    S0,
    S1,
    R,
    assert_close,
    assert_grid,
    every_rank,
    make_input,
    mesh_of,
)

import disttensor as dt
from disttensor.ops import ndarray as nd

pytestmark = pytest.mark.filterwarnings("ignore:.*(empty slice|Degrees of freedom):RuntimeWarning")
MESH_IDS = [str(s) for s in MESH_SHAPES]
DUNDERS = [
    "__iter__",
    "__len__",
    "__index__",
    "__format__",
    "__round__",
    "__copy__",
    "__deepcopy__",
    "__contains__",
    "__reversed__",
]
NUMPY_NAMES = sorted(n for n in dir(np.ndarray) if not n.startswith("_")) + [
    n for n in DUNDERS if hasattr(np.ndarray, n)
]
TMP = tempfile.mkdtemp(prefix="dt-ndarray-")


def simulate_on(mesh_shape, fn, *args):
    mesh = mesh_of(mesh_shape)
    return dt.simulate(mesh.size, fn, mesh, *args)


# -- one case per attribute: the same expression on a numpy array and on a DistTensor ---------
def _then(action, a):
    """Run a method that returns None (a write), then show the array."""
    action()
    return a


def _dump(a, path):
    buf = io.BytesIO()
    a.dump(buf)
    return pickle.loads(buf.getvalue())


def _tofile(a, path):
    a.tofile(path)
    return np.fromfile(path, dtype=a.dtype)


def _flat(a, path):
    return list(a.flat), a.flat[1], a.flat[1:3], len(a.flat)


def _flags(a, path):
    f = a.flags
    return f["C_CONTIGUOUS"], f.f_contiguous, f.writeable, f["A"]


def _round_builtin(a, path):
    return round(a, 1) if isinstance(a, dt.DistTensor) else np.round(a, 1)


# name -> case(a, path): ``a`` is a 2-D float64 array (numpy or DistTensor) of distinct
# integer values with at least 3 columns; ``path`` a scratch file name
CASES = {
    "T": lambda a, p: a.T,
    "all": lambda a, p: a.all(axis=0),
    "any": lambda a, p: (a > 3).any(),
    "argmax": lambda a, p: a.argmax(axis=1),
    "argmin": lambda a, p: a.argmin(),
    "argpartition": lambda a, p: a.argpartition(1, axis=1),
    "argsort": lambda a, p: a.argsort(axis=0),
    "astype": lambda a, p: a.astype(np.float32),
    "byteswap": lambda a, p: a.byteswap(),
    "choose": lambda a, p: (a.astype(np.int64) % 2).choose([10, 20]),
    "clip": lambda a, p: a.clip(-2, 5),
    "compress": lambda a, p: a.compress([True, False, True], axis=1),
    "conj": lambda a, p: a.conj(),
    "conjugate": lambda a, p: (a * 1j).conjugate(),
    "copy": lambda a, p: a.copy(),
    "cumprod": lambda a, p: a.cumprod(axis=1),
    "cumsum": lambda a, p: a.cumsum(),
    "device": lambda a, p: a.device,
    "diagonal": lambda a, p: a.diagonal(),
    "dot": lambda a, p: a.dot(a.T),
    "dtype": lambda a, p: a.dtype,
    "dump": _dump,
    "dumps": lambda a, p: pickle.loads(a.dumps()),
    "fill": lambda a, p: _then(lambda: a.fill(3.5), a),
    "flags": _flags,
    "flat": _flat,
    "flatten": lambda a, p: a.flatten(order="F"),
    "getfield": lambda a, p: a.astype(np.int64).getfield(np.int32, 0),
    "imag": lambda a, p: (a + 2j * a).imag,
    "item": lambda a, p: a.item(a.size - 1),
    "itemsize": lambda a, p: a.itemsize,
    "mT": lambda a, p: a.mT,
    "max": lambda a, p: a.max(axis=0, keepdims=True),
    "mean": lambda a, p: a.mean(axis=1),
    "min": lambda a, p: a.min(),
    "nbytes": lambda a, p: a.nbytes,
    "ndim": lambda a, p: a.ndim,
    "nonzero": lambda a, p: (a > 0).nonzero(),
    "partition": lambda a, p: _then(lambda: a.partition(1, axis=1), a),
    "prod": lambda a, p: a.prod(axis=1),
    "put": lambda a, p: _then(lambda: a.put([0, -1, 2], [-7.0, -8.0]), a),
    "ravel": lambda a, p: a.ravel(),
    "real": lambda a, p: a.real,
    "repeat": lambda a, p: a.repeat(2, axis=0),
    "reshape": lambda a, p: a.reshape(-1),
    "resize": lambda a, p: _then(lambda: a.resize((a.shape[1], a.shape[0] + 1), refcheck=False), a),
    "round": lambda a, p: (a / 3).round(2),
    "searchsorted": lambda a, p: np.sort(a.ravel()).searchsorted([2.5, -1.0]),
    "setfield": lambda a, p: _then(lambda: a.setfield(2.0, np.float64), a),
    "setflags": lambda a, p: (a.setflags(write=False), a.flags.writeable)[1],
    "shape": lambda a, p: a.shape,
    "size": lambda a, p: a.size,
    "sort": lambda a, p: _then(lambda: a.sort(axis=0), a),
    "squeeze": lambda a, p: a[None].squeeze(0),
    "std": lambda a, p: a.std(axis=0, ddof=1),
    "sum": lambda a, p: a.sum(axis=0, dtype=np.float32),
    "swapaxes": lambda a, p: a.swapaxes(0, 1),
    "take": lambda a, p: a.take([2, 0, -1], axis=1),
    "to_device": lambda a, p: a.to_device("cpu"),
    "tobytes": lambda a, p: a.tobytes(),
    "tofile": _tofile,
    "tolist": lambda a, p: a.tolist(),
    "trace": lambda a, p: a.trace(),
    "transpose": lambda a, p: a.transpose(1, 0),
    "var": lambda a, p: a.var(),
    "view": lambda a, p: a.view(np.int64),
    "__iter__": lambda a, p: list(a),
    "__len__": lambda a, p: len(a),
    "__index__": lambda a, p: operator.index(a.astype(np.int64).sum()),
    "__format__": lambda a, p: format(a.sum(), ".3f"),
    "__round__": _round_builtin,
    "__copy__": lambda a, p: copy.copy(a),
    "__deepcopy__": lambda a, p: copy.deepcopy(a),
    "__contains__": lambda a, p: (a[0, 0] + 0 in a, 1000.0 in a),
}
REFUSED = {"base", "ctypes", "data", "strides"}
# beyond numpy.ndarray: builtin round() (numpy's scalars have it, its arrays do not)
EXTRA = {"__round__"}
# a view of a Partial tensor's bits is refused (ops/ndarray.py view): checked on its own
NOT_ON_PARTIAL = {"view"}


def test_every_ndarray_attribute_is_implemented_or_refused():
    """Each public name of numpy.ndarray (and the protocol dunders numpy has) has a case here
    or is refused: a name numpy adds fails until it is classified. Refused names raise
    NotImplementedError naming the attribute and the reason, never AttributeError."""
    assert set(NUMPY_NAMES) | EXTRA == set(CASES) | REFUSED, (
        f"unclassified: {sorted(set(NUMPY_NAMES) - set(CASES) - REFUSED)}; "
        f"stale: {sorted((set(CASES) | REFUSED) - set(NUMPY_NAMES) - EXTRA)}"
    )
    assert not set(CASES) & REFUSED
    assert set(nd.REFUSED) == REFUSED
    for name in [*NUMPY_NAMES, *EXTRA]:
        assert name in dt.DistTensor.__dict__, f"DistTensor has no {name}"
        doc = getattr(dt.DistTensor.__dict__[name], "__doc__", None)
        assert doc and doc.strip(), f"DistTensor.{name} has no docstring"

    def body():
        x = dt.ones((4, 3), mesh=dt.ProcessMesh([0, 1]), placements=[S0])
        got = {}
        for name in sorted(REFUSED):
            try:
                getattr(x, name)
            except NotImplementedError as e:
                got[name] = str(e)
        return got

    for name, msg in every_rank(dt.simulate(2, body)).items():
        assert msg.startswith(f"DistTensor.{name} is not supported: "), msg
        assert len(msg) > 60, msg  # it says why


def _surface(mesh, shape_kind):
    """Every case on this mesh, against numpy, for a few placements of each kind."""
    s = mesh.size
    shape = (2 * s + 1, s + 2) if shape_kind == "uneven" else (max(s - 1, 1), 3)
    rng = np.random.default_rng(s)
    g = rng.permutation(np.prod(shape)).reshape(shape) - 4.0  # distinct integer values
    if mesh.ndim == 1:
        pls = [[S0], [S1], [R], [PSUM], [PMAX]]
    else:
        pls = [[S0, S1], [S1, S0], [PSUM, S0], [R, PMAX]]
    count, failures = 0, []
    for pl in pls:
        for name, case in CASES.items():
            if name in NOT_ON_PARTIAL and any(p.is_partial() for p in pl):
                continue
            path = os.path.join(TMP, f"{mesh.size}-{shape_kind}-{count}")
            what = f"{name} {mesh.shape} {shape_kind}{shape} {pl}"
            try:
                with np.errstate(all="ignore"):
                    want = case(g.copy(), f"{path}-numpy-{dt.get_rank()}")
            except Exception:  # numpy refuses (argmax of an empty axis, ...): no oracle
                continue
            count += 1
            try:
                with np.errstate(all="ignore"):
                    got = case(make_input(g, mesh, pl, seed=count), path)
                if dt.get_rank() in mesh:
                    _compare(got, want, what)
            except Exception as e:
                failures.append(f"{what}: {type(e).__name__}: {str(e)[:300]}")
    return count, failures


def _compare(got, want, what: str) -> None:
    """numpy's result: arrays (and numpy scalars) by dtype, shape and value; lists, tuples
    and Python values as numpy's."""
    if isinstance(got, dt.DistTensor):
        got = got.numpy()
    if isinstance(want, (np.ndarray, np.generic)):
        assert isinstance(got, (np.ndarray, np.generic)), f"{what}: got {type(got).__name__}"
        assert_close(got, want, what)
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{what}: {got!r}, {want!r}"
        if type(want) is list and want and not isinstance(want[0], np.ndarray):
            assert_close(np.asarray(got), np.asarray(want), what)  # tolist: Python floats
            return
        for i, (a, b) in enumerate(zip(got, want)):
            _compare(a, b, f"{what}[{i}]")
    else:
        assert type(got) is type(want) and got == want, f"{what}: got {got!r}, numpy {want!r}"


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
@pytest.mark.parametrize("shape_kind", ["uneven", "empty"])
def test_surface_against_numpy(mesh_shape, shape_kind):
    assert_grid(simulate_on(mesh_shape, _surface, shape_kind), minimum=100)


# -- no communication ---------------------------------------------------------------------------
NO_COMM = {
    "metadata": lambda x: (x.shape, x.dtype, x.ndim, x.size, x.nbytes, x.itemsize, x.device),
    "flags": lambda x: (x.flags.c_contiguous, x.flags["WRITEABLE"]),
    "np.shape/ndim/size": lambda x: (np.shape(x), np.ndim(x), np.size(x), np.size(x, 1)),
    "np.result_type": lambda x: (np.result_type(x, 1.0), np.iscomplexobj(x)),
    "copy": lambda x: x.copy(),
    "np.copy": lambda x: np.copy(x),
    "copy.copy": lambda x: copy.copy(x),
    "view": lambda x: x.view(),
    "astype(copy=False)": lambda x: x.astype(np.float64, copy=False),
    "zeros_like": lambda x: (dt.zeros_like(x), np.zeros_like(x)),
    "ones_like": lambda x: (dt.ones_like(x, dtype=np.int32), np.ones_like(x)),
    "full_like": lambda x: (dt.full_like(x, 2.5), np.full_like(x, 7, dtype=int)),
    "empty_like": lambda x: (dt.empty_like(x), np.empty_like(x)),
    "fill": lambda x: x.fill(4.0),
    "to_device": lambda x: x.to_device("cpu"),
}


def _no_communication(mesh):
    g = np.arange(35.0).reshape(7, 5)
    layouts = [[S0], [S1], [R], [PSUM]] if mesh.ndim == 1 else [[S0, S1], [PSUM, S0], [R, R]]
    out = {}
    for pl in layouts:
        for name, fn in NO_COMM.items():
            x = make_input(g, mesh, pl)
            with dt.CommCounter() as cc:
                fn(x)
            out[f"{name} {pl}"] = (cc.counts, cc.fallbacks)
    return out


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (2, 2)], ids=str)
def test_metadata_copies_likes_and_fill_do_not_communicate(mesh_shape):
    for what, (counts, fallbacks) in every_rank(simulate_on(mesh_shape, _no_communication)).items():
        assert counts == {} and fallbacks == {}, (what, counts, fallbacks)


def _copy_keeps_layout(mesh):
    g = np.arange(35.0).reshape(7, 5)
    out = []
    for pl in ([S0], [S1], [PSUM]) if mesh.ndim == 1 else ([S0, S1], [PSUM, S1]):
        x = make_input(g, mesh, pl)
        y = x.copy()
        y[0, 0] = -1.0  # a copy: x keeps its value
        out.append((y.placements == x.placements, x.numpy()[0, 0], y.numpy()[0, 0]))
    return out


@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2)], ids=str)
def test_copy_keeps_the_placements_and_owns_its_memory(mesh_shape):
    for same, x00, y00 in every_rank(simulate_on(mesh_shape, _copy_keeps_layout)):
        assert same and x00 == 0.0 and y00 == -1.0


# -- writes: in place, aliases see them -----------------------------------------------------------
WRITES = {
    "fill": (lambda a: a.fill(3.0), lambda a: a.fill(3.0)),
    "sort": (lambda a: a.sort(axis=0), lambda a: a.sort(axis=0)),
    "sort last": (lambda a: a.sort(), lambda a: a.sort()),
    "partition": (lambda a: a.partition(2, axis=0), lambda a: a.partition(2, axis=0)),
    "put": (lambda a: a.put([1, 7, -1], [5.5, 6.5]), lambda a: a.put([1, 7, -1], [5.5, 6.5])),
    "put wrap": (lambda a: a.put([40], [9.0], mode="wrap"), lambda a: a.put([40], 9.0, "wrap")),
    "setfield": (lambda a: a.setfield(1.5, np.float64), lambda a: a.setfield(1.5, np.float64)),
    "byteswap": (lambda a: a.byteswap(inplace=True), lambda a: a.byteswap(True)),
    "real=": (lambda a: setattr(a, "real", -a), lambda a: setattr(a, "real", -a)),
    "flat[]=": (lambda a: a.flat.__setitem__(slice(1, 9, 3), 0.5), None),
    "flat=": (lambda a: setattr(a, "flat", [1.0, 2.0]), None),
    "resize": (lambda a: a.resize((3, 3), refcheck=False), lambda a: a.resize(3, 3)),
}


def _writes(mesh):
    g = np.random.default_rng(3).permutation(35).reshape(7, 5) - 10.0
    layouts = [[S0], [S1], [R], [PSUM], [PMAX]] if mesh.ndim == 1 else [[S0, S1], [PSUM, R]]
    count, failures = 0, []
    for pl in layouts:
        for name, (np_write, dt_write) in WRITES.items():
            want = g.copy()
            np_write(want)
            x = make_input(g, mesh, pl)
            y = x  # an alias
            count += 1
            try:
                (dt_write or np_write)(y)
                if dt.get_rank() in mesh:
                    assert_close(x.numpy(), want, f"{name} {pl}")
                    assert x.placements == pl or name == "resize", (name, x.placements)
            except Exception as e:
                failures.append(f"{name} {mesh.shape} {pl}: {type(e).__name__}: {e}")
    return count, failures


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_writing_methods_write_in_place(mesh_shape):
    assert_grid(simulate_on(mesh_shape, _writes), minimum=20)


def _views_and_aliases(mesh):
    g = np.arange(12.0).reshape(4, 3)
    x = make_input(g, mesh, [S0])
    v = x.view()
    v[1, 1] = -5.0  # shares x's shards
    y = x
    y.sort(axis=1)  # in place: the alias and the view see it
    with dt.CommCounter() as cc:
        x.sort(axis=1)  # rows whole on every rank: local
        x.fill(2.0)
    w = x.copy()
    x.resize(2, 2)  # every reference to x sees the new shape
    return v.numpy(), y.shape, cc.counts, w.numpy().sum()


def test_views_share_memory_and_aliases_see_writes():
    for v, shape, counts, total in dt.simulate(
        2, lambda: _views_and_aliases(dt.ProcessMesh([0, 1]))
    ):
        np.testing.assert_array_equal(v, np.full((4, 3), 2.0))
        assert shape == (2, 2) and counts == {} and total == 24.0


def test_writes_refuse_tensors_that_require_a_gradient():
    def body():
        x = dt.ones((4, 3), mesh=dt.ProcessMesh([0, 1]), placements=[S0], requires_grad=True)
        errors = []
        for write in (lambda: x.fill(1.0), lambda: x.sort(), lambda: x.put(0, 1.0)):
            with pytest.raises(RuntimeError, match="requires a gradient"):
                write()
            errors.append(True)
        with dt.no_grad():
            x.fill(2.0)  # an update: allowed
        return len(errors), x.numpy().sum()

    assert every_rank(dt.simulate(2, body)) == (3, 24.0)


# -- views and files ----------------------------------------------------------------------------
def _views(mesh):
    g = np.arange(24.0).reshape(4, 6)
    out = []
    for pl in ([S0], [R]) if mesh.ndim == 1 else ([S0, R], [R, S0]):
        x = make_input(g, mesh, pl)
        out.append(x.view(np.float32).numpy())  # the last axis whole: twice as long
        out.append(x.view(np.int64).numpy())
    x = make_input(g, mesh, [S1] + [R] * (mesh.ndim - 1))
    with pytest.raises(NotImplementedError, match="last axis"):
        x.view(np.float32)
    with pytest.raises(NotImplementedError, match="Partial"):
        make_input(g, mesh, [PSUM] + [R] * (mesh.ndim - 1)).view(np.int64)
    with pytest.raises(NotImplementedError, match="type"):
        x.view(np.ndarray)
    return out


@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)], ids=str)
def test_view_as_another_dtype(mesh_shape):
    g = np.arange(24.0).reshape(4, 6)
    for got in every_rank(simulate_on(mesh_shape, _views))[::2]:
        np.testing.assert_array_equal(got, g.view(np.float32))


def test_dump_and_tofile_to_a_path_write_one_complete_file(tmp_path):
    g = np.arange(15.0).reshape(5, 3)

    def body():
        x = dt.shard_tensor(g, dt.ProcessMesh([0, 1, 2]), [S0])
        x.tofile(str(tmp_path / "x.bin"))
        x.dump(tmp_path / "x.pkl")
        # every rank returns after the file is complete
        return np.fromfile(tmp_path / "x.bin"), np.load(tmp_path / "x.pkl", allow_pickle=True)

    for raw, pickled in dt.simulate(3, body):
        np.testing.assert_array_equal(raw, g.ravel())
        np.testing.assert_array_equal(pickled, g)


# -- Python protocols ----------------------------------------------------------------------------
def test_python_protocols():
    def body():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(np.arange(6).reshape(3, 2), mesh, [S0])
        s = x.sum()  # a 0-d integer tensor (Partial over the split axis)
        out = {
            "iter": [r.numpy().tolist() for r in x],
            "reversed": [r.numpy().tolist() for r in reversed(x)],
            "index": [10, 20, 30, 40, 50, 60, 70][s - 10],
            "range": list(range(s))[-1],
            "format": f"{s:5d}|{x.mean():.2f}",
            "format empty": format(x, "") == str(x),
            "contains": (3 in x, 7 in x),
            "round": round(x / 4, 1).numpy().tolist(),
            "round 0": round(x / 4).numpy().tolist(),
            "item": (x.item(-1), x.item(2, 0), x.item((1, 1))),
        }
        for name, call, exc in [
            ("iter 0-d", lambda: iter(s), TypeError),
            ("index 1-d", lambda: operator.index(x), TypeError),
            ("index float", lambda: operator.index(s * 1.0), TypeError),
            ("format spec 2-d", lambda: format(x, ".2f"), TypeError),
            ("item size", lambda: x.item(), ValueError),
            ("item range", lambda: x.item(6), IndexError),
            ("item ndim", lambda: x.item(1, 1, 1), ValueError),
            ("fill sequence", lambda: x.fill([1, 2]), ValueError),
            ("mT 1-d", lambda: x[0].mT, ValueError),
            ("to_device", lambda: x.to_device("gpu"), ValueError),
            ("imag of real", lambda: setattr(x, "imag", 1), TypeError),
            ("sort axis None", lambda: x.sort(axis=None), TypeError),
            ("astype safe", lambda: x.astype(np.int8, casting="safe"), TypeError),
        ]:
            with pytest.raises(exc):
                call()
            out[name] = exc.__name__
        return out

    got = every_rank(dt.simulate(2, body))
    a = np.arange(6).reshape(3, 2)
    assert got["iter"] == a.tolist() and got["reversed"] == a[::-1].tolist()
    assert got["index"] == 60 and got["range"] == 14
    assert got["format"] == f"{np.int64(15):5d}|{a.mean():.2f}" and got["format empty"]
    assert got["contains"] == (True, False)
    assert (
        got["round"] == np.round(a / 4, 1).tolist() and got["round 0"] == np.round(a / 4).tolist()
    )
    assert got["item"] == (5, 4, 3)
    assert all(isinstance(v, int) for v in got["item"])


def test_deepcopy_copies_leaves_and_gradients():
    def body():
        mesh = dt.ProcessMesh([0, 1])
        w = dt.shard_tensor(np.arange(4.0), mesh, [S0], requires_grad=True)
        (w * w).sum().backward()
        c = copy.deepcopy(w)
        c.grad[0] = 100.0
        return (
            c.requires_grad and c.is_leaf,
            c.placements,
            w.grad.numpy().tolist(),
            c.grad.numpy().tolist(),
        )

    leaf, pls, wg, cg = every_rank(dt.simulate(2, body))
    assert leaf and pls == [S0] and wg == [0.0, 2.0, 4.0, 6.0] and cg == [100.0, 2.0, 4.0, 6.0]


def test_copy_passes_gradients_and_partition_refuses_backward():
    def body():
        mesh = dt.ProcessMesh([0, 1])
        w = dt.shard_tensor(np.arange(4.0), mesh, [S0], requires_grad=True)
        (w.copy() * 3).sum().backward()
        grad = w.grad.numpy().tolist()
        loss = (np.partition(w, 0) * w).sum()
        with pytest.raises(NotImplementedError, match="partition has no gradient"):
            loss.backward()
        return grad

    assert every_rank(dt.simulate(2, body)) == [3.0] * 4


def test_flags_are_live_and_writeable_can_be_cleared():
    def body():
        x = dt.shard_tensor(np.arange(6.0).reshape(3, 2), dt.ProcessMesh([0, 1]), [S0])
        flags = x.flags
        before = (flags.c_contiguous, flags["F"], flags.writeable, flags.behaved)
        x.flags.writeable = False  # as numpy: later writes raise
        after = (flags["WRITEABLE"], x.flags.carray)
        with pytest.raises(ValueError, match="read-only"):
            x.fill(1.0)
        x.flags["W"] = True
        x.fill(1.0)
        with pytest.raises(AttributeError):
            x.flags.c_contiguous = False
        with pytest.raises(KeyError):
            x.flags["NOPE"]
        return before, after, x.numpy().sum(), "WRITEABLE : True" in repr(x.flags)

    a = np.arange(6.0).reshape(3, 2)
    before, after, total, shown = every_rank(dt.simulate(2, body))
    assert before == (a.flags.c_contiguous, a.flags["F"], True, True)
    assert after == (False, False) and total == 6.0 and shown
