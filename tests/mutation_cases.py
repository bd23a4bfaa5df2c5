"""Writes against numpy: ``x[key] = value``, in-place operators and ``out=``, on simulated ranks
(tests/test_mutation.py) and under mpiexec (tests/mpi_runner.py).

Every case mutates a DistTensor placed on a mesh and a numpy copy of its global value the
same way, then compares the global value (and every alias's), the placements (a write keeps
them: Note [Writes keep the layout] in disttensor/ops/mutation.py) and, where the issue asks
for it, the communication (CommCounter). Targets take every placement op_cases.placements
gives (Shard, Replicate, every Partial), on uneven shapes and on shapes with empty shards.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from op_cases import (
    F64,
    I64,
    assert_close,
    assert_grid,
    fitting_meshes,
    make_input,
    placements,
    shapes_2d,
)

import disttensor as dt

R = dt.Replicate()


class Checks:
    """Counts checks and collects failures (a failure is one line, the grid goes on)."""

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []

    def run(self, what: str, fn: Callable[[], None]) -> None:
        self.count += 1
        try:
            with np.errstate(all="ignore"):
                fn()
        except Exception as e:
            self.failures.append(f"{what}: {type(e).__name__}: {str(e)[:300]}")

    def result(self) -> tuple[int, list[str]]:
        return self.count, self.failures


def _layouts(mesh: dt.ProcessMesh, ndim: int, dtype=F64) -> list[list[dt.Placement]]:
    """Layouts for values: Replicate, each Shard, Partial(sum) (others come with targets)."""
    out = [[R] * mesh.ndim]
    for d in range(ndim):
        out.append([dt.Shard(d)] + [R] * (mesh.ndim - 1))
    if np.dtype(dtype).kind == "f":
        out.append([dt.Partial()] + [R] * (mesh.ndim - 1))
    return out


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    exact = got.dtype.kind in "biu"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != numpy's {want.dtype}"
    assert_close(got, want, what, exact=exact)


def _write(
    checks: Checks,
    mesh: dt.ProcessMesh,
    g: np.ndarray,
    pl: list,
    what: str,
    on_dt: Callable[[dt.DistTensor], Any],
    on_np: Callable[[np.ndarray], Any],
) -> None:
    """``on_dt(x)`` against ``on_np(a)`` (a numpy copy of the same global value), checking x,
    an alias of x taken before the write, and that x keeps its placements."""

    seed = zlib.crc32(f"{what} {mesh.shape} {pl}".encode())  # the same on every rank

    def body():
        x = make_input(g, mesh, pl, seed=seed)
        alias = x
        a = g.copy()
        on_dt(x)
        on_np(a)
        _same(x.numpy(), a, what)
        _same(alias.numpy(), a, f"{what} (alias)")
        assert x.placements == list(pl), f"{what}: placements {x.placements} != {pl}"

    checks.run(f"{what} target {mesh.shape} {pl}", body)


def _region_writes(checks: Checks, mesh: dt.ProcessMesh, g: np.ndarray, pl: list) -> None:
    n, m = g.shape
    rng = np.random.default_rng(7)
    keys: list[tuple[str, Any, tuple[int, ...]]] = [
        ("rows 1:-1, cols 1:", (slice(1, -1), slice(1, None)), (max(n - 2, 0), m - 1)),
        ("row 2", 2 % n, (m,)),
        ("item -1, 0", (-1, 0), ()),
        ("every other row from the end", slice(None, None, -2), (len(range(n)[::-2]), m)),
        ("column 1, new axis", (Ellipsis, 1, None), (n, 1)),
        ("nothing", slice(3, 3), (0, m)),
    ]
    for label, key, region in keys:
        _write(
            checks,
            mesh,
            g,
            pl,
            f"x[{label}] = scalar",
            lambda x, k=key: x.__setitem__(k, 7.5),
            lambda a, k=key: a.__setitem__(k, 7.5),
        )
        value = rng.normal(size=region)
        _write(
            checks,
            mesh,
            g,
            pl,
            f"x[{label}] = array",
            lambda x, k=key, v=value: x.__setitem__(k, v),
            lambda a, k=key, v=value: a.__setitem__(k, v),
        )
        if region and region[-1] > 1:  # a row broadcast over the region
            row = rng.normal(size=region[-1:])
            _write(
                checks,
                mesh,
                g,
                pl,
                f"x[{label}] = row",
                lambda x, k=key, v=row: x.__setitem__(k, v),
                lambda a, k=key, v=row: a.__setitem__(k, v),
            )
        if len(region) == 0:
            continue
        for vpl in _layouts(mesh, len(region)):  # a DistTensor value, each layout
            _write(
                checks,
                mesh,
                g,
                pl,
                f"x[{label}] = DistTensor {vpl}",
                lambda x, k=key, v=value, q=vpl: x.__setitem__(k, make_input(v, mesh, q)),
                lambda a, k=key, v=value: a.__setitem__(k, v),
            )


def _shard_starts(n: int, mesh: dt.ProcessMesh, pl: list, axis: int) -> list[int]:
    """Where the shards of ``axis`` (length ``n``) start, worked out here with numpy.array_split
    (nested splits in mesh-dim order), not with the library's boxes; 0 and ``n`` included."""
    pieces = [np.arange(n)]
    for m, p in enumerate(pl):
        if p.is_shard() and p.dim == axis:
            pieces = [q for piece in pieces for q in np.array_split(piece, mesh.shape[m])]
    return sorted({0, n, *(int(q[0]) for q in pieces if q.size)})


