"""Every demo for real under mpiexec.

Each training demo checks itself against its single-process run (losses, gradients,
parameters) and exits non-zero on a mismatch. That check compares the library with itself,
so a bug in a shared local kernel, gradient or optimizer passes it; here each demo also
records its sharded run (hidden ``--record``) and the record is replayed by an independent
plain-numpy reference (tests/numpy_models.py, hand-written backward), which must agree.
"""

from __future__ import annotations

import json

import numpy as np
import numpy_models as nm
import pytest
from mpirun import run

OK = "OK: matches single process"

TRAINING = ["simple_net_dp.py", "simple_net_mp.py", "mlp_dp_mp.py", "gpt_dp_mp.py"]

# float64 replay: the sharded run and the numpy reference differ only by the order of
# floating-point sums, ~1e-14 relative after 3 steps (Adam included). 1e-10 leaves 4 orders
# of margin and is far below what a wrong term does: a GELU constant off in its 5th digit
# moves the first loss by ~1e-6 relative, a dropped bias correction or a lost 1/count by O(1).
RTOL = 1e-10
# Each tensor is compared relative to its own largest value, but at least this fraction of
# its group's largest value: attention's key bias has a gradient that is zero in exact
# arithmetic (softmax ignores a constant added to a row), ~1e-18 of rounding noise in both.
FLOOR = 1e-4
STEPS = 3


def load_record(path) -> dict:
    """The .npz of ``--record`` (demos/_common.py ``fit``) as groups of name -> array."""
    with np.load(path) as r:
        meta = json.loads(str(r["meta"]))
        group = {
            key: {k.split(":", 1)[1]: r[k] for k in r.files if k.startswith(key + ":")}
            for key in ("initial", "gradient", "final")
        }
        batches = [
            tuple(r[f"batch:{s}:{i}"] for i in range(2)) for s in range(1, meta["steps"] + 1)
        ]
        losses = r["losses"]
    return {"meta": meta, "batches": batches, "losses": losses, **group}


def mismatches(got: dict, want: dict, rtol: float = RTOL, floor: float = FLOOR) -> list[str]:
    """Tensors of ``got`` (name -> array) that differ from ``want`` by more than ``rtol``
    relative to max(their largest |value|, ``floor`` * the group's largest |value|)."""
    if set(got) != set(want):
        return [f"names differ: {sorted(set(got) ^ set(want))}"]
    top = max(float(np.abs(w).max(initial=0.0)) for w in want.values())
    bad = []
    for name, w in want.items():
        g = np.asarray(got[name], np.float64)
        if g.shape != w.shape:
            bad.append(f"{name}: shape {g.shape} != {w.shape}")
            continue
        scale = max(float(np.abs(w).max(initial=0.0)), floor * top) or 1.0
        diff = float(np.abs(g - w).max(initial=0.0)) / scale
        if not diff <= rtol:
            bad.append(f"{name}: rel diff {diff:.3g}")
    return bad


def check_against_numpy(demo: str, record: dict) -> None:
    """Replay ``record`` with the numpy reference of ``demo`` and compare."""
    _, make_opt = nm.DEMOS[demo]
    meta = record["meta"]
    for key, value in make_opt().settings.items():  # the reference trains as the demo does
        assert meta[key] == value, f"{demo} uses {key} {meta[key]}, the reference {value}"
    want = nm.replay(demo, record["initial"], record["batches"])
    bad = {
        "losses": mismatches({"loss": record["losses"]}, {"loss": want["losses"]}, floor=0.0),
        "gradients": mismatches(record["gradient"], want["gradients"]),
        "parameters": mismatches(record["final"], want["parameters"]),
    }
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"{demo} differs from the numpy reference: {bad}\n" + (
        f"losses {record['losses']} vs numpy {want['losses']}"
    )


def progress_lines(out: str) -> bool:
    return "step 1/" in out or "step  1/" in out


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("demo", TRAINING)
def test_demo_matches_numpy(demo, n, tmp_path):
    """float64, a few steps: the demo's own check passes, and the recorded sharded run
    equals the plain-numpy replay (1 rank: the smoke run of the single-process program)."""
    path = tmp_path / "record.npz"
    args = [f"demos/{demo}", "--steps", str(STEPS), "--record", str(path)]
    code, out = run(n, args, timeout=180)
    assert code == 0, out
    assert out.count(OK) == 1, "only rank 0 prints:\n" + out
    assert progress_lines(out), out
    record = load_record(path)
    assert record["meta"]["world"] == n and len(record["batches"]) == STEPS, record["meta"]
    check_against_numpy(demo, record)


def collective_line(out: str) -> dict[str, dict[str, int]]:
    """The "collectives per step" line as {phase: {kind: count}}."""
    line = next(x for x in out.splitlines() if x.startswith("collectives per step: "))
    phases = {}
    for part in line.removeprefix("collectives per step: ").split(" | "):
        phase, rest = part.split(" ", 1)
        phases[phase] = (
            {}
            if rest == "none"
            else {kind: int(n) for n, kind in (item.split(" ") for item in rest.split(", "))}
        )
    return phases


