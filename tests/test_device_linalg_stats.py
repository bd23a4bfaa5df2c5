"""Decompositions and statistics on device shards (disttensor/ops/decompositions.py, Note
[Decompositions on a device]; disttensor/ops/statistics.py): the same program on the device
as on the host.

Each family runs on simulated ranks that select the device ("fake": tests/fake_device.py's
stand-in for CuPy; "gpu": CuPy, skipped without one) and again on ranks that select the CPU,
on meshes (1,), (2,), (3,), (4,), (2, 2), with even, uneven, empty and (where the op takes
them) zero-size shapes and each placement the op takes (Shard of its axis and of the other,
Replicate, asymmetric Partials; nested shards on (2, 2)); arguments are DistTensors, host
arrays (copied to the device by the function) and arrays of the device. Every call must give
the host's global values, result types, placements and collectives (kinds, counts and bytes:
``dt.CommCounter``; device buffers handed to them), none may take the fallback, and every
DistTensor it returns must hold a shard of the device's array type, also where the ranks keep
the CPU selected and only the data is on the device. The host run is checked against numpy
by tests/test_decompositions.py and tests/test_scan_stats.py; some calls here are compared
with numpy directly too. On a GPU, singular vectors and eigenvectors are compared up to the
phase of each pair. Gradients of the composites (norm, cov, corrcoef) must be the host's;
then the arguments that take the replicate fallback, tensors on different devices, backward
through the decompositions, and arrays that are not DistTensors.
"""

from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple

import fake_device
import numpy as np
import pytest
from op_cases import (
    F32,
    F64,
    I64,
    PMAX,
    PSUM,
    S0,
    R,
    every_rank,
    make_input,
    mesh_of,
    placements,
    same,
)
from test_device import DEVICES, on

import disttensor as dt
from disttensor import backend
from disttensor.comm import Communicator
from disttensor.spmd.validate import data

C128 = np.dtype(np.complex128)
MESHES = [(1,), (2,), (3,), (4,), (2, 2)]
MESH_IDS = [str(s) for s in MESHES]
FAKE = fake_device.install()


class _Buffers(threading.local):
    types: set | None = None  # the array types of the buffers of this rank's collectives


_BUFFERS = _Buffers()


@pytest.fixture(autouse=True)
def buffer_types(monkeypatch):
    """The collectives note the types of the buffers they are handed (``_BUFFERS``): on
    device data they must be the device's arrays."""
    for name in ("allreduce", "iallreduce", "allgather", "reduce_scatter", "alltoall"):
        f = getattr(Communicator, name)

        def call(self, send, *args, _f=f, **kwargs):
            if _BUFFERS.types is not None:
                _BUFFERS.types.update(type(a) for a in (send, *args) if hasattr(a, "dtype"))
            return _f(self, send, *args, **kwargs)

        monkeypatch.setattr(Communicator, name, call)


# -- recording a program's calls -----------------------------------------------------------------
class P(NamedTuple):
    """An input: global value ``g`` placed as ``pls`` (asymmetric Partial splits)."""

    g: np.ndarray
    pls: list
    seed: int = 1


class Local(NamedTuple):
    """An input: ``g`` as an array (not a DistTensor) of the device the run is on."""

    g: np.ndarray


class Row(NamedTuple):
    what: str
    pairs: str | None  # "svd" or "eig": vectors up to the sign (phase) of each pair on a GPU
    counts: dict
    nbytes: dict
    buffers: set  # the array types handed to the collectives
    fallbacks: dict  # the calls that took the replicate fallback
    fallback: bool  # whether the call is one that takes it
    values: list
    want: Any  # numpy's result on the global values, or None
    single: bool  # a single-precision input (its Partial splits round): numpy's to its precision


def _value(o: Any) -> Any:
    """A result as the host sees it: a DistTensor's shard type, placements and global value;
    an array's type and a host copy; anything else itself."""
    if isinstance(o, dt.DistTensor):
        return ("tensor", type(o.to_local()), list(o.placements), o.numpy())
    if backend.is_device(o) or isinstance(o, np.ndarray):
        return ("array", type(o), None, backend.to_host(o))
    return o