def _reversed_slices(n: int, starts: list[int]) -> list[tuple[str, slice]]:
    """Negative-step slices of an axis of length ``n`` that start or stop at 0, at -1 and at
    each shard start b: a write stopping at b ends one element above b (the shard at b holds
    part of it up to, not including, its first element: the local slice stops at 0 and must
    not be open-ended), one starting at b begins with the shard's first element."""
    out = [
        ("-1::-1", slice(-1, None, -1)),
        ("-1:0:-1", slice(-1, 0, -1)),  # stops at 0: x[0] is not written
        ("0::-1", slice(0, None, -1)),
        (":-1:-1", slice(None, -1, -1)),  # nothing (stop n - 1)
        ("-1::-2", slice(-1, None, -2)),
    ]
    for b in starts:
        out += [
            (f":{b}:-1", slice(None, b, -1)),
            (f"{b}::-1", slice(b, None, -1)),
            (f"{b + 2}:{b}:-2", slice(b + 2, b, -2)),  # stops at b with a step of 2
            (f"-1:{b - 1 if b else ''}:-3", slice(-1, b - 1 if b else None, -3)),
        ]
    seen, unique = set(), []
    for label, k in out:  # each range once: a write sees only the range, not how it is spelled
        r = tuple(range(n)[k])
        if r not in seen:
            seen.add(r)
            unique.append((label, k))
    return unique


def _negative_steps(checks: Checks, mesh: dt.ProcessMesh, g: np.ndarray, pl: list) -> None:
    """Negative-step slices on both axes at once (the rows' and the columns' keys paired),
    written with a scalar (each rank's local slice only) and with a DistTensor laid out as
    the target (the value's pieces fetched by the region each rank holds: what the gradient of
    a slice of a split axis does, Note [Slices of split axes] in ops/shape.py)."""
    rows = _reversed_slices(g.shape[0], _shard_starts(g.shape[0], mesh, pl, 0))
    cols = _reversed_slices(g.shape[1], _shard_starts(g.shape[1], mesh, pl, 1))
    rng = np.random.default_rng(10)
    for i in range(max(len(rows), len(cols))):
        (rl, rk), (cl, ck) = rows[i % len(rows)], cols[i % len(cols)]
        key = (rk, ck)
        region = g[key].shape
        label = f"x[{rl}, {cl}] {g.shape}"
        _write(
            checks,
            mesh,
            g,
            pl,
            f"{label} = scalar",
            lambda x, k=key: x.__setitem__(k, -1.0),
            lambda a, k=key: a.__setitem__(k, -1.0),
        )
        value = rng.normal(size=region)
        _write(
            checks,
            mesh,
            g,
            pl,
            f"{label} = DistTensor {pl}",
            lambda x, k=key, v=value: x.__setitem__(k, make_input(v, mesh, pl)),
            lambda a, k=key, v=value: a.__setitem__(k, v),
        )


