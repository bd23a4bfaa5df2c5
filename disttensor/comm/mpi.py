"""MPI backend over mpi4py's buffer (upper-case) calls: tensor data is never pickled.

Data movement (gather, all-to-all, broadcast, send/recv) sends raw bytes, so every numpy dtype
works. Reductions use MPI's types: bool is reduced as uint8 with MAX/MIN (logical or/and), and
float16, which MPI lacks, is reduced in float32. MAX/MIN of floating and complex numbers use
numpy's maximum/minimum as MPI user ops: MPI's own MAX drops a NaN or keeps it depending on
the order the ranks are combined in (numpy propagates it), and has no complex MAX at all. Sums
of 8- and 16-bit integers are taken in int32 and cast back, so they wrap around as numpy's do:
Open MPI 5 saturates them where its vectorized sum runs (4096 int16 of 32767 on 2 ranks sum
to 32767 there, to -2 in numpy, in MPICH and in Open MPI's own sum of 4 elements).

Note [Host staging]
    MPI moves host memory (a CUDA-aware MPI is not assumed). A device array handed to a
    call (Note [Array backends] in disttensor/backend.py) is copied to a host buffer, the
    call runs on the host buffers, and the arrays it writes are copied back to the device
    (after ``wait()`` for a non-blocking call); an array that is both the send and the
    receive buffer is staged once, so in-place reductions stay in place. On a GPU the mesh
    dims use a device communicator where one is available (comm/__init__.py,
    ``device_communicator``), and this path serves the rest.
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
import time
import traceback
from typing import Any

import numpy as np

from ..backend import DEVICE_ARRAYS, of
from . import agree
from .agree import _doing
from .base import Communicator, Work, _observers, displacements, equal_counts, record
from .watchdog import WATCH

_ND = np.ndarray
_WATCH_ENTER, _WATCH_EXIT = WATCH.enter, WATCH.exit

_OPS = {}
_MODULE: list = []  # mpi4py.MPI once imported: an import statement per call costs a collective


def _mpi():
    if _MODULE:
        return _MODULE[0]
    from mpi4py import MPI  # lazy: importing disttensor must not initialize MPI

    _OPS.update(sum=MPI.SUM, avg=MPI.SUM, max=MPI.MAX, min=MPI.MIN)
    _MODULE.append(MPI)
    return MPI


def _IN_PLACE():
    return _mpi().IN_PLACE


_NUMPY_OPS: dict[tuple[str, str], object] = {}


def _numpy_op(op: str, dtype: np.dtype):
    """An MPI user op applying numpy's maximum/minimum to ``dtype`` items (NaN propagates,
    complex numbers compare as numpy compares them); created once per (op, dtype)."""
    key = (op, dtype.str)
    mop = _NUMPY_OPS.get(key)
    if mop is None:
        f = np.maximum if op == "max" else np.minimum

        def apply(inmem, inoutmem, datatype, dtype=dtype, f=f):
            a = np.frombuffer(inmem, dtype)
            b = np.frombuffer(inoutmem, dtype)
            f(a, b, out=b)

        mop = _NUMPY_OPS[key] = _mpi().Op.Create(apply, commute=True)
    return mop


def _bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


# -- the envelope (Note [The check rides along] in comm/agree.py) -----------------------------
HEAD = 16  # a slot's header: the fingerprint and the payload's byte size (-1: none), int64
ENVELOPE_BYTES = 2048  # the payload a group's envelope gathers at most (headers apart)


def room(size: int) -> int:
    """Payload bytes a rank's slot holds in a group of ``size`` ranks: its share of
    ENVELOPE_BYTES, a multiple of 16 (so every payload starts 16-byte aligned) and a round
    number where the ranks are a power of two (1 KiB on 2 ranks: a vector of 128 float64,
    the half of a 256-element one; the header comes on top)."""
    return ENVELOPE_BYTES // size // 16 * 16


class _Envelope:
    """A group's envelope buffers, made at its first check and reused: this rank's slot, and
    every rank's after the all-gather."""

    __slots__ = ("gather", "gathers", "room", "mine", "every", "head", "heads", "typed", "rows",
                 "specs", "sums", "words", "at")  # fmt: skip

    def __init__(self, comm, size: int) -> None:
        self.gather = comm.Allgather  # on the group's check channel
        self.room = room(size)
        slot = HEAD + self.room
        self.mine = np.zeros(slot, np.uint8)
        self.every = np.empty((size, slot), np.uint8)
        # mpi4py's message specs made once: parsing two arrays per call costs more
        MPI = _mpi()
        self.specs = ([MPI.buffer(self.mine), slot, MPI.BYTE],
                      [MPI.buffer(self.every), slot, MPI.BYTE])  # fmt: skip
        # this rank's (fingerprint, size), written through a memoryview: a numpy item
        # store costs twice as much, on the path of every small collective
        self.head = memoryview(self.mine).cast("q")[: HEAD // 8]
        self.heads = self.every[:, :HEAD].view(np.int64)  # every rank's (fingerprint, size)
        # the same read word by word, for the common group of two ranks: the second rank's
        # header starts at word ``at`` (0: another size, compared through ``heads``)
        self.words = memoryview(self.every).cast("B").cast("q")
        self.at = slot // 8 if size == 2 else 0
        self.typed: dict[tuple, tuple] = {}
        self.rows: list = []  # every rank's payload of the reduction being packed
        self.sums: dict[tuple, Planned] = {}  # MPIComm.allreduce's plans
        self.gathers: dict[tuple, Planned] = {}  # MPIComm.allgather's plans

    def reduction(self, comm: MPIComm, send: np.ndarray, op: str) -> Planned | None:
        """MPIComm.allreduce's plan for payloads like ``send`` (kept per shape, dtype and op),
        or None where the payload does not fit."""
        dtype, shape = send.dtype, send.shape
        plan = self.sums.get((shape, dtype, op))
        if plan is not None or send.nbytes > self.room:
            return plan
        mine, rows = self.views(dtype, shape)
        n = int(np.prod(shape, dtype=np.int64))
        key = (dtype, n, op)  # the fingerprint's key: the same as the general path's
        plan = Planned(comm, self, "all_reduce", mine, n * dtype.itemsize, key, rows, op, send)
        if comm.size == 2 and op != "avg" and dtype.char not in "?e":  # _reduce_rows' common
            plan.pair = _UFUNCS[op]  # case, in one call
        if len(self.sums) > 256:
            self.sums.clear()
        self.sums[shape, dtype, op] = plan
        return plan

    def gathering(self, comm: MPIComm, send: np.ndarray, counts: tuple) -> Planned | None:
        """MPIComm.allgather's plan for this rank's parts like ``send`` and every rank's
        ``counts`` (kept per shape, dtype and counts), or None where a part does not fit."""
        dtype, shape = send.dtype, send.shape
        plan = self.gathers.get((shape, dtype, counts))
        if plan is not None:
            return plan
        isz = dtype.itemsize
        if max(counts) * isz > self.room or send.size != counts[comm.rank]:
            return None
        mine = self.mine[HEAD : HEAD + counts[comm.rank] * isz].view(dtype).reshape(shape)
        bounds = None
        if len(set(counts)) == 1:
            rows = self.every[:, HEAD : HEAD + counts[0] * isz].view(dtype)
        else:
            rows = [self.every[r, HEAD : HEAD + n * isz].view(dtype) for r, n in enumerate(counts)]
            ends = np.cumsum(counts).tolist()
            bounds = [(end - n, end) for n, end in zip(counts, ends)]
        key = (dtype, counts)  # the fingerprint's key: the same as the general path's
        nbytes = counts[comm.rank] * isz
        plan = Planned(comm, self, "all_gather", mine, nbytes, key, rows, counts, send)
        plan.bounds, plan.full = bounds, (sum(counts),)
        plan.sizes = (counts[0] * isz, counts[-1] * isz)  # two ranks: unequal parts too
        if len(self.gathers) > 256:
            self.gathers.clear()
        self.gathers[shape, dtype, counts] = plan
        return plan

    def views(self, dtype: np.dtype, shape: tuple) -> tuple:
        """(this rank's payload, every rank's payload row by row) as ``dtype`` arrays of
        ``shape``: the all-reduce's hot path copies in and reduces out without a reshape."""
        hit = self.typed.get((dtype, shape))
        if hit is None:
            n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            mine = self.mine[HEAD : HEAD + n].view(dtype).reshape(shape)
            every = self.every[:, HEAD : HEAD + n].view(dtype)
            rows = [r.reshape(shape) for r in every]
            if len(self.typed) > 256:
                self.typed.clear()
            hit = self.typed[dtype, shape] = (mine, rows)
        return hit

    def payload(self, rank: int, nbytes: int, offset: int = 0) -> np.ndarray:
        """``rank``'s payload bytes ``[offset, offset + nbytes)``."""
        return self.every[rank, HEAD + offset : HEAD + offset + nbytes]


def _folded(folds: list, fp: int, stack: Any, item: Any = None, lin: Any = None) -> int:
    """Fingerprint ``fp`` of a planned call with what the library is doing folded in
    (``agree.in_context``): the items of ``stack`` (``_doing.stack``), then ``item`` where
    given (a planned step's own item, folded as if pushed: ``Planned``; ``stack`` may then be
    empty or None), then the moved tensor's lineage: the stack's, or ``lin`` where ``item``
    is given. The items' fold is kept in ``folds`` (a plan's): the last pair of items seen (a
    reshard's one, or an op's label and its reshard's; by identity) with its fold, and a dict
    of the folds of every pair seen, so the ops of a loop that make the same call (``rs / d``
    and ``rs_new / rs``) fold nothing again."""
    if item is None:
        n = len(stack)
        first = stack[0]
        second = stack[1] if n == 2 else None
        lin = stack.lin  # the moved tensor's (Note [Lineage names the tensor] in tensor.py)
    else:
        n = len(stack) + 1 if stack else 1
        first = item if n == 1 else stack[0]
        second = item if n == 2 else None
    last = folds  # [first, second, their fold, {(id(first), id(second)): the three}]
    if last[0] is first and last[1] is second and n <= 2:
        folded = last[2]
    elif n > 2:
        folded = agree.with_items(fp, stack if item is None else [*stack, item])
    else:
        seen = last[3]
        hit = seen.get((id(first), id(second)))
        if hit is None or hit[0] is not first or hit[1] is not second:
            pair = [first] if second is None else [first, second]
            hit = (first, second, agree.with_items(fp, pair))  # the items' fold alone
            if len(seen) >= 16:
                seen.clear()
            seen[id(first), id(second)] = hit
        last[0], last[1], last[2] = hit
        folded = hit[2]
    return folded if lin is None else agree.with_tensor(folded, lin)


def _host(a: Any, b: Any) -> bool:
    """Whether both buffers are host memory (device buffers never ride: Note [Host staging])."""
    return isinstance(a, np.ndarray) and isinstance(b, np.ndarray)


_UFUNCS = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum}