@pytest.mark.mpi
@pytest.mark.parametrize("demo", ["simple_net_dp.py", "mlp_dp_mp.py", "gpt_dp_mp.py"])
def test_data_parallel_demo_fused_and_plain(demo, tmp_path):
    """The data-parallel demos on 4 ranks, dt.DataParallel (the default) against
    ``--dp plain``: both equal the numpy replay; fused says how many gradient all-reduces
    went into how many buckets, plain how many gradients opt.step() reduced together with
    how many all-reduces; plain makes no fewer all-reduces per step than fused (its
    reductions are fused too, only later: none overlaps backward)."""
    lines = {}
    for mode in ("fused", "plain"):
        path = tmp_path / f"{mode}.npz"
        args = [f"demos/{demo}", "--steps", str(STEPS), "--dp", mode, "--record", str(path)]
        code, out = run(4, args, timeout=180)
        assert code == 0, out
        check_against_numpy(demo, load_record(path))
        lines[mode] = out
    fused, plain = (
        next(x for x in lines[m].splitlines() if x.startswith("data parallel: "))
        for m in ("fused", "plain")
    )
    assert plain.endswith("(--dp plain)"), plain
    words = fused.split()
    grads, buckets = int(words[2]), int(words[7])
    assert grads > buckets >= 1, fused
    words = plain.split()
    together, made = int(words[2]), int(words[9])
    assert together >= grads > made >= 1, plain  # plain also reduces what fused leaves

    def all_reduces(out):
        return sum(p.get("all_reduce", 0) for p in collective_line(out).values())

    assert all_reduces(lines["fused"]) <= all_reduces(lines["plain"]), lines


@pytest.mark.mpi
@pytest.mark.parametrize("demo", TRAINING)
def test_demo_float32(demo):
    """float32 on 4 ranks, the default number of steps: the demo's own check."""
    code, out = run(4, [f"demos/{demo}", "--dtype", "float32"], timeout=180)
    assert code == 0, out
    assert out.count(OK) == 1, "only rank 0 prints:\n" + out
    assert progress_lines(out), out


@pytest.mark.mpi
def test_reshard_demo():
    """demos/reshard_2x2.py checks every reshard against numpy and raises on a difference."""
    code, out = run(4, ["demos/reshard_2x2.py"], timeout=120)
    assert code == 0, out
    assert out.count("OK: every result equals numpy / the one-process run.") == 1, out
    assert "Reshards (each checked against numpy):" in out, out


@pytest.mark.mpi
@pytest.mark.parametrize("mesh", ["4x1", "1x4"])
def test_mlp_demo_other_meshes(mesh):
    code, out = run(4, ["demos/mlp_dp_mp.py", "--mesh", mesh, "--steps", "3"], timeout=120)
    assert code == 0, out
    assert f"mesh {mesh}" in out and OK in out, out


@pytest.mark.mpi
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_gpt_demo_with_a_sharding_stage(stage):
    """dt.shard_optimizer on the 2x2 dp x mp mesh: the single-process result, the memory
    report, and each stage's collectives in the optimizer step (stages 2 and 3 reduce-scatter;
    stage 3 gathers parameters in the forward, not in the step)."""
    code, out = run(
        4, ["demos/gpt_dp_mp.py", "--sharding", str(stage), "--steps", "4"], timeout=180
    )
    assert code == 0, out
    assert OK in out and f"ShardingStage{stage}: rank 0 holds" in out, out
    line = next(x for x in out.splitlines() if x.startswith("collectives per step"))
    optimizer = line.split("optimizer ")[1]
    assert ("reduce_scatter" in optimizer) == (stage >= 2), out
    assert ("all_gather" in optimizer) == (stage < 3), out
    assert ("all_gather" in line.split(" | ")[0]) == (stage == 3), out


@pytest.mark.mpi
def test_gpt_demo_loss_goes_down():
    code, out = run(2, ["demos/gpt_dp_mp.py", "--steps", "12"], timeout=180)
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("loss "))
    first, last = (float(v) for v in line.removeprefix("loss ").split(" -> "))
    assert last < 0.7 * first, out


@pytest.mark.mpi
@pytest.mark.parametrize("demo", ["mlp_dp_mp.py", "simple_net_mp.py"])
def test_demo_fails_loudly_on_a_mismatch(demo):
    """--perturb (hidden) adds 1e-3 to one rank's shard of a weight of the sharded model: the
    self-check must catch it, every rank must exit (no hang) and the job must fail."""
    code, out = run(2, [f"demos/{demo}", "--perturb", "--steps", "3"], timeout=120)
    assert code != 0, out
    assert "MISMATCH: the sharded run differs from the single process" in out, out
    assert OK not in out, out


