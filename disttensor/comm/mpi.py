"""MPI backend over mpi4py's buffer (upper-case) calls: tensor data is never pickled.

Data movement (gather, all-to-all, broadcast, send/recv) sends raw bytes, so every numpy dtype
works. Reductions use MPI's types: bool is reduced as uint8 with MAX/MIN (logical or/and), and
float16, which MPI lacks, is reduced in float32. MAX/MIN of floating and complex numbers use
numpy's maximum/minimum as MPI user ops: MPI's own MAX drops a NaN or keeps it depending on
the order the ranks are combined in (numpy propagates it), and has no complex MAX at all.

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
import sys
import time
import traceback

import numpy as np

from ..backend import DEVICE_ARRAYS, of
from .base import Communicator, Work, displacements, equal_counts
from .watchdog import WATCH

_OPS = {}


def _mpi():
    from mpi4py import MPI  # lazy: importing disttensor must not initialize MPI

    if not _OPS:
        _OPS.update(sum=MPI.SUM, avg=MPI.SUM, max=MPI.MAX, min=MPI.MIN)
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


def _staged(*written: int, reads_written: bool = False):
    """Note [Host staging] for a method whose positional arguments ``written`` are the
    arrays it writes (``reads_written``: it reads them first too, as a broadcast's root)."""

    def deco(method):
        @functools.wraps(method)
        def call(self, *args):
            if not any(type(a) in DEVICE_ARRAYS for a in args):
                return method(self, *args)
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


class MPIComm(Communicator):
    backend = "mpi"

    def __init__(self, comm, ranks: tuple[int, ...]) -> None:
        super().__init__()
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.ranks = ranks
        self._checker = None  # a duplicate of comm for agreement checks, made at the first
        self._fp = np.empty(2, np.int64)  # check (which every rank of the group makes)

    def _new_group(self, ranks: tuple[int, ...]) -> Communicator:
        MPI = _mpi()
        local = [self.ranks.index(r) for r in ranks]
        group = self.comm.Get_group().Incl(local)
        # MPI_Comm_create_group is collective over the new group's members only, so ranks
        # outside a mesh never have to take part. The tag separates concurrent creations.
        sub = self.comm.Create_group(group, tag=hash(ranks) % 32749)
        group.Free()
        assert sub != MPI.COMM_NULL
        return MPIComm(sub, ranks)

    # Reductions -------------------------------------------------------------------------------
    def _reduce_view(self, send: np.ndarray, recv: np.ndarray, op: str):
        """Buffers and MPI op for a reduction, with the dtype work-arounds of the module doc."""
        if send.dtype == np.bool_:
            s = _IN_PLACE() if send is recv else _bytes(send)
            return s, _bytes(recv), _OPS["min" if op == "min" else "max"], None
        if send.dtype == np.float16:
            wide = np.empty(recv.shape, np.float32)
            mop = _numpy_op(op, wide.dtype) if op in ("max", "min") else _OPS[op]
            return send.astype(np.float32), wide, mop, wide
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

        def wait() -> None:
            req.Wait()
            self._finish(recv, wide, op)

        return Work(wait, req.Test)

    @_staged(1)
    def _reduce_scatter(self, send, recv, counts, op):
        _mpi()
        s, r, mop, wide = self._reduce_view(send, recv, op)
        self.comm.Reduce_scatter(s, r, list(counts), mop)  # bool is 1 byte: counts hold
        self._finish(recv, wide, op)

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

    def _barrier(self):
        self.comm.Barrier()

    def _allgather_object(self, obj):
        return self.comm.allgather(obj)

    # Agreement (Note [Ranks agree before a collective] in comm/agree.py) -----------------------
    def _checks(self):
        if self._checker is None:
            self._checker = self.comm.Dup()  # its own channel: never matched with data calls
        return self._checker

    def _check_fp(self, fp, kind):
        buf = self._fp
        buf[0], buf[1] = fp, -fp
        key = WATCH.enter(kind, self.ranks)  # a rank that never comes: as if in the call
        try:
            self._checks().Allreduce(_IN_PLACE(), buf, _OPS["max"])
        finally:
            WATCH.exit(key)
        return int(buf[0]) == -int(buf[1])  # max f == min f: every rank passed the same f

    def _check_all(self, obj, kind):
        key = WATCH.enter(kind, self.ranks)
        try:
            return self._checks().allgather(obj)
        finally:
            WATCH.exit(key)


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
        label = f"{what} {peer} rank {ranks[args[1]]}" if peer else what  # args: buf, peer
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