def _advanced_writes(checks: Checks, mesh: dt.ProcessMesh, g: np.ndarray, pl: list) -> None:
    n, m = g.shape
    rows = np.array([0, n - 1, n // 2, 0])  # a repeated row: the last write wins, as in numpy
    cols = np.array([1, 0, m - 1, 1]) % m
    vals = np.array([10.0, 20.0, 30.0, 40.0])
    _write(
        checks,
        mesh,
        g,
        pl,
        "x[rows, cols] = values",
        lambda x: x.__setitem__((rows, cols), vals),
        lambda a: a.__setitem__((rows, cols), vals),
    )
    _write(
        checks,
        mesh,
        g,
        pl,
        "x[[rows]] -= 1 (list key)",
        lambda x: x.__setitem__(list(rows), x[list(rows)] - 1),
        lambda a: a.__setitem__(list(rows), a[list(rows)] - 1),
    )
    _write(
        checks,
        mesh,
        g,
        pl,
        "x[arange(n), labels] -= 1",
        lambda x: x.__setitem__(
            (np.arange(n), np.arange(n) % m), x[np.arange(n), np.arange(n) % m] - 1
        ),
        lambda a: a.__setitem__(
            (np.arange(n), np.arange(n) % m), a[np.arange(n), np.arange(n) % m] - 1
        ),
    )
    mask = g > 0
    _write(
        checks,
        mesh,
        g,
        pl,
        "x[numpy mask] = 0",
        lambda x: x.__setitem__(mask, 0.0),
        lambda a: a.__setitem__(mask, 0.0),
    )
    _write(
        checks,
        mesh,
        g,
        pl,
        "x[numpy mask] = values",
        lambda x: x.__setitem__(mask, np.arange(mask.sum(), dtype=float)),
        lambda a: a.__setitem__(mask, np.arange(mask.sum(), dtype=float)),
    )
    _write(
        checks,
        mesh,
        g,
        pl,
        "x[x > 0] = -1 (DistTensor mask, x's layout)",
        lambda x: x.__setitem__(x > 0, -1.0),
        lambda a: a.__setitem__(a > 0, -1.0),
    )
    for mpl in _layouts(mesh, 2, bool)[:3]:
        _write(
            checks,
            mesh,
            g,
            pl,
            f"x[mask {mpl}] = 2",
            lambda x, q=mpl: x.__setitem__(make_input(mask, mesh, q), 2.0),
            lambda a: a.__setitem__(mask, 2.0),
        )
    _write(
        checks,
        mesh,
        g,
        pl,
        "x[row mask, 1:] = 3",
        lambda x: x.__setitem__((mask[:, 0], slice(1, None)), 3.0),
        lambda a: a.__setitem__((mask[:, 0], slice(1, None)), 3.0),
    )
    idx = make_input(rows, mesh, [R] * mesh.ndim)
    _write(
        checks,
        mesh,
        g,
        pl,
        "x[DistTensor rows] = DistTensor",
        lambda x: x.__setitem__(
            idx, make_input(np.ones((4, m)), mesh, [dt.Shard(0)] + [R] * (mesh.ndim - 1))
        ),
        lambda a: a.__setitem__(rows, np.ones((4, m))),
    )


def _inplace(checks: Checks, mesh: dt.ProcessMesh, g: np.ndarray, pl: list) -> None:
    n, m = g.shape
    rng = np.random.default_rng(8)
    other = rng.normal(size=(n, m))
    row = rng.normal(size=m)
    sq = rng.normal(size=(m, m))
    for name, fn in [("+=", np.add), ("-=", np.subtract), ("*=", np.multiply), ("/=", np.divide)]:
        _write(
            checks,
            mesh,
            g,
            pl,
            f"x {name} 1.5",
            lambda x, f=fn: f(x, 1.5, out=x),
            lambda a, f=fn: f(a, 1.5, out=a),
        )
        _write(
            checks,
            mesh,
            g,
            pl,
            f"x {name} row (numpy)",
            lambda x, f=fn: f(x, row, out=x),
            lambda a, f=fn: f(a, row, out=a),
        )
        for vpl in _layouts(mesh, 2):
            _write(
                checks,
                mesh,
                g,
                pl,
                f"x {name} DistTensor {vpl}",
                lambda x, f=fn, q=vpl: f(x, make_input(other, mesh, q), out=x),
                lambda a, f=fn: f(a, other, out=a),
            )
    _write(checks, mesh, g, pl, "x += x (self)", lambda x: x.__iadd__(x), lambda a: a.__iadd__(a))
    _write(
        checks, mesh, g, pl, "x @= square", lambda x: x.__imatmul__(sq), lambda a: a.__imatmul__(sq)
    )
    _write(checks, mesh, g, pl, "x **= 2", lambda x: x.__ipow__(2), lambda a: a.__ipow__(2))

    def operators(x):
        y = x
        y += 1
        y *= 2
        y -= row
        y /= 4

    _write(checks, mesh, g, pl, "y = x; y += 1; y *= 2; y -= row; y /= 4", operators, operators)

    def view_of_columns(x):  # a view when the columns are not split; else written through
        v = x[:, 1:]
        v *= -1
        v += 2

    _write(checks, mesh, g, pl, "v = x[:, 1:]; v *= -1; v += 2", view_of_columns, view_of_columns)

    def slice_of_rows(x):
        x[1 : n - 1] += 100
        x[::2, 0] -= 1

    _write(checks, mesh, g, pl, "x[1:n-1] += 100; x[::2, 0] -= 1", slice_of_rows, slice_of_rows)

    def rows_taken_then_written(x):
        s = x[n // 2 :]
        s[0] = 5  # numpy: x changes too
        s *= 3

    _write(
        checks,
        mesh,
        g,
        pl,
        "s = x[n//2:]; s[0] = 5; s *= 3",
        rows_taken_then_written,
        rows_taken_then_written,
    )


def _out(checks: Checks, mesh: dt.ProcessMesh, g: np.ndarray, pl: list) -> None:
    n, m = g.shape
    other = np.linspace(-1, 1, n * m).reshape(n, m)
    _write(
        checks,
        mesh,
        g,
        pl,
        "np.clip(x, -0.5, 0.5, out=x)",
        lambda x: np.clip(x, -0.5, 0.5, out=x),
        lambda a: np.clip(a, -0.5, 0.5, out=a),
    )
    _write(
        checks,
        mesh,
        g,
        pl,
        "np.exp(x, out=x)",
        lambda x: np.exp(x, out=x),
        lambda a: np.exp(a, out=a),
    )
    _write(
        checks,
        mesh,
        g,
        pl,
        "np.add(x, other, out=x, where=other > 0)",
        lambda x: np.add(x, other, out=x, where=other > 0),
        lambda a: np.add(a, other, out=a, where=other > 0),
    )
    for vpl in _layouts(mesh, 2):

        def into_other(x, q=vpl):  # the out tensor has its own layout; it keeps it
            o = make_input(np.zeros((n, m)), mesh, q)
            r = np.multiply(x, 2.0, out=o)
            assert r is o and o.placements == q
            x[...] = o

        _write(
            checks,
            mesh,
            g,
            pl,
            f"np.multiply(x, 2, out=DistTensor {vpl})",
            into_other,
            lambda a: np.multiply(a, 2.0, out=a),
        )

    def sums(x):
        o = make_input(np.zeros(m), mesh, [R] * mesh.ndim)
        np.sum(x, axis=0, out=o)
        x[0] = o

    def sums_np(a):
        a[0] = np.sum(a, axis=0)

    _write(checks, mesh, g, pl, "np.sum(x, axis=0, out=o)", sums, sums_np)

    def numpy_out(x):
        w = np.ones(m)
        w -= 0.5 * x[0]  # numpy weights, DistTensor gradient: numpy's out= is written
        x[1 % n] = w

    def numpy_out_np(a):
        w = np.ones(m)
        w -= 0.5 * a[0]
        a[1 % n] = w

    _write(checks, mesh, g, pl, "w -= 0.5 * x[0] (numpy w)", numpy_out, numpy_out_np)


def _ints(checks: Checks, mesh: dt.ProcessMesh, gi: np.ndarray, pl: list) -> None:
    _write(
        checks,
        mesh,
        gi,
        pl,
        "int x += 3; x //= 2; x %= 5",
        lambda x: (x.__iadd__(3), x.__ifloordiv__(2), x.__imod__(5)),
        lambda a: (a.__iadd__(3), a.__ifloordiv__(2), a.__imod__(5)),
    )
    _write(
        checks,
        mesh,
        gi,
        pl,
        "int x[1:, 0] = 2.7 (truncated as numpy does)",
        lambda x: x.__setitem__((slice(1, None), 0), 2.7),
        lambda a: a.__setitem__((slice(1, None), 0), 2.7),
    )

    def refused():
        x = make_input(gi, mesh, pl)
        try:
            x += 1.5
        except TypeError as e:
            assert "Cannot cast ufunc 'add' output" in str(e), e
        else:
            raise AssertionError("int x += 1.5 should raise as numpy does")
        _same(x.numpy(), gi, "int x unchanged after the refused write")

    checks.run(f"int x += 1.5 raises, x unchanged {mesh.shape} {pl}", refused)


def _repeated(checks: Checks, mesh: dt.ProcessMesh, g: np.ndarray, pl: list) -> None:
    """In-place operators repeated on one tensor, as a loop makes them: from the second call
    on, the kept decision writes numpy's in-place ufunc straight in (Note [In-place
    operators] in disttensor/ops/mutation.py). Python scalars, a DistTensor value of each
    layout (the same tensor each time, and a new one made by an op each time, whose spec is
    the plan's), a row, and x itself."""
    n, m = g.shape
    rng = np.random.default_rng(11)
    other = rng.normal(size=(n, m)) + 2.0  # no division by zero
    row = rng.normal(size=m) + 2.0
    for name, fn in [("+=", np.add), ("-=", np.subtract), ("*=", np.multiply), ("/=", np.divide)]:
        cases: list[tuple[str, Callable[[dt.DistTensor], Any], Any]] = [
            ("1.5", lambda x: 1.5, 1.5),
            ("3", lambda x: 3, 3),
            ("True", lambda x: True, True),
            ("x itself", lambda x: x, None),
        ]
        for vpl in _layouts(mesh, 2):
            fixed: dict[int, dt.DistTensor] = {}

            def same(x, q=vpl, fixed=fixed):  # one tensor for the whole loop
                if id(x) not in fixed:
                    fixed[id(x)] = make_input(other, mesh, q)
                return fixed[id(x)]

            cases.append((f"DistTensor {vpl}", same, other))

            def made(x, q=vpl):  # a new tensor each time, its spec the plan's
                return make_input(other, mesh, q) * 1.0

            cases.append((f"DistTensor {vpl} * 1.0 (new)", made, other))
        for rpl in _layouts(mesh, 1)[:2]:  # Replicate, Shard(0) of the row
            cases.append((f"row {rpl}", lambda x, q=rpl: make_input(row, mesh, q), row))

        for label, value, want in cases:

            def on_dt(x, f=fn, v=value):
                for _ in range(3):
                    _apply(x, f, v(x))

            def on_np(a, f=fn, w=want):
                for _ in range(3):
                    _apply(a, f, a if w is None else w)

            _write(checks, mesh, g, pl, f"x {name} {label}, three times", on_dt, on_np)


def _apply(x: Any, f: np.ufunc, y: Any) -> None:
    """``x <op>= y`` through the operator itself (``x += y``), as a program writes it."""
    name = {np.add: "__iadd__", np.subtract: "__isub__", np.multiply: "__imul__",
            np.divide: "__itruediv__"}[f]  # fmt: skip
    assert getattr(x, name)(y) is x


def _communication(checks: Checks, mesh: dt.ProcessMesh, g: np.ndarray) -> None:
    """Writes of scalars and numpy values, and x[mask] = scalar with x's own mask, move
    nothing; a DistTensor value moves at most its own bytes."""
    pls = [p for p in placements(mesh, 2, F64) if not any(q.is_partial() for q in p)]
    n, m = g.shape
    for pl in pls:

        def local(pl=pl):
            x = make_input(g, mesh, pl)
            with dt.CommCounter() as cc:
                x[0, 0] = 1.0
                x[1:, :1] = np.ones((n - 1, 1))
                x[x > 0.5] = 0.0
                x[np.array([0, n - 1]), np.array([0, 1])] = 3.0
                x += 1
                x *= np.arange(m)
            assert cc.counts == {}, f"local writes communicated: {cc.counts}"

        checks.run(f"local writes move nothing {mesh.shape} {pl}", local)
        if not all(p.is_shard() for p in pl):
            continue  # a replicated target's region is on several ranks: each needs the value
        for vpl in _layouts(mesh, 2):

            def value_bytes(pl=pl, vpl=vpl):
                x = make_input(g, mesh, pl)
                v = make_input(np.ones((1, m)), mesh, vpl[:1] + [R] * (mesh.ndim - 1))
                with dt.CommCounter() as cc:
                    x[n // 2 : n // 2 + 1] = v  # one row: one rank's region
                assert cc.total_bytes <= v.size * v.dtype.itemsize, (
                    f"moved {cc.bytes} for a value of {v.size * v.dtype.itemsize} bytes"
                )

            checks.run(f"one row from a DistTensor {vpl}: its bytes at most {pl}", value_bytes)


def _autograd(checks: Checks, mesh: dt.ProcessMesh, g: np.ndarray, pl: list) -> None:
    def refused():
        w = make_input(g, mesh, pl)
        w.requires_grad = True
        for name, fn in [
            ("w += 1", lambda: w.__iadd__(1.0)),
            ("w[0] = 1", lambda: w.__setitem__(0, 1.0)),
            ("np.exp(w, out=w)", lambda: np.exp(w, out=w)),
        ]:
            try:
                fn()
            except RuntimeError as e:
                assert "requires a gradient" in str(e), e
            else:
                raise AssertionError(f"{name} on a tensor that requires grad should raise")
        _same(w.numpy(), g, "w unchanged")
        with dt.no_grad():  # an optimizer update
            w -= 0.5
            w[0] = 2.0
        want = g - 0.5
        want[0] = 2.0
        _same(w.numpy(), want, "w updated under no_grad")

    checks.run(f"autograd refuses writes, no_grad allows {mesh.shape} {pl}", refused)

    def stale():
        x = make_input(g, mesh, pl)
        w = make_input(g, mesh, pl)
        w.requires_grad = True
        loss = (w * x).sum()
        with dt.no_grad():
            x *= 2  # what the gradient of w needs, if the op kept x's own buffer
        try:
            loss.backward()
        except RuntimeError as e:
            assert "written in place" in str(e), e
        else:  # the op saved a copy of x (it had to move it): the gradient is of the old x
            _same(w.grad.numpy(), g, "gradient of the value x had")
        y = make_input(g, mesh, pl)
        loss = (w + y).sum()  # add's gradient reads no values: writing y is harmless
        y += 1
        w.grad = None
        loss.backward()
        _same(w.grad.numpy(), np.ones_like(g), "gradient after a harmless write")

    checks.run(f"backward refuses saved tensors written since {mesh.shape} {pl}", stale)


def case_mutation(world: int, light: bool = False, exact_size: bool = False) -> int:
    """The grid on every mesh that fits the world (``exact_size``: only meshes of all of its
    ranks; ``light``: the first few layouts)."""
    checks = Checks()
    for mesh in fitting_meshes(world):
        if exact_size and mesh.size != world:
            continue
        if dt.get_rank() not in mesh:  # writes are collective over the mesh's ranks only
            continue
        shapes = shapes_2d(mesh)
        rng = np.random.default_rng(9)
        g = rng.normal(size=shapes["uneven"])
        empty = rng.normal(size=shapes["empty"]) if "empty" in shapes else None
        gi = rng.integers(-9, 9, size=shapes["uneven"]).astype(I64)
        pls = placements(mesh, 2, F64)
        if light:
            pls = pls[:3]
        kinds = ("uneven",) if light else ("even", "uneven", "empty")
        steps = [rng.normal(size=shapes[k]) for k in kinds]
        for pl in pls:
            for h in steps:  # even, uneven and empty shards (light: uneven)
                _negative_steps(checks, mesh, h, pl)
            _region_writes(checks, mesh, g, pl)
            _advanced_writes(checks, mesh, g, pl)
            _inplace(checks, mesh, g, pl)
            _repeated(checks, mesh, g, pl)
            _out(checks, mesh, g, pl)
            if empty is not None:
                _region_writes(checks, mesh, empty, pl)
                _inplace(checks, mesh, empty, pl)
            _autograd(checks, mesh, g, pl)
        for pl in placements(mesh, 2, I64)[: 3 if light else None]:
            _ints(checks, mesh, gi, pl)
        _communication(checks, mesh, g)
    return assert_grid([checks.result()], ranks=[dt.get_rank()])
