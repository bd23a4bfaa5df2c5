"""QR, SVD and least squares of tall-skinny matrices without gathering them: ``np.linalg.qr``,
``svd``, ``svdvals`` and ``lstsq`` of an (m, n) matrix with m >= n whose rows are split over
mesh dims, by TSQR (Note [TSQR]), with numpy's own signs (Note [Householder signs]).

Q and U keep the rows split (Shard(0) on the mesh dims that split them, Replicate on the
others); R, the singular values, Vh and lstsq's results are Replicate. Wide matrices (m < n),
stacks of matrices, ``qr(mode="complete")`` and ``svd(full_matrices=True)`` of a matrix that
is not square (an m x m factor), ``qr(mode="raw")`` and ``svd(hermitian=True)`` take the
counted replicate fallback. ``np.linalg.eigh`` and ``eigvalsh`` decompose the (small)
matrices a program hands them whole (Note [Eigenproblems of whole matrices]). On device shards
the same algorithms run with the shards' array module (Note [Decompositions on a device]), and
the fallback cases take the device's replicate fallback (Note [The replicate fallback on a
device] in dispatch.py).

>>> import numpy as np, disttensor as dt
>>> a = np.array([[3.0, 1.0], [4.0, 2.0], [0.0, 5.0], [1.0, 1.0], [2.0, 0.0]])
>>> def f():
...     x = dt.shard_tensor(a, dt.ProcessMesh([0, 1]), [dt.Shard(0)])
...     q, r = np.linalg.qr(x)
...     return q.placements, r.placements, np.allclose(r.numpy(), np.linalg.qr(a).R)
>>> dt.simulate(2, f)[0]
([Shard(dim=0)], [Replicate()], True)

Note [TSQR]
    A QR of stacked blocks is a QR of their R factors: if block i is Q_i R_i, then
    a = diag(Q_1, ..., Q_P) [R_1; ...; R_P], and the QR of that stack, Q_s R, gives
    a = (diag(Q_i) Q_s) R. So each rank QR-factors its own rows (a k x n block gives an R_i of
    min(k, n) rows: short and empty shards are fine), the ranks that split the rows between
    them (a row group; mesh dims that replicate the matrix make several groups, which compute
    the same) all-gather their R_i, and every rank QR-factors the stack (at most min(m, P n)
    rows) alike: R is Replicate, and this rank's rows of Q are Q_i times its block of Q_s,
    split like the rows. One all-gather of at most n rows per rank, O(P n^2) elements, never
    the m x n matrix. A reduction tree (R's combined pairwise over log2 P rounds, then the
    blocks of each Q_s and R sent back down) does less arithmetic per rank but takes 2 log2 P
    point-to-point steps. Measured under mpiexec on a 2-core machine (the combine, Q
    included): on 2 ranks the two are equal for n <= 16 and the all-gather 10-15% faster for
    n = 64 and 256; on 3 and 4 (oversubscribed) ranks neither wins consistently. The
    all-gather is used: one collective, after which every rank holds R (a tree's root would
    still have to send it back). The same all-gather carries the first n rows of Q for the
    signs (Note [Householder signs]). Least squares is the TSQR of [a | b]: its R holds a's R,
    Q^H b beside it and below that the part of b outside a's column space, whose column norms
    are the residuals (no cancelling ||b||^2 - ||Q^H b||^2), so it is one collective too.
    Like numpy, which computes in double precision and casts, the factors are computed in
    float64/complex128 and cast to numpy's result type. A matrix whose rows are not split is
    resharded first, each step moving less than the fallback's gather: a Shard(1) mesh dim
    becomes Shard(0) (one all-to-all), a Partial one too (one reduce-scatter), except where a
    later mesh dim already splits the rows, whose split would have to be gathered first
    (Note [Nested sharding]): there it becomes Replicate (one all-gather or all-reduce over
    that mesh dim). Replicate mesh dims stay (no communication), so a Replicate matrix is
    factored on every rank with no communication at all. When the whole matrix is on this
    rank (a one-rank row group), numpy's own function runs on it: numpy's result bit for bit.

Note [Householder signs]
    A QR is unique only up to the sign of each row of R. numpy's (LAPACK's Householder QR)
    takes at step j the sign opposite to the real part of the pivot alpha_j, which looks like
    it needs the whole matrix; it does not. The reflectors of a = Q R are those of Q (a
    column scaled by a real number has the same reflector), and the reflectors of an
    orthonormal Q are read from its first n rows: I - Q[:n] D = Y_1 (T Y_1^H) is an unpivoted
    LU whose pivots are the reflectors' tau, Re(tau_j) >= 1 (the reconstruction of Householder
    vectors from TSQR by Ballard et al.). So the ranks holding the first n rows of ``a`` add
    their rows of Q_i to the all-gather (n rows in all), every rank forms Q[:n] and runs that
    LU, choosing d_j = -sign(Re w_j) at the pivot w_j it meets, and returns R = D R_s and
    Q = Q D: numpy's factors, to rounding. LAPACK's two special cases are decided by exact
    zeros, which TSQR sees only to rounding (within 16 n eps): a column already zero below
    its diagonal is not reflected (w_j = +-1: d_j = w_j), and a zero pivot gives a negative
    diagonal (Re w_j = 0). Where that zero is -0.0 (LAPACK reads its sign bit), or a
    rank-deficient ``a`` leaves a column of Q to rounding, R can differ from numpy's in the
    sign of a row (and for a rank-deficient ``a``, in its rows past the rank); Q R = a and
    Q^H Q = I always hold. The SVD is that of R, so U = Q U_r and Vh are numpy's up to the
    sign of each singular pair; they are numpy's own where LAPACK's gesdd itself starts with
    a QR (m >= 11 n / 6 in reference LAPACK), since R is then numpy's R.

Note [Decompositions on a device]
    On device shards (CuPy on a GPU) every step above runs with the shards' array module:
    the local QRs, the all-gather (into a buffer of the device) and the QR of the stacked R
    factors, the SVD of R and the least-squares solve on R stay on the device: the stack is
    on the device after the all-gather and holds at most P n rows, so factoring it there
    costs no copy. The one host step is the LU of Note [Householder signs]: a loop over the
    n pivots that decides a branch at each, on an n x n matrix, which on a GPU would be n
    kernel launches and n synchronisations; Q's first n rows and R's diagonal are copied to
    the host instead (O(n^2) elements, explicitly) and the n signs copied back. lstsq's rank
    is copied too (one integer: it sizes the solution, and numpy returns it). CuPy, unlike
    numpy, computes in the input's precision, so the data is cast to numpy's compute type
    (float64/complex128) first and the results to numpy's result type, as on the TSQR path.
    Where the host calls numpy's own function on a one-rank row group, the device calls
    CuPy's (its SVD and eigh: cuSOLVER's), with two exceptions: the QR also takes numpy's
    signs from the LU (cuSOLVER does not document its Householder sign choice), and lstsq
    takes the TSQR path's own steps on its one block (a QR of [a | b], then gelsd's rule on
    R), because cupy.linalg.lstsq's rcond rule is not LAPACK gelsd's. A host ``b`` handed to
    lstsq with a device ``a`` has this rank's rows of it copied to the device explicitly, as
    the replicate fallback copies the host arrays handed to numpy's functions (Note [The
    replicate fallback on a device] in dispatch.py): the host's algorithm and communication,
    not a gather. Results are numpy's to rounding (the U, Vh and eigenvectors of the SVD and
    eigh up to the sign of each pair, as ever), the rank and the result types exactly; the
    communication is the host's.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numpy.linalg import LinAlgError

from .. import autograd, backend, comm
from ..placement import Replicate, Shard
from ..spec import DistSpec
from ..tensor import DistTensor, dtensor_from_local, reshard
from .numpy_interop import Unsupported, implements

_R, _S0 = Replicate(), Shard(0)
_QRResult = type(np.linalg.qr(np.eye(1)))  # numpy's named tuples (their module is private)
_SVDResult = type(np.linalg.svd(np.eye(1)))
_MODES = ("reduced", "complete", "r", "raw")


# -- the row split -----------------------------------------------------------------------------
class _Rows(NamedTuple):
    """This rank's row group (Note [TSQR]): its ranks in row order, their first rows and row
    counts, this rank's index in it; ``coord`` is None on a rank outside the mesh."""

    coord: tuple[int, ...] | None
    group: tuple[int, ...]
    starts: tuple[int, ...]
    counts: tuple[int, ...]
    me: int


