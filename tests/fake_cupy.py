"""A stand-in for CuPy and ``cupy.cuda.nccl`` on simulated ranks, to test the NCCL backend
(disttensor/comm/nccl.py) where there is no GPU.

Each simulated rank (a thread of ``dt.simulate``) has a device of its own: streams, events,
memory and a PCI bus id, made on its first use. Arrays are numpy arrays on the host (a
subclass with CuPy's ``.data.ptr``, ``.get()`` and ``.set()``); kernels run at once, on the
calling thread. What a GPU would do later, in stream order, the stand-in checks instead:

* **Stream order.** Every kernel (a ufunc, an assignment, ``astype``, ``where``, a copy) and
  every NCCL call touches memory on the current stream, or the stream it was given. Each
  stream counts its operations and knows how far it has seen every other stream (an event
  recorded on stream A and waited for by stream B tells B all of A up to the record). A touch
  of memory that another stream wrote (or, for a write, read) and that this stream has not
  waited for is a race on a GPU: ``HazardError``. So a missing event or wait fails here as
  wrong data (sometimes) would on a device.
* **NCCL.** Calls take raw device pointers, counts, NCCL datatypes and ops, and a stream
  pointer, as ``cupy.cuda.nccl`` does; a pointer outside any live array of the rank's device
  is an error (a host array, a wrong offset). Collectives meet the other ranks of the
  communicator (a rendezvous of threads) and compute what NCCL computes, with NCCL's own
  semantics where they differ from numpy's: float max/min are fmax/fmin (a NaN is dropped),
  float16 sums round every partial sum. Calls of one group (``groupStart``/``groupEnd``) run
  at ``groupEnd``; sends and receives match per pair of ranks in the order issued, and a
  count or datatype that differs between the two sides is an error. Ranks that make
  different calls get an error naming them. A communicator whose ranks share a device is
  refused, as NCCL refuses it.
* **Logs.** Each device keeps ``trace``: stream-level actions in order (``("record", event,
  stream)``, ``("wait", stream, event)``, ``("query", event)``, ``("nccl", call, stream)``),
  and ``calls``: every NCCL call as ``(name, stream, count, dtype, op, root or peer)``.

``FakeCupy(missing=...)`` makes the module without ``cupy.cuda.nccl`` ("module") or with it
but without the library ("library"), as CuPy is where NCCL is absent.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import queue
import threading
import weakref
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from disttensor import comm

_TYPES = [
    ("NCCL_INT8", np.int8),
    ("NCCL_UINT8", np.uint8),
    ("NCCL_INT32", np.int32),
    ("NCCL_UINT32", np.uint32),
    ("NCCL_INT64", np.int64),
    ("NCCL_UINT64", np.uint64),
    ("NCCL_FLOAT16", np.float16),
    ("NCCL_FLOAT32", np.float32),
    ("NCCL_FLOAT64", np.float64),
]
_OPS = ["NCCL_SUM", "NCCL_PROD", "NCCL_MAX", "NCCL_MIN", "NCCL_AVG"]
TIMEOUT = 20.0  # seconds a rank waits for the others in a collective or a receive
GARBAGE = 0xA5  # the bytes of cupy.empty's memory: a result never written shows


class HazardError(AssertionError):
    """Memory touched on one stream while another stream's unawaited operation touches it."""


class FakeNcclError(RuntimeError):
    """What NCCL would refuse, hang on, or corrupt memory with."""


# -- memory and streams ------------------------------------------------------------------------
@dataclass
class _Touch:
    lo: int
    hi: int
    stream: FakeStream
    seq: int
    write: bool
    what: str


@dataclass
class _Alloc:
    lo: int
    hi: int
    touches: list[_Touch] = field(default_factory=list)