@pytest.mark.mpi
def test_demo_rejects_a_mesh_that_does_not_fit():
    code, out = run(2, ["demos/mlp_dp_mp.py", "--mesh", "2x2"], timeout=60)
    assert code != 0, out
    assert "--mesh 2x2 needs 4 ranks, this run has 2" in out, out


# -- the numpy reference itself --------------------------------------------------------------
def random_params(shapes: dict, rng) -> dict:
    """Random parameters; LayerNorm weights near 1, so they matter but do not vanish."""
    return {
        name: (1.0 + 0.3 * rng.standard_normal(s))
        if name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight", "norm.weight"))
        else 0.5 * rng.standard_normal(s)
        for name, s in shapes.items()
    }


def small_models(rng):
    """(name, model, params, batch): each demo's model at a small size."""
    v, c, h, n, b = 11, 8, 2, 5, 3
    gpt_shapes = {"tok.weight": (v, c), "pos.weight": (n + 2, c)}  # longer table than used
    for i in range(2):
        pre = f"blocks.{i}."
        gpt_shapes |= {pre + f"{ln}.{w}": (c,) for ln in ("ln1", "ln2") for w in ("weight", "bias")}
        for lin in ("q", "k", "v", "proj"):
            gpt_shapes |= {pre + f"attn.{lin}.weight": (c, c), pre + f"attn.{lin}.bias": (c,)}
        gpt_shapes |= {
            pre + "mlp.fc1.weight": (c, 4 * c),
            pre + "mlp.fc1.bias": (4 * c,),
            pre + "mlp.fc2.weight": (4 * c, c),
            pre + "mlp.fc2.bias": (c,),
        }
    gpt_shapes |= {"ln_f.weight": (c,), "ln_f.bias": (c,), "head.weight": (c, v)}
    ids = rng.integers(0, v, (b, n))
    ids[0, :2] = 3  # a repeated token: its embedding row adds two gradients
    labels = rng.integers(0, v, (b, n))
    mlp_shapes = {
        "fc1.weight": (5, 6),
        "fc1.bias": (6,),
        "norm.weight": (6,),
        "norm.bias": (6,),
        "fc2.weight": (6, 3),
        "fc2.bias": (3,),
    }
    xy = (rng.standard_normal((4, 5)), rng.standard_normal((4, 3)))
    return [
        ("simple_net", nm.simple_net, random_params({"w0": (5, 7), "w1": (7, 3)}, rng), xy),
        ("mlp", nm.mlp, random_params(mlp_shapes, rng), xy),
        (
            "gpt",
            lambda p, batch: nm.gpt(p, batch, heads=h),
            random_params(gpt_shapes, rng),
            (ids, labels),
        ),
    ]


@pytest.mark.parametrize("which", ["simple_net", "mlp", "gpt"])
def test_reference_backward_matches_finite_differences(which):
    """The hand-written backward of each reference model against central differences of its
    loss, along a random direction of each parameter tensor in turn."""
    rng = np.random.default_rng(0)
    _, model, p, batch = next(m for m in small_models(rng) if m[0] == which)
    _, grads = model(p, batch)
    assert set(grads) == set(p)
    eps = 1e-5
    for name in p:
        d = rng.standard_normal(p[name].shape)
        plus = dict(p, **{name: p[name] + eps * d})
        minus = dict(p, **{name: p[name] - eps * d})
        numeric = (model(plus, batch)[0] - model(minus, batch)[0]) / (2 * eps)
        analytic = float((grads[name] * d).sum())
        assert abs(numeric - analytic) <= 1e-6 * abs(analytic) + 1e-8, (name, numeric, analytic)


def test_reference_optimizers_first_step():
    """The first Adam step moves by lr * g / (|g| + eps) (bias correction makes m_hat = g,
    v_hat = g^2); AdamW first shrinks the weight by (1 - lr * wd); SGD moves by lr * g."""
    w, g = np.array([1.0, -2.0, 0.5]), np.array([0.3, -1e-3, 0.0])
    lr, eps, wd = 0.1, 1e-4, 0.01
    p = {"w": w.copy()}
    nm.SGD(lr).step(p, {"w": g})
    np.testing.assert_allclose(p["w"], w - lr * g, rtol=1e-15)
    p = {"w": w.copy()}
    nm.Adam(lr, eps=eps).step(p, {"w": g})
    np.testing.assert_allclose(p["w"], w - lr * g / (np.abs(g) + eps), rtol=1e-15)
    p = {"w": w.copy()}
    nm.Adam(lr, eps=eps, weight_decay=wd, decoupled=True).step(p, {"w": g})
    np.testing.assert_allclose(p["w"], w * (1 - lr * wd) - lr * g / (np.abs(g) + eps), rtol=1e-15)
    # L2 (coupled) decay: the decay enters the gradient, so the moments see g + wd * w
    p = {"w": w.copy()}
    nm.Adam(lr, eps=eps, weight_decay=wd).step(p, {"w": g})
    gw = g + wd * w
    np.testing.assert_allclose(p["w"], w - lr * gw / (np.abs(gw) + eps), rtol=1e-15)