def _row_form(a: DistTensor) -> DistTensor:
    """``a`` with every mesh dim Shard(0) or Replicate (Note [TSQR])."""
    pls, inner = list(a.placements), False  # inner: a later mesh dim splits the rows
    for m in reversed(range(len(pls))):
        p = pls[m]
        if not (p.is_replicate() or (p.is_shard() and p.dim == 0)):
            pls[m] = _R if inner else _S0
        inner |= pls[m] == _S0 and a.mesh.shape[m] > 1
    return a if tuple(pls) == a._spec.placements else reshard(a, a.mesh, pls)


def _rows(spec: DistSpec) -> _Rows:
    mesh = spec.mesh
    coord = mesh.get_coord(comm.get_rank())
    if coord is None:
        return _Rows(None, (), (), (), 0)
    index = tuple(
        slice(None) if p.is_shard() else c for p, c in zip(spec.placements, coord)
    )  # the mesh dims that split the rows vary, in C order: the nested splits' row order
    group = tuple(int(r) for r in mesh.mesh[index].ravel())
    boxes = [spec.local_box(mesh.get_coord(r))[0] for r in group]
    me = group.index(comm.get_rank())
    return _Rows(coord, group, tuple(s for s, _ in boxes), tuple(k for _, k in boxes), me)


