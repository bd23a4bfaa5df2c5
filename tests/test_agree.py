"""The agreement check before every collective (disttensor/comm/agree.py, Note [Ranks agree
before a collective]): each field of a call counts, and so does what the library is doing.

* ``fingerprint`` differs when one field alone differs (the collective's kind, dtype, element
  count or counts list, reduce op, root) and is equal for equal calls, in any process;
  ``current`` differs when only what the library is doing differs.
* Two ranks whose calls on one communicator differ in that one field get ``RanksDiverged`` on
  every rank, the same message naming both ranks' calls; equal calls pass and move their data.
  So do ranks whose collectives have the same kind, dtype and size but another reason (rank 0
  prints x while rank 1 reshards y; rank 0 gathers a while rank 1 gathers b of the same
  shape, or of the very same spec: the tensors' lineages differ), and calls whose payload
  does not ride in MPI's envelope (Note [The check rides along]): large buffers, one rank's
  small and another's large. A small collective carried
  in the envelope computes what MPI computes for a large one, dtype by dtype.
  The cases run on 2 simulated ranks and under mpiexec on 2 ranks (one launch runs them all),
  each with the default fingerprint and with the full descriptions of ``DISTTENSOR_DEBUG=1``.

``mpiexec -n 2 python tests/test_agree.py`` runs the cases and prints one verdict line each.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from mpirun import ROOT, run

import disttensor as dt
from disttensor import comm
from disttensor.comm import agree

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


# -- the fingerprint, field by field ----------------------------------------------------------
# (kind, key) pairs shaped like comm/base.py's, differing in the one field named
ONE_FIELD = {
    "kind": (("barrier", ()), ("all_gather_object", ())),
    "kind, equal keys": (("all_reduce", (F64, 4, "sum")), ("reduce_scatter", (F64, 4, "sum"))),
    "dtype": (("all_reduce", (F32, 4, "sum")), ("all_reduce", (F64, 4, "sum"))),
    "count": (("all_reduce", (F64, 4, "sum")), ("all_reduce", (F64, 5, "sum"))),
    "counts list": (("all_gather", (F64, (2, 2))), ("all_gather", (F64, (1, 3)))),
    # a hash of the counts' sum or set would miss another order
    "counts order": (("all_gather", (F64, (1, 3))), ("all_gather", (F64, (3, 1)))),
    "reduce op": (("all_reduce", (F64, 4, "sum")), ("all_reduce", (F64, 4, "max"))),
    "root": (("broadcast", (F64, 4, "root", 0)), ("broadcast", (F64, 4, "root", 1))),
}


@pytest.mark.parametrize("field", ONE_FIELD)
def test_fingerprint_differs_in_one_field_alone(field):
    a, b = ONE_FIELD[field]
    assert agree.fingerprint(*a) != agree.fingerprint(*b), (a, b)
    # the debug form compares these descriptions instead: they differ as well
    assert agree.full(*a) != agree.full(*b), (a, b)


@pytest.mark.parametrize("field", ONE_FIELD)
def test_equal_calls_have_equal_fingerprints(field):
    for kind, key in ONE_FIELD[field]:
        fp = agree.fingerprint(kind, key)
        assert 0 <= fp <= agree.MASK  # the check all-reduces -fp too, in an int64
        again = pickle.loads(pickle.dumps(key))  # an equal key made anew, as another rank has it
        agree.FINGERPRINTS.pop((kind, key), None)
        assert agree.fingerprint(kind, again) == fp
        assert agree.FINGERPRINTS[kind, key] == fp  # remembered for the next equal call


PRINT_FINGERPRINTS = """
import sys
sys.path.insert(0, "tests")
from test_agree import ONE_FIELD
from disttensor.comm.agree import fingerprint
print([fingerprint(*call) for pair in ONE_FIELD.values() for call in pair])
"""


def test_fingerprint_is_the_same_in_another_process():
    """MPI ranks are separate processes, each with a str hash seed of its own: a fingerprint
    built on ``hash`` would make equal calls diverge."""
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", PRINT_FINGERPRINTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    here = [agree.fingerprint(*call) for pair in ONE_FIELD.values() for call in pair]
    assert out.stdout.strip() == str(here)


def _label(name, tensors):  # shaped like dispatch's: its inputs go in a list
    return f"{name} of " + ", ".join(f"{t.shape} {t.dtype}" for t in tensors)


def test_current_fingerprint_holds_what_the_library_is_doing():
    """Equal calls for another reason differ (outermost item, order, the item's arguments,
    an op's inputs given as a list of tensors); equal reasons made anew are equal."""
    mesh = dt.ProcessMesh([0])
    a, b = dt.zeros((4, 2), mesh=mesh), dt.zeros((2, 4), mesh=mesh)
    call = ("all_gather", (F64, (4, 4)))

    def under(*items):
        with contextlib.ExitStack() as stack:
            for what, *args in items:
                stack.enter_context(agree.doing(what, *args))
            return agree.current(*call)

    bare = agree.current(*call)
    assert bare == agree.fingerprint(*call)  # nothing set: the call alone
    seen = {
        bare,
        under(("print (repr)",), ("numpy()",)),
        under(("numpy()",)),
        under(("numpy()",), ("print (repr)",)),
        under((_label, "add", [a])),
        under((_label, "add", [b])),
        under((_label, "multiply", [a])),
    }
    assert len(seen) == 7, seen
    assert under(("numpy()",), ("float()",)) == under(("numpy()",), ("float()",))
    again = dt.zeros((4, 2), mesh=mesh)  # another tensor of a's spec: the label is a's
    assert under((_label, "add", [again])) == under((_label, "add", [a]))
    assert 0 <= under((_label, "add", [a])) <= agree.MASK
    # an argument that cannot key the cache (an array) is described every time
    assert under((_label, "add", np.zeros(2))) == under((_label, "add", np.ones(2)))
    assert under((_label, "add", np.zeros(2))) != under((_label, "add", np.zeros(3)))


def test_envelope_room():
    """Note [The check rides along]: a group's envelope gathers at most ENVELOPE_BYTES of
    payload (16 bytes of header a rank on top), every payload starts 16-byte aligned, and the
    payload room is a round share where the ranks are a power of two: 2 ranks carry a vector
    half of 256 float64 (the gather of ``A @ p`` in a conjugate gradient of 256 unknowns)."""
    from disttensor.comm import mpi

    for n in range(1, 600):
        r = mpi.room(n)
        assert r >= 0 and r % 16 == 0, (n, r)
        assert n * r <= mpi.ENVELOPE_BYTES, (n, r)
        assert mpi.ENVELOPE_BYTES // n - r < 16, (n, r)  # the whole share, rounded down
    assert mpi.room(2) == 1024 and mpi.room(4) == 512 and mpi.room(8) == 256
    assert mpi.room(128) == 16 and mpi.room(256) == 0


# -- two ranks, calls that differ in one field --------------------------------------------------
DIFFERENT_CALLS = "were about to make different collective calls"


@dataclass(frozen=True)
class Case:
    """``fn(w, rank)`` runs on both ranks with the world communicator ``w``. ``says``: the
    fragments RanksDiverged must hold (both ranks' calls); none: the calls are equal and must
    pass, ``fn`` checking their results. ``xfail``: a known library gap (the reason); the
    case is expected to fail until it is fixed. ``warm``: run first on both ranks, with data
    moving (what it returns is ``fn``'s third argument): calls that make the diverging one
    take the library's fast paths."""

    name: str
    fn: Callable[..., None]
    says: tuple[str, ...] = ()
    xfail: str = ""
    warm: Callable[[comm.Communicator, int], Any] | None = None


def _kind_barrier_or_object(w, rank):
    if rank == 0:
        dt.barrier()  # the case: the public barrier against an object all-gather
    else:
        w.allgather_object({"rank": rank})


def _kind_agreement_equal_keys(w, rank):
    # the agreement the upper layers make (tensor.py, Note [Replicas agree]), equal keys
    key = ((8,), F64, (dt.Shard(0),))
    w.agree("shard_tensor" if rank == 0 else "dtensor_from_local", key)


def _kind_all_reduce_or_reduce_scatter(w, rank):
    send = np.ones(4)
    if rank == 0:
        w.allreduce(send, np.empty(4), "sum")
    else:
        w.reduce_scatter(send, np.empty(2), [2, 2], "sum")


def _kind_iallreduce_or_allreduce(w, rank):
    send, out = np.ones(4), np.empty(4)
    if rank == 0:
        w.iallreduce(send, out, "sum").wait()
    else:
        w.allreduce(send, out, "sum")


def _kind_ireduce_scatter_or_reduce_scatter(w, rank):
    send, out = np.ones(4), np.empty(2)
    if rank == 0:
        w.ireduce_scatter(send, out, [2, 2], "sum").wait()
    else:
        w.reduce_scatter(send, out, [2, 2], "sum")


def _kind_iallgather_or_allgather(w, rank):
    send, out = np.ones(2), np.empty(4)
    if rank == 0:
        w.iallgather(send, out, [2, 2]).wait()
    else:
        w.allgather(send, out, [2, 2])


def _dtype(w, rank):
    dtype = F32 if rank == 0 else F64
    w.allreduce(np.ones(4, dtype), np.empty(4, dtype), "sum")


def _count(w, rank):
    n = 4 + rank
    w.allreduce(np.ones(n), np.empty(n), "sum")


def _counts_list(w, rank):
    counts = [2, 2] if rank == 0 else [1, 3]
    w.allgather(np.ones(counts[rank]), np.empty(4), counts)


def _op_all_reduce(w, rank):
    w.allreduce(np.ones(4), np.empty(4), "sum" if rank == 0 else "max")


def _op_reduce_scatter(w, rank):
    w.reduce_scatter(np.ones(4), np.empty(2), [2, 2], "sum" if rank == 0 else "min")


def _root(w, rank):
    w.broadcast(np.ones(4), root=rank)  # each rank thinks itself the root


def _equal_calls(w, rank):
    """Every collective with equal fields on both ranks: the check passes, data moves."""
    dt.barrier()
    assert w.allgather_object(rank) == [0, 1]
    for dtype in (F32, F64):
        out = np.empty(4, dtype)
        w.allreduce(np.full(4, rank + 1, dtype), out, "max")
        assert np.array_equal(out, np.full(4, 2, dtype))
    for shape in ((), (3,), (2, 2)):  # recv None: a new array of send's shape, never a scalar
        got = w.allreduce(np.full(shape, rank + 1.0), None, "sum")
        assert type(got) is np.ndarray and got.shape == shape, (shape, type(got))
        assert np.array_equal(got, np.full(shape, 3.0))
    out = np.empty(2)
    w.reduce_scatter(np.arange(4.0), out, [2, 2], "sum")
    assert np.array_equal(out, 2 * np.arange(4.0)[2 * rank : 2 * rank + 2])
    out = np.empty(4)
    w.allgather(np.full(1 + 2 * rank, float(rank)), out, [1, 3])
    assert np.array_equal(out, [0.0, 1.0, 1.0, 1.0])
    buf = np.arange(4.0) if rank == 1 else np.empty(4)
    w.broadcast(buf, root=1)
    assert np.array_equal(buf, np.arange(4.0))
    w.agree("shard_tensor", ((8,), F64, (dt.Shard(0),)))


BIG = 4096  # float64 elements: 32 KiB, more than any envelope's payload (mpi.ENVELOPE_BYTES)


def _count_large(w, rank):
    n = BIG + rank
    w.allreduce(np.ones(n), np.empty(n), "sum")


def _count_small_or_large(w, rank):
    n = 4 if rank == 0 else BIG  # rank 0's payload rides, rank 1's does not
    w.allreduce(np.ones(n), np.empty(n), "sum")


def _kind_allreduce_or_agreement(w, rank):
    if rank == 0:
        w.allreduce(np.ones(3), np.empty(3), "sum")
    else:
        w.agree("shard_tensor", (F64, 3, "sum"))


def _mesh_and(*arrays_placements):
    mesh = dt.ProcessMesh([0, 1])
    return [dt.shard_tensor(a, mesh, [p]) for a, p in arrays_placements]


def _print_or_reshard(w, rank):
    """The issue's case: rank 0 prints x while rank 1 reshards y, of one spec (the same
    all-gather of 4 + 4 float64)."""
    x, y = _mesh_and((np.arange(8.0), dt.Shard(0)), (np.arange(8.0) + 8, dt.Shard(0)))
    if rank == 0:
        print(x)
    else:
        dt.reshard(y, y.mesh, [dt.Replicate()])


def _gather_a_or_b_placements(w, rank):
    """rank 0 gathers a while rank 1 gathers b of the same shape, split along another axis
    (the same all-gather of 32 + 32 float64)."""
    full = np.arange(64.0).reshape(8, 8)
    a, b = _mesh_and((full, dt.Shard(0)), (full + 64, dt.Shard(1)))
    (a if rank == 0 else b).numpy()


def _gather_a_or_b_shape(w, rank):
    """rank 0 gathers a while rank 1 gathers b of as many elements in another shape (the same
    all-gather of 16 + 16 float64)."""
    a, b = _mesh_and(
        (np.arange(32.0).reshape(4, 8), dt.Shard(0)), (np.arange(32.0).reshape(8, 4), dt.Shard(0))
    )
    (a if rank == 0 else b).numpy()


def _gather_a_or_b_same_spec(w, rank):
    """The issue's case the specs cannot tell: rank 0 gathers a while rank 1 gathers b of the
    very same spec (the same all-gather of 4 + 4 float64, for the same reason). The tensors'
    lineages differ (Note [Lineage names the tensor] in tensor.py)."""
    a, b = _mesh_and((np.arange(8.0), dt.Shard(0)), (np.arange(8.0) + 8, dt.Shard(0)))
    (a if rank == 0 else b).numpy()


def _gather_derived_same_spec(w, rank):
    """As above, the tensors made by different ops from one tensor."""
    (x,) = _mesh_and((np.arange(8.0), dt.Shard(0)))
    a, b = x + 1, np.exp(x)
    print(a if rank == 0 else b)


def _gather_slices_same_spec(w, rank):
    """Two slices of a split axis, ``u[1:]`` and ``u[:-1]``: one spec, made without dispatch
    (their rows move between ranks), named by the slice; the sort gathers its input."""
    (u,) = _mesh_and((np.arange(9.0), dt.Shard(0)))
    a, b = u[1:], u[:-1]
    np.sort(a if rank == 0 else b).numpy()


def _scalar_differs_by_rank(w, rank):
    """One op on every rank, with a Python scalar that differs by rank: no single-process
    value, so another tensor on each rank."""
    (x,) = _mesh_and((np.arange(8.0), dt.Shard(0)))
    dt.reshard(x * (2.0 + rank), x.mesh, [dt.Replicate()])


def _reduce_pair(w, rank):
    """_reduce_d_or_e_fast's warm-up: both products reduced on both ranks."""
    p, q = _mesh_and((np.arange(4.0), dt.Shard(0)), (np.arange(4.0) + 4, dt.Shard(0)))
    rs = dt.shard_tensor(np.float64(2.0), p.mesh, [dt.Replicate()])
    for _ in range(3):
        rs / (p @ p)
        rs / (q @ q)
    return p, q, rs


def _reduce_d_or_e_fast(w, rank, warm):
    """``rs / d`` on rank 0 and ``rs / e`` on rank 1, d and e Partial scalars of one spec,
    through the dispatch fast path (its decisions cached by the warm-up): the same op, the
    same all-reduce, for another tensor. d and e ride in it together (Note [Small reductions
    ride together] in tensor.py), each rank's own first: without the lineage, rank 0 would
    take e's sum for d's."""
    p, q, rs = warm
    d, e = p @ p, q @ q
    rs / (d if rank == 0 else e)


def _same_tensor_other_paths(w, rank):
    """Equal calls: the same tensor made on rank 0 by dispatch's fast paths (its decisions
    cached by calls that communicate nothing, made there alone) and on rank 1 by the general
    path: its lineage does not depend on the path, so the gather passes."""
    (x,) = _mesh_and((np.arange(8.0), dt.Shard(0)))
    if rank == 0:
        for _ in range(3):
            np.clip(x + x * 2.0, 1, 9) - 1
    y = np.clip(x + x * 2.0, 1, 9) - 1
    got = y.numpy()
    assert np.array_equal(got, np.clip(np.arange(8.0) * 3, 1, 9) - 1), got


def _divide_and_exp(w, rank):
    """_divide_or_exp_fast's warm-up: both ops called on both ranks, so that their
    decisions are cached."""
    (p,) = _mesh_and((np.arange(4.0), dt.Shard(0)))
    rs = dt.shard_tensor(np.float64(2.0), p.mesh, [dt.Replicate()])
    for _ in range(3):
        rs / (p @ p)
        np.exp(p @ p)
    return p, rs


def _divide_or_exp_fast(w, rank, warm):
    """Ops whose plans move their input the same way (an all-reduce of one Partial float64),
    each called before on both ranks so that the call that diverges takes the dispatch fast
    path (Note [Dispatch fast path]): the op's name still reaches the fingerprint."""
    p, rs = warm
    d = p @ p
    if rank == 0:
        rs / d
    else:
        np.exp(d)


def _vectors_moved(w, rank):
    """_planned_*'s warm-up: two vectors of one spec gathered and two Partial scalars reduced
    on both ranks, twice, so that both moves are planned (Note [Planned moves] in
    reshard.py): the calls that follow take the planned path under MPI."""
    a, b = _mesh_and((np.arange(8.0), dt.Shard(0)), (np.arange(8.0) + 8, dt.Shard(0)))
    rs = dt.shard_tensor(np.float64(2.0), a.mesh, [dt.Replicate()])
    for _ in range(2):
        for t in (a, b):
            dt.reshard(t + 0.0, t.mesh, [dt.Replicate()])
            rs / (t @ t)
    return a, b, rs


def _planned_gather_a_or_b(w, rank, warm):
    """rank 0 gathers a while rank 1 gathers b of one spec, both through a planned move: the
    moved tensor's lineage is in the planned call's fingerprint too."""
    a, b, _ = warm
    t = a if rank == 0 else b
    dt.reshard(t * 1.0, t.mesh, [dt.Replicate()])


def _planned_divide_or_exp(w, rank, warm):
    """``rs / d`` on rank 0 and ``np.exp(d)`` on rank 1 through a planned move of d: the
    op's label on the stack is in the planned call's fingerprint, and the message names the
    op and the move as the general path's does."""
    a, _, rs = warm
    d = a @ a
    if rank == 0:
        rs / d
    else:
        np.exp(d)


def _planned_and_general_agree(w, rank, warm):
    """Equal calls, one rank on the planned path and the other on the general one (rank 0
    under dt.explain, which takes the general path): the fingerprints are equal, the
    values numpy's, the collectives counted alike."""
    a, b, rs = warm
    with dt.CommCounter() as counter, dt.explain() if rank == 0 else contextlib.nullcontext():
        g = dt.reshard(a * 2.0, a.mesh, [dt.Replicate()])
        q = rs / (b @ b)
    assert np.array_equal(g.to_local(), np.arange(8.0) * 2), g.to_local()
    assert q.to_local() == 2.0 / float(np.sum((np.arange(8.0) + 8) ** 2)), q.to_local()
    assert counter.counts == {"all_gather": 1, "all_reduce": 1}, counter.counts
    assert counter.checks == 2, counter.checks


def _unchecked_reductions(w, rank):
    """With the check off (DISTTENSOR_CHECK=0) the MPI backend sums most dtypes in the MPI
    call alone: the results are the checked path's, for those and for the dtypes and ops
    that keep their work-arounds (bool, float16, 8- and 16-bit sums, NaN-propagating max).
    MPI only: the setting is the process's, which simulated ranks share."""
    if w.backend != "mpi":
        return
    before = agree.set_checks(False)
    try:
        for name, values in _REDUCED.items():
            dtype = np.dtype(name)
            for op in ("sum", "max"):
                if dtype.kind == "c" and op == "max":
                    continue
                mine = np.array(values[rank], dtype)
                with np.errstate(all="ignore"):
                    got = w.allreduce(mine, None, op)
                    agree.set_checks(True)
                    want = w.allreduce(mine, np.empty_like(mine), op)
                    agree.set_checks(False)
                assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (name, op)
        got = w.allreduce(np.float64(rank + 1.0) * np.ones(()), None, "sum")
        assert type(got) is np.ndarray and got.shape == () and got == 3.0
    finally:
        agree.set_checks(*before)


def _equal_calls_large(w, rank):
    """Calls whose payloads do not fit the envelope, for all ranks or some: the check passes
    and the data call moves them."""
    out = np.empty(BIG)
    w.allreduce(np.full(BIG, rank + 1.0), out, "sum")
    assert np.array_equal(out, np.full(BIG, 3.0))
    counts = [BIG, 1]  # rank 0's block does not fit, rank 1's does: both take the data call
    out = np.empty(BIG + 1)
    w.allgather(np.full(counts[rank], float(rank)), out, counts)
    assert np.array_equal(out, [0.0] * BIG + [1.0])
    buf = np.arange(float(BIG)) if rank == 0 else np.empty(BIG)
    w.broadcast(buf, root=0)
    assert np.array_equal(buf, np.arange(float(BIG)))
    # uneven all-to-all, rank 0 sends 1 + BIG, rank 1 sends 2 + 1: not every payload fits
    send_counts = [[1, BIG], [2, 1]][rank]
    recv_counts = [[1, 2], [BIG, 1]][rank]
    send = np.concatenate([np.full(c, 10.0 * rank + j) for j, c in enumerate(send_counts)])
    out = np.empty(sum(recv_counts))
    w.alltoall(send, send_counts, out, recv_counts)
    want = np.concatenate([np.full(c, 10.0 * j + rank) for j, c in enumerate(recv_counts)])
    assert np.array_equal(out, want)


# values whose reductions do not depend on the order MPI combines two ranks' in (no +0.0 and
# -0.0 meeting in max or min): NaN, infinities, ties, the dtypes' edges
_REDUCED = {
    "bool": ([True, False, False, True], [False, False, True, True]),
    # sums wrap around as numpy's do (Open MPI's vectorized sum saturates: comm/mpi.py)
    "int8": ([127, -5, 7, 0], [1, -128, 7, 3]),
    "uint8": ([255, 1, 0, 200], [1, 255, 0, 100]),
    "int16": ([32767, -5, 7, 0], [1, -32768, 7, 3]),
    "uint16": ([65535, 1, 0, 40000], [1, 65535, 0, 40000]),
    "int64": ([2**62, -3, 5, 0], [2**62, 4, -5, 1]),
    "float16": ([65504.0, 1.5, np.nan, -np.inf], [65504.0, 2.0**-24, 1.0, 3.0]),  # overflow
    "float32": ([1.0, np.nan, np.inf, -0.0], [2.0, 3.0, -np.inf, -1.0]),
    "float64": ([1e300, -2.5, np.nan, 0.1], [1e300, 2.5, 7.0, 0.2]),
    "complex128": ([1 + 2j, np.nan, 3 - 1j, 0.5j], [1 - 2j, 4 + 0j, 3 + 1j, -0.5j]),
}


def _carried_like_data_call(w, rank):
    """Every dtype and op through the envelope (4 elements ride) and through MPI (the same
    4 elements first in a buffer too large to ride): the same results, bit for bit."""
    for name, values in _REDUCED.items():
        dtype = np.dtype(name)
        mine = np.array(values[rank], dtype)
        for op in ("sum", "avg", "max", "min"):
            if op == "avg" and dtype.kind not in "fc":
                continue  # integers refuse an average on every path
            if dtype.kind == "c" and op in ("max", "min"):
                continue  # numpy's order of complex numbers: the same user op either way
            small = np.empty(4, dtype)
            with np.errstate(all="ignore"):
                w.allreduce(mine, small, op)
                big = np.zeros(BIG, dtype)
                big[:4] = mine
                w.allreduce(big, big, op)  # in place, as buckets do
            got, want = small.view(np.uint8), big[:4].view(np.uint8)
            assert np.array_equal(got, want), (name, op, small, big[:4])
    counts = [3, 5]
    send = np.arange(8.0) * (rank + 1)
    out = np.empty(counts[rank])
    w.reduce_scatter(send, out, counts, "max")
    assert np.array_equal(out, (np.arange(8.0) * 2)[[slice(0, 3), slice(3, 8)][rank]])


def _small_calls_ride(w, rank):
    """Under MPI (fingerprint mode) a collective whose payloads fit the envelope never
    reaches the backend's data call, and computes the data call's result; one that does not
    fit makes exactly one data call."""
    if w.backend != "mpi" or agree.DEBUG:
        return  # simulated ranks meet in the data exchange; debug compares texts first
    made = []
    names = [f"_{call}" for call in DATA_CALLS]
    for n in names:
        setattr(w, n, lambda *args, n=n: made.append(n) or getattr(type(w), n)(w, *args))
    try:
        mine = np.arange(8.0) + 10 * rank
        out = np.empty(8)
        w.allreduce(mine, out, "sum")
        assert np.array_equal(out, np.arange(8.0) * 2 + 10)
        w.iallreduce(out, out, "max").wait()
        assert np.array_equal(out, np.arange(8.0) * 2 + 10)
        w.allgather(mine[:4], out, [4, 4])
        assert np.array_equal(out, np.r_[0:4, 10:14])
        w.allgather(mine[: 3 + 2 * rank], out, [3, 5])
        assert np.array_equal(out, np.r_[0:3, 10:15])
        w.reduce_scatter(mine, out[:4], [4, 4], "sum")
        assert np.array_equal(out[:4], (np.arange(8.0) * 2 + 10)[4 * rank : 4 * rank + 4])
        w.alltoall(mine, None, out, None)
        assert np.array_equal(out, np.r_[0:4, 10:14] + 4 * rank)
        sent = [1, 2 + rank]  # rank j sends 1 element to rank 0 and 2 + j to rank 1
        recv_counts = [[1, 1], [2, 3]][rank]
        got = np.empty(sum(recv_counts))
        w.alltoall(mine[: sum(sent)], sent, got, recv_counts)
        assert np.array_equal(got, [[0.0, 10.0], [1.0, 2.0, 11.0, 12.0, 13.0]][rank])
        buf = mine.copy()
        w.broadcast(buf, root=1)
        assert np.array_equal(buf, np.arange(8.0) + 10)
        w.barrier()
        assert w.allgather_object({"rank": rank}) == [{"rank": 0}, {"rank": 1}]
        assert made == [], made
        w.allreduce(np.ones(BIG), np.empty(BIG), "sum")
        assert made == ["_allreduce"], made
    finally:
        for n in names:
            delattr(w, n)


def _calls(call0: str, call1: str) -> tuple[str, ...]:
    """Both ranks' calls as the message names them (kind, then the key's fields)."""
    return (DIFFERENT_CALLS, f"rank 0: {call0} (call #", f"rank 1: {call1} (call #")


CASES = [
    Case("kind_barrier_or_object", _kind_barrier_or_object, _calls("barrier", "all_gather_object")),
    Case(
        "kind_agreement_equal_keys",
        _kind_agreement_equal_keys,
        (
            DIFFERENT_CALLS,
            "rank 0: shard_tensor (8,), float64, (Shard(dim=0),) (call #",
            "rank 1: dtensor_from_local (8,), float64, (Shard(dim=0),) (call #",
        ),
    ),
    Case(
        "kind_all_reduce_or_reduce_scatter",
        _kind_all_reduce_or_reduce_scatter,
        _calls("all_reduce float64, 4, sum", "reduce_scatter float64, (2, 2), sum"),
    ),
    Case(
        "kind_iallreduce_or_allreduce",
        _kind_iallreduce_or_allreduce,
        # MPI never matches a non-blocking collective with a blocking one (MPICH waits for
        # ever): the check tells them apart
        _calls("iall_reduce float64, 4, sum", "all_reduce float64, 4, sum"),
    ),
    Case(
        "kind_ireduce_scatter_or_reduce_scatter",
        _kind_ireduce_scatter_or_reduce_scatter,
        _calls("ireduce_scatter float64, (2, 2), sum", "reduce_scatter float64, (2, 2), sum"),
    ),
    Case(
        "kind_iallgather_or_allgather",
        _kind_iallgather_or_allgather,
        _calls("iall_gather float64, (2, 2)", "all_gather float64, (2, 2)"),
    ),
    Case("dtype", _dtype, _calls("all_reduce float32, 4, sum", "all_reduce float64, 4, sum")),
    Case("count", _count, _calls("all_reduce float64, 4, sum", "all_reduce float64, 5, sum")),
    Case(
        "counts_list",
        _counts_list,
        _calls("all_gather float64, (2, 2)", "all_gather float64, (1, 3)"),
    ),
    Case(
        "op_all_reduce",
        _op_all_reduce,
        _calls("all_reduce float64, 4, sum", "all_reduce float64, 4, max"),
    ),
    Case(
        "op_reduce_scatter",
        _op_reduce_scatter,
        _calls("reduce_scatter float64, (2, 2), sum", "reduce_scatter float64, (2, 2), min"),
    ),
    Case("root", _root, _calls("broadcast float64, 4, root, 0", "broadcast float64, 4, root, 1")),
    Case(
        "count_large",
        _count_large,
        _calls(f"all_reduce float64, {BIG}, sum", f"all_reduce float64, {BIG + 1}, sum"),
    ),
    Case(
        "count_small_or_large",
        _count_small_or_large,
        _calls("all_reduce float64, 4, sum", f"all_reduce float64, {BIG}, sum"),
    ),
    Case(
        "kind_allreduce_or_agreement",
        _kind_allreduce_or_agreement,
        _calls("all_reduce float64, 3, sum", "shard_tensor float64, 3, sum"),
    ),
    Case(
        "print_or_reshard",
        _print_or_reshard,
        (
            DIFFERENT_CALLS,
            "rank 0: print (repr) > numpy() > reshard [Shard(dim=0)] -> [Replicate()] of (8,) "
            "float64 on mesh (2,) > all_gather float64, (4, 4) (call #",
            "rank 1: reshard [Shard(dim=0)] -> [Replicate()] of (8,) float64 on mesh (2,) > "
            "all_gather float64, (4, 4) (call #",
        ),
    ),
    Case(
        "gather_a_or_b_placements",
        _gather_a_or_b_placements,
        (
            DIFFERENT_CALLS,
            "rank 0: numpy() > reshard [Shard(dim=0)] -> [Replicate()] of (8, 8) float64 on "
            "mesh (2,) > all_gather float64, (32, 32) (call #",
            "rank 1: numpy() > reshard [Shard(dim=1)] -> [Replicate()] of (8, 8) float64 on "
            "mesh (2,) > all_gather float64, (32, 32) (call #",
        ),
    ),
    Case(
        "gather_a_or_b_shape",
        _gather_a_or_b_shape,
        (
            DIFFERENT_CALLS,
            "rank 0: numpy() > reshard [Shard(dim=0)] -> [Replicate()] of (4, 8) float64",
            "rank 1: numpy() > reshard [Shard(dim=0)] -> [Replicate()] of (8, 4) float64",
        ),
    ),
    Case(
        "divide_or_exp_fast",
        _divide_or_exp_fast,
        (
            DIFFERENT_CALLS,
            "rank 0: divide of () float64 [Replicate()], () float64 [Partial(reduce_type='sum')] "
            "> reshard [Partial(reduce_type='sum')] -> [Replicate()] of () float64",
            "rank 1: exp of () float64 [Partial(reduce_type='sum')] > reshard",
        ),
        warm=_divide_and_exp,
    ),
    Case(
        "gather_a_or_b_same_spec",
        _gather_a_or_b_same_spec,
        (
            DIFFERENT_CALLS,
            "rank 0: numpy() > tensor #",
            "rank 1: numpy() > tensor #",
            "> reshard [Shard(dim=0)] -> [Replicate()] of (8,) float64 on mesh (2,) > "
            "all_gather float64, (4, 4) (call #",
            "ranks that show different numbers move different tensors",
        ),
    ),
    Case(
        "gather_derived_same_spec",
        _gather_derived_same_spec,
        (DIFFERENT_CALLS, "rank 0: print (repr) > numpy() > tensor #", "different tensors"),
    ),
    Case(
        "gather_slices_same_spec",
        _gather_slices_same_spec,
        (DIFFERENT_CALLS, "rank 0: tensor #", "rank 1: tensor #", "different tensors"),
    ),
    Case(
        "scalar_differs_by_rank",
        _scalar_differs_by_rank,
        (DIFFERENT_CALLS, "rank 0: tensor #", "rank 1: tensor #", "Python scalars on each rank"),
    ),
    Case(
        "reduce_d_or_e_fast",
        _reduce_d_or_e_fast,
        (
            DIFFERENT_CALLS,
            "rank 0: divide of () float64 [Replicate()], () float64 [Partial(reduce_type='sum')] "
            "> tensor #",
            "> reshard [Partial(reduce_type='sum')] -> [Replicate()] of (2,) float64",
        ),
        warm=_reduce_pair,
    ),
    Case(
        "planned_gather_a_or_b",
        _planned_gather_a_or_b,
        (
            DIFFERENT_CALLS,
            "rank 0: tensor #",
            "rank 1: tensor #",
            "> reshard [Shard(dim=0)] -> [Replicate()] of (8,) float64 on mesh (2,) > "
            "all_gather float64, (4, 4) (call #",
            "ranks that show different numbers move different tensors",
        ),
        warm=_vectors_moved,
    ),
    Case(
        "planned_divide_or_exp",
        _planned_divide_or_exp,
        (
            DIFFERENT_CALLS,
            "rank 0: divide of () float64 [Replicate()], () float64 [Partial(reduce_type='sum')] "
            "> reshard [Partial(reduce_type='sum')] -> [Replicate()] of () float64 on mesh "
            "(2,) > all_reduce float64, 1, sum (call #",
            "rank 1: exp of () float64 [Partial(reduce_type='sum')] > reshard "
            "[Partial(reduce_type='sum')] -> [Replicate()] of () float64 on mesh (2,) > "
            "all_reduce float64, 1, sum (call #",
        ),
        warm=_vectors_moved,
    ),
    Case("planned_and_general_agree", _planned_and_general_agree, warm=_vectors_moved),
    Case("same_tensor_other_paths", _same_tensor_other_paths),
    Case("equal_calls", _equal_calls),
    Case("unchecked_reductions", _unchecked_reductions),
    Case("equal_calls_large", _equal_calls_large),
    Case("carried_like_data_call", _carried_like_data_call),
    Case("small_calls_ride", _small_calls_ride),
]
BY_NAME = {c.name: c for c in CASES}
MODES = ("fingerprint", "debug")


class DataMoved(AssertionError):
    """A diverged call got past the check to its data call."""


# the Communicator methods that move data; the backend implements each as "_" + name
DATA_CALLS = (
    "allreduce",
    "iallreduce",
    "ireduce_scatter",
    "allgather",
    "iallgather",
    "reduce_scatter",
    "alltoall",
    "broadcast",
    "barrier",
    "allgather_object",
)


@contextlib.contextmanager
def _no_data_moves(w: comm.Communicator) -> Iterator[None]:
    """Under MPI, a diverged call that passes the check must not reach MPI: its mismatched
    buffers would hang the launch or end it with an MPI error, and no later case would get a
    verdict. So the backend's data calls raise DataMoved instead (the check runs before them,
    on a channel of its own). Simulated ranks carry the check in the data exchange itself,
    and mismatched buffers only meet in this process: nothing to stop there."""
    if w.backend != "mpi":
        yield
        return
    names = [f"_{call}" for call in DATA_CALLS]  # the backend's hooks, shadowed here

    def stop(name):
        def call(*args):
            raise DataMoved(f"the check passed; rank {w.rank} reached {name}")

        return call

    for n in names:
        setattr(w, n, stop(n))
    try:
        yield
    finally:
        for n in names:
            delattr(w, n)


@contextlib.contextmanager
def _mode(mode: str) -> Iterator[None]:
    """The check in ``mode``: the fingerprint, or DISTTENSOR_DEBUG's full descriptions (a
    process-wide setting: every simulated rank shares it, every MPI rank makes it)."""
    before = agree.set_checks(True, mode == "debug")
    try:
        yield
    finally:
        agree.set_checks(*before)


def _outcome(case: Case, w: comm.Communicator, rank: int) -> tuple[str, str]:
    """This rank's (outcome, message): outcome "ok" or what went otherwise."""
    try:
        warm = () if case.warm is None else (case.warm(w, rank),)
        with _no_data_moves(w) if case.says else contextlib.nullcontext():
            case.fn(w, rank, *warm)
    except dt.RanksDiverged as e:
        if not case.says:
            return f"RanksDiverged on equal calls: {e}", str(e)
        missing = [f for f in case.says if f not in str(e)]
        return (f"RanksDiverged lacks {missing}: {e}" if missing else "ok"), str(e)
    except Exception as e:
        return f"raised {type(e).__name__}: {e}", ""
    return ("raised nothing, RanksDiverged expected" if case.says else "ok"), ""


def run_case(case: Case) -> tuple[str, str, bool]:
    """Run ``case`` on this rank and judge both ranks' outcomes (collective over the world):
    (verdict "PASS" or "FAIL", why, whether the ranks are still in step)."""
    w = comm.world()
    mine = _outcome(case, w, w.rank)
    try:
        everyone = w.allgather_object((case.name, *mine))
    except Exception as e:
        return "FAIL", f"ranks out of step after the case: {type(e).__name__}: {e}", False
    if {name for name, _, _ in everyone} != {case.name}:
        return "FAIL", f"ranks out of step: they ran {[n for n, _, _ in everyone]}", False
    bad = [f"rank {r}: {o}" for r, (_, o, _) in enumerate(everyone) if o != "ok"]
    if bad:
        return "FAIL", "; ".join(bad), True
    if len({text for _, _, text in everyone}) != 1:  # every rank raises one message
        return "FAIL", f"the ranks' messages differ: {[t for _, _, t in everyone]}", True
    return "PASS", "", True


def _ids() -> list:
    """(mode, case) parameters, the known gaps marked strict xfail with their reason."""
    return [
        pytest.param(
            m,
            c.name,
            id=f"{m}-{c.name}",
            marks=[pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else [],
        )
        for m in MODES
        for c in CASES
    ]


@pytest.mark.parametrize(("mode", "name"), _ids())
def test_case_on_simulated_ranks(mode, name):
    with _mode(mode):
        results = dt.simulate(2, run_case, BY_NAME[name], timeout=10)
    verdict, why, in_step = results[0]
    assert results[1] == results[0], results  # both ranks judged the same outcomes
    assert in_step, why
    assert verdict == "PASS", why


# -- under mpiexec: one launch runs every case in both modes ------------------------------------
VERDICT = re.compile(r"^CASE (\S+) (\S+) (PASS|FAIL) (.*)$", re.M)
_launch: list[tuple[int | None, dict[tuple[str, str], tuple[str, str]], str]] = []


def _mpi_cases() -> tuple[int | None, dict[tuple[str, str], tuple[str, str]], str]:
    """(exit code, {(mode, case): (verdict, why)}, output) of the launch, made once; a
    launch that hung is remembered as such (exit code None)."""
    if not _launch:
        env = {"DISTTENSOR_TIMEOUT": "10"}  # a rank left waiting ends the launch in seconds
        try:
            code, out = run(2, ["tests/test_agree.py"], timeout=60, env=env)
        except TimeoutError as e:
            code, out = None, str(e)
        verdicts = {(m[1], m[2]): (m[3], m[4]) for m in VERDICT.finditer(out)}
        _launch.append((code, verdicts, out))
    return _launch[0]


@pytest.mark.mpi
def test_launch_ends_cleanly():
    code, verdicts, out = _mpi_cases()
    assert code == 0, out[-4000:]
    assert f"DONE {len(MODES) * len(CASES)} cases" in out, out[-4000:]
    assert set(verdicts) == {(m, c.name) for m in MODES for c in CASES}, out[-4000:]


@pytest.mark.mpi
@pytest.mark.parametrize(("mode", "name"), _ids())
def test_case_under_mpiexec(mode, name):
    code, verdicts, out = _mpi_cases()
    assert (mode, name) in verdicts, f"no verdict: the launch ended (exit {code}):\n{out[-4000:]}"
    verdict, why = verdicts[mode, name]
    assert verdict == "PASS", why


def main() -> None:
    assert dt.get_world_size() == 2, "run on 2 ranks: mpiexec -n 2 python tests/test_agree.py"
    rank = dt.get_rank()
    for mode in MODES:
        with _mode(mode):
            for case in CASES:
                verdict, why, in_step = run_case(case)
                if rank == 0:
                    print(f"CASE {mode} {case.name} {verdict} {why!r}", flush=True)
                if not in_step:  # later cases would only report the same breakage
                    sys.exit(1)
    if rank == 0:
        print(f"DONE {len(MODES) * len(CASES)} cases", flush=True)


if __name__ == "__main__":
    main()
