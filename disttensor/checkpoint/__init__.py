"""Distributed checkpoints: ``dt.save(state, path)`` and ``dt.load(template, path)``.

files.py: .npy pieces, the metadata document, IOCounter; tiles.py: checksum tiles; tree.py: the
state tree as JSON and template matching; commit.py: atomic publication, recovery, agreeing
on errors; saving.py and loading.py: the two collectives. The user's page is
docs/checkpoints.md.

Note [Checkpoint layout]
    A checkpoint is a directory: one ``metadata.json`` and one standard .npy file per piece.
    A piece is a distinct non-empty box of a tensor's stored layout, written by one of the
    ranks that hold it (replicas take turns by tensor and piece index, so a Replicate tensor
    is written once, and many replicated tensors spread over the ranks). A Partial tensor is
    reduced before it is written, each Partial mesh dim to a Shard of the longest axis (one
    reduce-scatter), so the file holds the global value and a loader needs no reduction.
    numpy arrays and Python values are taken from rank 0 (every rank is expected to hold the
    same). The metadata has, per tensor, its kind, global shape, dtype, mesh (shape, ranks,
    dim names), placements as saved and as stored, and its pieces (file, global offset and
    shape, writer rank, checksums); the state's structure with its Python values; and the
    crc32 of its own body.

Note [Atomic saves]
    Everything is written into ``.<name>.tmp-<id>`` beside ``path`` (the same file system);
    each file is flushed and fsynced. An all-gather that follows every rank's fsync carries
    the pieces' checksums to rank 0, which then alone writes the metadata (last, fsynced),
    fsyncs the directory, and commits: if ``path`` holds a checkpoint, (1) it renames it to
    ``.<name>.old-<id>``, (2) renames the new directory to ``path``, fsyncs the parent and
    only then (3) deletes the old one (renamed to a trash name first, so a half-deleted
    directory never carries a name that is read). A crash before (1) leaves ``path`` as it
    was; between (1) and (2) ``path`` is missing and ``load`` takes the aside copy (there is
    at most one complete aside: stale ones are deleted before (1), while ``path`` is whole);
    after (2) ``path`` is the new checkpoint. Leftovers of crashed saves are deleted by the
    next successful commit. With many ranks nothing changes: the other ranks only write into
    the temporary directory, and a rank that dies before the all-gather ends the job (MPI
    aborts it) before rank 0 has renamed anything; only rank 0 renames. One save per path at
    a time; the file system must be shared by the ranks and keep rename atomic (local file
    systems, NFS, Lustre, GPFS do).

Note [Reading only what overlaps]
    A loader computes its box in the template's layout, intersects it with every piece's box
    and reads only the intersections. Checksums are per tile of the piece's data seen as a
    2-D array (rows: all axes but the last; tiles.py): at least 64 KiB, at most 1024 per
    file, strips no narrower than a 4 KiB page, about as many row bands as column strips;
    plus one of the .npy header. A rank reads and verifies exactly the tiles that hold its
    slice: loading into the saved layout reads each rank's own bytes; another layout reads
    its slice rounded out to whole tiles (a column slice of rows of 4 KiB or less reads the
    rows whole, as any reader of a row-major file must, a page at a time). Tiles that are
    contiguous in the file come with one positioned read (straight into the result when they
    hold exactly the slice); strips of rows through a memory map.

Note [Agreeing on errors]
    A missing or corrupt file, or a template that does not fit, may be seen by some ranks
    only (each reads different pieces). So ``load`` never raises alone: after reading the
    metadata and checking the template, and again after reading the data, the ranks
    all-gather their errors (a few bytes when there are none) and every rank raises the same
    one, naming the file and the ranks that saw it. ``save`` does the same for the writes
    and the commit. Errors in the arguments (a value a checkpoint cannot hold) are found
    locally and raised on every rank before any collective.

Note [Loading without a template tensor]
    The template gives each DistTensor its mesh and placements. Where it has none for a
    saved DistTensor (the template has an empty dict, a non-container leaf such as None, or
    the entry is inside such a subtree), the tensor is loaded split along its longest axis
    over every rank of the world (``loading.default_spec``), so each rank reads about 1/n of
    it; ``Optimizer.load_state_dict`` then moves the optimizer state of a fresh optimizer
    (whose ``state_dict()`` has an empty ``"state"``) to the parameters' placements. A numpy
    array in the template asks for the whole value as a numpy array on every rank.

Note [Checkpoints of device tensors]
    Files are host data, so a device tensor (Note [Array backends] in backend.py) goes
    through the host, explicitly and once per rank and tensor. ``save`` reduces Partials and
    reshards to the stored layout on the device (the collectives of a host save), then each
    rank copies to the host only the box it is the writer of (one copy per piece it writes;
    a replica that does not write copies nothing) and writes it as a host save does: the
    files are those of a host save of the same values, byte for byte (only the save's id in
    the metadata differs, as between any two saves). ``load`` assembles each rank's box on
    the host from the tiles it reads, verified there (the checksums are over the file's
    bytes), and copies it onto the device once: the template tensor's device, or the
    selected one (``dt.set_device``) for a tensor the template has none for (Note [Loading
    without a template tensor]). So a host checkpoint loads onto a device and a device
    checkpoint onto the host. IOCounter counts the copies (``device_copies``,
    ``device_bytes``); numpy arrays and Python values of the state are host data and stay so.

>>> import os, tempfile, numpy as np, disttensor as dt
>>> mesh = dt.ProcessMesh([0])
>>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
>>> w = dt.shard_tensor(np.eye(2), mesh, [dt.Shard(0)])
>>> dt.save({"model": {"w": w}, "step": 7, "note": "warm-up"}, path)
>>> state = dt.load({"model": {"w": dt.zeros_like(w)}, "step": 0}, path)
>>> state["step"], state["model"]["w"].to_local()
(7, array([[1., 0.],
       [0., 1.]]))
"""

from .files import CheckpointError, IOCounter
from .loading import load
from .saving import save

__all__ = ["CheckpointError", "IOCounter", "load", "save"]