def _result_types(probe) -> tuple[np.dtype, np.dtype]:
    """(the type numpy computes in, the type it returns), from numpy's own function on a 1 x 1
    stand-in, so dtypes linalg refuses raise numpy's TypeError (which sends a call through
    ``np.linalg`` to the fallback, where numpy raises it again on every rank)."""
    result = np.dtype(probe())
    return np.dtype(np.complex128 if result.kind == "c" else np.float64), result


def _check_2d(a: DistTensor, at_least: bool) -> None:
    bad = a.ndim < 2 if at_least else a.ndim != 2
    if bad:
        need = "at least two-dimensional" if at_least else "two-dimensional"
        raise LinAlgError(f"{a.ndim}-dimensional array given. Array must be {need}")


# -- TSQR ----------------------------------------------------------------------------------------
def _tsqr(
    local: np.ndarray, rows: _Rows, n: int, dtype: np.dtype, want_q: bool, signs: bool
) -> tuple[np.ndarray | None, np.ndarray]:
    """(this rank's rows of Q, or None unless ``want_q``; R, alike on every rank) of the rows
    of a row group of two or more ranks, n columns (Note [TSQR]): one all-gather.
    ``signs``: numpy's (Note [Householder signs]; needs at least n rows)."""

    def sizes(j: int) -> tuple[int, int]:
        """(rows of R_j, its rows among the first n of the matrix)."""
        k, start = rows.counts[j], rows.starts[j]
        return min(k, n), min(max(n - start, 0), k) if signs else 0

    r_me, top_me = sizes(rows.me)
    xp = backend.xp(local)  # numpy, or the device's module (Note [Decompositions on a device])
    local = local.astype(dtype, copy=False)
    if want_q or top_me:
        q_i, r_i = xp.linalg.qr(local)
    else:
        q_i, r_i = None, xp.linalg.qr(local, mode="r")
    send = xp.concatenate([r_i.ravel(), q_i[:top_me].ravel() if top_me else r_i[:0].ravel()])
    counts = [r * n + top * r for r, top in map(sizes, range(len(rows.group)))]
    gathered = xp.empty(sum(counts), dtype)
    comm.group(rows.group).allgather(send, gathered, counts)

    stack, tops, at = [], [], 0
    for j in range(len(rows.group)):
        r, top = sizes(j)
        stack.append(gathered[at : at + r * n].reshape(r, n))
        tops.append(gathered[at + r * n : at + r * n + top * r].reshape(top, r))
        at += r * n + top * r
    q_s, r_s = xp.linalg.qr(xp.concatenate(stack))
    offsets = np.cumsum([0] + [len(s) for s in stack])
    if signs and n:
        top = xp.concatenate([t @ q_s[o : o + len(t[0])] for t, o in zip(tops, offsets) if len(t)])
        q_s, r_s = _numpy_signs(q_s, r_s, top)
    q = q_i @ q_s[offsets[rows.me] : offsets[rows.me] + r_me] if want_q else None
    return q, r_s


