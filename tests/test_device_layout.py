"""Layout ops and scans (disttensor/ops/layout.py, disttensor/ops/scan.py) on device shards.

Each program runs twice on simulated ranks: on the CPU and on the device (tests/fake_device.py's
stand-in for CuPy, or CuPy on a GPU where there is one). Every call's result must be a tensor
of device shards, its global value and placements the host run's (bit for bit on the
stand-in, which computes with numpy; within rounding on a GPU) and numpy's (the oracle, on the
global inputs), and its collectives and point-to-point messages (CommCounter's counts and
bytes) the host run's. Families: pad, diff (n, prepend, append), tril/triu, diagonal, diag,
trace, tensordot, flips, rolls and joins of split axes (their boundary exchanges), the nonzero
family and ``np.where(condition)``, take_along_axis, cumsum/cumprod (np.cumsum,
np.cumulative_sum, x.cumsum(), the reverse scan of cumsum's gradient); their gradients; meshes
(1), (2), (3), (4), (2, 2) with even, uneven, empty-shard and zero-size shapes and every
placement op_cases gives (Shard of each axis, Replicate, asymmetric Partials).
"""

from __future__ import annotations

import math

import numpy as np
import op_cases
import pytest
from op_cases import BOOL, F64, I64, MESH_SHAPES, S0, R, assert_close, make_input, mesh_of
from op_cases import placements as placements_of
from test_device import DEVICES, on

import disttensor as dt
from disttensor import backend
from disttensor.ops.scan import scan
from disttensor.spmd.validate import data

MESH_IDS = [str(s) for s in MESH_SHAPES]


# -- running a program on the host and on the device ---------------------------------------------
class Calls:
    """Runs calls on DistTensors and records, per call, what the device run must repeat: the
    global values, placements and messages (``records``); the shards' array types are
    collected apart (``kinds``: the device's on the device, numpy's on the host)."""

    def __init__(self) -> None:
        self.records: list = []
        self.kinds: set[type] = set()

    def run(self, what: str, fn, args: tuple, want=None, exact: bool = False) -> None:
        """``fn(*args)`` (DistTensors in ``args``) counted; ``want``: numpy's result."""
        with dt.CommCounter() as cc, np.errstate(all="ignore"):
            out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            assert isinstance(o, dt.DistTensor), (what, type(o))
            self.kinds.add(type(o.to_local()))
        inside = dt.get_rank() in outs[0].mesh
        values = [o.numpy() if inside else o.to_local().shape for o in outs]
        if want is not None and inside:
            wants = want if isinstance(want, tuple) else (want,)
            for got, w in zip(values, wants):
                assert_close(got, np.asarray(w), what, exact)
        placements = [o.placements for o in outs]
        self.records.append((what, values, placements, cc.counts, cc.bytes, cc.fallbacks))

    def check(self, mesh, fn, g, pl, what: str, exact: bool = False) -> None:
        """``fn`` of ``g`` placed as ``pl`` (asymmetric Partials), against ``fn(g)``."""
        with np.errstate(all="ignore"):
            want = fn(g)
        self.run(f"{what} {g.dtype}{g.shape} {pl}", fn, (make_input(g, mesh, pl),), want, exact)

    def result(self) -> tuple[list, set[type]]:
        return self.records, self.kinds


def compare(device: str, mesh_shape, program, *args) -> int:
    """``program(mesh, calls, *args)`` on the host and on ``device``: every rank's records
    equal, the device's shards all of the device's array type. The number of calls."""
    mesh = mesh_of(mesh_shape)

    def run(mesh, *args):
        calls = Calls()
        program(mesh, calls, *args)
        return calls.result()

    host = on("cpu", mesh.size, run, mesh, *args)
    dev = on(device, mesh.size, run, mesh, *args)
    want = backend.select(device).array_type
    for r, ((got, kinds), (expected, host_kinds)) in enumerate(zip(dev, host)):
        assert kinds == {want} and host_kinds == {np.ndarray}, (r, kinds, host_kinds)
        assert len(got) == len(expected), (r, len(got), len(expected))
        for a, b in zip(got, expected):
            if device == "fake":  # the stand-in computes with numpy: bit for bit
                assert op_cases.same(a, b), f"rank {r}: {a[0]}: device {a} host {b}"
                continue
            assert a[0] == b[0] and a[2:] == b[2:], f"rank {r}: device {a} host {b}"
            for x, y in zip(a[1], b[1]):
                assert_close(x, y, f"rank {r}: {a[0]}")
    return len(dev[0][0])