def _reduce_rows(rows: list, out: np.ndarray, op: str, size: int) -> None:
    """``out`` = the ``op``-reduction of ``rows`` in rank order, by the module doc's rules
    for dtypes (so a carried reduction equals what MPI computes through ``_reduce_view``)."""
    f = _UFUNCS[op]
    char = out.dtype.char
    if size == 2 and op != "avg" and char not in "?e":  # the common case, in one call
        f(rows[0], rows[1], out=out)
        return
    acc = out
    if char == "?":  # bool: logical or, and for min
        f = np.logical_and if op == "min" else np.logical_or
    elif char == "e":  # float16: in float32, rounded once
        acc = rows[0].astype(np.float32)
        rows = [acc, *rows[1:]]
    f(rows[0], rows[1], out=acc)
    for r in rows[2:]:
        f(acc, r, out=acc)
    if op == "avg":
        acc /= size  # integers and bools refuse, as in _finish
    if acc is not out:
        out[...] = acc


# Each kind that rides: pack (this rank's payload into the slot, returning its byte size, or
# -1 when it does not fit or is not host memory) and unpack (the call's result from the
# gathered slots, once every rank's payload is there). Both get the communicator, its
# envelope and the collective's own arguments.
def _pack_reduce(c, e, send, recv, *rest):
    if send.nbytes > e.room or not _host(send, recv):
        return -1
    mine, e.rows = e.views(send.dtype, send.shape)
    mine[...] = send
    return send.nbytes