def _numpy_signs(q: Any, r: Any, top: Any) -> tuple[Any, Any]:
    """(Q D, D R): the factors ``q``, ``r`` with numpy's signs, from ``top``, the first n rows
    of ``q`` (Note [Householder signs]). The LU runs on the host: on a device ``top`` and R's
    diagonal are copied to it and the signs back (Note [Decompositions on a device])."""
    d = _householder_signs(backend.to_host(top), backend.to_host(r.diagonal()))
    d = backend.of(q).asarray(d)
    return q * d, d[:, None] * r


def _householder_signs(top: np.ndarray, diagonal: np.ndarray) -> np.ndarray:
    """d (+-1 per column) such that Q diag(d) is the Q of LAPACK's Householder QR, from the
    first n rows of an orthonormal Q and the diagonal of its R (Note [Householder signs])."""
    b = np.array(top)
    n = len(b)
    d = np.ones(n)
    tol = 16 * max(n, 1) * np.finfo(np.float64).eps
    for j in range(n):
        w = b[j, j]
        s = 1.0 if w.real >= 0 else -1.0
        if abs(w - s) <= tol:  # already zero below the diagonal: LAPACK does not reflect
            d[j] = s
            continue  # and the LU's column is e_j: nothing to eliminate
        if abs(w.real) <= tol:  # a zero pivot: beta = -norm, a negative diagonal
            d[j] = -1.0 if diagonal[j].real >= 0 else 1.0
        else:
            d[j] = -s
        b[j + 1 :, j + 1 :] -= np.outer(b[j + 1 :, j] / (w - d[j]), b[j, j + 1 :])
    return d


# -- results -------------------------------------------------------------------------------------
def _replicated(value: np.ndarray, mesh) -> DistTensor:
    return dtensor_from_local(value, mesh, [_R] * mesh.ndim, global_shape=value.shape)


def _like_rows(value: np.ndarray, spec: DistSpec, ncols: int) -> DistTensor:
    """This rank's rows ``value`` of an (m, ncols) result split like ``spec``'s rows."""
    shape = (spec.shape[0], ncols)
    return dtensor_from_local(value, spec.mesh, spec.placements, global_shape=shape)


def _no_gradient(name: str, inputs: tuple, outputs: tuple) -> None:
    """A node without a gradient, so that backward through a decomposition raises naming it."""
    if autograd.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in inputs):
        autograd.record(name, inputs, [o for o in outputs if o.dtype.kind in "fc"], None)