def like(a, host: np.ndarray):
    """``host`` as an array of ``a``'s kind: numpy beside numpy, the selected device's array
    beside a DistTensor (a host array of one or more axes would not mix with device
    tensors)."""
    return host if isinstance(a, np.ndarray) else backend.current().asarray(host)


# -- layout ops ----------------------------------------------------------------------------------
def layout_calls(r: int, c: int) -> list:
    """pad, diff, triangles, diagonals, trace, tensordot and the boundary exchanges of an (r, c)
    array."""
    return [
        ("pad 1", lambda a: np.pad(a, 1)),
        ("pad widths", lambda a: np.pad(a, ((2, 0), (0, 1)))),
        ("pad values", lambda a: np.pad(a, ((1, 2), (3, 0)), constant_values=((1, 2), (3, 4)))),
        ("dt.pad value", lambda a: dt.pad(a, (0, 3), constant_values=7)),
        ("diff", lambda a: np.diff(a, axis=0)),
        ("diff 2 1", lambda a: np.diff(a, 2, axis=1)),
        ("diff 3 0", lambda a: np.diff(a, 3, 0)),
        ("diff past", lambda a: np.diff(a, r + 1, 0)),
        ("diff prepend", lambda a: np.diff(a, 1, 0, prepend=0.5)),
        ("diff append array", lambda a: np.diff(a, axis=0, append=like(a, np.full((1, c), 2.0)))),
        ("diff prepend 0-d", lambda a: np.diff(a, axis=1, prepend=like(a, np.array(1.5)))),
        ("tril", np.tril),
        ("tril 1", lambda a: np.tril(a, 1)),
        ("triu -1", lambda a: np.triu(a, -1)),
        ("triu 2", lambda a: np.triu(a, k=2)),
        ("diagonal", np.diagonal),
        ("diagonal 1", lambda a: np.diagonal(a, 1)),
        ("diagonal -1", lambda a: a.diagonal(-1)),
        ("diagonal axes 1 0", lambda a: np.diagonal(a, 1, 1, 0)),
        ("diag -2", lambda a: np.diag(a, -2)),
        ("diag of a diagonal", lambda a: np.diag(np.diagonal(a), 1)),
        ("trace", np.trace),
        ("trace 1", lambda a: a.trace(1)),
        ("tensordot 2", lambda a: np.tensordot(a, a, 2)),
        ("tensordot axes", lambda a: np.tensordot(a, a, ([0], [0]))),
        ("flip", lambda a: np.flip(a, 0)),
        ("roll", lambda a: np.roll(a, (2, -1), (0, 1))),
        ("vstack", lambda a: np.vstack([a, a])),
        ("concatenate", lambda a: np.concatenate([a, a[:1]], axis=0)),
    ]


def _np(a) -> bool:
    return isinstance(a, np.ndarray)