def _unpack_iallreduce(c, e, send, recv, op):
    _reduce_rows(e.rows, recv.reshape(send.shape), op, c.size)
    return Work()  # already complete


def _unpack_reduce_scatter(c, e, send, recv, counts, op):
    start = sum(counts[: c.rank]) * send.itemsize
    n = counts[c.rank] * send.itemsize
    rows = [e.payload(r, n, start).view(send.dtype) for r in range(c.size)]
    _reduce_rows(rows, recv.reshape(-1), op, c.size)
    return True


def _unpack_iallgather(c, e, send, recv, counts):
    _unpack_allgather(c, e, send, recv, counts)
    return Work()  # already complete


def _unpack_ireduce_scatter(c, e, send, recv, counts, op):
    _unpack_reduce_scatter(c, e, send, recv, counts, op)
    return Work()  # already complete


def _put(e, a: np.ndarray, offset: int = 0) -> int:
    """``a``'s bytes into this rank's payload at ``offset``: the payload's end, or -1."""
    end = offset + a.nbytes
    if end > e.room:
        return -1
    e.mine[HEAD + offset : HEAD + end] = _bytes(a)
    return end


def _pack_allgather(c, e, send, recv, counts):
    return _put(e, send) if _host(send, recv) else -1


def _unpack_allgather(c, e, send, recv, counts):
    isz = recv.itemsize
    out = _bytes(recv)
    if len(set(counts)) == 1:
        n = counts[0] * isz
        out.reshape(c.size, n)[...] = e.every[:, HEAD : HEAD + n]
        return True
    at = 0
    for r, count in enumerate(counts):
        n = count * isz
        out[at : at + n] = e.payload(r, n)
        at += n
    return True


def _pack_alltoall(c, e, send, send_counts, recv, recv_counts):
    if not _host(send, recv):
        return -1
    if send_counts is None:  # equal blocks: the key holds send.size, equal on every rank
        return _put(e, send)
    # the sender's counts go first: a receiver finds its block by them
    at = _put(e, np.asarray(send_counts, np.int64))
    return _put(e, send, at) if at >= 0 else -1


def _unpack_alltoall(c, e, send, send_counts, recv, recv_counts):
    isz = recv.itemsize
    out = _bytes(recv)
    rc = recv_counts or equal_counts(recv, c.size)
    block = send.size // c.size * c.rank * isz
    at = 0
    for r, count in enumerate(rc):
        n = count * isz
        if send_counts is None:
            start = block
        else:
            theirs = e.payload(r, 8 * c.size).view(np.int64)
            start = 8 * c.size + int(theirs[: c.rank].sum()) * isz
        out[at : at + n] = e.payload(r, n, start)
        at += n
    return True


def _pack_broadcast(c, e, buf, root):
    if not _host(buf, buf) or buf.nbytes > e.room:
        return -1
    if c.rank == root:
        _put(e, buf)
    return buf.nbytes  # every rank says it fits: the root alone sends its bytes


def _unpack_broadcast(c, e, buf, root):
    if c.rank != root:
        _bytes(buf)[...] = e.payload(root, buf.nbytes)
    return True


def _pack_nothing(c, e):
    return 0


def _unpack_barrier(c, e):
    return True  # the envelope is the barrier: no rank leaves it before every rank came


def _pack_object(c, e, obj):
    return _put(e, np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8))


def _unpack_object(c, e, obj):
    sizes = e.heads[:, 1].tolist()
    return [pickle.loads(e.payload(r, n).tobytes()) for r, n in enumerate(sizes)]


_RIDES = {  # all_reduce rides in MPIComm.allreduce, written out
    "iall_reduce": (_pack_reduce, _unpack_iallreduce),
    "reduce_scatter": (_pack_reduce, _unpack_reduce_scatter),
    "ireduce_scatter": (_pack_reduce, _unpack_ireduce_scatter),
    "all_gather": (_pack_allgather, _unpack_allgather),
    "iall_gather": (_pack_allgather, _unpack_iallgather),
    "all_to_all": (_pack_alltoall, _unpack_alltoall),
    "broadcast": (_pack_broadcast, _unpack_broadcast),
    "barrier": (_pack_nothing, _unpack_barrier),
    "all_gather_object": (_pack_object, _unpack_object),
}


def _staged(*written: int, reads_written: bool = False):
    """Note [Host staging] for a method whose positional arguments ``written`` are the
    arrays it writes (``reads_written``: it reads them first too, as a broadcast's root)."""

    def deco(method):
        @functools.wraps(method)
        def call(self, *args):
            if not DEVICE_ARRAYS or not any(type(a) in DEVICE_ARRAYS for a in args):
                return method(self, *args)  # no device backend registered: nothing to stage
            staged = list(args)
            hosts: dict[int, np.ndarray] = {}  # an array passed twice is staged once
            for i in sorted(range(len(args)), key=lambda i: i in written):  # reads first
                a = args[i]
                if type(a) not in DEVICE_ARRAYS:
                    continue
                h = hosts.get(id(a))
                if h is None:
                    fresh = i in written and not reads_written  # its values are not read
                    h = np.empty(a.shape, a.dtype) if fresh else of(a).to_host(a)
                    hosts[id(a)] = h
                staged[i] = h
            back = [(args[i], staged[i]) for i in written if type(args[i]) in DEVICE_ARRAYS]

            def copy_back() -> None:
                for dev, host in back:
                    dev[...] = of(dev).from_host(host)

            out = method(self, *staged)
            if not isinstance(out, Work):
                copy_back()
                return out
            wait = out._wait

            def staged_wait() -> None:
                if wait is not None:
                    wait()
                copy_back()

            out._wait = staged_wait
            return out

        return call

    return deco