# -- qr ------------------------------------------------------------------------------------------
def qr(a, mode="reduced"):
    """``np.linalg.qr`` of an (m, n) matrix with m >= n: TSQR over the split rows, one
    all-gather of the small R factors (Note [TSQR]); Q split like the rows, R Replicate, both
    numpy's, signs included (Note [Householder signs]).

    >>> import numpy as np, disttensor as dt
    >>> a = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    >>> def f():
    ...     x = dt.shard_tensor(a, dt.ProcessMesh([0, 1]), [dt.Shard(0)])
    ...     return np.round(dt.qr(x, mode="r").numpy(), 4)
    >>> dt.simulate(2, f)[0]
    array([[-5.9161, -7.4374],
           [ 0.    ,  0.8281]])
    """
    if not isinstance(a, DistTensor):  # an array: its own library's QR
        return backend.xp(a).linalg.qr(a, mode)
    if mode not in _MODES:
        if mode in ("f", "full", "e", "economic"):
            raise Unsupported(f"the deprecated mode {mode!r}")
        raise ValueError(f"Unrecognized mode '{mode}'")
    _check_2d(a, at_least=True)
    if a.ndim > 2:
        raise Unsupported("a stack of matrices")
    t, result_t = _result_types(lambda: np.linalg.qr(np.zeros((1, 1), a.dtype), mode="r").dtype)
    m, n = a.shape
    if m < n or mode == "raw" or (mode == "complete" and m > n):
        raise Unsupported(f"mode={mode!r} of a {m} x {n} matrix (a wide or an m x m factor)")
    x = _row_form(a)
    spec, rows = x._spec, _rows(x._spec)
    xp = backend.xp(x._local)
    if rows.coord is None:
        q, r = xp.empty((0, n), result_t), xp.empty((n, n), result_t)
    elif len(rows.group) == 1 and xp is np:  # the whole matrix is here: numpy's own QR
        if mode == "r":
            q, r = None, np.linalg.qr(x._local, mode="r")
        else:
            q, r = np.linalg.qr(x._local)
    elif len(rows.group) == 1:
        # on a device: its QR, with numpy's signs (Note [Decompositions on a device])
        q, r = xp.linalg.qr(x._local.astype(t, copy=False))
        q, r = _numpy_signs(q, r, q[:n]) if n else (q, r)
    else:
        q, r = _tsqr(x._local, rows, n, t, want_q=mode != "r", signs=True)
    R = _replicated(r.astype(result_t, copy=False), a.mesh)
    if mode == "r":
        _no_gradient("qr", (a,), (R,))
        return R
    Q = _like_rows(q.astype(result_t, copy=False), spec, n)
    _no_gradient("qr", (a,), (Q, R))
    return _QRResult(Q, R)


# -- svd -----------------------------------------------------------------------------------------
def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    """``np.linalg.svd`` of an (m, n) matrix with m >= n: the SVD of TSQR's R (Note [TSQR]),
    U = Q U_r split like the rows, S and Vh Replicate; S is numpy's, U and Vh are numpy's up
    to the sign of each singular pair. ``full_matrices=True`` needs an m x m U unless a is
    square: the fallback.

    >>> import numpy as np, disttensor as dt
    >>> a = np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    >>> def f():
    ...     x = dt.shard_tensor(a, dt.ProcessMesh([0, 1]), [dt.Shard(0)])
    ...     u, s, vh = dt.svd(x, full_matrices=False)
    ...     return u.placements, s.numpy()
    >>> dt.simulate(2, f)[0]
    ([Shard(dim=0)], array([2., 1.]))
    """
    if not isinstance(a, DistTensor):  # an array: its own library's SVD
        if not backend.is_device(a):
            return np.linalg.svd(a, full_matrices, compute_uv, hermitian)
        if hermitian:  # CuPy's svd has no hermitian
            raise backend.unsupported("svd(hermitian=True)", backend.of(a))
        return backend.xp(a).linalg.svd(a, full_matrices, compute_uv)
    if hermitian:
        raise Unsupported("hermitian=True (numpy's eigh of a square matrix)")
    _check_2d(a, at_least=True)
    if a.ndim > 2:
        raise Unsupported("a stack of matrices")
    t, result_t = _result_types(lambda: np.linalg.qr(np.zeros((1, 1), a.dtype), mode="r").dtype)
    m, n = a.shape
    if m < n or (full_matrices and compute_uv and m > n):
        raise Unsupported(f"full_matrices={full_matrices} of a {m} x {n} matrix")
    x = _row_form(a)
    spec, rows = x._spec, _rows(x._spec)
    real_t = np.empty(0, result_t).real.dtype
    xp = backend.xp(x._local)
    if rows.coord is None:
        u, s, vh = xp.empty((0, n)), xp.empty(n), xp.empty((n, n))
    elif len(rows.group) == 1:  # the whole matrix is here: numpy's own SVD, or the device's
        # in numpy's compute type (Note [Decompositions on a device])
        local = x._local if xp is np else x._local.astype(t, copy=False)
        if compute_uv:
            u, s, vh = xp.linalg.svd(local, full_matrices=False)
        else:
            u, s, vh = None, xp.linalg.svd(local, compute_uv=False), None
    else:
        q, r = _tsqr(x._local, rows, n, t, want_q=compute_uv, signs=compute_uv)
        if compute_uv:
            u_r, s, vh = xp.linalg.svd(r)
            u = q @ u_r
        else:
            u, s, vh = None, xp.linalg.svd(r, compute_uv=False), None
    S = _replicated(s.astype(real_t, copy=False), a.mesh)
    if not compute_uv:
        _no_gradient("svd", (a,), (S,))
        return S
    U = _like_rows(u.astype(result_t, copy=False), spec, n)
    Vh = _replicated(vh.astype(result_t, copy=False), a.mesh)
    _no_gradient("svd", (a,), (U, S, Vh))
    return _SVDResult(U, S, Vh)


