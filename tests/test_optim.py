"""dt.optim: every optimizer against an independent numpy implementation of the PyTorch update
formulas, on parameters sharded over 1, 2 and 4 simulated ranks; optimizer state placements;
Partial (data-parallel) gradients and the collectives step() makes; schedules and errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import disttensor as dt

S0, S1, R, P = dt.Shard(0), dt.Shard(1), dt.Replicate(), dt.Partial()
F64 = np.float64
STEPS = 5
SHAPE = (5, 6)  # uneven over 2 and 4 ranks on both axes


# -- the reference: PyTorch's formulas, in numpy ----------------------------------------------
def torch_sgd(w, g, st, t, lr, weight_decay=0.0):
    d_p = g + weight_decay * w if weight_decay else g
    return w - lr * d_p


def torch_momentum(w, g, st, t, lr, momentum=0.9, weight_decay=0.0, nesterov=False):
    """torch.optim.SGD with momentum (dampening 0): the buffer starts as the first gradient."""
    d_p = g + weight_decay * w if weight_decay else g
    buf = d_p.copy() if t == 1 else momentum * st["velocity"] + d_p
    st["velocity"] = buf
    d_p = d_p + momentum * buf if nesterov else buf
    return w - lr * d_p


def torch_adam(w, g, st, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
    """torch.optim.Adam (L2 decay added to the gradient) or AdamW (decoupled decay)."""
    b1, b2 = betas
    if decoupled:
        w = w * (1 - lr * weight_decay)
    elif weight_decay:
        g = g + weight_decay * w
    m = st.get("exp_avg", np.zeros_like(w))
    v = st.get("exp_avg_sq", np.zeros_like(w))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    st["exp_avg"], st["exp_avg_sq"] = m, v
    bias1, bias2 = 1 - b1**t, 1 - b2**t
    denom = np.sqrt(v) / math.sqrt(bias2) + eps
    return w - (lr / bias1) * m / denom


def torch_adamw(w, g, st, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    return torch_adam(w, g, st, t, lr, betas, eps, weight_decay, decoupled=True)


REFERENCE = {
    "SGD": torch_sgd,
    "Momentum": torch_momentum,
    "Adam": torch_adam,
    "AdamW": torch_adamw,
}

CONFIGS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "weight_decay": 0.05}),
    ("Momentum", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    ("Momentum", {"lr": 0.05, "momentum": 0.8, "nesterov": True}),
    ("Momentum", {"lr": 0.05, "momentum": 0.7, "weight_decay": 0.02, "nesterov": True}),
    ("Adam", {"lr": 0.05}),
    ("Adam", {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1}),
    ("AdamW", {"lr": 0.05, "betas": (0.9, 0.99), "weight_decay": 0.1}),
    ("AdamW", {"lr": 0.02}),  # the default decay, 0.01
]

LAYOUTS = {  # world -> [(mesh shape, placements)]
    1: [((1,), [S0]), ((1,), [S1]), ((1,), [R])],
    2: [((2,), [S0]), ((2,), [S1]), ((2,), [R])],
    4: [((4,), [S0]), ((4,), [S1]), ((4,), [R]), ((2, 2), [S1, S0]), ((2, 2), [S0, S0])],
}


def _problem():
    """Initial weights and per-step loss data: grad_t = C_t + D * w (depends on w)."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(SHAPE)
    cs = [rng.standard_normal(SHAPE) for _ in range(STEPS)]
    d = rng.uniform(0.5, 2.0, SHAPE)
    return w0, cs, d


def _reference(kind, kwargs, w0, cs, d):
    w, st = w0.copy(), {}
    for t, c in enumerate(cs, start=1):
        w = REFERENCE[kind](w, c + d * w, st, t, **kwargs)
    return w, st


