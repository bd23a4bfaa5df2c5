"""bench/kernels_vs_torch.py --quick as a subprocess (one process, no mpiexec): every workload's row
prints and, where PyTorch is installed, its float64 correctness check against PyTorch runs
and can fail.

No timing is asserted. PyTorch is optional: without it (run here either way, with ``import
torch`` made to fail) or with ``--no-torch`` the script times dt alone and skips the check,
which compares dt with PyTorch; dt's own numerics are checked against numpy by the rest of the
suite (tests/test_ops_nn.py, tests/test_grad.py, ...).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from mpirun import ROOT

WORKLOADS = ("mlp_gelu", "mlp_tanh", "transformer", "layer_norm", "softmax", "cross_entropy")
HAS_TORCH = importlib.util.find_spec("torch") is not None


# the script run as on a machine without PyTorch: ``import torch`` raises ImportError
HIDE_TORCH = (
    "import runpy, sys; sys.modules['torch'] = None; sys.argv[0] = 'bench/kernels_vs_torch.py'; "
    "runpy.run_path('bench/kernels_vs_torch.py', run_name='__main__')"
)


def _run(*args: str, hide_torch: bool = False) -> tuple[int, str]:
    script = ["-c", HIDE_TORCH] if hide_torch else ["bench/kernels_vs_torch.py"]
    proc = subprocess.run(
        [sys.executable, *script, "--quick", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout


def _rows(out: str) -> dict[str, list[str]]:
    """The table's rows by workload name (the lines after the header's rule)."""
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("-----"))
    return {
        cells[0]: cells
        for line in lines[rule + 1 :]
        if (cells := line.split()) and cells[0] in WORKLOADS
    }


@pytest.mark.parametrize("mode", ["default", "no-torch", "torch-absent"])
def test_kernels_benchmark_runs(mode):
    """Exit 0, the machine line, the check's verdict (or the line saying it is skipped), and
    a row for every workload with dt's time (and PyTorch's where it ran)."""
    extra = ["--no-torch"] if mode == "no-torch" else []
    code, out = _run(*extra, hide_torch=mode == "torch-absent")
    assert code == 0, out
    assert out.startswith("machine: "), out
    with_torch = HAS_TORCH and mode == "default"
    if with_torch:
        check = [line for line in out.splitlines() if line.startswith("correctness check")]
        assert check and "dt and PyTorch agree" in check[0], out
    else:
        # --no-torch is named first when given, whether or not PyTorch is installed.
        absent = mode == "torch-absent" or (mode == "default" and not HAS_TORCH)
        why = "PyTorch is not installed" if absent else "--no-torch"
        assert f"{why}: timing dt alone; correctness check skipped" in out, out
        assert ("torch not installed" if absent else "torch left out") in out, out
    rows = _rows(out)
    assert set(rows) == set(WORKLOADS), out
    for cells in rows.values():
        assert float(cells[1]) > 0, out  # dt ms
        if with_torch:
            assert float(cells[2]) > 0 and float(cells[3]) > 0, out  # torch ms, dt/torch
        else:
            assert cells[2] in ("not", "left"), out  # "not installed" / "left out"


@pytest.mark.skipif(not HAS_TORCH, reason="the check compares with PyTorch")
def test_kernels_benchmark_check_fails_on_a_wrong_input():
    """The dt side's input off by 1e-7 relative (the hidden --plant) must fail the check:
    exit 1, say what differed, time nothing."""
    code, out = _run("--only", "softmax,transformer", "--plant", "transformer")
    assert code == 1, out
    assert "correctness check FAILED" in out, out
    assert "transformer: step 1 loss" in out and "softmax" not in out.split("FAILED")[1], out
    assert "dt ms" not in out, out


def test_kernels_benchmark_only():
    """``--only`` picks workloads; an unknown name is refused."""
    code, out = _run("--only", "softmax, layer_norm", "--no-torch")
    assert code == 0, out
    assert set(_rows(out)) == {"softmax", "layer_norm"}, out
    code, out = _run("--only", "conv2d", "--no-torch")
    assert code == 2 and "unknown workloads ['conv2d']" in out, out