def svdvals(x):
    """``np.linalg.svdvals``: the singular values of TSQR's R, Replicate (Note [TSQR]).

    >>> import numpy as np, disttensor as dt
    >>> a = np.array([[3.0, 0.0], [0.0, 4.0], [0.0, 0.0], [0.0, 0.0]])
    >>> def f():
    ...     return dt.svdvals(dt.shard_tensor(a, dt.ProcessMesh([0, 1]), [dt.Shard(0)])).numpy()
    >>> dt.simulate(2, f)[0]
    array([4., 3.])
    """
    return svd(x, compute_uv=False)  # CuPy has no svdvals: its svd(compute_uv=False) on a device


# -- lstsq ---------------------------------------------------------------------------------------
def lstsq(a, b, rcond=None):
    """``np.linalg.lstsq`` of an (m, n) ``a`` with m >= n and rows split, and a ``b`` of m rows
    (1-D or 2-D; a DistTensor or an array): the TSQR of [a | b] (Note [TSQR]), then
    numpy's (LAPACK gelsd's) rule on the SVD of R: singular values up to ``rcond`` times the
    largest are dropped, so rank-deficient systems get numpy's minimum-norm solution. One
    all-gather; x, residuals and s Replicate, the rank an np.int32, as numpy's.

    >>> import numpy as np, disttensor as dt
    >>> a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    >>> b = np.array([1.0, 3.0, 5.0, 7.5])
    >>> def f():
    ...     x, res, rank, s = dt.lstsq(dt.shard_tensor(a, dt.ProcessMesh([0, 1]), [dt.Shard(0)]), b)
    ...     return np.round(x.numpy(), 4), np.round(res.numpy(), 4), rank
    >>> dt.simulate(2, f)[0]
    (array([0.9 , 2.15]), array([0.075]), np.int32(2))
    """
    if not isinstance(a, DistTensor):
        raise Unsupported("a numpy a")
    if isinstance(b, DistTensor) and b.mesh != a.mesh:
        raise Unsupported("b on another mesh")
    if isinstance(rcond, DistTensor):
        raise Unsupported("a DistTensor rcond")
    on = backend.of(a._local)
    if isinstance(b, DistTensor) or backend.is_device(b):
        b_on = backend.of(getattr(b, "_local", b))
        if b_on is not on:  # never moved silently between devices (Note [Array backends])
            raise backend.mixed("lstsq", on, b_on)
    else:  # host data: this rank's rows of it go where a is (below)
        b = np.asarray(b)
    b_dtype = b.dtype
    is_1d = b.ndim == 1
    _check_2d(a, at_least=False)
    if b.ndim + is_1d != 2:
        raise LinAlgError(f"{b.ndim}-dimensional array given. Array must be two-dimensional")
    m, n = a.shape
    if b.shape[0] != m:
        raise LinAlgError("Incompatible dimensions")
    t, result_t = _result_types(
        lambda: np.linalg.lstsq(np.zeros((1, 1), a.dtype), np.zeros(1, b_dtype))[0].dtype
    )
    if m < n:
        raise Unsupported(f"a wide {m} x {n} matrix")
    kb = 1 if is_1d else b.shape[1]
    x = _row_form(a)
    spec, rows = x._spec, _rows(x._spec)
    b_local = on.asarray(_rows_of(b, spec, rows))  # Note [Decompositions on a device]
    real_t = np.empty(0, result_t).real.dtype
    xp = on.xp
    if rows.coord is None:  # stand-ins: a rank outside the mesh holds empty shards
        sol, res, rank, s = xp.empty((n, kb)), xp.empty(0), np.int32(0), xp.empty(n)
    elif len(rows.group) == 1 and xp is np:  # the whole system is here: numpy's own
        sol, res, rank, s = np.linalg.lstsq(x._local, b_local.reshape(m, kb), rcond)
    else:
        both = xp.concatenate([x._local.astype(t), b_local.reshape(-1, kb).astype(t)], axis=1)
        if len(rows.group) == 1:  # on a device (Note [Decompositions on a device])
            r = xp.linalg.qr(both, mode="r")
        else:
            _, r = _tsqr(both, rows, n + kb, t, want_q=False, signs=False)
        sol, rank, s = _solve(r[:n, :n], r[:n, n:], rcond, m, n)
        res = xp.sum(xp.abs(r[n:, n:]) ** 2, axis=0)  # the part of b outside a's columns
        if rank != n or m <= n:
            res = xp.empty(0)
    sol = sol[:, 0] if is_1d else sol
    X = _replicated(sol.astype(result_t), a.mesh)
    RES = _replicated(res.astype(real_t), a.mesh)
    S = _replicated(s.astype(real_t), a.mesh)
    _no_gradient("lstsq", (a, b), (X, RES, S))
    return X, RES, rank, S