def _run(kind, kwargs, w0, cs, d, world):
    out = []
    for shape, placements in LAYOUTS[world]:
        mesh = dt.init_mesh(shape)
        w = dt.nn.Parameter(dt.shard_tensor(w0, mesh, placements))
        local = w.to_local()
        opt = getattr(dt.optim, kind)([w], **kwargs)
        for c in cs:
            opt.zero_grad()
            loss = (w * c).sum() + 0.5 * (w * w * d).sum()
            loss.backward()
            opt.step()
        assert w.to_local() is local  # updated in place: the model sees it
        assert list(w.placements) == placements and w.requires_grad and w.is_leaf
        state = {}
        for name, s in opt.state.get(id(w), {}).items():
            assert s.spec == w.spec, (name, s.spec, w.spec)
            assert s.mesh == mesh and list(s.placements) == placements
            assert s.local_shape == w.local_shape
            state[name] = s.numpy()
        out.append((shape, placements, w.numpy(), state, opt.step_count))
    return out


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize(
    "kind,kwargs",
    CONFIGS,
    ids=[k + "".join(f"-{n}={v}" for n, v in kw.items() if n != "lr") for k, kw in CONFIGS],
)
def test_matches_pytorch_formulas(kind, kwargs, world):
    w0, cs, d = _problem()
    want_w, want_state = _reference(kind, kwargs, w0, cs, d)
    assert not np.allclose(want_w, w0)
    names = {"SGD": set(), "Momentum": {"velocity"}}.get(kind, {"exp_avg", "exp_avg_sq"})
    for rank_out in dt.simulate(world, _run, kind, kwargs, w0, cs, d, world):
        for shape, placements, w, state, steps in rank_out:
            what = (kind, shape, placements)
            assert steps == STEPS
            np.testing.assert_allclose(w, want_w, rtol=1e-12, atol=1e-15, err_msg=str(what))
            assert set(state) == names, what
            for name in names:
                np.testing.assert_allclose(
                    state[name], want_state[name], rtol=1e-12, atol=1e-15, err_msg=str(what)
                )


# -- data-parallel (Partial) gradients ---------------------------------------------------------
def _dp_step(x, w0, b0, shape, kind):
    names = ["dp"] if len(shape) == 1 else ["dp", "mp"]
    mesh = dt.init_mesh(shape, dim_names=names)
    tp = len(shape) == 2
    w = dt.nn.Parameter(dt.shard_tensor(w0, mesh, [R, S1] if tp else [R]))
    b = dt.nn.Parameter(dt.shard_tensor(b0, mesh, [R, S0] if tp else [R]))
    xs = dt.shard_tensor(x, mesh, [S0, R] if tp else [S0])
    opt = getattr(dt.optim, kind)([w, b], lr=0.1)
    ((xs @ w + b) ** 2).sum().backward()
    assert w.grad.placements[0] == P and b.grad.placements[0] == P
    with dt.CommCounter() as cc:
        opt.step()
    counts = cc.counts
    for p in (w, b):  # the state, if any, has the parameter's spec (not the gradient's)
        for s in opt.state.get(id(p), {}).values():
            assert s.spec == p.spec
    return w.numpy(), b.numpy(), counts


