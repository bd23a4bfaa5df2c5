"""Atomic publication of a checkpoint directory, recovery of an interrupted one, and the
small collective with which the ranks agree on an error (Note [Atomic saves] and Note
[Agreeing on errors] in the package docstring).

Beside the target ``<parent>/<name>`` live, only while a save runs or after a crash:
``.<name>.tmp-<id>`` (a save being written), ``.<name>.old-<id>`` (the previous checkpoint,
moved aside during the commit) and ``.<name>.trash-<id>`` (being deleted). ``<id>`` starts
with the time in nanoseconds, so names sort by age.

>>> import os, tempfile
>>> target = os.path.join(tempfile.mkdtemp(), "ckpt")
>>> tmp = make_temp(target)
>>> open(os.path.join(tmp, "metadata.json"), "w").close()
>>> commit(tmp, target)
>>> resolve(target) == target, sorted(os.listdir(os.path.dirname(target)))
(True, ['ckpt'])
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any

from .. import comm
from .files import METADATA, CheckpointError

log = logging.getLogger("disttensor")


def _split(path: str) -> tuple[str, str]:
    parent, name = os.path.split(os.path.abspath(path))
    return parent, name


def _new_id() -> str:
    return f"{time.time_ns():020d}-{os.getpid()}"


def _siblings(path: str, kind: str) -> list[str]:
    """Paths of ``.<name>.<kind>-*`` beside ``path``, oldest first."""
    parent, name = _split(path)
    prefix = f".{name}.{kind}-"
    try:
        found = sorted(e for e in os.listdir(parent) if e.startswith(prefix))
    except FileNotFoundError:
        return []
    return [os.path.join(parent, e) for e in found]


def fsync_dir(directory: str) -> None:
    """Make the entries of ``directory`` (created files, renames) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_temp(path: str) -> str:
    """Create the temporary directory a save of ``path`` writes into (beside it, so on the
    same file system, where a rename is atomic)."""
    parent, name = _split(path)
    if not os.path.isdir(parent):
        raise FileNotFoundError(
            f"dt.save: the directory {parent} does not exist; create it before saving {path}"
        )
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"dt.save: {path} exists and is not a checkpoint directory")
    tmp = os.path.join(parent, f".{name}.tmp-{_new_id()}")
    os.mkdir(tmp)
    return tmp


def _discard(directory: str, name: str) -> None:
    """Remove a directory beside checkpoint ``name``: first renamed to a trash name (atomic),
    so a crash midway never leaves a half-deleted directory under a name ``resolve`` reads."""
    trash = os.path.join(os.path.dirname(directory), f".{name}.trash-{_new_id()}")
    try:
        os.rename(directory, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def commit(tmp: str, path: str) -> None:
    """Publish the complete directory ``tmp`` at ``path``, replacing a previous checkpoint so
    that a crash at any moment leaves one complete checkpoint at ``path`` or, between the two
    renames, moved aside (``resolve`` finds it)."""
    fsync_dir(tmp)
    parent, name = _split(path)
    if os.path.isdir(path):
        for old in _siblings(path, "old"):  # path is complete: older copies are stale
            _discard(old, name)
        os.rename(path, os.path.join(parent, f".{name}.old-{_new_id()}"))
    os.rename(tmp, path)
    fsync_dir(parent)
    for stale in _siblings(path, "old") + _siblings(path, "tmp"):  # tmp: crashed saves
        _discard(stale, name)
    for trash in _siblings(path, "trash"):
        shutil.rmtree(trash, ignore_errors=True)


def resolve(path: str) -> str:
    """The directory to load ``path`` from: ``path`` itself, or, when a save was interrupted
    between its two renames, the previous checkpoint it had moved aside."""
    path = os.path.abspath(path)
    if os.path.isfile(os.path.join(path, METADATA)):
        return path
    if os.path.exists(path):
        raise CheckpointError(
            f"dt.load: {path} has no {METADATA}: it is not a disttensor checkpoint"
        )
    asides = [d for d in _siblings(path, "old") if os.path.isfile(os.path.join(d, METADATA))]
    if asides:
        log.warning(
            "dt.load: %s is missing; loading %s, the checkpoint an interrupted save "
            "had moved aside",
            path,
            asides[-1],
        )
        return asides[-1]
    raise FileNotFoundError(f"dt.load: there is no checkpoint at {path}")


# -- agreeing on errors --------------------------------------------------------------------------
def agree(error: BaseException | None) -> None:
    """Collective over the world: raise the first rank's error on every rank, if any rank has
    one (the same type and message, naming the rank), so no rank is left waiting."""
    errors = comm.world().allgather_object(portable(error))
    raise_first(errors)


def portable(error: BaseException | None) -> Any:
    if error is None:
        return None
    msg = error.args[0] if len(error.args) == 1 and isinstance(error.args[0], str) else str(error)
    return type(error), msg


def raise_first(errors: list[Any]) -> None:
    """Raise the first non-None (type, message) of per-rank ``errors``."""
    for rank, e in enumerate(errors):
        if e is not None:
            cls, msg = e
            if len(errors) > 1:
                msg = f"{msg} (on rank {rank})"
            raise cls(msg)