class Planned:
    """A small collective of one call shape on a group's envelope (Note [The check rides
    along] in comm/agree.py): an all-reduce of a payload that fits, or an all-gather whose
    parts fit, made once per shape, dtype and op or counts and kept on the envelope
    (``_Envelope.reduction``, ``_Envelope.gathering``). Calling it makes the collective:
    ``MPIComm.allreduce`` and ``allgather`` call it for their small case, and a planned move
    calls it straight from reshard.execute (Note [Planned moves] in reshard.py). This is the
    path of every small collective, the check's exchange (``MPIComm._exchange``) written out:
    a call more costs 0.15 us of an 8-float all-reduce's 7."""

    __slots__ = ("comm", "e", "kind", "mine", "fp", "nbytes", "key", "folds", "rows", "arg",
                 "pair", "bounds", "shape", "dtype", "full", "sizes")  # fmt: skip

    def __init__(self, comm, e, kind: str, mine, nbytes: int, key: tuple, rows, arg, send):
        self.comm, self.e, self.kind = comm, e, kind
        self.mine = mine  # this rank's payload: a view of its slot
        self.fp = agree.FINGERPRINTS.get((kind, key)) or agree.fingerprint(kind, key)
        self.nbytes = nbytes  # this rank's payload bytes
        self.key = key  # the fingerprint's key: the same as the general path's
        self.folds = [None, None, 0, {}]  # the fingerprint with the doing items: _folded
        self.rows = rows  # every rank's payload, after the gather
        self.arg = arg  # the all-reduce's op, or the all-gather's counts
        self.pair = None  # the ufunc that reduces two rows in one call (else _reduce_rows)
        self.bounds = None  # the all-gather's: each row's bounds in the result, unequal parts
        self.shape, self.dtype = send.shape, send.dtype  # this rank's send arrays'
        self.full = ()  # the all-gather's result shape, for a vector
        self.sizes = (nbytes, nbytes)  # two ranks: each one's payload bytes, in its header

    def __call__(self, send: np.ndarray, recv: Any = None, item: Any = None, lin: Any = None):
        """The collective of ``send`` into ``recv`` (None: a new array), returned. ``item``,
        ``lin``: a planned move's item and moved tensor's lineage (reshard.execute), folded
        into the fingerprint as the general path folds what it pushes on the stack (the
        check on, not in debug mode: reshard.execute calls it so); the move's call gives
        None, doing nothing, for a send array it was not planned for (another dtype, shape
        or layout)."""
        stack = _doing.stack
        if item is None:
            fp = _folded(self.folds, self.fp, stack) if stack else self.fp
        else:
            dtype = send.dtype
            if (
                (dtype is not self.dtype and dtype != self.dtype)  # equal dtypes: not one object
                or send.shape != self.shape
                or not send.flags.c_contiguous
            ):
                return None
            if lin is None and stack:  # as the general path: an enclosing move's
                lin = stack.lin
            fp = _folded(self.folds, self.fp, stack, item, lin)
        return self.carry(send, recv, fp, stack, item, lin)

    def fingerprint(self, item: Any, lin: Any) -> int:
        """The fingerprint of this plan's move named ``item`` of a tensor of lineage ``lin``
        with nothing on the stack: a compiled step's replay works it out once (capture.py)."""
        return _folded(self.folds, self.fp, None, item, lin)

    def carry(self, send, recv, fp: int, stack: Any = None, item: Any = None, lin: Any = None):
        """The collective with fingerprint ``fp``, of a ``send`` array it was planned for
        (contiguous, its dtype and shape); ``stack``, ``item``, ``lin``: what names the call
        if the ranks diverge (``__call__``)."""
        c, e, nbytes = self.comm, self.e, self.nbytes
        c._seq += 1
        obs = _observers.fns
        if obs:
            record("check", 16)
        self.mine[...] = send
        head = e.head
        head[0] = fp
        head[1] = nbytes
        key = _WATCH_ENTER(self.kind, c.ranks)  # a rank that never comes: as in the call
        try:
            e.gather(*e.specs)
        finally:
            _WATCH_EXIT(key)
        q, at = e.words, e.at  # two ranks: both headers read as words (MPIComm._exchange)
        sizes = self.sizes
        if at and q[0] == q[at] == fp and q[1] == sizes[0] and q[at + 1] == sizes[1]:
            pair = self.pair
            if pair is not None and recv is None and not obs:  # the common case, one call
                out = pair(self.rows[0], self.rows[1])
                return out if type(out) is _ND else np.asarray(out)  # 0-d: a numpy scalar
            return self._landed(send, recv, True, obs)
        return self._unmatched(send, recv, fp, stack, item, lin, obs)

    def _unmatched(self, send, recv, fp: int, stack: Any, item: Any, lin: Any, obs: Any):
        """The collective's result where the two headers' fast comparison failed: a
        fingerprint differs (RanksDiverged on every rank), or a payload is not host memory,
        or the group is not of two ranks (``carry``, ``replay``)."""
        carried = self.comm._compare(self.e.heads.tolist(), fp)
        if carried is None:
            self._diverged(stack, item, lin)
        return self._landed(send, recv, carried, obs)

    def _landed(self, send, recv, carried: bool, obs: Any):
        """The collective's result after the envelope's gather (``carry``): from every
        rank's payload where ``carried``, else by the data call (another rank's buffers are
        not host memory)."""
        c, rows = self.comm, self.rows
        if obs:
            record(self.kind, self.nbytes)
        if self.kind == "all_reduce":
            pair = self.pair
            if pair is not None and recv is None and carried:
                out = pair(rows[0], rows[1])
                return out if type(out) is _ND else np.asarray(out)  # 0-d: a numpy scalar
            if recv is None:
                recv = np.empty_like(send)
            if not carried:
                c._allreduce(np.ascontiguousarray(send), recv, self.arg)
            elif pair is not None and recv.shape == send.shape:
                pair(rows[0], rows[1], out=recv)
            else:
                _reduce_rows(rows, recv.reshape(send.shape), self.arg, c.size)
            return recv
        if recv is None:
            recv = np.empty(self.full, self.dtype)
        if not carried:
            c._allgather(np.ascontiguousarray(send), recv, self.arg)
            return recv
        out = recv.reshape(-1)
        if self.bounds is None:  # equal parts: one copy
            out.reshape(rows.shape)[...] = rows
        else:  # one call: a loop of slice stores costs twice as much
            np.concatenate(rows, out=out)
        return recv

    def replay(self, fp: int, item: Any, lin: Any, other: Any) -> Any:
        """``carry`` for a compiled step's replay (Note [Compiled steps] in capture.py):
        ``f(send)``, the collective with fingerprint ``fp`` of the move named ``item`` of a
        tensor of lineage ``lin``, everything it reads bound once and its result's making
        chosen once (two ranks); a send array the plan is not for (another shape or dtype)
        takes ``other(send)``. The result is a new array, as ``carry``'s."""
        comm, e, kind, nbytes = self.comm, self.e, self.kind, self.nbytes
        mine, head, (sp0, sp1), q, at = self.mine, e.head, e.specs, e.words, e.at
        ranks, shape, dtype, rows, carry = comm.ranks, self.shape, self.dtype, self.rows, self.carry
        gather, enter, leave, observers = e.gather, _WATCH_ENTER, _WATCH_EXIT, _observers
        s0, s1 = self.sizes
        pair = self.pair if kind == "all_reduce" else None
        if pair is not None and shape == ():  # a 0-d sum: a 0-d view of a new 1-item array
            r0, r1 = rows[0].reshape(1), rows[1].reshape(1)
            made = lambda: pair(r0, r1).reshape(())  # noqa: E731
        elif pair is not None:
            made = functools.partial(pair, rows[0], rows[1])
        elif kind == "all_gather":  # equal parts: one copy; else one call
            made = rows.flatten if self.bounds is None else functools.partial(np.concatenate, rows)
        else:
            made = None
        if not at or made is None:  # not two ranks, or a reduction of no one call
            return lambda send: (
                carry(send, None, fp, None, item, lin)
                if type(send) is _ND and send.shape == shape and send.dtype == dtype
                else other(send)
            )

        def run(send: Any) -> Any:
            if (
                send.shape != shape
                or type(send) is not _ND
                or (send.dtype is not dtype and send.dtype != dtype)
            ):
                return other(send)
            if observers.fns:  # counted: the general call
                return carry(send, None, fp, None, item, lin)
            comm._seq += 1
            mine[...] = send  # any layout
            head[0] = fp
            head[1] = nbytes
            key = enter(kind, ranks)
            try:
                gather(sp0, sp1)
            finally:
                leave(key)
            if q[0] == q[at] == fp and q[1] == s0 and q[at + 1] == s1:
                return made()
            return self._unmatched(send, None, fp, None, item, lin, None)

        return run

    def _diverged(self, stack: Any, item: Any, lin: Any) -> None:
        """The ranks' calls differ: every rank describes its call (a planned move's with its
        item on the stack, as the general path has it) and raises RanksDiverged."""
        if item is None:  # the general path's: the stack has it all
            self.comm._diverged(self.kind, self.key)
            return
        if stack is None:
            stack = _doing.stack = agree.Stack()
        named = stack.lin
        stack.append(item)
        stack.lin = lin
        try:
            self.comm._diverged(self.kind, self.key)
        finally:
            stack.pop()
            stack.lin = named


