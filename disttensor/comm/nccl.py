"""NCCL backend: collectives on device (CuPy) arrays over ``cupy.cuda.nccl``.

``nccl_group(mpi_comm)`` gives the NCCL communicator of the ranks of an MPI-backed group
(collective over them; made once per group and cached), or None where NCCL cannot serve the
group (Note [When NCCL is not used]); the caller then moves device data through host memory
over MPI. The MPI communicator stays underneath for everything that is not tensor data: the
agreement check before each collective (Note [Ranks agree before a collective] in
comm/agree.py), ``allgather_object`` and barriers. Host (numpy) buffers given to this
backend go over MPI as well, so the small metadata collectives of the layers above need no
device copies.

The calling convention is base.py's: contiguous buffers, counts in elements, the caller
allocates. Data movement (gathers, all-to-all, broadcast, send/recv) moves bytes, so every
dtype works; reductions follow Note [NCCL reductions]; streams, Note [NCCL streams].

Note [NCCL streams]
    Every NCCL call is ordered on the device with the program's kernels and with the
    communicator's other calls, never by blocking the host:

    * Collectives and point-to-point messages are issued on the current stream (the compute
      stream): they start after the kernels that wrote their buffers, and the kernels queued
      after them see their results. Like every CuPy kernel, a call returns once it is queued.
    * The non-blocking all-reduce (``iallreduce``: the data-parallel buckets, overlapped with
      backward) runs on a side stream of the communicator. An event recorded on the compute
      stream first makes the side stream wait for the gradients; the reduction and its
      finishing kernels (the average's division, the keys of Note [NaN through NCCL max/min])
      follow on the side stream, then a second event. ``Work.test()`` queries that event;
      ``Work.wait()`` makes the stream current at the wait wait for it. The side stream's
      scratch arrays are allocated while it is current (CuPy's pool returns freed memory to
      the stream that allocated it, so the compute stream cannot reuse it too early) and are
      kept alive by the Work until its wait.
    * One communicator's calls never overlap on the device: a call on another stream than the
      communicator's previous call first makes its stream wait for an event recorded on that
      one. (NCCL needs a communicator's calls in one order on every rank, and what it does
      with one communicator on two streams has changed between versions; this rule relies on
      none of it.) So a blocking collective after a non-blocking one of the same group waits
      for it on the device, while other groups (another mesh dim's) are other communicators
      and overlap freely.

Note [NCCL reductions]
    NCCL reduces int8, uint8, int32, uint32, int64, uint64, float16, float32 and float64 with
    sum, max and min. Everything else is mapped so that every result equals the MPI backend's
    (comm/mpi.py):

    * avg is a sum, then a division by the group size on the device, as in the MPI backend;
      an integer avg raises TypeError before anything moves (numpy cannot divide integers in
      place).
    * bool travels as uint8: sum and max are max (logical or), min is min (logical and).
    * int16 and uint16 (NCCL has no 16-bit integers) are widened to int32 and cast back: sums
      wrap around as numpy's 16-bit sums do; max and min are exact.
    * complex sum and avg are float sums of the (real, imaginary) pairs. Complex max and min
      (numpy's lexicographic order: NCCL has no such op) are staged through host memory over
      MPI, as is any dtype NCCL has no type for.
    * float16 sums travel and add in float16: NCCL rounds every partial sum to float16, as
      numpy rounds ``a + b`` of float16 arrays, where the MPI backend adds in float32 and
      rounds once, so the last bit may differ (sums that are exact in float16 agree).
    * float max and min: Note [NaN through NCCL max/min].

Note [NaN through NCCL max/min]
    NCCL's float max and min are CUDA's fmax/fmin (float16 on sm_80 and later: __hmax and
    __hmin): IEEE maxNum/minNum, which *drop* a NaN and return the other operand, so a NaN on
    one rank vanishes from the result. numpy's maximum/minimum propagate it (the MPI backend
    uses them). So floats are reduced as integer keys that order as the floats do, with NaN at
    the far end: the float's bits read as a signed integer of its width, with the magnitude
    bits flipped for negative numbers (then -inf < ... < -0.0 < +0.0 < ... < +inf in integer
    order), and every NaN the largest integer for max, the smallest for min (both are bit
    patterns of NaNs, which the keys never give otherwise). NCCL's integer max/min of the keys
    is exact; the inverse map gives the floats back, and a NaN key numpy's NaN (positive,
    quiet). The price: two elementwise passes and scratch of the buffer's size, no second
    collective (float16 widens to float32 keys, NCCL having no int16). Zeros of both signs
    come out as max +0.0 and min -0.0; numpy's answer there depends on the operand order.

Note [Uneven counts on NCCL]
    NCCL's all-gather and reduce-scatter take one count for all ranks. With uneven counts
    (the same list on every rank, so every rank takes the same path):

    * padded, where ``size * max(counts) <= PAD_LIMIT * sum(counts)`` (the shards of
      numpy.array_split, which differ by one row at most): the blocks are copied into n equal
      blocks, the native collective runs, the blocks are copied out: at most a quarter more
      bytes on the wire, and n small device copies;
    * otherwise by point to point in one NCCL group, the exact bytes: the all-gather sends
      this rank's block to every other rank and receives each of theirs; the reduce-scatter
      is n reduces, block j to rank j.

    All-to-all is always a group of sends and receives (NCCL has no all-to-all); a rank's own
    block is a device copy.

Note [Point to point on NCCL]
    ``isend`` and ``irecv`` queue their message; the first ``wait()`` of any of them (or the
    communicator's next collective) issues every queued message in one NCCL group on the
    current stream. Inside a group two ranks may send to each other without deadlock, and
    NCCL matches a pair's sends and receives in the order they are issued, where MPI matches
    by tag: so the queued messages are issued in tag order, then in posting order (MPI's
    non-overtaking rule). A message to this rank itself is a device copy. ``wait()`` orders
    the stream, not the host, like a collective.

Note [When NCCL is not used]
    ``nccl_group`` returns None, and the caller stages device data through host memory over
    MPI, where:

    * CuPy or its ``cupy.cuda.nccl`` cannot be imported, or the NCCL library is missing
      (``pip install nvidia-nccl-cu12``, in the ``gpu`` extra), or CuPy sees no device;
    * two ranks of the group use one GPU: NCCL refuses a communicator with one device in two
      ranks. Each rank's (host name, PCI bus id) is all-gathered over MPI to find them.

    The ranks decide together: every rank puts its own findings into one all-gather over
    MPI, so all of them take the same path, also where one rank alone lacks NCCL. Rank 0
    says once per process and path, in the "disttensor" log, which path is in use:
    "disttensor: device arrays: collectives over NCCL 2.23.4" (INFO) or "disttensor: device
    arrays: host staging over MPI: <reason>" (a WARNING, which Python shows on stderr where
    logging is not configured).
"""