def _layout_program(mesh, calls: Calls) -> None:
    rng = np.random.default_rng(3)
    sh = op_cases.shapes_2d(mesh)
    g = data(sh["uneven"], F64, rng)
    for pl in placements_of(mesh, 2, F64):
        for what, fn in layout_calls(*g.shape):
            calls.check(mesh, fn, g, pl, what)
    for label in ("even", "empty", "zero"):
        g = data(sh[label], F64, rng)
        for pl in placements_of(mesh, 2, F64)[::2]:
            for what, fn in layout_calls(*g.shape)[::3]:
                calls.check(mesh, fn, g, pl, f"{label} {what}")
    ints = data(sh["uneven"], I64, rng, "small")
    for pl in placements_of(mesh, 2, I64):
        for what, fn in layout_calls(*ints.shape)[1::4]:
            calls.check(mesh, fn, ints, pl, what, exact=True)
    bools = data(sh["empty"], BOOL, rng)
    for pl in placements_of(mesh, 2, BOOL)[::2]:
        for what, fn in layout_calls(*bools.shape)[4:16:3]:
            calls.check(mesh, fn, bools, pl, what, exact=True)
    s = mesh.size
    for v in (data((2 * s + 1,), F64, rng), data((max(s - 1, 1),), F64, rng)):
        for pl in placements_of(mesh, 1, F64)[::2]:
            for what, fn in (
                ("diag", np.diag),
                ("diag 2", lambda a: np.diag(a, 2)),
                ("diff", np.diff),
                ("pad", lambda a: np.pad(a, (2, 3), constant_values=-1.5)),
                ("tril", np.tril),
            ):
                calls.check(mesh, fn, v, pl, f"vector {what}")
    t = data((3, s + 1, 2 * s + 1), F64, rng)
    for pl in placements_of(mesh, 3, F64)[:6]:
        for what, fn in (
            ("pad", lambda a: np.pad(a, ((0, 1), (2, 0), (1, 1)))),
            ("diff", lambda a: np.diff(a, 2, 1)),
            ("tril", lambda a: np.tril(a, -1)),
            ("diagonal", lambda a: np.diagonal(a, 1, 2, 1)),
            ("trace", lambda a: np.trace(a, 0, 1, 2)),
        ):
            calls.check(mesh, fn, t, pl, f"3-D {what}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_layout_ops_on_device(device, mesh_shape):
    assert compare(device, mesh_shape, _layout_program) > 100


# -- scans ---------------------------------------------------------------------------------------
def scan_calls() -> list:
    return [
        ("cumsum 0", lambda a: np.cumsum(a, axis=0)),
        ("cumsum 1", lambda a: np.cumsum(a, 1)),
        ("cumsum None", np.cumsum),
        ("x.cumsum", lambda a: a.cumsum(axis=0)),
        ("cumulative_sum", lambda a: np.cumulative_sum(a, axis=0)),
        ("cumprod 0", lambda a: np.cumprod(a, axis=0)),
        ("cumprod 1", lambda a: np.cumprod(a, axis=1)),
        ("x.cumprod None", lambda a: a.cumprod()),
        ("cumsum dtype", lambda a: a.cumsum(axis=0, dtype=np.float32)),
        ("reverse cumsum 0", lambda a: _reverse(a, 0)),
        ("reverse cumsum 1", lambda a: _reverse(a, 1)),
    ]


def _reverse(a, axis: int):
    """The reverse scan of cumsum's gradient (internal: ``scan(..., reverse=True)``)."""
    if _np(a):
        return np.flip(np.cumsum(np.flip(a, axis), axis), axis)
    return scan("sum", a, axis, reverse=True)


def _scan_program(mesh, calls: Calls) -> None:
    rng = np.random.default_rng(5)
    sh = op_cases.shapes_2d(mesh)
    for label in ("uneven", "empty", "even", "zero"):
        g = data(sh[label], F64, rng, "exponent")
        every = label == "uneven"
        for pl in placements_of(mesh, 2, F64)[:: 1 if every else 2]:
            for what, fn in scan_calls()[:: 1 if every else 3]:
                calls.check(mesh, fn, g, pl, f"{label} {what}")
    ints = data(sh["uneven"], I64, rng, "small")
    bools = data(sh["empty"], BOOL, rng)
    for pl in placements_of(mesh, 2, I64):
        for what, fn in scan_calls()[::2]:
            calls.check(mesh, fn, ints, pl, what, exact=True)
        calls.check(mesh, lambda a: np.cumsum(a.astype(np.int32), 0), ints, pl, "int32", True)
    for pl in placements_of(mesh, 2, BOOL)[::2]:
        calls.check(mesh, lambda a: np.cumsum(a, axis=0), bools, pl, "bool cumsum", True)
    t = data((2, 2 * mesh.size + 1, 3), F64, rng)
    for pl in placements_of(mesh, 3, F64)[:6]:
        calls.check(mesh, lambda a: np.cumsum(a, axis=1), t, pl, "3-D cumsum")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_scans_on_device(device, mesh_shape):
    assert compare(device, mesh_shape, _scan_program) > 50


# -- the nonzero family --------------------------------------------------------------------------
def nonzero_calls() -> list:
    return [
        ("nonzero", np.nonzero),
        ("x.nonzero", lambda a: a.nonzero()),
        ("where", np.where),
        ("argwhere", np.argwhere),
        ("flatnonzero", np.flatnonzero),
        ("where of a comparison", lambda a: np.where(a > 0)),
    ]


def _nonzero_program(mesh, calls: Calls) -> None:
    rng = np.random.default_rng(7)
    sh = op_cases.shapes_2d(mesh)
    for label in ("uneven", "empty", "even", "zero"):
        g = data(sh[label], I64, rng, "small")  # zeros among them: the indices move
        for pl in placements_of(mesh, 2, I64)[:: 1 if label == "uneven" else 3]:
            for what, fn in nonzero_calls():
                calls.check(mesh, fn, g, pl, f"{label} {what}", exact=True)
    dense = np.arange(1.0, 1.0 + math.prod(sh["uneven"])).reshape(sh["uneven"])
    bools = data(sh["uneven"], BOOL, rng)
    s = mesh.size
    for pl in placements_of(mesh, 2, F64)[::2]:  # no zeros: the data moves instead
        calls.check(mesh, np.nonzero, dense, pl, "dense nonzero", exact=True)
    for pl in placements_of(mesh, 2, BOOL)[::2]:
        calls.check(mesh, np.argwhere, bools, pl, "bool argwhere", exact=True)
    for pl in placements_of(mesh, 1, I64):
        calls.check(mesh, np.nonzero, data((2 * s + 1,), I64, rng, "small"), pl, "vector", True)
    for pl in placements_of(mesh, 3, F64)[:4]:
        t = data((3, s + 1, 2), F64, rng, "small")
        calls.check(mesh, np.argwhere, t, pl, "3-D argwhere", exact=True)
    for fn in (np.argwhere, np.flatnonzero):
        calls.check(mesh, fn, np.array(3.0), [R] * mesh.ndim, "0-d", exact=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_nonzero_family_on_device(device, mesh_shape):
    assert compare(device, mesh_shape, _nonzero_program) > 20


# -- take_along_axis -----------------------------------------------------------------------------
def _take_program(mesh, calls: Calls) -> None:
    rng = np.random.default_rng(9)
    s = mesh.size
    for shape in [(2 * s + 1, s + 2), (max(s - 1, 1), 3), (0, 3)]:
        g = data(shape, F64, rng)
        r, c = shape
        along0 = rng.integers(-r, r, (r + 1, c)) if r else np.zeros((0, c), np.int64)
        along1 = rng.integers(-c, c, (r, 3))
        cases = [(along0, 0), (along1, 1), (along1[:1], -1)]  # the last one broadcasts arr
        if r:
            cases.append((along0[0], None))  # the raveled array
        for pa in placements_of(mesh, 2, F64):
            for k, (idx, axis) in enumerate(cases):
                pls = placements_of(mesh, idx.ndim, I64)
                pi = pls[k % len(pls)]  # indices in another layout each time
                want = np.take_along_axis(g, idx, axis)
                x, i = make_input(g, mesh, pa), make_input(idx, mesh, pi, seed=2)
                what = f"take_along_axis axis={axis} {shape} {pa} {pi}"
                calls.run(what, lambda x, i, axis=axis: np.take_along_axis(x, i, axis), (x, i),
                          want, exact=not any(p.is_partial() for p in pa))  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=MESH_IDS)
def test_take_along_axis_on_device(device, mesh_shape):
    assert compare(device, mesh_shape, _take_program) > 20


# -- gradients -----------------------------------------------------------------------------------
def grad_calls(r: int, c: int) -> list:
    """Differentiable calls of an (r, c) tensor; ``take`` indices along both axes."""
    rng = np.random.default_rng(11)
    idx0, idx1 = rng.integers(-r, r, (r + 2, c)), rng.integers(0, c, (r, 2))
    return [
        ("cumsum 0", lambda a: np.cumsum(a, axis=0)),
        ("cumsum 1", lambda a: a.cumsum(axis=1)),
        ("cumprod 0", lambda a: np.cumprod(a, axis=0)),
        ("pad", lambda a: np.pad(a, ((1, 2), (0, 1)), constant_values=3.0)),
        ("diff", lambda a: np.diff(a, min(2, r), axis=0)),  # n > r: see ops/gradients.py
        ("diff prepend", lambda a: np.diff(a, axis=0, prepend=1.0)),
        ("tril", lambda a: np.tril(a, -1)),
        ("triu", np.triu),
        ("diagonal", lambda a: np.diagonal(a, 1)),
        ("diag", lambda a: np.diag(np.diagonal(a), -1)),
        ("trace", np.trace),
        ("flip roll", lambda a: np.roll(np.flip(a, 0), 2, 0)),
        ("vstack", lambda a: np.vstack([a, a * 2.0])),
        ("take 0", lambda a: np.take_along_axis(a, _index(a, idx0), 0)),
        ("take 1", lambda a: np.take_along_axis(a, _index(a, idx1), 1)),
    ]


def _index(a, idx: np.ndarray):
    """Indices beside ``a``: a Replicate DistTensor on its mesh (on its device), or ``idx``
    beside a numpy array."""
    return idx if _np(a) else dt.shard_tensor(idx, a.mesh, [R] * a.mesh.ndim)


def _grad_program(mesh, calls: Calls) -> None:
    rng = np.random.default_rng(13)
    s = mesh.size
    for shape in [(2 * s + 1, s + 2), (max(s - 1, 1), 3)]:
        g = data(shape, F64, rng, "nonzero")
        g[0, 0] = 0.0  # cumprod's gradient through a zero
        for pl in placements_of(mesh, 2, F64)[::2]:
            for what, fn in grad_calls(*shape):

                def grad(x, fn=fn):
                    y = fn(x)
                    weights = dt.shard_tensor(np.linspace(-1.0, 2.0, y.size).reshape(y.shape),
                                              y.mesh, [R] * y.mesh.ndim)  # fmt: skip
                    (y * weights).sum().backward()
                    return x.grad

                x = make_input(g, mesh, pl)
                x.requires_grad_(True)
                calls.run(f"grad {what} {shape} {pl}", grad, (x,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (2, 2)], ids=str)
def test_gradients_on_device(device, mesh_shape):
    assert compare(device, mesh_shape, _grad_program) > 30


# -- ranks outside the mesh, plain device arrays, errors -------------------------------------------
def _outside_program(mesh, calls: Calls) -> None:
    """Rank 2 is not in the mesh: it holds empty shards of the device's type."""
    mesh = dt.ProcessMesh([0, 1])
    g = data((5, 4), I64, np.random.default_rng(15), "small")
    for what, fn in [
        ("pad", lambda a: np.pad(a, 1)),
        ("diff", lambda a: np.diff(a, 2, 0)),
        ("tril", np.tril),
        ("diagonal", lambda a: np.diagonal(a, 1)),
        ("diag", lambda a: np.diag(a[0])),
        ("trace", np.trace),
        ("cumsum", lambda a: np.cumsum(a, axis=0)),
        ("nonzero", np.nonzero),
        ("argwhere", np.argwhere),
        ("flatnonzero", np.flatnonzero),
        ("take", lambda a: np.take_along_axis(a, _index(a, np.zeros((2, 4), np.int64)), 0)),
    ]:
        calls.check(mesh, fn, g, [S0], what, exact=True)


@pytest.mark.parametrize("device", DEVICES)
def test_ranks_outside_the_mesh(device):
    assert compare(device, (3,), _outside_program) == 11


@pytest.mark.parametrize("device", DEVICES)
def test_plain_device_arrays_take_the_devices_functions(device):
    g = data((5, 4), F64, np.random.default_rng(17))
    ints = data((5, 4), I64, np.random.default_rng(17), "small")

    def program():
        be = backend.current()
        a, i = be.asarray(g), be.asarray(ints)
        idx = be.asarray(np.array([[1, 0, -1, 2]]))
        out = {
            "cumsum": dt.cumsum(a, 0),
            "cumprod None": dt.cumprod(a),
            "diff": dt.diff(a, 2, 0),
            "diff prepend": dt.diff(a, prepend=0.0),
            "pad": dt.pad(a, 1, constant_values=2.0),
            "tril": dt.tril(a, 1),
            "diagonal": dt.diagonal(a, 1),
            "diag": dt.diag(a, -1),
            "trace": dt.trace(a),
            "take": dt.take_along_axis(a, idx, 0),
            "take None": dt.take_along_axis(a, be.asarray(np.array([3, -1])), None),
            "nonzero": dt.nonzero(i)[1],
            "argwhere": dt.argwhere(i),
            "flatnonzero": dt.flatnonzero(i),
        }
        assert {type(v) for v in out.values()} == {be.array_type}, out
        return {k: backend.to_host(v) for k, v in out.items()}

    got = on(device, 1, program)[0]
    want = {
        "cumsum": np.cumsum(g, 0),
        "cumprod None": np.cumprod(g),
        "diff": np.diff(g, 2, 0),
        "diff prepend": np.diff(g, prepend=0.0),
        "pad": np.pad(g, 1, constant_values=2.0),
        "tril": np.tril(g, 1),
        "diagonal": np.diagonal(g, 1),
        "diag": np.diag(g, -1),
        "trace": np.trace(g),
        "take": np.take_along_axis(g, np.array([[1, 0, -1, 2]]), 0),
        "take None": np.take_along_axis(g, np.array([3, -1]), None),
        "nonzero": np.nonzero(ints)[1],
        "argwhere": np.argwhere(ints),
        "flatnonzero": np.flatnonzero(ints),
    }
    for k, w in want.items():
        assert_close(got[k], w, k, exact=device == "fake")


def test_errors_on_device_are_the_hosts():
    """numpy's errors on the device as on the host, after the same messages (CuPy would wrap
    an out-of-range index: it is checked first); dt's functions refuse a host array of one or
    more axes among device tensors before any communication (Note [Array backends])."""

    def program(device):
        dt.set_device(device)
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(np.zeros((3, 5)), mesh, [S0])
        bad = dt.shard_tensor(np.full((1, 5), 3), mesh, [R])
        calls = [
            (lambda: np.take_along_axis(x, bad, 0), IndexError, "index 3 is out of bounds"),
            (lambda: np.take_along_axis(x, np.full((1, 1), 9), 0), IndexError, "out of bounds"),
            (lambda: np.diff(x, -1), ValueError, "order must be non-negative"),
            (lambda: np.pad(x, -1), ValueError, "can't contain negative values"),
            (lambda: np.nonzero(x[0, 0]), ValueError, "Calling nonzero on 0d arrays"),
        ]
        if device != "cpu":
            calls += [
                (lambda: dt.diff(x, axis=0, append=np.ones((1, 5))), TypeError, "different"),
                (lambda: dt.vstack([x, np.ones((1, 5))]), TypeError, "different devices"),
                (lambda: dt.take_along_axis(x, np.zeros((1, 5), int), 0), TypeError, "different"),
            ]
        raised = []
        for call, exc, match in calls:
            with dt.CommCounter() as cc, pytest.raises(exc, match=match):
                call()
            raised.append((exc.__name__, cc.counts))
        return raised

    host = op_cases.every_rank(dt.simulate(2, program, "cpu"))
    dev = op_cases.every_rank(dt.simulate(2, program, "fake"))
    assert dev[: len(host)] == host and host[0][1], (dev, host)  # the rule moved, then raised
    assert all(counts == {} for _, counts in dev[len(host) :]), dev


PAD_MODES = [
    ("edge", {}),
    ("reflect", {}),
    ("symmetric", {"reflect_type": "odd"}),
    ("wrap", {}),
    ("linear_ramp", {"end_values": (1.0, -2.0)}),
    ("maximum", {"stat_length": 2}),
    ("mean", {}),
    ("minimum", {}),
]


def _pad_modes_program(mesh, calls: Calls) -> None:
    """np.pad's other modes: numpy's function on the gathered value on the host (the
    replicate fallback), the device's pad on the gathered device value (dispatch.py's Note
    [The replicate fallback on a device]): the same gathers, the same accounting."""
    g = data(op_cases.shapes_2d(mesh)["uneven"], F64, np.random.default_rng(21))
    for pl in placements_of(mesh, 2, F64)[::2]:
        for mode, kwargs in PAD_MODES:

            def pad(a, mode=mode, kwargs=kwargs):
                return np.pad(a, ((1, 2), (2, 0)), mode, **kwargs)

            calls.check(mesh, pad, g, pl, f"pad {mode}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)], ids=str)
def test_pad_modes_through_the_fallback(device, mesh_shape):
    assert compare(device, mesh_shape, _pad_modes_program) > 20