class MPIComm(Communicator):
    backend = "mpi"

    def __init__(self, comm, ranks: tuple[int, ...]) -> None:
        super().__init__()
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.ranks = ranks
        self._checker = None  # a duplicate of comm for agreement checks, made at the first
        self._envelope: _Envelope | None = None  # check (which every rank of the group makes)

    def _new_group(self, ranks: tuple[int, ...]) -> Communicator:
        MPI = _mpi()
        local = [self.ranks.index(r) for r in ranks]
        group = self.comm.Get_group().Incl(local)
        # MPI_Comm_create_group is collective over the new group's members only, so ranks
        # outside a mesh never have to take part. The tag separates concurrent creations.
        key = WATCH.enter(f"creating the communicator of ranks {list(ranks)}", ranks)
        try:
            sub = self.comm.Create_group(group, tag=hash(ranks) % 32749)
        finally:
            WATCH.exit(key)
        group.Free()
        assert sub != MPI.COMM_NULL
        return MPIComm(sub, ranks)

    # Reductions -------------------------------------------------------------------------------
    def _reduce_view(self, send: np.ndarray, recv: np.ndarray, op: str):
        """Buffers and MPI op for a reduction, with the dtype work-arounds of the module doc."""
        char = send.dtype.char
        if char == "?":
            s = _IN_PLACE() if send is recv else _bytes(send)
            return s, _bytes(recv), _OPS["min" if op == "min" else "max"], None
        if char == "e" or (char in "bBhH" and op in ("sum", "avg")):
            wide = np.empty(recv.shape, np.float32 if char == "e" else np.int32)
            mop = _numpy_op(op, wide.dtype) if op in ("max", "min") else _OPS[op]
            return send.astype(wide.dtype), wide, mop, wide
        mop = _OPS[op]
        if op in ("max", "min") and send.dtype.kind in "fc":
            mop = _numpy_op(op, send.dtype)
        return (_IN_PLACE() if send is recv else send), recv, mop, None

    def _finish(self, recv: np.ndarray, wide, op: str) -> None:
        if wide is not None:
            if op == "avg":
                wide /= self.size
            recv[...] = wide.reshape(recv.shape)
        elif op == "avg":
            recv /= self.size

    @_staged(1)
    def _allreduce(self, send, recv, op):
        _mpi()
        s, r, mop, wide = self._reduce_view(send, recv, op)
        self.comm.Allreduce(s, r, mop)
        self._finish(recv, wide, op)

    @_staged(1)
    def _iallreduce(self, send, recv, op):
        _mpi()
        s, r, mop, wide = self._reduce_view(send, recv, op)
        req = self.comm.Iallreduce(s, r, mop)

        def wait(held=(send, s, r)) -> None:  # the buffers live until the call completes
            req.Wait()
            self._finish(recv, wide, op)

        return Work(wait, req.Test)

    @_staged(1)
    def _reduce_scatter(self, send, recv, counts, op):
        _mpi()
        s, r, mop, wide = self._reduce_view(send, recv, op)
        self.comm.Reduce_scatter(s, r, list(counts), mop)  # bool is 1 byte: counts hold
        self._finish(recv, wide, op)

    @_staged(1)
    def _ireduce_scatter(self, send, recv, counts, op):
        _mpi()
        s, r, mop, wide = self._reduce_view(send, recv, op)
        counts = np.asarray(counts, np.intc)
        req = self.comm.Ireduce_scatter(s, r, counts, mop)

        def wait(held=(send, s, r, counts)) -> None:  # (as _iallreduce's)
            req.Wait()
            self._finish(recv, wide, op)

        return Work(wait, req.Test)

    # Data movement ------------------------------------------------------------------------
    @_staged(1)
    def _allgather(self, send, recv, counts):
        MPI = _mpi()
        if len(set(counts)) == 1:  # the same list on every rank, so every rank takes this branch
            # Allgather is 1.7-3x faster than Allgatherv in MPICH (docs/performance.md).
            self.comm.Allgather(_bytes(send), _bytes(recv))
            return
        b = [c * send.itemsize for c in counts]
        self.comm.Allgatherv(_bytes(send), [_bytes(recv), b, displacements(b), MPI.BYTE])

    @_staged(1)
    def _iallgather(self, send, recv, counts):
        MPI = _mpi()
        if len(set(counts)) == 1:  # as _allgather
            req = self.comm.Iallgather(_bytes(send), _bytes(recv))
            held: tuple = (send, recv)
        else:
            b = np.asarray([c * send.itemsize for c in counts], np.intc)
            d = np.asarray(displacements(b.tolist()), np.intc)
            req = self.comm.Iallgatherv(_bytes(send), [_bytes(recv), b, d, MPI.BYTE])
            held = (send, recv, b, d)  # the counts too: MPI reads them until completion

        def wait(held=held) -> None:  # the buffers live until the call completes
            req.Wait()

        return Work(wait, req.Test)

    @_staged(2)
    def _alltoall(self, send, send_counts, recv, recv_counts):
        MPI = _mpi()
        if send_counts is None and recv_counts is None:  # equal blocks everywhere (caller says)
            self.comm.Alltoall(_bytes(send), _bytes(recv))
            return
        send_counts = send_counts or equal_counts(send, self.size)
        recv_counts = recv_counts or equal_counts(recv, self.size)
        sb = [c * send.itemsize for c in send_counts]
        rb = [c * recv.itemsize for c in recv_counts]
        self.comm.Alltoallv(
            [_bytes(send), sb, displacements(sb), MPI.BYTE],
            [_bytes(recv), rb, displacements(rb), MPI.BYTE],
        )

    @_staged(0, reads_written=True)
    def _broadcast(self, buf, root):
        self.comm.Bcast(_bytes(buf), root)

    @_staged()
    def _isend(self, buf, dest, tag):
        return Work(self.comm.Isend(_bytes(buf), dest, tag).Wait)

    @_staged(0)
    def _irecv(self, buf, source, tag):
        return Work(self.comm.Irecv(_bytes(buf), source, tag).Wait)

    def sendrecv(self, send, dest, recv, source, tag=0):
        """``Communicator.sendrecv`` as one ``Sendrecv`` for host buffers (MPI_PROC_NULL for
        a message not made), registered with the watchdog under the ranks it waits on."""
        if (send is not None and type(send) is not _ND) or (
            recv is not None and type(recv) is not _ND
        ):
            return Communicator.sendrecv(self, send, dest, recv, source, tag)
        MPI = _mpi()
        if send is None:
            dest = MPI.PROC_NULL
        elif _observers.fns:
            record("send", send.nbytes)
        if recv is None:
            source = MPI.PROC_NULL
        # the label names the peers by global rank, made once per pair (a halo's every step)
        peers = tuple(self.ranks[r] if r >= 0 else None for r in (dest, source))
        label = _LABELS.get(("sendrecv", peers))
        if label is None:
            named = [f"{w} rank {r}" for w, r in zip(("to", "from"), peers) if r is not None]
            label = _LABELS.setdefault(("sendrecv", peers), f"sendrecv {', '.join(named)}")
        wkey = _WATCH_ENTER(label, self.ranks)
        try:
            self.comm.Sendrecv(None if send is None else _bytes(send), dest, tag,
                               None if recv is None else _bytes(recv), source, tag)  # fmt: skip
        finally:
            _WATCH_EXIT(wkey)

    def _barrier(self):
        self.comm.Barrier()

    def _allgather_object(self, obj):
        return self.comm.allgather(obj)

    # Agreement (Note [Ranks agree before a collective] in comm/agree.py) -----------------------
    def _checks(self):
        if self._checker is None:
            # its own channel: never matched with data calls. Dup is collective: a rank that
            # never comes must end in the watchdog's timeout like any other call
            key = WATCH.enter("the agreement check's first use (MPI_Comm_dup)", self.ranks)
            try:
                self._checker = self.comm.Dup()
            finally:
                WATCH.exit(key)
        return self._checker

    def _check(self, kind, key, call):
        """``Communicator._check`` with the fingerprints in the envelope, and ``call``'s data
        in it too where every rank's fits (Note [The check rides along] in comm/agree.py)."""
        if agree.DEBUG or self.size == 1:
            return Communicator._check(self, kind, key, call)
        self._seq += 1
        record("check", 16)
        fp = agree.current(kind, key)
        e = self._envelope or self._new_envelope()
        rides = None if call is None else _RIDES.get(kind)
        carried = self._exchange(e, fp, kind, -1 if rides is None else rides[0](self, e, *call))
        if carried is None:
            self._diverged(kind, key)
        return rides[1](self, e, *call) if carried else None

    _agree_before = _check

    def allreduce(self, send, recv, op="sum"):
        """``Communicator.allreduce``, whose small case (host buffers, a payload that fits
        the envelope) is ``_check``'s carried path written out: the Partial -> Replicate of
        a loss or a norm, where the Python around the MPI call is most of the time."""
        if (
            type(send) is not _ND
            or (recv is not None and type(recv) is not _ND)
            or agree.DEBUG
            or self.size == 1
        ):
            return Communicator.allreduce(self, send, recv, op)
        if not agree.CHECK:
            return self._unchecked_sum(send, recv, op)
        e = self._envelope or self._new_envelope()
        plan = e.sums.get((send.shape, send.dtype, op)) or e.reduction(self, send, op)
        if plan is None:  # too big for the envelope
            return Communicator.allreduce(self, send, recv, op)
        return plan(send, recv)

    def _unchecked_sum(self, send, recv, op):
        """``allreduce`` with the check off (DISTTENSOR_CHECK=0): a sum of a dtype MPI adds
        as numpy does (not bool, float16 or 8- and 16-bit integers: ``_reduce_view``) is the
        MPI call alone; anything else takes the general path."""
        if op != "sum" or send.dtype.char in "?ebBhH" or send is recv:
            return Communicator.allreduce(self, send, recv, op)
        if recv is None:
            return self._bare_sum(send)
        if _observers.fns:
            record("all_reduce", send.nbytes)
        if not _MODULE:
            _mpi()
        key = _WATCH_ENTER("all_reduce", self.ranks)
        try:
            self.comm.Allreduce(send, recv, _OPS["sum"])
        finally:
            _WATCH_EXIT(key)
        return recv

    def _bare_sum(self, send: np.ndarray) -> np.ndarray:
        """The MPI sum alone of host array ``send`` (of a dtype MPI adds as numpy does) into
        a new array: a C-order copy reduced in place, one buffer for MPI to read (0.4 us less
        than two in a program's loop); counted and watched."""
        recv = send.copy()
        if _observers.fns:
            record("all_reduce", send.nbytes)
        MPI = _MODULE[0] if _MODULE else _mpi()
        key = _WATCH_ENTER("all_reduce", self.ranks)
        try:
            self.comm.Allreduce(MPI.IN_PLACE, recv, MPI.SUM)
        finally:
            _WATCH_EXIT(key)
        return recv

    def allgather(self, send, recv, counts):
        """``Communicator.allgather``, whose small case (host buffers, every rank's part fits
        the envelope) is ``_check``'s carried path written out, as ``allreduce``'s: the
        vector a matrix-vector product gathers each iteration."""
        if (
            type(send) is not _ND
            or type(recv) is not _ND
            or not agree.CHECK
            or agree.DEBUG
            or self.size == 1
        ):
            return Communicator.allgather(self, send, recv, counts)
        e = self._envelope or self._new_envelope()
        counts = tuple(counts)
        plan = e.gathers.get((send.shape, send.dtype, counts)) or e.gathering(self, send, counts)
        if plan is None:  # a part too big for the envelope
            return Communicator.allgather(self, send, recv, counts)
        plan(send, recv)

    def planned(self, kind: str, send: np.ndarray, arg: Any) -> Planned | bool | None:
        """The plan of this group's all-reduce (``arg``: its op) or all-gather (``arg``:
        every rank's counts) of arrays like ``send`` (contiguous, host), for a planned move
        (Note [Planned moves] in reshard.py); False where the call does not ride in the
        envelope (too big, one rank), None where the group has no envelope yet (the check
        has not run on it)."""
        e = self._envelope
        if self.size == 1:
            return False
        if e is None:
            return None
        plan = (
            e.reduction(self, send, arg) if kind == "all_reduce" else e.gathering(self, send, arg)
        )
        return plan or False

    def unchecked(self, kind: str, dtype: np.dtype, arg: Any) -> Any:
        """The MPI call alone, with no agreement check, for a compiled step's replay whose
        ranks agreed at its first call on this group (Note [Compiled steps] in capture.py):
        ``f(send)`` -> a new array, counted and watched like every call; ``kind``
        "all_reduce" (``arg``: the op; a sum of a dtype MPI adds as numpy does, as
        ``_unchecked_sum``: ``_bare_sum``) or "all_gather" (``arg``: every rank's element
        counts; a vector's parts, concatenated); ``send``: a host array of ``dtype``, copied
        into the new array and reduced or gathered there in place (one buffer for MPI to
        read). None for any other call: the caller takes the general one."""
        if self.size == 1 or dtype.char in "?ebBhH":
            return None
        MPI = _mpi()
        mpi, ranks = self.comm, self.ranks
        if kind == "all_reduce":
            return self._bare_sum if arg == "sum" else None
        counts = tuple(arg)
        full, empty, isz = (sum(counts),), np.empty, dtype.itemsize
        b = [c * isz for c in counts]
        at = displacements(counts)[self.rank]
        mine = slice(at, at + counts[self.rank])  # this rank's part, copied in: in place
        spec = (b, displacements(b), MPI.BYTE)
        in_place = MPI.IN_PLACE

        def gather(send: np.ndarray) -> np.ndarray:
            recv = empty(full, dtype)
            recv[mine] = send.reshape(-1)
            if _observers.fns:
                record("all_gather", send.nbytes)
            key = _WATCH_ENTER("all_gather", ranks)
            try:
                mpi.Allgatherv(in_place, [recv.view(np.uint8), *spec])
            finally:
                _WATCH_EXIT(key)
            return recv

        return gather

    def _check_fp(self, fp, kind, call=None):
        """The bare check in the envelope (a device communicator's, comm/nccl.py)."""
        same = self._exchange(self._envelope or self._new_envelope(), fp, kind, -1)
        return same is not None, None

    def _new_envelope(self) -> _Envelope:
        self._envelope = _Envelope(self._checks(), self.size)
        return self._envelope

    def _exchange(self, e: _Envelope, fp: int, kind: str, size: int) -> bool | None:
        """Send this rank's slot (``fp`` and a payload of ``size`` bytes, already packed; -1:
        none), gather every rank's: None if the fingerprints differ, else whether every
        rank's payload is there."""
        head = e.head
        head[0] = fp
        head[1] = size
        key = _WATCH_ENTER(kind, self.ranks)  # a rank that never comes: as if in the call
        try:
            e.gather(*e.specs)
        finally:
            _WATCH_EXIT(key)
        q, at = e.words, e.at  # two ranks: both headers read as words, no list made
        if at and q[0] == q[at] == fp and q[1] == q[at + 1] == size >= 0:
            return True
        return self._compare(e.heads.tolist(), fp)

    @staticmethod
    def _compare(heads: list, fp: int) -> bool | None:
        """Every rank's (fingerprint, payload size) after the gather: None if a fingerprint
        is not ``fp``, else whether every rank's payload is there."""
        carried = True
        for f, n in heads:
            if f != fp:
                return None
            if n < 0:  # a payload not there: the data call moves them all
                carried = False
        return carried

    def _check_all(self, obj, kind):
        key = WATCH.enter(kind, self.ranks)
        try:
            return self._checks().allgather(obj)
        finally:
            WATCH.exit(key)


