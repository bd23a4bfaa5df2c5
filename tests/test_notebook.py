"""demos/inspect.ipynb runs top to bottom on 4 real MPI ranks: ipyparallel engines started by
the venv's mpiexec from the notebook's first cell, every ``%%px`` cell on all of them. Any
cell that raises (an assertion in the notebook included) fails the test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "demos" / "inspect.ipynb"


def _stop_clusters(ipython_dir: Path) -> list[str]:
    """Stop every cluster whose file is in ``ipython_dir`` (a failing cell ends the notebook
    before its last cell, which stops the cluster); returns their ids."""
    import ipyparallel as ipp

    stopped = []
    for path in sorted(ipython_dir.glob("profile_*/security/cluster-*.json")):
        cluster = ipp.Cluster.from_file(str(path))
        cluster.stop_cluster_sync()
        stopped.append(cluster.cluster_id)
    return stopped


def _text(nb) -> str:
    """Everything the notebook's cells showed, as text."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_inspect_notebook_on_real_ranks(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    # A private IPython dir holds the cluster's files, so the cleanup below finds exactly
    # the clusters this run started, and nothing is left in the user's ~/.ipython.
    ipython_dir = tmp_path / "ipython"
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # 4 engines and a kernel on 2 cores in CI
    # A kernel of this very Python (not whatever "python3" kernel the machine has installed).
    spec = tmp_path / "jupyter" / "kernels" / "disttensor-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "disttensor test", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb,
        timeout=180,  # per cell: the first starts the controller and 4 engines
        kernel_name="disttensor-test",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    try:
        client.execute()  # raises CellExecutionError at the first cell that fails
    finally:
        left = _stop_clusters(ipython_dir)
    assert not left, f"the notebook's last cell did not stop its cluster(s) {left}"

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "every code cell ran"
    assert sum(c.source.startswith("%%px") for c in code) >= 6, "the ranks run most cells"
    shown = _text(nb)
    # rank 0's outputs: the global value, the picture, the explain reports, the training
    assert "[stdout:0] DistTensor([[ 0.,  1.,  2.,  3.,  4.]," in shown, shown
    assert "0:4 |              0              |         1         |" in shown, shown
    assert "all_gather over dp 96 bytes" in shown, shown
    assert "DataParallel bucket of 6 gradients" in shown, shown
    assert "[stdout:0] losses:" in shown, shown
    for rank in range(4):  # print on every rank, the rank logger on every rank
        assert f"rank {rank} holds" in shown, shown
        assert f"[rank {rank}] INFO notebook: my shard of x" in shown, shown