@pytest.mark.parametrize("shape", [(2,), (3,), (4,), (2, 2)], ids=str)  # 8 rows: uneven on 3
@pytest.mark.parametrize("kind", ["SGD", "Adam"])
def test_partial_gradients_are_reduced(shape, kind):
    rng = np.random.default_rng(1)
    x, w0, b0 = rng.standard_normal((8, 3)), rng.standard_normal((3, 4)), rng.standard_normal(4)
    r = 2 * (x @ w0 + b0)
    gw, gb = x.T @ r, r.sum(axis=0)
    if kind == "SGD":
        want_w, want_b = w0 - 0.1 * gw, b0 - 0.1 * gb
    else:
        want_w = torch_adam(w0, gw, {}, 1, 0.1)
        want_b = torch_adam(b0, gb, {}, 1, 0.1)
    for w, b, counts in dt.simulate(math.prod(shape), _dp_step, x, w0, b0, shape, kind):
        # both reduce over dp: one all-reduce of the two packed together, nothing else
        assert counts == {"all_reduce": 1}, counts
        np.testing.assert_allclose(w, want_w, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(b, want_b, rtol=1e-12, atol=1e-14)


LEFT = ("moves", "max")  # .grad not in the parameter's placements after the step


def _grouped_step(device: str, fuse: bool):
    """Gradients Partial over dp, over mp, over both, in two dtypes, one that must also move
    between Shard layouts, one alone in its group: the step's all-reduces, each gradient's
    placements after the step, and the parameters."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import fake_device

    fake_device.install()
    dt.set_device(device)
    mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
    rng = np.random.default_rng(5)
    PM = dt.Partial("max")
    layouts = {  # name: (parameter placements, gradient placements, dtype)
        "both": ([R, R], [P, P], F64),
        "both2": ([R, R], [P, P], F64),
        "dp": ([R, S1], [P, S1], F64),
        "dp2": ([R, R], [P, R], F64),
        "mp": ([S0, R], [S0, P], F64),
        "mp2": ([R, R], [R, P], F64),
        "f32a": ([R, R], [P, R], np.float32),
        "f32b": ([R, S0], [P, S0], np.float32),
        "moves": ([R, S1], [P, S0], F64),  # reduced with dp's group, then moved
        "max": ([R, R], [PM, R], F64),  # alone in its group (max over dp): its own all-reduce
    }
    params, grads = {}, {}
    for name, (ppl, gpl, dtype) in layouts.items():
        w = rng.standard_normal((5, 3)).astype(dtype)
        g = rng.standard_normal((5, 3)).astype(dtype)
        params[name] = dt.nn.Parameter(dt.shard_tensor(w, mesh, ppl))
        # a Partial with these parts: each rank's own share of g (its global value is g)
        spec = dt.shard_tensor(g, mesh, [R if p.is_partial() else p for p in gpl])
        parts = dt.reshard(spec, mesh, gpl)
        grads[name] = parts
    opt = dt.optim.SGD(list(params.values()), lr=0.5)
    for name, p in params.items():
        p.grad = grads[name]
    if not fuse:  # the reference: every gradient resharded on its own, before the step
        for p in params.values():
            p.grad = dt.reshard(p.grad, mesh, p.placements)
    with dt.CommCounter() as cc:
        opt.step()
    shards = [type(p.to_local()).__name__ for p in params.values()]
    return (
        cc.counts,
        {n: p.grad.placements == p.placements for n, p in params.items() if n not in LEFT},
        {n: p.numpy() for n, p in params.items()},
        shards,
    )


@pytest.mark.parametrize("device", ["cpu", "fake"])
def test_partial_gradients_are_reduced_together_per_group(device):
    """Note [Gradients reduced at the step]: one all-reduce per (mesh dims, dtype, reduce
    type) group of two or more gradients; the rest as before; values those of reducing each
    gradient on its own (bit for bit: two-rank groups)."""
    got = dt.simulate(4, _grouped_step, device, True)
    for counts, reduced, _, shards in got:
        # groups {both, both2}, {dp, dp2, moves}, {mp, mp2}, {f32a, f32b}: one each; max
        # alone: its own; moves then goes from Shard(0) to Shard(1): an all-to-all
        assert counts == {"all_reduce": 4 + 1, "all_to_all": 1}, counts
        assert all(reduced.values()), reduced
        assert set(shards) == {"ndarray" if device == "cpu" else "FakeArray"}, shards
    ref = dt.simulate(4, _grouped_step, device, False)
    for (_, _, values, _), (_, _, want, _) in zip(got, ref):
        for name in want:
            np.testing.assert_array_equal(values[name], want[name], err_msg=name)


def _no_comm_steps():
    mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
    params = [
        dt.nn.Parameter(dt.shard_tensor(np.ones((4, 6)), mesh, pl))
        for pl in ([S0, R], [R, S1], [S0, S1], [R, R])
    ]
    opt = dt.optim.Adam(params, lr=0.1)
    counts = []
    for _ in range(3):
        opt.zero_grad()
        sum(((p * p).sum() for p in params[1:]), (params[0] * params[0]).sum()).backward()
        assert all(p.grad.spec == p.spec for p in params)
        with dt.CommCounter() as cc:
            opt.step()
        counts.append(cc.total)
    return counts


def test_no_collectives_when_grads_have_param_placements():
    for counts in dt.simulate(4, _no_comm_steps):
        assert counts == [0, 0, 0]


def _moved_grad():
    """A gradient in another layout than its parameter is resharded (here S(1) -> S(0))."""
    mesh = dt.init_mesh((2,))
    w = dt.nn.Parameter(dt.shard_tensor(np.arange(8.0).reshape(2, 4), mesh, [S0]))
    w.grad = dt.shard_tensor(np.ones((2, 4)), mesh, [S1])
    opt = dt.optim.SGD([w], lr=0.5)
    with dt.CommCounter() as cc:
        opt.step()
    return w.numpy(), cc.total


def test_grad_in_other_placements_is_resharded():
    for w, total in dt.simulate(2, _moved_grad):
        np.testing.assert_array_equal(w, np.arange(8.0).reshape(2, 4) - 0.5)
        assert total >= 1


# -- bookkeeping, schedules, errors ------------------------------------------------------------
def _param(value, placements=None):
    mesh = dt.ProcessMesh([0])
    return dt.nn.Parameter(dt.shard_tensor(np.asarray(value, F64), mesh, placements or [R]))


def test_params_without_grad_are_skipped_and_state_dict():
    w, b, c = _param([1.0, 2.0]), _param([3.0]), _param([[5.0, 6.0]])
    opt = dt.optim.Adam([w, b, c], lr=0.1)
    for _ in range(2):
        ((w * w).sum() + (b * 3).sum()).backward()
        opt.step()
        opt.zero_grad()
    assert w.grad is None and b.grad is None and c.grad is None
    np.testing.assert_array_equal(c.numpy(), [[5.0, 6.0]])
    assert id(c) not in opt.state
    sd = opt.state_dict()
    assert sd["step"] == 2 and opt.step_count == 2
    assert set(sd["state"]) == {0, 1}
    assert set(sd["state"][0]) == {"exp_avg", "exp_avg_sq"}
    assert sd["state"][0]["exp_avg"] is opt.state[id(w)]["exp_avg"]
    assert sd["state"][1]["exp_avg"].shape == (1,)
    # b's gradient is the constant 3: two Adam steps of lr each (m_hat / sqrt(v_hat) = 1)
    np.testing.assert_allclose(b.numpy(), [3.0 - 0.2], rtol=1e-7)
    assert dt.optim.SGD([w]).state_dict() == {"step": 0, "state": {}}


def test_zero_grad():
    w, b = _param([1.0]), _param([2.0])
    opt = dt.optim.Momentum([w, b])
    ((w * b).sum()).backward()
    assert w.grad is not None and b.grad is not None
    opt.zero_grad()
    assert w.grad is None and b.grad is None


def test_duplicate_params_deduplicated():
    w, b = _param([1.0, 2.0]), _param([0.0])
    opt = dt.optim.SGD([w, w, b, w], lr=0.5)
    assert opt.params == [w, b] and opt.params[0] is w
    (w.sum() + b.sum()).backward()
    opt.step()  # one update, not three
    np.testing.assert_array_equal(w.numpy(), [0.5, 1.5])
    np.testing.assert_array_equal(b.numpy(), [-0.5])


def test_schedule_values():
    sd = dt.optim.step_decay(1.0, every=3, gamma=0.5)
    assert [sd(s) for s in range(1, 8)] == [1, 1, 1, 0.5, 0.5, 0.5, 0.25]
    cos = dt.optim.cosine(1.0, total=4, final=0.1)
    want = [0.1 + 0.45 * (1 + math.cos(math.pi * s / 4)) for s in range(5)]
    assert [cos(s) for s in range(5)] == pytest.approx(want, rel=1e-15)
    assert cos(4) == pytest.approx(0.1) and cos(9) == pytest.approx(0.1)
    assert cos(2) == pytest.approx(0.55)
    wu = dt.optim.linear_warmup(0.2, warmup=4)
    assert [wu(s) for s in range(1, 7)] == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2, 0.2])
    both = dt.optim.linear_warmup(dt.optim.cosine(0.1, total=100), warmup=10)
    peak = 0.05 * (1 + math.cos(math.pi * 0.1))
    assert both(5) == pytest.approx(peak / 2) and both(10) == pytest.approx(peak)
    assert both(100) == pytest.approx(0.0, abs=1e-15)


def test_lr_schedule_in_optimizer_and_set_lr():
    calls = []

    def sched(step):
        calls.append(step)
        return 0.1 * step

    w = _param([1.0, 1.0])
    opt = dt.optim.SGD([w], lr=sched)
    assert opt.lr == pytest.approx(0.1)  # before any step: the first step's rate
    for _ in range(3):
        opt.zero_grad()
        (w * np.array([1.0, 2.0])).sum().backward()
        opt.step()
    assert set(calls) == {1, 2, 3} and calls.index(3) > calls.index(2) > calls.index(1)
    # gradient (1, 2) at rates 0.1, 0.2, 0.3
    np.testing.assert_allclose(w.numpy(), [1 - 0.6, 1 - 1.2], rtol=1e-14)
    assert opt.lr == pytest.approx(0.3)
    opt.set_lr(0.5)
    assert opt.lr == 0.5
    opt.step()  # the old gradient is still there
    np.testing.assert_allclose(w.numpy(), [0.4 - 0.5, -0.2 - 1.0], rtol=1e-14)
    opt.set_lr(dt.optim.step_decay(1.0, every=2))
    assert opt.lr == pytest.approx(0.1)  # step 4: 1.0 * 0.1 ** ((4 - 1) // 2)
    with pytest.raises(ValueError, match="learning rate"):
        opt.set_lr(-0.1)
    assert opt.lr == pytest.approx(0.1)  # unchanged
    opt.step()  # step 5 runs at 0.1 ** 2
    np.testing.assert_allclose(w.numpy(), [-0.1 - 0.01, -1.2 - 0.02], rtol=1e-14)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), -1e-9])
def test_invalid_lr(bad):
    with pytest.raises(ValueError, match="learning rate"):
        dt.optim.SGD([_param([1.0])], lr=bad)
    with pytest.raises(ValueError, match="learning rate"):
        dt.optim.Adam([_param([1.0])], lr=bad)


def test_bad_parameters():
    with pytest.raises(ValueError, match="empty"):
        dt.optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="empty"):
        dt.optim.AdamW(iter([]))
    with pytest.raises(TypeError, match="DistTensor"):
        dt.optim.SGD([np.ones(2)], lr=0.1)
    partial = dt.dtensor_from_local(np.ones(2), dt.ProcessMesh([0]), [P]).requires_grad_()
    with pytest.raises(ValueError, match="Partial"):
        dt.optim.Adam([_param([1.0]), partial])
    # a generator is consumed once, in order
    ws = [_param([float(i)]) for i in range(3)]
    assert dt.optim.Momentum(w for w in ws).params == ws


def _partial_param():
    mesh = dt.ProcessMesh([0, 1])
    p = dt.dtensor_from_local(np.ones(3), mesh, [P]).requires_grad_()
    try:
        dt.optim.SGD([p], lr=0.1)
    except ValueError as e:
        return str(e)
    return None


def test_partial_parameter_raises_on_every_rank():
    msgs = dt.simulate(2, _partial_param)
    assert all(m is not None and "Partial" in m for m in msgs)