def _owner(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


_byte_bounds = getattr(np.lib, "array_utils", np).byte_bounds  # numpy 2, numpy 1


def _bounds(a: np.ndarray) -> tuple[int, int]:
    """The memory ``a`` spans: [first byte, one past the last)."""
    lo, hi = _byte_bounds(a)
    return lo, hi


class FakeStream:
    """A stream: counts its operations and knows how far it has seen each other stream."""

    def __init__(self, device: FakeDevice, name: str, ptr: int) -> None:
        self.device, self.name, self.ptr = device, name, ptr
        self.seq = 0
        self.seen: dict[int, int] = {}  # id(stream) -> that stream's seq this one waited for

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    def knows(self, other: FakeStream, seq: int) -> bool:
        return other is self or self.seen.get(id(other), 0) >= seq

    def wait_event(self, event: FakeEvent) -> None:
        if event.stream is None:
            return  # CUDA: waiting for an event never recorded returns at once
        for k, v in event.seen.items():
            self.seen[k] = max(self.seen.get(k, 0), v)
        self.device.trace.append(("wait", self.name, event.name))

    def record(self, event: FakeEvent | None = None) -> FakeEvent:
        event = event or FakeEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.device.trace.append(("synchronize", self.name))

    @property
    def done(self) -> bool:
        return not self.device.busy

    def __enter__(self) -> FakeStream:
        self.device.stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.device.stack.pop()

    def __repr__(self) -> str:
        return f"<FakeStream {self.name}>"


_event_names = itertools.count(1)


class FakeEvent:
    """A CUDA event: what its stream had done when it was recorded."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess=False):
        self.name = f"event{next(_event_names)}"
        self.stream: FakeStream | None = None
        self.seen: dict[int, int] = {}

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream or _device().current
        self.stream = stream
        self.seen = dict(stream.seen)
        self.seen[id(stream)] = stream.seq
        stream.device.trace.append(("record", self.name, stream.name))

    @property
    def done(self) -> bool:
        dev = _device()
        dev.trace.append(("query", self.name))
        return not dev.busy

    def synchronize(self) -> None:
        _device().trace.append(("synchronize", self.name))


class FakeDevice:
    """One simulated rank's GPU: its streams (the null stream first), memory and logs."""

    def __init__(self, rank: int, bus: str) -> None:
        self.id = 0
        self.rank = rank
        self.pci_bus_id = bus
        self.null = FakeStream(self, "null", 0)
        self.streams: dict[int, FakeStream] = {0: self.null}
        self.stack: list[FakeStream] = []
        self.allocs: dict[int, _Alloc] = {}
        self.trace: list[tuple] = []
        self.calls: list[tuple] = []
        self.busy = False  # events and streams report "not done" while set
        self.group: list | None = None  # NCCL calls between groupStart and groupEnd
        self.group_depth = 0

    @property
    def current(self) -> FakeStream:
        return self.stack[-1] if self.stack else self.null

    def new_stream(self) -> FakeStream:
        ptr = 0x1000 + len(self.streams)
        s = self.streams[ptr] = FakeStream(self, f"stream{len(self.streams)}", ptr)
        return s

    def synchronize(self) -> None:
        self.trace.append(("synchronize", "device"))

    # memory ----------------------------------------------------------------------------------
    def _alloc(self, owner: np.ndarray) -> _Alloc:
        a = self.allocs.get(id(owner))
        if a is None:
            lo, hi = _bounds(owner)
            a = self.allocs[id(owner)] = _Alloc(lo, hi)
            weakref.finalize(owner, self.allocs.pop, id(owner), None)
        return a

    def register(self, a: np.ndarray) -> None:
        self._alloc(_owner(a))

    def touch(self, a: np.ndarray, write: bool, what: str, stream: FakeStream | None = None):
        """``a`` (a view of device memory) read or written by an operation on ``stream``."""
        lo, hi = _bounds(a)
        self._touch(self._alloc(_owner(a)), lo, hi, write, what, stream or self.current)

    def touch_ptr(self, ptr: int, nbytes: int, write: bool, what: str, stream: FakeStream):
        """Raw device memory [ptr, ptr + nbytes) touched by an NCCL call on ``stream``."""
        if nbytes == 0:
            return
        for alloc in list(self.allocs.values()):
            if alloc.lo <= ptr and ptr + nbytes <= alloc.hi:
                self._touch(alloc, ptr, ptr + nbytes, write, what, stream)
                return
        raise FakeNcclError(
            f"{what}: [{ptr:#x}, +{nbytes}) is not inside a live device array of rank "
            f"{self.rank} (a host array, or a wrong offset or count)"
        )

    def _touch(self, alloc: _Alloc, lo: int, hi: int, write: bool, what: str, s: FakeStream):
        for t in alloc.touches:
            if t.lo < hi and lo < t.hi and (write or t.write) and not s.knows(t.stream, t.seq):
                raise HazardError(
                    f"rank {self.rank}: {what} on {s.name} {'writes' if write else 'reads'} "
                    f"memory that {t.what} on {t.stream.name} "
                    f"{'wrote' if t.write else 'read'}, and {s.name} never waited for it "
                    "(a race on a GPU: an event recorded there and waited for here is missing)"
                )
        seq = s.tick()
        # an older touch of the same stream within this range tells nothing more
        alloc.touches = [
            t
            for t in alloc.touches
            if not (t.stream is s and lo <= t.lo and t.hi <= hi and (write or not t.write))
        ]
        alloc.touches.append(_Touch(lo, hi, s, seq, write, what))


_local = threading.local()
_the: list[FakeCupy] = []  # the stand-in in use (devices are per thread)


def _device() -> FakeDevice:
    dev = getattr(_local, "device", None)
    if dev is None:
        fake = _the[-1]
        rank = comm.get_rank()
        dev = _local.device = FakeDevice(rank, fake.bus_of(rank))
        fake.devices[rank] = dev
    return dev


# -- arrays ------------------------------------------------------------------------------------
def _plain(x: Any) -> Any:
    return x.view(np.ndarray) if isinstance(x, FakeArray) else x


class FakeArray(np.ndarray):
    """Device memory: numpy underneath; every kernel on it is checked for stream order."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        dev = _device()
        what = f"{ufunc.__name__}.{method}" if method != "__call__" else ufunc.__name__
        for x in inputs:
            if isinstance(x, np.ndarray) and not isinstance(x, FakeArray) and x.ndim:
                raise TypeError(f"{what}: a host array mixed with device arrays")
            if isinstance(x, FakeArray):
                dev.touch(x, False, what)
        if out is not None:
            for o in out:
                dev.touch(o, True, what)
            kwargs["out"] = tuple(_plain(o) for o in out)
        result = getattr(ufunc, method)(*(_plain(x) for x in inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(result, what)

    def __array_function__(self, func, types, args, kwargs):
        if func in (np.array_repr, np.array_str):
            return func(*(_plain(a) for a in args), **kwargs)
        raise TypeError(
            f"numpy.{func.__name__} on a device array: CuPy's functions (the cupy module) must "
            "be used on device arrays"
        )

    def __setitem__(self, key: Any, value: Any) -> None:
        dev = _device()
        if isinstance(value, np.ndarray) and not isinstance(value, FakeArray):
            raise TypeError("assigning a host array into a device array: use .set() or asarray")
        if isinstance(value, FakeArray):
            dev.touch(value, False, "copy")
        target = self.view(np.ndarray)[key]
        dev.touch(target if isinstance(target, np.ndarray) else self, True, "copy")
        np.ndarray.__setitem__(self.view(np.ndarray), key, _plain(value))

    def astype(self, dtype: Any, *args: Any, **kwargs: Any) -> FakeArray:
        _device().touch(self, False, "astype")
        return _wrap(self.view(np.ndarray).astype(dtype, *args, **kwargs), "astype")

    def copy(self, order: str = "C") -> FakeArray:
        _device().touch(self, False, "copy")
        return _wrap(self.view(np.ndarray).copy(order), "copy")

    @property
    def data(self) -> SimpleNamespace:  # CuPy's MemoryPointer, as far as the backend looks
        _device().register(self)
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def get(self, stream: Any = None) -> np.ndarray:
        """A host copy, after the current stream's work (CuPy's device-to-host copy)."""
        _device().touch(self, False, "get")
        return np.array(self.view(np.ndarray))

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Copy host ``arr`` in (CuPy's host-to-device copy, on the current stream)."""
        if arr.shape != self.shape:
            raise ValueError(f"set: shape {arr.shape} into {self.shape}")
        _device().touch(self, True, "set")
        np.copyto(self.view(np.ndarray), np.asarray(arr, self.dtype))