def _rows_of(b: Any, spec: DistSpec, rows: _Rows) -> Any:
    """This rank's rows of ``b``, split like ``a``'s rows (``spec``): a slice of an array; a
    DistTensor resharded to that split (a local slice where it is Replicate)."""
    if isinstance(b, DistTensor):
        return reshard(b, b.mesh, spec.placements)._local
    if rows.coord is None:
        return backend.xp(b).empty((0, *b.shape[1:]), b.dtype)
    start, k = spec.local_box(rows.coord)[0]
    return b[start : start + k]


def _solve(r: Any, c: Any, rcond, m: int, n: int):
    """(x, rank, s) of min ||R x - c|| with LAPACK gelsd's rule: singular values at most
    rcond * s[0] dropped (rcond None: eps * max(m, n); rcond <= 0 or >= 1: gelsd's own eps).
    On a device the rank, which sizes the solution, is copied to the host."""
    xp = backend.xp(r)
    try:
        u, s, vh = xp.linalg.svd(r)
    except LinAlgError:
        raise LinAlgError("SVD did not converge in Linear Least Squares") from None
    if rcond is None:
        rcond = np.finfo(np.float64).eps * max(m, n)
    if not 0 < rcond < 1:
        rcond = np.finfo(np.float64).epsneg  # LAPACK's dlamch('E'), 2**-53
    rank = int(backend.to_host(xp.count_nonzero(s > rcond * s[0]))) if n else 0
    x = vh[:rank].conj().T @ ((u[:, :rank].conj().T @ c) / s[:rank, None])
    return x, np.int32(rank), s


# numpy's functions, by identity (Note [numpy functions by identity] in ops/numpy_interop.py)
for _func, _impl in (
    (np.linalg.qr, qr),
    (np.linalg.svd, svd),
    (np.linalg.svdvals, svdvals),
    (np.linalg.lstsq, lstsq),
):
    implements(_func, name=_impl.__name__)(lambda given, impl=_impl: impl(**given))


# Note [Eigenproblems of whole matrices]
# ``np.linalg.eigh`` needs each matrix whole: its eigenvectors depend on every entry. The
# matrices a distributed program hands it are small (PCA's D x D covariance, a Gram matrix,
# a Rayleigh-Ritz projection), usually Replicate already, so the decomposition runs on every
# rank on its local value with no communication, and the results are Replicate: every rank
# gets numpy's own eigenvalues and eigenvectors, bit for bit. Mesh dims that split a leading
# (batch) axis of a stack of matrices keep their split (each rank decomposes its own
# matrices). A mesh dim that splits one of the two matrix axes, or holds Partial values, is
# resharded to Replicate first (one all-gather or all-reduce over it: the op's own
# communication, as the replicate fallback would do, but with the batch splits kept). No
# gradient: backward through eigh raises naming it. On a device it is CuPy's eigh (cuSOLVER's),
# in numpy's compute type (Note [Decompositions on a device]).
_EighResult = type(np.linalg.eigh(np.eye(1)))  # numpy's named tuple (its module is private)