# the watchdog's labels of point-to-point calls: (what, "to" or "from", global rank), and
# ("sendrecv", (global rank to, global rank from), None where no message) -> label
_LABELS: dict[tuple, str] = {}


def _watched(name: str, what: str, nonblocking: bool = False, peer: str = "") -> None:
    """Register MPIComm's ``name`` with the watchdog while it blocks (Note [Waiting for a
    rank that is gone]); a non-blocking call is registered while its Work waits. A
    point-to-point call (``peer`` "to" or "from") is reported with the rank it waits on,
    which is the rank that skipped the matching call."""
    call = getattr(MPIComm, name)

    def blocking(self, *args):
        key = WATCH.enter(what, self.ranks)
        try:
            return call(self, *args)
        finally:
            WATCH.exit(key)

    def started(self, *args):
        work = call(self, *args)
        wait, ranks = work._wait, self.ranks
        label = what
        if peer:  # args: buf, peer; the label made once per peer (a halo's sends every step)
            key = (what, peer, ranks[args[1]])
            label = _LABELS.get(key) or _LABELS.setdefault(key, f"{what} {peer} rank {key[2]}")
        if wait is not None:

            def watched_wait() -> None:
                key = WATCH.enter(label, ranks)
                try:
                    wait()
                finally:
                    WATCH.exit(key)

            work._wait = watched_wait
        return work

    setattr(MPIComm, name, started if nonblocking else blocking)