class Recorder:
    """Runs calls on the ranks of ``mesh`` and records what each returned and communicated.
    ``moved``: the inputs are made on the host and moved to that device (``to_device``),
    which the ranks do not select: results must stay where the data is, whatever new
    tensors would be made on."""

    def __init__(self, mesh, moved: str | None = None) -> None:
        self.mesh, self.moved = mesh, moved
        self.rows: list[Row] = []

    def _input(self, a: Any) -> Any:
        if isinstance(a, P):
            x = make_input(a.g, self.mesh, a.pls, a.seed)
            return x.to_device(self.moved) if self.moved else x
        if isinstance(a, Local):
            return backend.select(self.moved or dt.get_device()).asarray(a.g)
        return a

    def __call__(self, what: str, fn, *args, pairs=None, want=None, fallback=False, **kw) -> None:
        placed = [self._input(a) for a in args]
        kw = {k: self._input(v) for k, v in kw.items()}
        _BUFFERS.types = set()
        try:
            with dt.CommCounter() as cc, np.errstate(all="ignore"):
                out = fn(*placed, **kw)
        finally:
            buffers, _BUFFERS.types = _BUFFERS.types, None
        outs = list(out) if isinstance(out, tuple) else [out]  # numpy's named tuples too
        values = [_value(o) for o in outs]  # gathered after counting
        single = any(isinstance(a, P) and a.g.dtype.itemsize == 4 for a in args)
        counted = (cc.counts, cc.bytes, buffers, cc.fallbacks, fallback)
        self.rows.append(Row(what, pairs, *counted, values, want, single))


def _run(device: str, mesh_shape, family, selected: bool = True) -> list[list[Row]]:
    """Every rank's rows of ``family(record)`` on ranks that select ``device`` (or, not
    ``selected``, keep the CPU and move the inputs there)."""
    mesh = mesh_of(mesh_shape)

    def program():
        record = Recorder(mesh, None if selected else device)
        family(record)
        return record.rows

    return on(device if selected else "cpu", mesh.size, program)


_HOST: dict = {}


def _host(mesh_shape, family) -> list[list[Row]]:
    """``_run("cpu", ...)``, once per mesh and family (the tests compare several device runs
    with it)."""
    key = (tuple(mesh_shape), family)
    if key not in _HOST:
        _HOST[key] = _run("cpu", mesh_shape, family)
    return _HOST[key]


def _close(got: Any, want: Any, what: str, device: str, single: bool = False) -> None:
    """numpy's dtype and shape, and its values: exactly for integers and bools; to rounding
    for floats (the stand-in computes with numpy: only where an algorithm differs);
    ``single``: a single-precision input bounds the accuracy."""
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (
        f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
    )
    if want.dtype.kind not in "fc":
        assert np.array_equal(got, want), f"{what}: got {got}, want {want}"
        return
    single = single or want.dtype.itemsize <= 4 or want.dtype == np.complex64
    tol = (1e-5 if single else 1e-10) if device == "fake" else (2e-4 if single else 1e-8)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=what)


