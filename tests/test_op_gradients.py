"""The gradient column of docs/ops.md is true: each op goes backward as the page says.

The page's column (what ``python -m disttensor.oplist`` wrote, parsed from docs/ops.md) is
checked against what ``backward()`` does through each exported op on a tiny float64 input on
two simulated ranks, with the input's rows split (as the generator's probe has it), its
columns split (a mesh dim splits the reduced axis of softmax, log_softmax, logsumexp,
layer_norm and cross_entropy: their composite route instead of the fused op) and replicated:

- yes: backward through the sum of every output that requires a gradient runs and gives the
  input a gradient of its shape and dtype, and every node on the tape has a gradient function
  (an op's from ``autograd.GRADIENTS``, or the one a composite records with
  ``autograd.record``: sort's);
- no: backward raises NotImplementedError, and some node on the tape has no gradient
  function, for an op with none in ``autograd.GRADIENTS``;
- constant: no output requires a gradient, and each output is integer or bool, or the op is
  in ``autograd.NOT_DIFFERENTIABLE`` (piecewise-constant float results), or in FLOAT_CONSTANTS
  below with the reason.

The calls are the generator's (``oplist.calls``: how each op is called on a 4 x 4 tensor), so
an op the generator cannot call fails there first. One simulation for every op: about a second.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from grad_cases import tape

import disttensor as dt
from disttensor import autograd, oplist

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| `dt\.(\w+)` \| (yes|no) \| (yes|no|constant) \|$", re.M)
PLACEMENTS = {"rows split": dt.Shard(0), "columns split": dt.Shard(1), "replicated": dt.Replicate()}
# ops with float results that carry no gradient, though not in NOT_DIFFERENTIABLE
FLOAT_CONSTANTS = {"histogram": "its bin edges come from the host range of the data"}
# ops with a fused op of their own name and a composite route where a mesh dim splits the axes
# they reduce (Note [Fused or composite]); gelu is fused on every route
FUSED = {"softmax", "log_softmax", "logsumexp", "layer_norm", "cross_entropy", "gelu"}
COMPOSITE_WHEN_COLUMNS_SPLIT = FUSED - {"gelu"}


def page_column() -> dict[str, str]:
    """op -> its gradient column in docs/ops.md."""
    return {m.group(1): m.group(3) for m in ROW.finditer((ROOT / "docs/ops.md").read_text())}


def _outputs(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [o for x in out for o in _outputs(x)]
    return [out]


def _kind(o: Any) -> str:
    """The dtype kind of an output: "f", "i", "b", ... (a Python bool is "b", an int "i")."""
    if isinstance(o, dt.DistTensor):
        return o.dtype.kind
    return np.asarray(o).dtype.kind


def _run(name: str, placement: dt.Placement) -> dict[str, Any]:
    """Backward through op ``name`` on x (4 x 4 float64, placed so) on every rank alike."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((4, 4))
    mesh = dt.ProcessMesh([0, 1])
    errors = []
    for call in oplist.calls(name):
        x = dt.shard_tensor(a + a.T, mesh, [placement], requires_grad=True)
        try:
            with np.errstate(all="ignore"):
                out = call(dt, x)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
            continue
        outs = _outputs(out)
        flowing = [o for o in outs if isinstance(o, dt.DistTensor) and o.requires_grad]
        rec: dict[str, Any] = {"kinds": [_kind(o) for o in outs], "tape": {}, "grad": None}
        if not flowing:
            return {**rec, "outcome": "constant"}
        loss = flowing[0].sum()
        for o in flowing[1:]:
            loss = loss + o.sum()
        for o in flowing:
            for op, has in tape(o).items():
                rec["tape"][op] = rec["tape"].get(op, True) and has
        try:
            with np.errstate(all="ignore"):
                loss.backward()
        except NotImplementedError as e:
            return {**rec, "outcome": "no", "error": str(e)}
        if x.grad is None:
            return {**rec, "outcome": "constant"}
        g = x.grad
        return {**rec, "outcome": "yes", "grad": (g.shape, g.dtype, g.numpy())}
    return {"outcome": "uncallable", "error": errors}


def _run_all(names: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(n, where): _run(n, p) for n in names for where, p in PLACEMENTS.items()}


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str], dict[str, Any]]:
    return dt.simulate(2, _run_all, oplist.exported_ops())[0]


COLUMN = page_column()


def test_the_page_lists_every_op() -> None:
    assert sorted(COLUMN) == sorted(oplist.exported_ops()), (
        f"docs/ops.md's op tables and dt's ops differ; run `{oplist.COMMAND}`"
    )


@pytest.mark.parametrize("name", sorted(COLUMN))
def test_gradient_column(name: str, results: dict) -> None:
    says = COLUMN[name]
    for where in PLACEMENTS:
        r = results[name, where]
        what = f"docs/ops.md says dt.{name}'s gradient is {says!r}; {where}"
        assert r["outcome"] != "uncallable", f"{what}: no call of oplist.calls runs: {r['error']}"
        assert r["outcome"] == says, f"{what}, backward says {r['outcome']!r} ({r})"
        if says == "yes":
            shape, dtype, _ = r["grad"]
            assert (shape, dtype) == ((4, 4), np.float64), f"{what}: a {dtype}{shape} gradient"
            lacking = sorted(op for op, has in r["tape"].items() if not has)
            assert not lacking, f"{what}: ops on the tape without a gradient: {lacking}"
        elif says == "no":
            lacking = [op for op, has in r["tape"].items() if not has]
            assert lacking, f"{what}: refused, yet every op on its tape {r['tape']} has a gradient"
            registered = [op for op in lacking if op in autograd.GRADIENTS]
            assert not registered, f"{what}: {registered} have a gradient in the registry"
        else:
            floats = [k for k in r["kinds"] if k in "fc"]
            assert not floats or name in autograd.NOT_DIFFERENTIABLE or name in FLOAT_CONSTANTS, (
                f"{what}: float results {r['kinds']} without a gradient, and dt.{name} is not "
                "in autograd.NOT_DIFFERENTIABLE (ops/gradients.py) or FLOAT_CONSTANTS here"
            )


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_and_composite_routes(name: str, results: dict) -> None:
    """The fused ops are differentiable on every route, with the same gradient: replicated runs
    the fused op (its own name on the tape, its gradient in the registry); columns split the
    composite of differentiable dt ops, where the op reduces along the columns (logsumexp
    reduces every axis: rows split is composite too)."""
    assert COLUMN[name] == "yes"
    fused = results[name, "replicated"]
    assert fused["tape"].get(name) and name in autograd.GRADIENTS, fused["tape"]
    if name in COMPOSITE_WHEN_COLUMNS_SPLIT:
        tape = results[name, "columns split"]["tape"]
        assert name not in tape, f"dt.{name} ran its fused op on split columns: {tape}"
    for where in ("rows split", "columns split"):
        np.testing.assert_allclose(
            results[name, where]["grad"][2], fused["grad"][2], rtol=1e-10, atol=1e-12,
            err_msg=f"dt.{name}: the gradient with {where} differs from the replicated one",
        )  # fmt: skip