for _name, _what in [
    ("_allreduce", "all_reduce"),
    ("_reduce_scatter", "reduce_scatter"),
    ("_allgather", "all_gather"),
    ("_alltoall", "all_to_all"),
    ("_broadcast", "broadcast"),
    ("_barrier", "barrier"),
    ("_allgather_object", "all_gather_object"),
]:
    _watched(_name, _what)
_watched("_iallreduce", "all_reduce", nonblocking=True)
_watched("_ireduce_scatter", "reduce_scatter", nonblocking=True)
_watched("_iallgather", "all_gather", nonblocking=True)
_watched("_isend", "send", nonblocking=True, peer="to")
_watched("_irecv", "recv", nonblocking=True, peer="from")


def world_comm() -> MPIComm:
    MPI = _mpi()
    w = MPI.COMM_WORLD
    WATCH.start(MPI)
    return MPIComm(w, tuple(range(w.Get_size())))


def _launched_size() -> int:
    """The job size mpiexec announced in the environment (MPICH, Open MPI, MVAPICH), else 1."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def _abort_on_uncaught(exc_type, exc, tb) -> None:
    """sys.excepthook: show the traceback, then end the whole MPI job.

    Without this a rank that dies leaves the others blocked in their next collective and
    mpiexec waits forever; mpi4py's own ``python -m mpi4py`` does the same. A rank that dies
    before using MPI initializes it just to abort: hydra does not end the job when a rank
    exits without having joined it.
    """
    if _previous_hook is sys.__excepthook__:  # the traceback in one write: the launcher
        sys.stderr.write("".join(traceback.format_exception(exc_type, exc, tb)))  # forwards
        sys.stderr.flush()  # it whole even when the abort below races with its forwarding
    else:
        _previous_hook(exc_type, exc, tb)
    MPI = sys.modules.get("mpi4py.MPI")
    initialized = MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized()
    if not initialized and _launched_size() <= 1:
        return
    if not initialized:
        if MPI is not None and MPI.Is_finalized():
            return
        MPI = _mpi()
    if MPI.COMM_WORLD.Get_size() > 1:
        try:
            sys.stderr.write(
                f"disttensor: uncaught {exc_type.__name__} on rank {MPI.COMM_WORLD.Get_rank()}; "
                "aborting the MPI job\n"
            )
            sys.stderr.flush()
            sys.stdout.flush()
            time.sleep(0.2)  # let mpiexec forward this rank's output before the job is killed
        finally:
            MPI.COMM_WORLD.Abort(1)


_previous_hook = sys.excepthook


def install_abort_hook() -> None:
    """Install the hook once; DISTTENSOR_NO_ABORT=1 leaves sys.excepthook alone."""
    global _previous_hook
    if os.environ.get("DISTTENSOR_NO_ABORT") == "1" or sys.excepthook is _abort_on_uncaught:
        return
    _previous_hook = sys.excepthook
    sys.excepthook = _abort_on_uncaught