def _wrap(result: Any, what: str) -> Any:
    """A kernel's new device array(s), written on the current stream."""
    if isinstance(result, tuple):
        return tuple(_wrap(r, what) for r in result)
    if not isinstance(result, np.ndarray):
        return result
    out = result.view(FakeArray)
    _device().touch(out, True, what)
    return out


def _empty(shape: Any, dtype: Any = float) -> FakeArray:
    a = np.empty(shape, dtype)
    a.reshape(-1).view(np.uint8).fill(GARBAGE)
    out = a.view(FakeArray)
    _device().register(out)
    return out


def _where(cond: Any, x: Any, y: Any) -> FakeArray:
    dev = _device()
    for a in (cond, x, y):
        if isinstance(a, FakeArray):
            dev.touch(a, False, "where")
    return _wrap(np.where(_plain(cond), _plain(x), _plain(y)), "where")


def _asarray(a: Any, dtype: Any = None) -> FakeArray:
    if isinstance(a, FakeArray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return _wrap(np.array(a, dtype), "asarray")  # a host-to-device copy: new memory


# -- NCCL ---------------------------------------------------------------------------------------
class _Clique:
    """The ranks of one NCCL communicator: where their collectives meet and their messages
    wait."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.members: dict[int, FakeDevice] = {}
        self.slots: list[Any] = [None] * size
        self.barrier = threading.Barrier(size)
        self.boxes: dict[tuple[int, int], queue.Queue] = {}
        self.lock = threading.Lock()

    def box(self, src: int, dst: int) -> queue.Queue:
        with self.lock:
            return self.boxes.setdefault((src, dst), queue.Queue())

    def meet(self, rank: int, item: Any) -> list[Any]:
        self.slots[rank] = item
        self._wait()
        posted = list(self.slots)
        self._wait()  # nobody reuses the slots before everyone has read them
        return posted

    def _wait(self) -> None:
        try:
            self.barrier.wait(TIMEOUT)
        except threading.BrokenBarrierError:
            raise FakeNcclError("an NCCL collective waited for a rank that never came") from None


class FakeNcclComm:
    """``cupy.cuda.nccl.NcclCommunicator`` of one rank: pointers in, NCCL's results out."""

    def __init__(self, nccl: FakeNccl, ndev: int, uid: bytes, rank: int) -> None:
        if not isinstance(uid, bytes) or len(uid) != 128:
            raise TypeError("NcclCommunicator: commId must be the 128 bytes of get_unique_id()")
        if not 0 <= rank < ndev:
            raise FakeNcclError(f"NcclCommunicator: rank {rank} of {ndev}")
        self.nccl, self.rank, self.ndev = nccl, rank, ndev
        self.dev = _device()
        with nccl.lock:
            clique = nccl.cliques.setdefault(uid, _Clique(ndev))
            if clique.size != ndev or rank in clique.members:
                raise FakeNcclError(f"NcclCommunicator: ranks disagree on the clique ({rank})")
            for other, dev in clique.members.items():
                if dev.pci_bus_id == self.dev.pci_bus_id:
                    raise FakeNcclError(
                        f"Duplicate GPU detected: rank {rank} and rank {other} both on "
                        f"{dev.pci_bus_id} (NCCL refuses this)"
                    )
            clique.members[rank] = self.dev
            nccl.created.append((uid, rank, ndev))
        self.clique = clique

    # the API -----------------------------------------------------------------------------------
    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        self._call(
            "allReduce",
            stream,
            count,
            datatype,
            op,
            None,
            [(sendbuf, count)],
            [(recvbuf, count)],
            lambda xs, r: [self.nccl.reduce(xs, op)],
        )

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        n = recvcount

        def compute(xs, r):
            return [self.nccl.reduce(xs, op)[r * n : (r + 1) * n]]

        self._call(
            "reduceScatter",
            stream,
            n,
            datatype,
            op,
            None,
            [(sendbuf, n * self.ndev)],
            [(recvbuf, n)],
            compute,
        )

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        self._call(
            "allGather",
            stream,
            count,
            datatype,
            None,
            None,
            [(sendbuf, count)],
            [(recvbuf, count * self.ndev)],
            lambda xs, r: [np.concatenate(xs)],
        )

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        ins = [(sendbuff, count)] if self.rank == root else []
        self._call(
            "broadcast",
            stream,
            count,
            datatype,
            None,
            root,
            ins,
            [(recvbuff, count)],
            lambda xs, r: [xs[root]],
        )

    def bcast(self, buff, count, datatype, root, stream):
        self.broadcast(buff, buff, count, datatype, root, stream)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        outs = [(recvbuf, count)] if self.rank == root else []
        self._call(
            "reduce",
            stream,
            count,
            datatype,
            op,
            root,
            [(sendbuf, count)],
            outs,
            lambda xs, r: [self.nccl.reduce(xs, op)] if r == root else [],
        )

    def send(self, sendbuf, count, datatype, peer, stream):
        self._p2p("send", sendbuf, count, datatype, peer, stream)

    def recv(self, recvbuf, count, datatype, peer, stream):
        self._p2p("recv", recvbuf, count, datatype, peer, stream)

    def device_id(self) -> int:
        return self.dev.id

    def rank_id(self) -> int:
        return self.rank

    def size(self) -> int:
        return self.ndev

    def destroy(self) -> None:
        self.clique = None

    def abort(self) -> None:
        self.clique = None

    def check_async_error(self) -> None:
        return None

    # the work ----------------------------------------------------------------------------------
    def _stream(self, ptr: int) -> FakeStream:
        s = self.dev.streams.get(ptr)
        if s is None:
            raise FakeNcclError(f"stream pointer {ptr:#x} is not a stream of rank {self.rank}")
        return s

    def _call(self, name, stream_ptr, count, datatype, op, root, ins, outs, compute):
        """A collective: log it, then run it now or at groupEnd."""
        stream = self._stream(stream_ptr)
        dtype = self.nccl.dtype(datatype)
        op_name = None if op is None else _OPS[op]
        self.dev.calls.append((name, stream.name, count, dtype.name, op_name, root))
        self.dev.trace.append(("nccl", name, stream.name))
        signature = (name, count, dtype.name, op_name, root)

        def run() -> None:
            self._collective(name, stream, signature, dtype, ins, outs, compute)

        if self.dev.group is not None:
            self.dev.group.append(("collective", run))
        else:
            run()

    def _collective(self, name, stream, signature, dtype, ins, outs, compute):
        data = [self._read(p, n, dtype, name, stream) for p, n in ins]
        posted = self.clique.meet(self.rank, (signature, data[0] if data else None))
        calls = [p[0] for p in posted]
        if any(c != calls[0] for c in calls):
            raise FakeNcclError(
                "ranks made different NCCL calls at the same point: "
                + ", ".join(f"rank {r}: {c}" for r, c in enumerate(calls))
            )
        results = compute([p[1] for p in posted], self.rank)
        for (p, n), value in zip(outs, results):
            self._write(p, n, value, name, stream)

    def _p2p(self, kind, ptr, count, datatype, peer, stream_ptr):
        stream = self._stream(stream_ptr)
        dtype = self.nccl.dtype(datatype)
        self.dev.calls.append((kind, stream.name, count, dtype.name, None, peer))
        self.dev.trace.append(("nccl", kind, stream.name))
        if not 0 <= peer < self.ndev or peer == self.rank:
            raise FakeNcclError(f"{kind} to peer {peer} from rank {self.rank} of {self.ndev}")
        if kind == "send":
            item = ("send", lambda: self._post(ptr, count, dtype, peer, stream))
        else:
            item = ("recv", lambda: self._take(ptr, count, dtype, peer, stream))
        if self.dev.group is not None:
            self.dev.group.append(item)
        else:
            item[1]()

    def _post(self, ptr, count, dtype, peer, stream):
        data = self._read(ptr, count, dtype, "send", stream)
        self.clique.box(self.rank, peer).put((count, dtype, data))

    def _take(self, ptr, count, dtype, peer, stream):
        try:
            sent, sent_dtype, data = self.clique.box(peer, self.rank).get(timeout=TIMEOUT)
        except queue.Empty:
            raise FakeNcclError(f"recv on rank {self.rank} from {peer}: nothing sent") from None
        if (sent, sent_dtype) != (count, dtype):
            raise FakeNcclError(
                f"recv on rank {self.rank} of {count} {dtype} from rank {peer}, which sent "
                f"{sent} {sent_dtype}"
            )
        self._write(ptr, count, data, "recv", stream)

    def _read(self, ptr, count, dtype, what, stream) -> np.ndarray:
        nbytes = count * dtype.itemsize
        self.dev.touch_ptr(ptr, nbytes, False, f"NCCL {what}", stream)
        raw = (ctypes.c_char * nbytes).from_address(ptr) if nbytes else b""
        return np.frombuffer(bytes(raw), dtype)

    def _write(self, ptr, count, value, what, stream) -> None:
        value = np.ascontiguousarray(value)
        nbytes = count * value.dtype.itemsize
        if value.size != count:
            raise FakeNcclError(f"{what}: {value.size} elements for a count of {count}")
        self.dev.touch_ptr(ptr, nbytes, True, f"NCCL {what}", stream)
        if nbytes:
            ctypes.memmove(ptr, value.ctypes.data, nbytes)


class FakeNccl:
    """``cupy.cuda.nccl``: constants, unique ids, communicators and groups."""

    def __init__(self, available: bool = True) -> None:
        self.available = available
        self.lock = threading.Lock()
        self.cliques: dict[bytes, _Clique] = {}
        self.created: list[tuple] = []  # (uid, rank, ndev) of every NcclCommunicator
        self.uids: list[bytes] = []
        self.NcclError = FakeNcclError
        for i, (name, _) in enumerate(_TYPES):
            setattr(self, name, i)
        for i, name in enumerate(_OPS):
            setattr(self, name, i)

    def get_version(self) -> int:
        if not self.available:
            raise RuntimeError("libnccl.so.2: cannot open shared object file")
        return 22703

    def get_unique_id(self) -> bytes:
        uid = os.urandom(128)
        with self.lock:
            self.uids.append(uid)
        return uid

    def NcclCommunicator(self, ndev: int, uid: bytes, rank: int) -> FakeNcclComm:
        return FakeNcclComm(self, ndev, uid, rank)

    def groupStart(self) -> None:
        dev = _device()
        dev.group_depth += 1
        if dev.group is None:
            dev.group = []

    def groupEnd(self) -> None:
        dev = _device()
        dev.group_depth -= 1
        if dev.group_depth:
            return
        ops, dev.group = dev.group, None
        for kind in ("collective", "send", "recv"):  # sends are posted before any receive
            for k, run in ops:
                if k == kind:
                    run()

    # helpers of the stand-in ------------------------------------------------------------------
    def dtype(self, code: int) -> np.dtype:
        return np.dtype(_TYPES[code][1])

    def reduce(self, arrays: list[np.ndarray], op: int) -> np.ndarray:
        """What NCCL computes: in rank order, in the arrays' dtype (integers wrap, float16
        rounds each partial sum); float max/min are fmax/fmin, which drop a NaN."""
        name = _OPS[op]
        out = arrays[0].copy()
        floating = out.dtype.kind == "f"
        with np.errstate(all="ignore"):
            for a in arrays[1:]:
                if name in ("NCCL_SUM", "NCCL_AVG"):
                    out = out + a
                elif name == "NCCL_PROD":
                    out = out * a
                elif name == "NCCL_MAX":
                    out = np.fmax(out, a) if floating else np.maximum(out, a)
                else:
                    out = np.fmin(out, a) if floating else np.minimum(out, a)
            if name == "NCCL_AVG":
                out = (out / len(arrays)).astype(out.dtype)
        return out


class _NoNccl:
    """``cupy.cuda`` of a CuPy built without NCCL: importing the module fails."""

    @property
    def nccl(self) -> Any:
        raise ImportError("cannot import name 'nccl' from 'cupy.cuda' (no NCCL support)")


class FakeCupy:
    """The ``cupy`` module the NCCL backend uses, with a device per simulated rank.

    ``bus_of(rank)`` gives each rank's PCI bus id (default: a GPU of its own); ``missing``
    "module" or "library" takes NCCL away as described in the module docstring."""

    def __init__(self, bus_of=None, missing: str | None = None) -> None:
        self.bus_of = bus_of or (lambda rank: f"0000:{rank + 1:02x}:00.0")
        self.devices: dict[int, FakeDevice] = {}
        self.nccl = FakeNccl(available=missing != "library")
        cuda = _NoNccl() if missing == "module" else SimpleNamespace(nccl=self.nccl)
        cuda.Stream = lambda null=False, non_blocking=False, ptds=False: _device().new_stream()
        cuda.Event = FakeEvent
        cuda.Device = lambda device=None: _device()
        cuda.get_current_stream = lambda: _device().current
        cuda.runtime = SimpleNamespace(getDeviceCount=lambda: 1)
        self.cuda = cuda
        self.ndarray = FakeArray
        self.empty = _empty
        self.where = _where
        self.asarray = _asarray
        self.isnan = np.isnan  # a ufunc: device arrays take it through __array_ufunc__
        self.float32, self.float64, self.uint8 = np.float32, np.float64, np.uint8

    def zeros(self, shape: Any, dtype: Any = float) -> FakeArray:
        return _wrap(np.zeros(shape, dtype), "zeros")

    def asnumpy(self, a: Any) -> np.ndarray:
        return a.get() if isinstance(a, FakeArray) else np.asarray(a)

    def device(self) -> FakeDevice:
        """The calling rank's device."""
        return _device()

    def __enter__(self) -> FakeCupy:
        _the.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _the.remove(self)
        _local.__dict__.clear()