from __future__ import annotations

import importlib
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .base import Communicator, Work, displacements, equal_counts

log = logging.getLogger("disttensor")

# Note [Uneven counts on NCCL]: the padded all-gather / reduce-scatter may move this many
# times the bytes of the exact one at most
PAD_LIMIT = 1.25

# numpy dtypes NCCL has a type for, by the name of cupy.cuda.nccl's constant
_NCCL_TYPES = {
    np.dtype(np.int8): "NCCL_INT8",
    np.dtype(np.uint8): "NCCL_UINT8",
    np.dtype(np.int32): "NCCL_INT32",
    np.dtype(np.uint32): "NCCL_UINT32",
    np.dtype(np.int64): "NCCL_INT64",
    np.dtype(np.uint64): "NCCL_UINT64",
    np.dtype(np.float16): "NCCL_FLOAT16",
    np.dtype(np.float32): "NCCL_FLOAT32",
    np.dtype(np.float64): "NCCL_FLOAT64",
}
_NCCL_OPS = {"sum": "NCCL_SUM", "avg": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN"}
_BYTE = np.dtype(np.uint8)


# -- how a reduction travels (Note [NCCL reductions]) -------------------------------------------
@dataclass(frozen=True)
class Plan:
    """How NCCL reduces one (dtype, op): ``how`` is "view" (the buffer itself, viewed as
    ``wire``), "widen" (cast to ``wire`` and back), "keys" (Note [NaN through NCCL max/min])
    or "host" (staged over MPI); ``per_item`` wire elements per element; ``op`` NCCL's op."""

    how: str
    wire: np.dtype | None
    op: str
    per_item: int = 1


def plan(dtype: Any, op: str) -> Plan:
    """The way ``op`` over ``dtype`` goes through NCCL (Note [NCCL reductions]).

    >>> plan(np.bool_, "sum")
    Plan(how='view', wire=dtype('uint8'), op='max', per_item=1)
    >>> plan(np.float16, "max").how, plan(np.float16, "max").wire
    ('keys', dtype('int32'))
    >>> plan(np.complex64, "avg").wire, plan(np.complex64, "avg").per_item
    (dtype('float32'), 2)
    >>> plan(np.complex128, "min").how
    'host'
    """
    dtype = np.dtype(dtype)
    if op == "avg" and dtype.kind in "biu":
        raise TypeError(
            f"avg of {dtype} on NCCL: an average of integers is not an integer (numpy cannot "
            "divide them in place either); reduce a float array"
        )
    if dtype == np.bool_:
        return Plan("view", _BYTE, "min" if op == "min" else "max")
    if dtype.kind in "iu":
        if dtype.itemsize == 2:
            return Plan("widen", np.dtype(np.int32), op)
        return Plan("view", dtype, op) if dtype in _NCCL_TYPES else Plan("host", None, op)
    if dtype.kind == "f" and dtype in _NCCL_TYPES:
        if op in ("max", "min"):
            return Plan("keys", np.dtype(np.int64 if dtype.itemsize == 8 else np.int32), op)
        return Plan("view", dtype, op)
    if dtype.kind == "c" and op in ("sum", "avg") and dtype.itemsize in (8, 16):
        return Plan("view", np.dtype(f"f{dtype.itemsize // 2}"), op, per_item=2)
    return Plan("host", None, op)


def float_keys(xp: Any, x: Any, key: np.dtype, op: str) -> Any:
    """Integer keys of the floats ``x`` that order as they do, NaN last for max and first for
    min (Note [NaN through NCCL max/min]); ``xp`` is numpy or cupy.

    >>> k = float_keys(np, np.array([-np.inf, -1.0, -0.0, 0.0, 2.0, np.inf]), np.int64, "max")
    >>> bool(np.all(np.diff(k) > 0))
    True
    >>> int(float_keys(np, np.array([np.nan]), np.int64, "min")[0]) == np.iinfo(np.int64).min
    True
    """
    key = np.dtype(key)
    info = np.iinfo(key)
    if x.dtype.itemsize != key.itemsize:  # float16: exact in float32
        x = x.astype(np.dtype(f"f{key.itemsize}"))
    bits = x.view(key)
    flipped = xp.where(bits < 0, bits ^ key.type(info.max), bits)
    return xp.where(xp.isnan(x), key.type(info.max if op == "max" else info.min), flipped)


def from_keys(xp: Any, keys: Any, out: Any, op: str) -> None:
    """Write the floats of ``keys`` (``float_keys``'s) into ``out``, a NaN key as numpy's NaN.

    >>> x = np.array([np.nan, -2.5, -0.0, 7.0], np.float16)
    >>> out = np.empty_like(x)
    >>> from_keys(np, float_keys(np, x, np.dtype(np.int32), "min"), out, "min")
    >>> out
    array([ nan, -2.5, -0. ,  7. ], dtype=float16)
    """
    key = keys.dtype
    info = np.iinfo(key)
    nan_key = key.type(info.max if op == "max" else info.min)
    quiet_nan = np.array(np.nan, np.dtype(f"f{key.itemsize}")).view(key)[()]
    bits = xp.where(keys < 0, keys ^ key.type(info.max), keys)
    bits = xp.where(keys == nan_key, quiet_nan, bits)
    values = bits.view(np.dtype(f"f{key.itemsize}"))
    if values.dtype != out.dtype:  # float16, exact in its float32 keys
        values = values.astype(out.dtype)
    out[...] = values.reshape(out.shape)


def _flat(a: Any, dtype: np.dtype | None = None) -> Any:
    """``a`` as a 1-D view, of ``dtype`` when given (a contiguous buffer's bytes or pairs)."""
    flat = a.reshape(-1)
    return flat if dtype is None or flat.dtype == dtype else flat.view(dtype)


# -- the communicator ---------------------------------------------------------------------------
@dataclass
class _Message:
    """A queued send or receive (Note [Point to point on NCCL])."""

    send: bool
    buf: Any  # the 1-D byte view
    peer: int
    tag: int
    seq: int
    work: Work | None = field(default=None, repr=False)


class NCCLComm(Communicator):
    """A group's NCCL communicator (made by ``nccl_group``): device (CuPy) buffers move over
    NCCL, host (numpy) buffers and metadata over ``mpi``, the MPI-backed communicator of the
    same ranks. ``cupy`` is the CuPy module (or a stand-in with its API), ``nccl`` its
    ``cupy.cuda.nccl``, ``comm`` the ``NcclCommunicator``."""

    backend = "nccl"

    def __init__(self, mpi: Communicator, cupy: Any, nccl: Any, comm: Any) -> None:
        super().__init__()
        self.mpi = mpi
        self.rank, self.size, self.ranks = mpi.rank, mpi.size, mpi.ranks
        self.cp = cupy
        self.nccl = nccl
        self.comm = comm
        self._side: Any = None  # the stream of non-blocking all-reduces, made on first use
        self._last: Any = None  # the stream of this communicator's latest NCCL call
        self._queue: list[_Message] = []  # point-to-point messages not yet issued
        self._queued = 0

    # -- groups, agreement and metadata: the MPI communicator's -------------------------------
    def _new_group(self, ranks: tuple[int, ...]) -> Communicator:
        g = nccl_group(self.mpi.group(ranks), self.cp)
        if g is None:  # cannot happen: a subset of ranks with NCCL and GPUs of their own
            raise RuntimeError(f"NCCL could not serve ranks {list(ranks)} of {list(self.ranks)}")
        return g

    def agree(self, kind: str, key: tuple) -> None:
        self.mpi.agree(kind, key)  # on the MPI backend's own channel for checks

    def _check_fp(self, fp: int, kind: str, call: tuple | None = None) -> tuple[bool, Any]:
        return self.mpi._check_fp(fp, kind)  # device data never rides the MPI envelope

    def _check_all(self, obj: Any, kind: str) -> list[Any]:
        return self.mpi._check_all(obj, kind)

    def _barrier(self) -> None:
        self.mpi._barrier()

    def _allgather_object(self, obj: Any) -> list[Any]:
        return self.mpi._allgather_object(obj)

    # -- streams (Note [NCCL streams]) ----------------------------------------------------------
    def _on(self, stream: Any, *covered: Any) -> Any:
        """Make ``stream`` follow this communicator's previous NCCL call when that was on
        another stream (none of ``covered``, which ``stream`` already waits for); returns it."""
        last = self._last
        if last is not None and last.ptr != stream.ptr and all(c.ptr != last.ptr for c in covered):
            event = self.cp.cuda.Event(disable_timing=True)
            event.record(last)
            stream.wait_event(event)
        self._last = stream
        return stream

    def _compute_stream(self) -> Any:
        """The current stream, ordered after the queued messages and earlier calls."""
        self._issue_queue()
        return self._on(self.cp.cuda.get_current_stream())

    def _device(self, *arrays: Any) -> bool:
        """Whether the buffers are device arrays (else host arrays: over MPI); never mixed."""
        on = [isinstance(a, self.cp.ndarray) for a in arrays]
        if any(on) != all(on):
            raise TypeError(
                f"{type(self).__name__}: buffers must all be device (CuPy) arrays or all host "
                f"(numpy) arrays, got {', '.join(type(a).__name__ for a in arrays)}"
            )
        return on[0]

    def _call(self, name: str, *args: Any) -> None:
        """``self.comm.<name>(*args)``, the last argument a stream whose pointer NCCL takes."""
        *rest, stream = args
        getattr(self.comm, name)(*rest, stream.ptr)

    def _type(self, dtype: np.dtype) -> int:
        return getattr(self.nccl, _NCCL_TYPES[np.dtype(dtype)])

    def _op(self, op: str) -> int:
        return getattr(self.nccl, _NCCL_OPS[op])

    # -- reductions -----------------------------------------------------------------------------
    def _allreduce(self, send, recv, op):
        if not self._device(send, recv):
            return self.mpi._allreduce(send, recv, op)
        p = plan(send.dtype, op)
        if p.how == "host":
            return self._staged(send, recv, op)
        self._reduce(send, recv, p, self._compute_stream())
        return None

    def _iallreduce(self, send, recv, op):
        if not self._device(send, recv):
            return self.mpi._iallreduce(send, recv, op)
        p = plan(send.dtype, op)
        if p.how == "host":
            self._staged(send, recv, op)
            return Work()
        cuda = self.cp.cuda
        side = self._side_stream()
        with side:  # scratch allocated on the side stream (Note [NCCL streams])
            scratch = self._reduce(send, recv, p, side)
            done = cuda.Event(disable_timing=True)
            done.record(side)

        def wait() -> None:
            cuda.get_current_stream().wait_event(done)
            scratch.clear()  # freed to the side stream's pool, reused in its order

        return Work(wait, lambda: bool(done.done))

    def _iallgather(self, send, recv, counts):
        """Equal parts: NCCL's all-gather on the side stream, as ``_iallreduce`` (stage 3's
        groups gathered ahead, Note [Groups gathered ahead] in parallel/sharding.py); uneven
        parts: at once, on the compute stream."""
        if not self._device(send, recv):
            return self.mpi._iallgather(send, recv, counts)
        nbytes = [c * send.itemsize for c in counts]
        if len(set(nbytes)) != 1 or nbytes[0] == 0:
            self._allgather(send, recv, counts)
            return Work()
        cuda = self.cp.cuda
        side = self._side_stream()
        sb, rb = _flat(send, _BYTE), _flat(recv, _BYTE)
        self._call("allGather", sb.data.ptr, rb.data.ptr, nbytes[0], self._type(_BYTE), side)
        done = cuda.Event(disable_timing=True)
        done.record(side)

        def wait(held=(send, recv)) -> None:  # the buffers live until the call completes
            cuda.get_current_stream().wait_event(done)

        return Work(wait, lambda: bool(done.done))

    def _side_stream(self) -> Any:
        """The side stream of the non-blocking calls, ordered after the compute stream's
        work so far (which wrote the send buffer) and this communicator's previous call (Note
        [NCCL streams])."""
        cuda = self.cp.cuda
        self._issue_queue()
        compute = cuda.get_current_stream()
        if self._side is None:
            self._side = cuda.Stream(non_blocking=True)
        side = self._side
        ready = cuda.Event(disable_timing=True)
        ready.record(compute)
        side.wait_event(ready)
        self._on(side, compute)
        return side

    def _reduce(self, send: Any, recv: Any, p: Plan, stream: Any) -> list:
        """All-reduce on ``stream`` as ``p`` says; returns the scratch arrays it queued work on
        (kept by a non-blocking caller until the wait)."""
        scratch: list = []
        n = send.size * p.per_item
        if n:
            wsend, wrecv = self._wire(send, recv, p, scratch)
            dtype, nop = self._type(p.wire), self._op(p.op)
            self._call("allReduce", wsend.data.ptr, wrecv.data.ptr, n, dtype, nop, stream)
            self._finish(wrecv, recv, p)
        return scratch

    def _wire(self, send: Any, recv: Any, p: Plan, scratch: list) -> tuple[Any, Any]:
        """The buffers NCCL reads and writes for ``send``/``recv`` under ``p``."""
        if p.how == "view":
            wsend = _flat(send, p.wire)
            return wsend, (wsend if send is recv else _flat(recv, p.wire))
        if p.how == "widen":
            wsend = _flat(send).astype(p.wire)
        else:  # keys
            wsend = float_keys(self.cp, _flat(send), p.wire, p.op)
        wrecv = self.cp.empty(recv.size, p.wire)
        scratch += [wsend, wrecv]
        return wsend, wrecv

    def _finish(self, wrecv: Any, recv: Any, p: Plan) -> None:
        """Write the wire result into ``recv`` (widened or keyed) and divide for avg."""
        if p.how == "widen":
            recv[...] = wrecv.astype(recv.dtype).reshape(recv.shape)
        elif p.how == "keys":
            from_keys(self.cp, wrecv, recv, p.op)
        if p.op == "avg":
            recv /= self.size

    def _staged(self, send: Any, recv: Any, op: str, counts: Sequence[int] | None = None) -> None:
        """A reduction NCCL cannot do, through host memory over MPI (Note [NCCL reductions])."""
        host = self.cp.asnumpy(send)  # waits for the stream's kernels that wrote it
        out = np.empty(recv.shape, recv.dtype)
        if counts is None:
            self.mpi._allreduce(host, out, op)
        else:
            self.mpi._reduce_scatter(host, out, counts, op)
        recv.set(out)

    def _reduce_scatter(self, send, recv, counts, op):
        if not self._device(send, recv):
            return self.mpi._reduce_scatter(send, recv, counts, op)
        p = plan(send.dtype, op)
        if p.how == "host":
            return self._staged(send, recv, op, counts)
        stream = self._compute_stream()
        scratch: list = []
        if sum(counts) == 0:
            return None
        wsend, wrecv = self._wire(send, recv, p, scratch)
        wcounts = [c * p.per_item for c in counts]
        dtype, nop = self._type(p.wire), self._op(p.op)
        top = max(wcounts)
        if len(set(wcounts)) == 1:
            self._call("reduceScatter", wsend.data.ptr, wrecv.data.ptr, top, dtype, nop, stream)
        elif self.size * top <= PAD_LIMIT * sum(wcounts):  # Note [Uneven counts on NCCL]
            padded = self.cp.empty(self.size * top, p.wire)
            for j, (d, c) in enumerate(zip(displacements(wcounts), wcounts)):
                padded[j * top : j * top + c] = wsend[d : d + c]
            block = self.cp.empty(top, p.wire)
            self._call("reduceScatter", padded.data.ptr, block.data.ptr, top, dtype, nop, stream)
            wrecv[...] = block[: wcounts[self.rank]]
        else:
            spare = self.cp.empty(top, p.wire)  # non-roots' receive buffer, never read
            item = p.wire.itemsize
            self.nccl.groupStart()
            try:
                for j, (d, c) in enumerate(zip(displacements(wcounts), wcounts)):
                    if c:
                        into = wrecv if j == self.rank else spare
                        base = wsend.data.ptr + d * item
                        self._call("reduce", base, into.data.ptr, c, dtype, nop, j, stream)
            finally:
                self.nccl.groupEnd()
        self._finish(wrecv, recv, p)
        return None

    # -- data movement --------------------------------------------------------------------------
    def _allgather(self, send, recv, counts):
        if not self._device(send, recv):
            return self.mpi._allgather(send, recv, counts)
        stream = self._compute_stream()
        item = send.itemsize
        sb, rb = _flat(send, _BYTE), _flat(recv, _BYTE)
        nbytes = [c * item for c in counts]
        top = max(nbytes)
        if top == 0:
            return None
        u8 = self._type(_BYTE)
        if len(set(nbytes)) == 1:
            self._call("allGather", sb.data.ptr, rb.data.ptr, top, u8, stream)
        elif self.size * top <= PAD_LIMIT * sum(nbytes):  # Note [Uneven counts on NCCL]
            mine = self.cp.empty(top, _BYTE)
            mine[: sb.size] = sb
            padded = self.cp.empty(self.size * top, _BYTE)
            self._call("allGather", mine.data.ptr, padded.data.ptr, top, u8, stream)
            for j, (d, c) in enumerate(zip(displacements(nbytes), nbytes)):
                rb[d : d + c] = padded[j * top : j * top + c]
        else:
            d = displacements(nbytes)
            self._exchange([(j, sb, rb[d[j] : d[j] + nbytes[j]]) for j in range(self.size)], stream)
        return None

    def _alltoall(self, send, send_counts, recv, recv_counts):
        if not self._device(send, recv):
            return self.mpi._alltoall(send, send_counts, recv, recv_counts)
        stream = self._compute_stream()
        sc = [c * send.itemsize for c in send_counts or equal_counts(send, self.size)]
        rc = [c * recv.itemsize for c in recv_counts or equal_counts(recv, self.size)]
        sb, rb = _flat(send, _BYTE), _flat(recv, _BYTE)
        sd, rd = displacements(sc), displacements(rc)
        pairs = [
            (j, sb[sd[j] : sd[j] + sc[j]], rb[rd[j] : rd[j] + rc[j]]) for j in range(self.size)
        ]
        self._exchange(pairs, stream)
        return None

    def _exchange(self, pairs: list[tuple[int, Any, Any]], stream: Any) -> None:
        """Per peer j, send bytes ``out`` to j and receive bytes ``into`` from j, in one NCCL
        group on ``stream``; this rank's own pair is a device copy; empty ones are skipped
        (the peer skips its side: the counts of a pair agree)."""
        u8 = self._type(_BYTE)
        for j, out, into in pairs:
            if j == self.rank and into.size:
                into[...] = out
        if not any(j != self.rank and (out.size or into.size) for j, out, into in pairs):
            return
        self.nccl.groupStart()
        try:
            for j, out, into in pairs:
                if j == self.rank:
                    continue
                if out.size:
                    self._call("send", out.data.ptr, out.size, u8, j, stream)
                if into.size:
                    self._call("recv", into.data.ptr, into.size, u8, j, stream)
        finally:
            self.nccl.groupEnd()

    def _broadcast(self, buf, root):
        if not self._device(buf):
            return self.mpi._broadcast(buf, root)
        stream = self._compute_stream()
        b = _flat(buf, _BYTE)
        if b.size:
            ptr = b.data.ptr
            self._call("broadcast", ptr, ptr, b.size, self._type(_BYTE), root, stream)
        return None

    # -- point to point (Note [Point to point on NCCL]) ------------------------------------------
    def _isend(self, buf, dest, tag):
        if not self._device(buf):
            return self.mpi._isend(buf, dest, tag)
        return self._enqueue(True, buf, dest, tag)

    def _irecv(self, buf, source, tag):
        if not self._device(buf):
            return self.mpi._irecv(buf, source, tag)
        return self._enqueue(False, buf, source, tag)

    def _enqueue(self, send: bool, buf: Any, peer: int, tag: int) -> Work:
        self._queued += 1
        m = _Message(send, _flat(buf, _BYTE), peer, tag, self._queued)
        self._queue.append(m)
        m.work = Work(self._issue_queue)
        return m.work

    def _issue_queue(self) -> None:
        """Issue every queued message in one NCCL group on the current stream, each peer's in
        (tag, posting) order; mark their Works done."""
        if not self._queue:
            return
        queue, self._queue = sorted(self._queue, key=lambda m: (m.tag, m.seq)), []
        stream = self._on(self.cp.cuda.get_current_stream())
        mine = [m for m in queue if m.peer == self.rank]
        sends = [m for m in mine if m.send]
        for r in (m for m in mine if not m.send):  # to self: copies, matched in the same order
            match = next((s for s in sends if s.tag == r.tag), None)
            if match is None:
                raise RuntimeError(
                    f"recv from this rank itself (rank {self.ranks[self.rank]}, tag {r.tag}) "
                    "with no matching send queued"
                )
            sends.remove(match)
            r.buf[...] = match.buf
        u8 = self._type(_BYTE)
        self.nccl.groupStart()
        try:
            for m in queue:
                if m.peer != self.rank and m.buf.size:
                    name = "send" if m.send else "recv"
                    self._call(name, m.buf.data.ptr, m.buf.size, u8, m.peer, stream)
        finally:
            self.nccl.groupEnd()
        for m in queue:
            m.work._wait = None  # issued: a later wait() has nothing left to do


# -- the factory (Note [When NCCL is not used]) --------------------------------------------------
# each MPI-backed communicator's answer, for the life of the process (as MPI's groups are
# cached for it): a weak key would not help, its NCCLComm holds the communicator
_decided: dict[Communicator, NCCLComm | None] = {}
_said: set[str] = set()  # the messages rank 0 has logged
_UNDECIDED: Any = object()


def nccl_group(mpi_comm: Communicator, cupy: Any = None) -> NCCLComm | None:
    """The NCCL communicator of ``mpi_comm``'s ranks, or None where NCCL cannot serve them
    (Note [When NCCL is not used]); made once per communicator and cached, None included.
    Collective over ``mpi_comm`` on its first call. ``cupy`` defaults to the real module (a
    stand-in with its API may be given)."""
    g = _decided.get(mpi_comm, _UNDECIDED)  # one lookup: the seam asks at every group()
    if g is not _UNDECIDED:
        return g
    cp, nccl, why = _load(cupy)
    where = None
    if why is None:
        try:
            where = (socket.gethostname(), str(cp.cuda.Device().pci_bus_id))
        except Exception as e:  # CUDA without a device, or a driver too old for the runtime
            why = f"CuPy sees no GPU ({type(e).__name__}: {e})"
    found = mpi_comm._allgather_object((why, where))
    reason = _refusal(found, mpi_comm.ranks)
    if reason is not None:
        _say(mpi_comm, logging.WARNING, f"host staging over MPI: {reason}")
        _decided[mpi_comm] = None
        return None
    uid = nccl.get_unique_id() if mpi_comm.rank == 0 else None
    uid = mpi_comm._allgather_object(uid)[0]  # made by the group's first rank, for all
    comm = nccl.NcclCommunicator(mpi_comm.size, uid, mpi_comm.rank)
    _say(mpi_comm, logging.INFO, f"collectives over NCCL {_version(nccl)}")
    g = _decided[mpi_comm] = NCCLComm(mpi_comm, cp, nccl, comm)
    return g


def _load(cupy: Any) -> tuple[Any, Any, str | None]:
    """(cupy, cupy.cuda.nccl, None), or a reason why NCCL cannot be used."""
    if cupy is None:
        try:
            import cupy
        except Exception as e:  # ImportError, or CUDA libraries that fail to load
            return None, None, f"CuPy cannot be imported ({type(e).__name__}: {e})"
    try:
        nccl = getattr(cupy.cuda, "nccl", None)  # loaded already (or a stand-in's)
        if nccl is None:
            nccl = importlib.import_module("cupy.cuda.nccl")
    except ImportError as e:
        return cupy, None, f"CuPy has no cupy.cuda.nccl ({e})"
    if not getattr(nccl, "available", True):  # CuPy could not load libnccl
        why = "the NCCL library is missing (pip install nvidia-nccl-cu12: disttensor[gpu])"
        return cupy, None, why
    try:
        nccl.get_version()
    except Exception as e:
        return cupy, None, f"the NCCL library does not load ({type(e).__name__}: {e})"
    return cupy, nccl, None


def _refusal(found: list[tuple[str | None, tuple[str, str] | None]], ranks) -> str | None:
    """Why the group cannot use NCCL, from every rank's (reason, (host, bus id)), or None."""
    for r, (why, _) in zip(ranks, found):
        if why is not None:
            return f"rank {r}: {why}"
    seen: dict[tuple[str, str], int] = {}
    for r, (_, where) in zip(ranks, found):
        if where in seen:
            host, bus = where
            return (
                f"ranks {seen[where]} and {r} share the GPU {bus} on {host} (NCCL needs a GPU "
                "of its own for every rank of a group)"
            )
        seen[where] = r
    return None


def _version(nccl: Any) -> str:
    """``2.23.4`` from NCCL's version code: major * 10000 + minor * 100 + patch since 2.9,
    major * 1000 + minor * 100 + patch before.

    >>> from types import SimpleNamespace
    >>> _version(SimpleNamespace(get_version=lambda: 22304)), _version(SimpleNamespace(
    ...     get_version=lambda: 2708))
    ('2.23.4', '2.7.8')
    """
    v = int(nccl.get_version())
    if v >= 10000:
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return f"{v // 1000}.{v // 100 % 10}.{v % 100}"


def _say(mpi_comm: Communicator, level: int, text: str) -> None:
    """Log ``text`` once per process, on global rank 0 (Note [When NCCL is not used])."""
    if mpi_comm.ranks[mpi_comm.rank] != 0 or text in _said:
        return
    _said.add(text)
    log.log(level, "disttensor: device arrays: %s", text)


__all__ = ["PAD_LIMIT", "NCCLComm", "Plan", "float_keys", "from_keys", "nccl_group", "plan"]