def _whole_matrices(a: DistTensor) -> DistTensor:
    """``a`` with no mesh dim splitting its last two axes and no Partial (Note [Eigenproblems
    of whole matrices]); numpy's errors for arrays that are not stacks of square matrices."""
    if a.ndim < 2:
        raise np.linalg.LinAlgError(
            f"{a.ndim}-dimensional array given. Array must be at least two-dimensional"
        )
    if a.shape[-1] != a.shape[-2]:
        raise np.linalg.LinAlgError("Last 2 dimensions of the array must be square")
    pls = [
        Replicate() if p.is_partial() or (p.is_shard() and p.dim >= a.ndim - 2) else p
        for p in a.placements
    ]
    return a if tuple(pls) == a._spec.placements else reshard(a, a.mesh, pls)


def _eig_results(a: DistTensor, name: str, uplo: str, vectors: bool):
    if uplo not in ("L", "U"):
        raise ValueError("UPLO argument must be 'L' or 'U'")
    x = _whole_matrices(a)
    spec = x._spec
    probe = np.linalg.eigh(np.eye(1, dtype=a.dtype))  # numpy's result types (and its TypeError)
    coord = spec.mesh.get_coord(comm.get_rank())
    w_spec = DistSpec(spec.mesh, spec.placements, spec.shape[:-1], probe.eigenvalues.dtype)
    v_spec = DistSpec(spec.mesh, spec.placements, spec.shape, probe.eigenvectors.dtype)
    xp, local = backend.xp(x._local), x._local
    if xp is not np:  # CuPy computes in the input's precision, numpy in double
        local = local.astype(_result_types(lambda: v_spec.dtype)[0], copy=False)
    if coord is None:
        w = xp.empty(w_spec.local_shape(None), w_spec.dtype)
        v = xp.empty(v_spec.local_shape(None), v_spec.dtype)
    elif vectors:
        w, v = xp.linalg.eigh(local, uplo)
    else:
        w, v = xp.linalg.eigvalsh(local, uplo), None
    outs = [DistTensor(w.astype(w_spec.dtype, copy=False), w_spec)]
    if vectors:
        outs.append(DistTensor(v.astype(v_spec.dtype, copy=False), v_spec))
    if autograd.is_grad_enabled() and a.requires_grad:
        autograd.record(name, (a,), outs, None)  # no gradient: backward raises naming it
    return outs


@implements(np.linalg.eigh, name="eigh")
def _np_eigh(given):
    return eigh(**given)


@implements(np.linalg.eigvalsh, name="eigvalsh")
def _np_eigvalsh(given):
    return eigvalsh(**given)


def eigh(a, UPLO="L"):
    """``np.linalg.eigh``: eigenvalues (ascending) and eigenvectors of symmetric matrices, on
    every rank that holds them (Note [Eigenproblems of whole matrices]).

    >>> import numpy as np, disttensor as dt
    >>> a = np.array([[2.0, 1.0], [1.0, 2.0]])
    >>> w, v = np.linalg.eigh(dt.shard_tensor(a, dt.ProcessMesh([0]), [dt.Replicate()]))
    >>> w.numpy(), w.placements
    (array([1., 3.]), [Replicate()])
    """
    if not isinstance(a, DistTensor):  # an array: its own library's eigh
        return backend.xp(a).linalg.eigh(a, UPLO)
    return _EighResult(*_eig_results(a, "eigh", UPLO, vectors=True))


def eigvalsh(a, UPLO="L"):
    """``np.linalg.eigvalsh``: the eigenvalues of symmetric matrices, as ``eigh``.

    >>> import numpy as np, disttensor as dt
    >>> c = dt.shard_tensor(np.diag([3.0, 1.0]), dt.ProcessMesh([0]), [dt.Shard(0)])
    >>> np.linalg.eigvalsh(c).numpy()
    array([1., 3.])
    """
    if not isinstance(a, DistTensor):  # an array: its own library's eigvalsh
        return backend.xp(a).linalg.eigvalsh(a, UPLO)
    return _eig_results(a, "eigvalsh", UPLO, vectors=False)[0]


__all__ = ["eigh", "eigvalsh", "lstsq", "qr", "svd", "svdvals"]