def _phases(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per vector (the last axis), the unit factor c with got * c ~ want, read at want's
    largest item."""
    j = np.argmax(np.abs(want), axis=-1)[..., None]
    c = np.take_along_axis(want, j, -1) / np.take_along_axis(got, j, -1)
    return c / np.abs(c)


def _aligned(pairs: str | None, got: list, want: list) -> list:
    """A GPU's vectors turned to the host's phases (U and Vh per singular pair, eigenvectors
    per column): cuSOLVER's and LAPACK's SVD and eigh agree up to them; other values as they
    are."""
    got = list(got)
    if pairs == "svd" and len(got) == 3:
        c = _phases(got[2], want[2])  # per row of Vh
        got[2] = got[2] * c
        got[0] = got[0] * np.swapaxes(c, -1, -2).conj()
    elif pairs == "eig":
        c = _phases(np.swapaxes(got[1], -1, -2), np.swapaxes(want[1], -1, -2))
        got[1] = got[1] * np.swapaxes(c, -1, -2)
    return got


def _compare(dev: list[Row], host: list[Row], device: str) -> None:
    """One rank's rows on the device against its rows on the host."""
    shard_type = FAKE.array_type if device == "fake" else backend.select("gpu").array_type
    assert [r.what for r in dev] == [r.what for r in host]
    for d, h in zip(dev, host):
        assert d.fallbacks == h.fallbacks and bool(h.fallbacks) == h.fallback, (
            d.what,
            d.fallbacks,
            h.fallbacks,
        )
        assert (d.counts, d.nbytes) == (h.counts, h.nbytes), (
            f"{d.what}: the device communicated {d.counts} {d.nbytes}, the host {h.counts} "
            f"{h.nbytes}"
        )
        assert d.buffers <= {shard_type} and h.buffers <= {np.ndarray}, (d.what, d.buffers)
        assert len(d.values) == len(h.values), d.what
        got = [v[3] if isinstance(v, tuple) else v for v in d.values]
        host_values = [v[3] if isinstance(v, tuple) else v for v in h.values]
        if device == "gpu":
            got = _aligned(d.pairs, got, host_values)
        for i, (vd, vh, a, b) in enumerate(zip(d.values, h.values, got, host_values)):
            what = f"{d.what} [{i}]"
            if isinstance(vh, tuple):  # a DistTensor or an array: a shard of the device's
                assert (vd[0], vd[2]) == (vh[0], vh[2]), (what, vd[:3], vh[:3])
                assert vd[1] is shard_type and vh[1] is np.ndarray, (what, vd[1], vh[1])
            else:  # a Python bool, a numpy scalar (count_nonzero's, lstsq's rank)
                assert type(vd) is type(vh), (what, type(vd), type(vh))
            _close(a, b, what, device)
        if d.want is not None:  # numpy itself, on the global values
            wants = list(d.want) if isinstance(d.want, tuple) else [d.want]
            for i, (a, w) in enumerate(zip(got, wants)):
                _close(a, w, f"{d.what} [{i}] against numpy", device, d.single)


# -- the families ----------------------------------------------------------------------------------
def _placements(mesh, ndim: int, dtype=F64) -> list[list]:
    """Shard of each axis, Replicate and two asymmetric Partials on 1-D meshes (Partial(max)
    only for real data); the op tests' subset on (2, 2) (nested shards included)."""
    out = placements(mesh, ndim, dtype)
    if mesh.ndim == 1:
        keep = [p for p in out if not p[0].is_partial()] + [[PSUM]]
        return keep + ([[PMAX]] if np.dtype(dtype).kind != "c" else [])
    if np.dtype(dtype).kind == "c":
        out = [p for p in out if not any(q.is_partial() and q != PSUM for q in p)]
    return out[:7]


def _matrix(shape, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.normal(size=shape)
    if np.dtype(dtype).kind == "c":
        g = g + 1j * rng.normal(size=shape)
    return g.astype(dtype)


def _tall_shapes(s: int) -> list[tuple[str, tuple[int, int]]]:
    """Even and uneven row splits, short shards (fewer rows per rank than columns), empty
    shards (fewer rows than ranks), square."""
    return [
        ("even", (4 * s, 3)),
        ("uneven", (4 * s + 3, 3)),
        ("short", (s + 3, 4)),
        ("empty", (max(s - 1, 1), max(s - 1, 1))),
        ("square", (s + 1, s + 1)),
    ]


def _rows_like(pls: list) -> list:
    return [p if p.is_shard() else R for p in pls]


def _decompositions(record: Recorder) -> None:
    """qr (reduced and r), svd, svdvals, lstsq (b a DistTensor split like a's rows, a host
    array or an array of the device); float64 everywhere, float32 and complex128 on some
    placements."""
    mesh, seed = record.mesh, 0
    for dtype in (F64, F32, C128):
        for i, pls in enumerate(_placements(mesh, 2, dtype)):
            kinds = _tall_shapes(mesh.size)
            if dtype != F64:
                if i % 2:
                    continue
                kinds = kinds[(i // 2) % 2 :: 2]
            for kind, shape in kinds:
                seed += 1
                g = _matrix(shape, dtype, seed)
                b = _matrix((shape[0], 2), F64, seed + 1)
                x = P(g, pls, seed)
                what = f"{kind} {shape} {dtype} {pls}"
                checked = seed % 3  # against numpy too: one call in three
                want = np.linalg.qr(g) if checked == 0 else None
                record(f"qr {what}", np.linalg.qr, x, want=want)
                record(f"qr r {what}", np.linalg.qr, x, mode="r")
                record(f"svd {what}", np.linalg.svd, x, full_matrices=False, pairs="svd")
                want = np.linalg.svd(g, compute_uv=False) if checked == 1 else None
                record(f"svdvals {what}", np.linalg.svdvals, x, want=want)
                want = np.linalg.lstsq(g, b) if checked == 2 else None
                record(f"lstsq {what}", np.linalg.lstsq, x, P(b, _rows_like(pls), 7), want=want)
                b1 = g[:, 0].real.copy()  # a host array (copied to the device), or a device's
                b1, where = (b1, "host") if seed % 2 else (Local(b1), "device")
                record(f"lstsq {where} array b {what}", dt.lstsq, x, b1, rcond=1e-3)


def _eigh(record: Recorder) -> None:
    """eigh and eigvalsh of whole matrices and of stacks whose batch axis is split (a batch of
    one matrix: empty shards), UPLO both ways, float32."""
    mesh = record.mesh
    s = mesh.size
    rng = np.random.default_rng(4)
    for shape in ((s + 2, s + 2), (3, 4, 4), (1, 3, 3), (2 * s + 1, 2, 2)):
        a = rng.normal(size=shape)
        a = a + np.swapaxes(a, -1, -2)
        for i, pls in enumerate(_placements(mesh, len(shape))):
            uplo = "LU"[i % 2]
            what = f"{shape} {pls} UPLO={uplo}"
            want = np.linalg.eigh(a, uplo) if i == 0 else None
            record(f"eigh {what}", np.linalg.eigh, P(a, pls, 3), uplo, pairs="eig", want=want)
            record(f"eigvalsh {what}", dt.eigvalsh, P(a, pls, 3), uplo)
        f32 = a.astype(F32)
        want = np.linalg.eigh(f32)
        record(f"eigh float32 {shape}", dt.eigh, P(f32, [S0] * mesh.ndim), pairs="eig", want=want)


def _shapes_2d(s: int, zero: bool = False) -> list[tuple[str, tuple[int, int]]]:
    shapes = [("even", (2 * s, 3)), ("uneven", (2 * s + 1, s + 1)), ("empty", (max(s - 1, 1), 2))]
    return shapes + [("zero", (0, 3))] if zero else shapes


NORMS = [  # (ord, axis, keepdims): vector and matrix norms
    (None, None, False),
    (None, 0, True),
    (2, 1, False),
    (1, 0, False),
    (np.inf, 1, True),
    (-np.inf, 0, False),
    (0, 1, False),
    (3, 0, False),
    (-1.5, 1, False),
    ("fro", None, False),
    (1, None, True),
    (np.inf, None, False),
    (-1, (1, 0), False),
    (-np.inf, (0, 1), True),
]


def _norms(record: Recorder) -> None:
    mesh = record.mesh
    rng = np.random.default_rng(5)
    for kind, shape in _shapes_2d(mesh.size, zero=True):
        g = data(shape, F64, rng, "nonzero")
        c = (g + 1j * data(shape, F64, rng)).astype(C128)
        ints = data(shape, I64, rng, "small")
        for i, pls in enumerate(_placements(mesh, 2)):
            for ord, axis, keep in NORMS[i % 2 :: 2]:  # half on each placement
                if 0 in shape and (ord in (-np.inf, -1) or (ord == -1.5 and axis == 1)):
                    continue  # numpy raises (a minimum of nothing), or divides by zero
                what = f"norm ord={ord} axis={axis} keepdims={keep} {kind} {pls}"
                want = np.linalg.norm(g, ord, axis, keep) if i == 0 else None
                record(what, np.linalg.norm, P(g, pls, 2), ord, axis, keep, want=want)
        for pls in _placements(mesh, 2, C128):
            record(f"complex norm {kind} {pls}", np.linalg.norm, P(c, pls, 2), axis=1)
        for pls in _placements(mesh, 2, I64):
            record(f"int norm {kind} {pls}", np.linalg.norm, P(ints, pls, 2))
    t = data((2, 2 * mesh.size + 1, 3), F64, rng)
    for pls in _placements(mesh, 3)[:4]:
        for ord, axis in (("fro", (0, 2)), (1, (2, 0)), (None, 1)):
            record(f"3-D norm ord={ord} axis={axis} {pls}", np.linalg.norm, P(t, pls), ord, axis)


COMPARISONS = [  # (function, equal_nan, against itself (Replicate) or another array)
    ("isclose", False, False),
    ("allclose", True, True),
    ("isclose", True, False),
    ("array_equal", False, True),
    ("allclose", False, False),
    ("array_equal", True, True),
    ("array_equal", True, False),
    ("isclose", True, True),
]


def _comparisons(record: Recorder) -> None:
    """isclose, allclose, array_equal, array_equiv: DistTensor pairs, scalars, host arrays and
    arrays of the device (Replicate operands), integers."""
    mesh = record.mesh
    rng = np.random.default_rng(6)
    rep = [R] * mesh.ndim
    for kind, shape in _shapes_2d(mesh.size):
        g = data(shape, F64, rng, "small")
        g = np.where(rng.random(shape) < 0.1, rng.choice([np.nan, np.inf, -np.inf], shape), g)
        h = np.where(rng.random(shape) < 0.5, g, g + rng.normal(0, 1e-6, shape))
        h = np.where(rng.random(shape) < 0.2, np.nan, h)
        ints = data(shape, I64, rng, "small")
        for i, pls in enumerate(_placements(mesh, 2)):
            for name, equal_nan, itself in COMPARISONS[i % 2 :: 2]:  # half on each placement
                f = getattr(np, name)
                other = P(g, rep) if itself else P(h, pls, 9)
                want = f(g, other.g, equal_nan=equal_nan)
                what = f"{name} equal_nan={equal_nan} itself={itself} {kind} {pls}"
                record(what, f, P(g, pls), other, equal_nan=equal_nan, want=want)
            record(f"isclose device array {kind} {pls}", dt.isclose, P(g, pls), Local(h))
            record(f"isclose host array {kind} {pls}", np.isclose, P(g, pls), h, equal_nan=True)
            what = f"allclose scalars {kind} {pls}"
            record(what, np.allclose, P(g, pls), 0.5, rtol=0.1, atol=np.float32(2))
            if shape[0]:
                bcast = np.broadcast_to(g[:1], shape).copy()
                what = f"array_equiv {kind} {pls}"
                record(what, np.array_equiv, P(bcast, pls), P(g[:1], rep), want=True)
                record(f"{what} host row", np.array_equiv, P(bcast, pls), g[:1], want=True)
        for pls in _placements(mesh, 2, I64):
            record(f"int isclose {kind} {pls}", np.isclose, P(ints, pls), P(ints + 1, pls), atol=1)
            record(f"int array_equal {kind} {pls}", np.array_equal, P(ints, pls), P(ints, rep))


def _statistics(record: Recorder) -> None:
    """cov and corrcoef (rowvar, bias, ddof, dtype; 1-D), count_nonzero (axes, keepdims)."""
    mesh = record.mesh
    rng = np.random.default_rng(7)
    variants = ({}, {"bias": True}, {"ddof": 2}, {"dtype": np.float32})
    for kind, shape in _shapes_2d(mesh.size):
        g = data(shape, F64, rng)
        ints = data(shape, I64, rng, "small")
        col = g[:, 0].copy()
        for i, pls in enumerate(_placements(mesh, 2)):
            x = P(g, pls, 5)
            for rowvar in (False, True):
                kw = variants[(i + rowvar) % len(variants)]
                want = np.cov(g, rowvar=rowvar, **kw) if i < 2 else None
                what = f"cov rowvar={rowvar} {kw} {kind} {pls}"
                record(what, np.cov, x, rowvar=rowvar, **kw, want=want)
                record(f"corrcoef rowvar={rowvar} {kind} {pls}", np.corrcoef, x, rowvar=rowvar)
        for pls in _placements(mesh, 2, I64):
            for axis, keep in ((None, False), (0, False), (1, True), (None, True), ((0, 1), False)):
                want = np.count_nonzero(ints, axis=axis, keepdims=keep)
                what = f"count_nonzero axis={axis} keepdims={keep} {kind} {pls}"
                record(what, np.count_nonzero, P(ints, pls), axis=axis, keepdims=keep, want=want)
        for pls in _placements(mesh, 1):
            x = P(col, pls, 5)
            record(f"1-D cov {kind} {pls}", np.cov, x, want=np.cov(col))
            record(f"1-D corrcoef {kind} {pls}", np.corrcoef, x)
            record(f"1-D cov rowvar=False {kind} {pls}", np.cov, x, rowvar=False)


def _histograms(record: Recorder) -> None:
    """bins as a count and as edges (a host list), range, density, weights (a DistTensor, or
    a float32 host array: numpy's count type), integers (counts and edges exact)."""
    mesh = record.mesh
    rng = np.random.default_rng(8)
    for kind, shape in _shapes_2d(mesh.size, zero=True):
        g = data(shape, F64, rng)
        w = data(shape, F64, rng, "positive")
        ints = data(shape, I64, rng, "small")
        for pls in _placements(mesh, 2):
            for label, kw in (
                ("bins=5", {"bins": 5}),
                ("edges", {"bins": [-3.0, -1.0, 0.0, 0.5, 4.0]}),
                ("range", {"bins": 4, "range": (-1, 2)}),
                ("density", {"bins": 3, "density": True}),
            ):
                what = f"histogram {label} {kind} {pls}"
                record(what, np.histogram, P(g, pls, 6), **kw, want=np.histogram(g, **kw))
            want = np.histogram(g, 4, weights=w)
            what = f"histogram weights {kind} {pls}"
            record(what, np.histogram, P(g, pls, 6), 4, weights=P(w, pls, 7), want=want)
            what = f"histogram host weights {kind} {pls}"
            record(what, np.histogram, P(g, pls, 6), 4, weights=w.astype(F32), want=None)
        for pls in _placements(mesh, 2, I64):
            want = np.histogram(ints, 3)
            record(f"int histogram {kind} {pls}", np.histogram, P(ints, pls, 6), 3, want=want)


def _with_gradient(f):
    """``f`` and its gradient: (f(x), x.grad) of the loss sum(f(x)^2), one forward and one
    backward."""

    def step(x: dt.DistTensor):
        x.requires_grad_()
        y = f(x)
        (y * y).sum().backward()
        return y, x.grad

    return step


def _norm_of(ord, axis):
    return lambda t: np.linalg.norm(t, ord, axis)


def _gradients(record: Recorder) -> None:
    """The gradients of norm, cov and corrcoef (dt ops all the way), forward and backward
    counted together."""
    mesh = record.mesh
    g = np.random.default_rng(9).normal(size=(2 * mesh.size + 1, 4))
    norms = ((None, None), (None, 0), (None, 1), (1, 0), (np.inf, 1), (3, 0), (1, None))
    for pls in _placements(mesh, 2):
        for ord, axis in norms:
            what = f"grad norm ord={ord} axis={axis} {pls}"
            record(what, _with_gradient(_norm_of(ord, axis)), P(g, pls, 8))
        for f in (np.cov, np.corrcoef):
            for rowvar in (False, True):
                fn = _with_gradient(lambda t, f=f, rowvar=rowvar: f(t, rowvar=rowvar))
                record(f"grad {f.__name__} rowvar={rowvar} {pls}", fn, P(g, pls, 8))


FAMILIES = {
    "decompositions": _decompositions,
    "eigh": _eigh,
    "norm": _norms,
    "comparisons": _comparisons,
    "statistics": _statistics,
    "histogram": _histograms,
    "gradients": _gradients,
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's (and ours) on degenerate input
@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")  # complex Partial splits
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("mesh_shape", MESHES, ids=MESH_IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_family_on_device_equals_the_host(device, mesh_shape, family):
    host = _host(mesh_shape, FAMILIES[family])
    dev = _run(device, mesh_shape, FAMILIES[family])
    assert len(dev) == len(host) == math.prod(mesh_shape)
    for rows_d, rows_h in zip(dev, host):
        assert len(rows_h) > 10
        _compare(rows_d, rows_h, device)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("mesh_shape", [(2, 2)], ids=str)
def test_results_stay_on_the_device_of_the_data(mesh_shape, family):
    """Device inputs on ranks that keep the CPU selected: the results are still device arrays
    (the library's own arrays follow the data, not the selected device)."""
    host = _host(mesh_shape, FAMILIES[family])
    dev = _run("fake", mesh_shape, FAMILIES[family], selected=False)
    for rows_d, rows_h in zip(dev, host):
        _compare(rows_d, rows_h, "fake")


# -- the fallback, what still raises, what is refused -----------------------------------------
def _fallbacks(record: Recorder) -> None:
    """Arguments dt takes through the replicate fallback: the device's function on gathered
    values (Note [The replicate fallback on a device] in dispatch.py), accounted as on the
    host; sign-free parts of the factors (CuPy's and numpy's signs may differ)."""
    g = np.random.default_rng(10).normal(size=(2 * record.mesh.size + 3, 3))
    for pls in _placements(record.mesh, 2)[:3]:
        x = P(g, pls)
        record(f"qr complete |R| {pls}", _abs_r, x, fallback=True)
        record(f"svd full S {pls}", _singular_values, x, fallback=True)
        record(f"norm nuc {pls}", np.linalg.norm, x, "nuc", fallback=True)
        record(f"norm 2 {pls}", np.linalg.norm, x, 2, want=np.linalg.norm(g, 2), fallback=True)


def _abs_r(x):
    return np.abs(np.linalg.qr(x, mode="complete")[1])


def _singular_values(x):
    return np.linalg.svd(x)[1]


@pytest.mark.filterwarnings("ignore:disttensor.*on host copies:RuntimeWarning")
@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_fallback_arguments_on_device_are_the_hosts(device, mesh_shape):
    host = _host(mesh_shape, _fallbacks)
    for rows_d, rows_h in zip(_run(device, mesh_shape, _fallbacks), host):
        _compare(rows_d, rows_h, device)


def test_tensors_on_different_devices_are_refused_before_communicating():
    g = np.random.default_rng(11).normal(size=(7, 3))

    def program():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(g, mesh, [S0])
        d = x.to_device("fake")
        errors = []
        with dt.CommCounter() as cc:
            for call in (
                lambda: dt.lstsq(d, x[:, 0]),  # a host b DistTensor with a device a
                lambda: dt.lstsq(x, FAKE.xp.asarray(g[:, 0])),  # a device array with a host a
                lambda: dt.histogram(d, 4, weights=x),
            ):
                with pytest.raises(TypeError, match="different devices") as e:
                    call()
                errors.append(str(e.value).split(":")[0])
        return errors, cc.counts

    assert every_rank(dt.simulate(2, program)) == (["lstsq", "lstsq", "histogram"], {})


def _no_gradient(mesh) -> list[str]:
    """backward through each decomposition raises naming it."""
    g = np.random.default_rng(12).normal(size=(9, 3))
    sym = g.T @ g
    out = []
    for name, f, a in (
        ("qr", lambda t: np.linalg.qr(t).R, g),
        ("svd", lambda t: np.linalg.svd(t, full_matrices=False).S, g),
        ("lstsq", lambda t: np.linalg.lstsq(t, t[:, 0])[0], g),
        ("eigh", lambda t: np.linalg.eigh(t).eigenvalues, sym),
    ):
        x = dt.shard_tensor(a, mesh, [S0], requires_grad=True)
        y = f(x)
        with pytest.raises(NotImplementedError, match=f"{name} has no gradient") as e:
            (y * y).sum().backward()
        out.append(str(e.value))
    return out


def test_backward_through_decompositions_raises_as_on_the_host():
    host = every_rank(on("cpu", 2, _no_gradient, dt.ProcessMesh([0, 1])))
    assert every_rank(on("fake", 2, _no_gradient, dt.ProcessMesh([0, 1]))) == host


def _on_device(got: Any, want: Any) -> bool:
    """A device result (an array or a tuple of them) equals numpy's: its type and host copy."""
    got = got if isinstance(got, tuple) else (got,)
    want = tuple(want) if isinstance(want, tuple) else (want,)
    assert all(type(o) is FAKE.array_type for o in got), [type(o) for o in got]
    return same(tuple(backend.to_host(o) for o in got), want)


def test_arrays_that_are_not_disttensors_use_their_own_library():
    """On a device array (not a DistTensor) dt's functions are the device's (numpy's on host
    arrays); what CuPy's functions lack raises naming it."""
    rng = np.random.default_rng(13)
    g, h = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))
    sym = g.T @ g
    xp = FAKE.xp
    a, b, s = xp.asarray(g), xp.asarray(h), xp.asarray(sym)
    assert _on_device(dt.qr(a), np.linalg.qr(g))
    assert _on_device(dt.svd(a, full_matrices=False), np.linalg.svd(g, full_matrices=False))
    assert _on_device(dt.eigh(s), np.linalg.eigh(sym))
    assert _on_device(dt.eigvalsh(s, "U"), np.linalg.eigvalsh(sym, "U"))
    assert _on_device(dt.isclose(a, b), np.isclose(g, h))
    assert dt.allclose(a, a) is True and dt.array_equal(a, b) is False
    assert dt.array_equiv(a, a[:1]) is False and dt.array_equiv(a, xp.asarray(g)) is True
    assert _on_device(dt.count_nonzero(a > 0, axis=0), np.count_nonzero(g > 0, axis=0))
    for call, what in (
        (lambda: dt.svd(s, hermitian=True), "svd(hermitian=True)"),
        (lambda: dt.count_nonzero(a, keepdims=True), "count_nonzero(keepdims=True)"),
    ):
        with pytest.raises(NotImplementedError, match="not implemented on GPU") as e:
            call()
        assert what in str(e.value)
