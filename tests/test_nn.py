"""dt.nn: Module bookkeeping, every layer against a numpy reference (forward and parameter
gradients in float64), seeded initialization across meshes, Dropout masks, shard_layer and
the tensor-parallel plans, on simulated ranks.
"""

from __future__ import annotations

import math

import numpy as np
import oracle
import pytest
from op_cases import every_rank

import disttensor as dt

S0, S1, R, P = dt.Shard(0), dt.Shard(1), dt.Replicate(), dt.Partial()
F64 = np.float64


@pytest.fixture(autouse=True)
def _keep_global_stream():
    """Tests here call dt.manual_seed on the main thread: leave its stream as it was."""
    from disttensor import creation

    saved = dict(vars(creation._rng))
    yield
    vars(creation._rng).clear()
    vars(creation._rng).update(saved)


def _close(got, want, rtol=1e-12, atol=1e-13, what=""):
    got = np.asarray(got)
    assert got.shape == np.shape(want), (what, got.shape, np.shape(want))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=str(what))


def _params(module) -> dict[str, np.ndarray]:
    return {n: p.numpy() for n, p in module.named_parameters()}


# -- numpy references ---------------------------------------------------------------------------
def np_linear(x, w, b=None):
    y = x @ w
    return y if b is None else y + b


def np_layer_norm(x, w=None, b=None, naxes=1, eps=1e-5):
    axes = tuple(range(x.ndim - naxes, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def np_cross_entropy(logits, labels, axis=-1):
    lg = np.moveaxis(logits, axis, -1)
    m = lg.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(lg - m).sum(axis=-1, keepdims=True)))[..., 0]
    picked = np.take_along_axis(lg, labels[..., None], axis=-1)[..., 0]
    return lse - picked


def np_attention(x, p, heads, prefix="", causal=True):
    """Multi-head self-attention written from scratch: weights are (in, out), y = x @ W + b."""
    b, n, d = x.shape
    hd = d // heads

    def proj(name, t):
        return t @ p[f"{prefix}{name}.weight"] + p[f"{prefix}{name}.bias"]

    def split(t):  # (b, n, d) -> (b, heads, n, hd)
        return t.reshape(b, n, heads, hd).transpose(0, 2, 1, 3)

    q, k, v = (split(proj(name, x)) for name in ("q", "k", "v"))
    scores = np.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(hd)
    if causal:
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    out = np.einsum("bhij,bhjd->bhid", np_softmax(scores, -1), v)
    return proj("proj", out.transpose(0, 2, 1, 3).reshape(b, n, d))


def np_mlp(x, p, prefix=""):
    h = np_gelu(x @ p[f"{prefix}fc1.weight"] + p[f"{prefix}fc1.bias"])
    return h @ p[f"{prefix}fc2.weight"] + p[f"{prefix}fc2.bias"]


def np_block(x, p, heads, prefix=""):
    def ln(name, t):
        return np_layer_norm(t, p[f"{prefix}{name}.weight"], p[f"{prefix}{name}.bias"])

    x = x + np_attention(ln("ln1", x), p, heads, f"{prefix}attn.")
    return x + np_mlp(ln("ln2", x), p, f"{prefix}mlp.")


def fd_grads(f, params: dict[str, np.ndarray], eps=1e-6) -> dict[str, np.ndarray]:
    """Central differences of the scalar ``f(params)`` with respect to every parameter."""
    out = {}
    for name, value in params.items():
        g = np.zeros_like(value)
        for i in np.ndindex(value.shape):
            old = value[i]
            value[i] = old + eps
            hi = f(params)
            value[i] = old - eps
            lo = f(params)
            value[i] = old
            g[i] = (hi - lo) / (2 * eps)
        out[name] = g
    return out


def _randomize(module, rng, scale=0.5):
    """Load random values into every parameter (LayerNorm starts at 1/0: too special)."""
    module.load_state_dict(
        {n: rng.standard_normal(p.shape) * scale for n, p in module.named_parameters()}
    )


# -- Module bookkeeping ------------------------------------------------------------------------
class Pair(dt.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = dt.nn.Linear(2, 3, seed=0, dtype=F64)
        self.b = dt.nn.Linear(3, 2, seed=1, dtype=F64)
        self.scale = dt.nn.Parameter(dt.ones((2,), F64))

    def forward(self, x):
        return self.b(self.a(x)) * self.scale


def test_attribute_registration():
    m = Pair()
    assert list(m._modules) == ["a", "b"]
    assert list(m._parameters) == ["scale"]
    assert m.scale.requires_grad and m.scale.is_leaf
    assert list(m.children()) == [m.a, m.b]
    assert [type(x).__name__ for x in m.modules()] == ["Pair", "Linear", "Linear"]
    # a DistTensor that needs no gradient is a plain attribute, not a parameter
    m.const = dt.ones((2,), F64)
    assert "const" not in m._parameters and "const" not in dict(m.named_parameters())
    # reassigning a parameter name to something else unregisters it
    m.scale = None
    assert m.scale is None and "scale" not in dict(m.named_parameters())
    m.scale = dt.nn.Parameter(dt.ones((2,), F64))
    assert "scale" in dict(m.named_parameters())
    del m.scale
    with pytest.raises(AttributeError):
        _ = m.scale
    del m.b
    assert [n for n, _ in m.named_parameters()] == ["a.weight", "a.bias"]
    with pytest.raises(AttributeError, match="nope"):
        _ = m.nope


def test_named_parameters_order_and_names():
    shared = dt.nn.Linear(2, 2, seed=3, dtype=F64)
    net = dt.nn.Sequential(
        dt.nn.Linear(2, 2, seed=0, dtype=F64),
        dt.nn.ModuleList([dt.nn.LayerNorm(2, dtype=F64), shared, dt.nn.ReLU()]),
        dt.nn.Sequential(dt.nn.Tanh(), shared),  # the same module twice: listed once
        dt.nn.Linear(2, 1, bias=False, seed=1, dtype=F64),
    )
    net[3].tied = net[0].weight  # the same parameter under a second name: listed once
    names = [n for n, _ in net.named_parameters()]
    assert names == [
        "0.weight",
        "0.bias",
        "1.0.weight",
        "1.0.bias",
        "1.1.weight",
        "1.1.bias",
        "3.weight",
    ]
    assert [id(p) for p in net.parameters()] == [id(p) for _, p in net.named_parameters()]
    assert len(net) == 4 and len(net[1]) == 3 and net[1][1] is shared
    assert list(net[2]) == [net[2][0], shared]
    assert [n for n, _ in net.named_parameters(prefix="model")][:2] == [
        "model.0.weight",
        "model.0.bias",
    ]
    ml = dt.nn.ModuleList()
    ml.append(dt.nn.Linear(1, 1, seed=0))
    assert [n for n, _ in ml.named_parameters()] == ["0.weight", "0.bias"]


def test_state_dict_returns_the_parameters():
    m = Pair()
    sd = m.state_dict()
    assert list(sd) == ["scale", "a.weight", "a.bias", "b.weight", "b.bias"]
    assert sd["a.weight"] is m.a.weight and sd["scale"] is m.scale


def test_load_state_dict_from_numpy():
    m = Pair()
    rng = np.random.default_rng(0)
    new = {n: rng.standard_normal(p.shape) for n, p in m.state_dict().items()}
    before = {n: id(p) for n, p in m.named_parameters()}
    m.load_state_dict(new)
    for n, p in m.named_parameters():
        assert id(p) == before[n] and p.requires_grad and p.is_leaf
        np.testing.assert_array_equal(p.numpy(), new[n])
    # lists and float32 values are accepted too (cast to the parameter's dtype)
    m.load_state_dict({**new, "scale": [3.0, 4.0]})
    np.testing.assert_array_equal(m.scale.numpy(), [3.0, 4.0])


def test_load_state_dict_strict_errors_change_nothing():
    m = Pair()
    old = _params(m)
    good = {n: np.full(v.shape, 7.0) for n, v in old.items()}

    def unchanged():
        for n, v in _params(m).items():
            np.testing.assert_array_equal(v, old[n])

    missing = dict(good)
    del missing["b.bias"]
    with pytest.raises(KeyError, match=r"missing keys \['b.bias'\]"):
        m.load_state_dict(missing)
    unchanged()
    with pytest.raises(KeyError, match=r"unexpected keys \['c.weight'\]"):
        m.load_state_dict({**good, "c.weight": np.ones(2)})
    unchanged()
    bad_shape = {**good, "b.bias": np.ones(3)}  # the wrong entry comes last
    with pytest.raises(ValueError, match=r"b\.bias"):
        m.load_state_dict(bad_shape)
    unchanged()
    with pytest.raises(ValueError, match=r"b\.bias"):
        m.load_state_dict({"a.weight": good["a.weight"], "b.bias": np.ones(3)}, strict=False)
    unchanged()
    # not strict: unknown names are ignored, missing ones keep their values
    m.load_state_dict({"a.bias": np.ones(3), "zzz": np.ones(5)}, strict=False)
    np.testing.assert_array_equal(m.a.bias.numpy(), np.ones(3))
    np.testing.assert_array_equal(m.b.weight.numpy(), old["b.weight"])


def _load_resharded():
    mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
    net = dt.nn.Sequential(
        dt.nn.Linear(4, 6, seed=0, dtype=F64), dt.nn.Linear(6, 5, seed=1, dtype=F64)
    )
    plan = {"0": dt.nn.ColwiseParallel("mp"), "1": dt.nn.RowwiseParallel(0)}
    dt.shard_layer(net, mesh, dt.nn.plan_shard_fn(plan))
    specs = {n: (p.mesh, list(p.placements), id(p)) for n, p in net.named_parameters()}
    rng = np.random.default_rng(1)
    values = {n: rng.standard_normal(p.shape) for n, p in net.named_parameters()}
    line = dt.ProcessMesh([3, 1, 0, 2], dim_names=["x"])
    sources = {
        "0.weight": dt.shard_tensor(values["0.weight"], line, [S0]),
        "0.bias": dt.shard_tensor(values["0.bias"], mesh, [S0, R]),
        "1.weight": dt.shard_tensor(values["1.weight"], mesh, [S1, S0]),
        "1.bias": dt.shard_tensor(values["1.bias"], dt.ProcessMesh([0, 1, 2, 3]), [R]),
    }
    net.load_state_dict(sources)
    for n, p in net.named_parameters():
        assert (p.mesh, list(p.placements), id(p)) == specs[n], n
        assert p.is_leaf and p.requires_grad
        np.testing.assert_array_equal(p.numpy(), values[n])
    return True


def test_load_state_dict_from_other_mesh_and_placements():
    assert all(dt.simulate(4, _load_resharded))


def _load_from_sub_mesh():
    mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
    lin = dt.nn.Linear(4, 6, seed=0, dtype=F64)
    dt.shard_layer(lin, mesh, dt.nn.plan_shard_fn({"": dt.nn.ColwiseParallel("mp")}))
    value = np.arange(24.0).reshape(4, 6)
    sub = dt.ProcessMesh([2, 3])  # ranks 0 and 1 hold none of the source
    lin.load_state_dict({"weight": dt.shard_tensor(value, sub, [S1]), "bias": np.zeros(6)})
    assert list(lin.weight.placements) == [R, S1]
    np.testing.assert_array_equal(lin.weight.numpy(), value)
    return True


def test_load_state_dict_from_sub_mesh():
    assert all(dt.simulate(4, _load_from_sub_mesh))


def _reload_own_state():
    mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
    net = dt.nn.MLP(4, 8, seed=0, dtype=F64)
    plan = {"fc1": dt.nn.ColwiseParallel("mp"), "fc2": dt.nn.RowwiseParallel("mp")}
    dt.shard_layer(net, mesh, dt.nn.plan_shard_fn(plan))
    assert list(net.fc1.weight.placements) == [R, S1]
    own = {n: p.detach() for n, p in net.named_parameters()}  # already in place
    with dt.CommCounter() as cc:
        net.load_state_dict(own)
    return cc.counts


def test_load_state_dict_in_place_values_move_nothing():
    assert every_rank(dt.simulate(4, _reload_own_state)) == {}


def test_train_eval_propagate():
    net = dt.nn.Sequential(dt.nn.Dropout(0.5), dt.nn.ModuleList([dt.nn.Dropout(0.1)]))
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net[1].train()
    assert not net.training and net[1].training and net[1][0].training
    net.train()
    assert all(m.training for m in net.modules())


def test_zero_grad():
    m = Pair()
    (m(np.ones((3, 2))) ** 2).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_only_parameters_register():
    m = dt.nn.Module()
    w = dt.nn.Parameter(dt.ones((2,), F64))
    m.h = w * 2  # an activation (e.g. cached in forward): a plain attribute
    assert "h" not in m._parameters and m.h.requires_grad
    m.x = dt.ones((2,), F64, requires_grad=True)  # a leaf input: not a parameter either
    assert "x" not in m._parameters
    m.w = w
    assert m._parameters["w"] is w
    with pytest.raises(ValueError, match="leaf"):  # replacing a parameter by a non-leaf
        m.w = w * 2
    m.w = dt.ones((2,), F64, requires_grad=True)  # a resharded copy (a shard_fn): registered
    assert isinstance(m._parameters["w"], dt.nn.Parameter)
    with pytest.raises(TypeError):
        dt.nn.Parameter(np.ones(2))


class _Tied(dt.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = dt.nn.Linear(3, 3, seed=0, dtype=F64)
        self.b = dt.nn.Linear(3, 3, seed=1, dtype=F64)
        self.b.weight = self.a.weight  # weight tying

    def forward(self, x):
        return self.b(dt.tanh(self.a(x)))


def _tied_step(plan):
    m = _Tied()
    if plan is not None:
        mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
        dt.shard_layer(m, mesh, dt.nn.plan_shard_fn(plan))
    opt = dt.optim.SGD(list(m.parameters()), lr=0.1)
    (m(np.arange(6.0).reshape(2, 3) / 5) ** 2).sum().backward()
    opt.step()
    return len(opt.params), m.a.weight is m.b.weight, m.a.weight.numpy()


@pytest.mark.parametrize(
    "plan", [{}, {"a": dt.nn.ColwiseParallel("mp")}], ids=["replicate", "one-side-planned"]
)
def test_shard_layer_keeps_tied_parameters_tied(plan):
    n, tied, value = every_rank(dt.simulate(4, _tied_step, None))
    got = every_rank(dt.simulate(4, _tied_step, plan))
    assert (n, tied) == (3, True) and got[:2] == (3, True)
    np.testing.assert_allclose(got[2], value, rtol=1e-12)


def test_shard_layer_refuses_a_tied_parameter_placed_two_ways():
    def body():
        plan = {"a": dt.nn.ColwiseParallel("mp"), "b": dt.nn.RowwiseParallel("mp")}
        with pytest.raises(ValueError, match="placed two ways"):
            _tied_step(plan)

    dt.simulate(4, body)


def test_forward_not_defined():
    with pytest.raises(NotImplementedError, match="forward"):
        dt.nn.Module()(1)

    class NoInit(dt.nn.Module):
        def __init__(self):
            self.x = 1

    with pytest.raises(AttributeError, match="__init__"):
        NoInit()


# -- layers against numpy ------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    layer = dt.nn.Linear(5, 3, bias=bias, seed=4, dtype=F64)
    p = _params(layer)
    bound = 1 / math.sqrt(5)
    assert all(np.abs(v).max() <= bound for v in p.values())
    assert layer.weight.shape == (5, 3) and (layer.bias is None) == (not bias)
    assert list(p) == (["weight", "bias"] if bias else ["weight"])
    x = np.random.default_rng(0).standard_normal((2, 4, 5))
    _close(layer(x).numpy(), np_linear(x, p["weight"], p.get("bias")))


def test_embedding():
    emb = dt.nn.Embedding(7, 3, std=0.5, seed=2, dtype=F64)
    w = emb.weight.numpy()
    assert w.shape == (7, 3)
    ids = np.array([[0, 6, 3], [3, -1, 2]])
    _close(emb(ids).numpy(), w[ids])
    ref = dt.nn.Embedding(7, 3, seed=2, dtype=F64).weight.numpy()
    _close(w, 0.5 * ref)  # std scales the same N(0, 1) draw


@pytest.mark.parametrize("shape,affine", [(4, True), (4, False), ((3, 4), True), ((3, 4), False)])
def test_layer_norm(shape, affine):
    ln = dt.nn.LayerNorm(shape, elementwise_affine=affine, eps=1e-4, dtype=F64)
    naxes = 1 if isinstance(shape, int) else len(shape)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4)) * 3 + 1
    if affine:
        np.testing.assert_array_equal(ln.weight.numpy(), np.ones(ln.normalized_shape))
        np.testing.assert_array_equal(ln.bias.numpy(), np.zeros(ln.normalized_shape))
        _randomize(ln, rng)
        p = _params(ln)
        want = np_layer_norm(x, p["weight"], p["bias"], naxes, 1e-4)
    else:
        assert list(ln.named_parameters()) == []
        want = np_layer_norm(x, naxes=naxes, eps=1e-4)
    xt = dt.shard_tensor(x, dt.ProcessMesh([0]), [R])
    _close(ln(xt).numpy(), want, rtol=1e-10, atol=1e-12)
    _close(ln(x), want, rtol=1e-10, atol=1e-12)  # numpy in, numpy out


@pytest.mark.parametrize(
    "layer,ref",
    [
        (dt.nn.ReLU(), lambda x: np.maximum(x, 0)),
        (dt.nn.GELU(), np_gelu),
        (dt.nn.Tanh(), np.tanh),
        (dt.nn.Sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
        (dt.nn.Softmax(), np_softmax),
        (dt.nn.Softmax(axis=0), lambda x: np_softmax(x, 0)),
        (dt.nn.Identity(), lambda x: x),
    ],
    ids=["relu", "gelu", "tanh", "sigmoid", "softmax", "softmax0", "identity"],
)
def test_activations(layer, ref):
    x = np.random.default_rng(2).standard_normal((3, 5)) * 3
    xt = dt.shard_tensor(x, dt.ProcessMesh([0]), [R])
    assert list(layer.named_parameters()) == []
    _close(layer(xt).numpy(), ref(x))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    at = dt.shard_tensor(a, dt.ProcessMesh([0]), [R])
    sq = (a - b) ** 2
    want = {"mean": sq.mean(), "sum": sq.sum(), "none": sq}[reduction]
    _close(dt.nn.MSELoss(reduction)(at, b).numpy(), want)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_loss(reduction):
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((5, 7)) * 4
    labels = rng.integers(0, 7, 5)
    per_row = np_cross_entropy(logits, labels)
    want = {"mean": per_row.mean(), "sum": per_row.sum(), "none": per_row}[reduction]
    lt = dt.shard_tensor(logits, dt.ProcessMesh([0]), [R])
    _close(dt.nn.CrossEntropyLoss(reduction)(lt, labels).numpy(), want, rtol=1e-10)
    # a class axis other than the last
    logits3 = rng.standard_normal((2, 4, 3))
    labels3 = rng.integers(0, 4, (2, 3))
    per3 = np_cross_entropy(logits3, labels3, axis=1)
    want3 = {"mean": per3.mean(), "sum": per3.sum(), "none": per3}[reduction]
    lt3 = dt.shard_tensor(logits3, dt.ProcessMesh([0]), [R])
    _close(dt.nn.CrossEntropyLoss(reduction, axis=1)(lt3, labels3).numpy(), want3, rtol=1e-10)


def test_loss_bad_reduction():
    with pytest.raises(ValueError, match="reduction"):
        dt.nn.MSELoss("avg")
    with pytest.raises(ValueError, match="reduction"):
        dt.nn.CrossEntropyLoss("max")


@pytest.mark.parametrize("causal", [True, False])
def test_multi_head_attention(causal):
    att = dt.nn.MultiHeadAttention(8, 2, causal=causal, seed=5, dtype=F64)
    assert [n for n, _ in att.named_parameters()] == [
        f"{m}.{w}" for m in ("q", "k", "v", "proj") for w in ("weight", "bias")
    ]
    x = np.random.default_rng(5).standard_normal((2, 5, 8))
    xt = dt.shard_tensor(x, dt.ProcessMesh([0]), [R])
    _close(att(xt).numpy(), np_attention(x, _params(att), 2, causal=causal), rtol=1e-10)
    with pytest.raises(ValueError, match="divisible"):
        dt.nn.MultiHeadAttention(6, 4)


def test_mlp():
    mlp = dt.nn.MLP(4, 8, seed=6, dtype=F64)
    x = np.random.default_rng(6).standard_normal((3, 4))
    _close(mlp(x).numpy(), np_mlp(x, _params(mlp)), rtol=1e-10)


def test_transformer_block():
    block = dt.nn.TransformerBlock(8, 4, mlp_ratio=2, seed=7, dtype=F64)
    rng = np.random.default_rng(7)
    _randomize(block, rng)
    assert block.mlp.fc1.weight.shape == (8, 16)
    x = rng.standard_normal((2, 3, 8))
    xt = dt.shard_tensor(x, dt.ProcessMesh([0]), [R])
    _close(block(xt).numpy(), np_block(x, _params(block), 4), rtol=1e-10)


# -- parameter gradients against finite differences -------------------------------------------
def _check_grads(module, x, ref, rtol=1e-6, atol=1e-8):
    cot = np.random.default_rng(11).standard_normal(np.shape(ref(x, _params(module))))
    xt = dt.shard_tensor(x, dt.ProcessMesh([0]), [R])
    (module(xt) * cot).sum().backward()
    want = fd_grads(lambda p: float(np.sum(ref(x, p) * cot)), _params(module))
    for n, p in module.named_parameters():
        _close(p.grad.numpy(), want[n], rtol=rtol, atol=atol, what=n)


def test_linear_grads():
    layer = dt.nn.Linear(3, 2, seed=8, dtype=F64)
    x = np.random.default_rng(8).standard_normal((4, 3))
    _check_grads(layer, x, lambda x, p: np_linear(x, p["weight"], p["bias"]))


def test_layer_norm_grads():
    ln = dt.nn.LayerNorm(5, dtype=F64)
    rng = np.random.default_rng(9)
    _randomize(ln, rng)
    x = rng.standard_normal((3, 5))
    _check_grads(ln, x, lambda x, p: np_layer_norm(x, p["weight"], p["bias"]))


def test_attention_grads():
    att = dt.nn.MultiHeadAttention(4, 2, seed=9, dtype=F64)
    x = np.random.default_rng(10).standard_normal((2, 3, 4))
    _check_grads(att, x, lambda x, p: np_attention(x, p, 2))


def _sharded_attention_grads(x, cot):
    mesh = dt.ProcessMesh([0, 1], dim_names=["mp"])
    att = dt.nn.MultiHeadAttention(4, 2, seed=9, dtype=F64)
    plan = {n: dt.nn.ColwiseParallel() for n in "qkv"} | {"proj": dt.nn.RowwiseParallel()}
    dt.shard_layer(att, mesh, dt.nn.plan_shard_fn(plan))
    (att(dt.shard_tensor(x, mesh, [R])) * cot).sum().backward()
    return {n: (p.grad.numpy(), list(p.placements)) for n, p in att.named_parameters()}


def test_attention_grads_tensor_parallel():
    att = dt.nn.MultiHeadAttention(4, 2, seed=9, dtype=F64)
    rng = np.random.default_rng(12)
    x, cot = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    want = fd_grads(lambda p: float(np.sum(np_attention(x, p, 2) * cot)), _params(att))
    for got in dt.simulate(2, _sharded_attention_grads, x, cot):
        assert got["q.weight"][1] == [S1] and got["proj.weight"][1] == [S0]
        for n, (g, _) in got.items():
            _close(g, want[n], rtol=1e-6, atol=1e-8, what=n)


# -- initialization across meshes ---------------------------------------------------------------
class Net(dt.nn.Module):
    """Embedding -> TransformerBlock -> LayerNorm -> Linear head, every weight unseeded."""

    def __init__(self, vocab=11, dim=8, heads=2):
        super().__init__()
        self.emb = dt.nn.Embedding(vocab, dim, std=0.5, dtype=F64)
        self.block = dt.nn.TransformerBlock(dim, heads, mlp_ratio=2, dtype=F64)
        self.ln = dt.nn.LayerNorm(dim, dtype=F64)
        self.head = dt.nn.Linear(dim, vocab, dtype=F64)

    def forward(self, ids):
        return self.head(self.ln(self.block(self.emb(ids))))


def _net_plan(mesh_dim):
    plan = dict(dt.nn.megatron_plan("block", mesh_dim))
    plan["emb"] = dt.nn.VocabParallel(mesh_dim)
    plan["head"] = dt.nn.ColwiseParallel(mesh_dim)
    return dt.nn.plan_shard_fn(plan)


MESHES = {  # mesh shape -> (dim names, the tensor-parallel mesh dim, the batch mesh dim)
    (2,): (["mp"], None, None),
    (4,): (["mp"], 0, None),
    (2, 2): (["dp", "mp"], "mp", "dp"),
}


def _train_step_ref(seed, ids, labels):
    dt.manual_seed(seed)
    net = Net()
    loss = dt.nn.CrossEntropyLoss()(net(ids), labels)
    loss.backward()
    grads = {n: p.grad.numpy() for n, p in net.named_parameters()}
    return _params(net), float(loss.numpy()), grads


def _train_step_sharded(seed, shape, ids, labels):
    names, tp, dp = MESHES[shape]
    mesh = dt.init_mesh(shape, dim_names=names)
    dt.manual_seed(seed)
    net = Net()
    dt.shard_layer(net, mesh, _net_plan(tp))
    batch = [R] * mesh.ndim
    if dp is not None:
        batch[mesh.dim_names.index(dp)] = S0
    loss = dt.nn.CrossEntropyLoss()(
        net(dt.shard_tensor(ids, mesh, batch)), dt.shard_tensor(labels, mesh, batch)
    )
    loss.backward()
    placements = {n: list(p.placements) for n, p in net.named_parameters()}
    grads = {n: p.grad.numpy() for n, p in net.named_parameters()}
    return _params(net), float(loss.numpy()), grads, placements


@pytest.mark.parametrize("shape", list(MESHES), ids=str)
def test_init_and_training_step_match_one_rank(shape):
    """Same manual_seed: bit-identical parameters; then loss and gradients to float64
    tolerance (the sharded sums add in another order)."""
    rng = np.random.default_rng(13)
    ids, labels = rng.integers(0, 11, (4, 3)), rng.integers(0, 11, (4, 3))
    params, loss, grads = _train_step_ref(21, ids, labels)
    drawn = [v.tobytes() for n, v in params.items() if "ln" not in n]  # LayerNorms: 1 and 0
    assert len(drawn) == 15 and len(set(drawn)) == 15  # every unseeded draw is its own stream
    world = math.prod(shape)
    for got_params, got_loss, got_grads, placements in dt.simulate(
        world, _train_step_sharded, 21, shape, ids, labels
    ):
        assert list(got_params) == list(params)
        for n, v in params.items():
            np.testing.assert_array_equal(got_params[n], v, err_msg=n)
        assert placements["emb.weight"] == [R] * (len(shape) - 1) + [S0]
        assert placements["head.weight"] == [R] * (len(shape) - 1) + [S1]
        assert placements["block.mlp.fc2.weight"] == [R] * (len(shape) - 1) + [S0]
        assert placements["ln.weight"] == [R] * len(shape)
        assert abs(got_loss - loss) <= 1e-12 * abs(loss)
        for n, g in grads.items():
            _close(got_grads[n], g, rtol=1e-9, atol=1e-12, what=n)


def _seeded_block(global_seed, shape):
    mesh = dt.init_mesh(shape, dim_names=["mp"])
    dt.manual_seed(global_seed)
    dt.rand((3,))  # move the global stream along
    block = dt.nn.TransformerBlock(8, 2, seed=4, dtype=F64)
    emb = dt.nn.Embedding(5, 8, seed=4, dtype=F64)
    # a bare block: its sub-layer names carry no prefix (see test_megatron_plan_bare_block)
    col, row = dt.nn.ColwiseParallel(), dt.nn.RowwiseParallel()
    plan = {"attn.[qkv]": col, "attn.proj": row, "mlp.fc1": col, "mlp.fc2": row}
    dt.shard_layer(block, mesh, dt.nn.plan_shard_fn(plan))
    dt.shard_layer(emb, mesh, dt.nn.plan_shard_fn({"": dt.nn.VocabParallel()}))
    assert list(block.mlp.fc2.weight.placements) == [S0] and list(emb.weight.placements) == [S0]
    # seeded layers draw nothing from the global stream
    after = dt.rand((3,)).numpy()
    return _params(block), emb.weight.numpy(), after


def test_explicit_seed_ignores_global_stream():
    dt.manual_seed(0)
    ref_block = _params(dt.nn.TransformerBlock(8, 2, seed=4, dtype=F64))
    ref_emb = dt.nn.Embedding(5, 8, seed=4, dtype=F64).weight.numpy()
    dt.manual_seed(77)
    dt.rand((3,))
    ref_after = dt.rand((3,)).numpy()
    for shape in [(1,), (2,), (4,)]:
        for block, emb, after in dt.simulate(shape[0], _seeded_block, 77, shape):
            np.testing.assert_array_equal(emb, ref_emb)
            np.testing.assert_array_equal(after, ref_after)
            for n, v in ref_block.items():
                np.testing.assert_array_equal(block[n], v, err_msg=n)
    # different seeds: different weights; q, k, v and proj all differ from each other
    other = _params(dt.nn.TransformerBlock(8, 2, seed=5, dtype=F64))
    assert not np.array_equal(other["attn.q.weight"], ref_block["attn.q.weight"])
    qkvp = [ref_block[f"attn.{m}.weight"].tobytes() for m in ("q", "k", "v", "proj")]
    assert len(set(qkvp)) == 4


# -- Dropout ------------------------------------------------------------------------------------
def test_dropout_eval_and_trivial_p():
    x = dt.shard_tensor(np.arange(1.0, 7.0), dt.ProcessMesh([0]), [R])
    d = dt.nn.Dropout(0.5).eval()
    assert d(x) is x
    assert dt.nn.Dropout(0.0)(x) is x
    dt.manual_seed(0)
    y = dt.nn.Dropout(1.0)(x)
    np.testing.assert_array_equal(y.numpy(), np.zeros(6))
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="p must be"):
            dt.nn.Dropout(bad)
    with pytest.raises(TypeError, match="DistTensor"):
        dt.nn.Dropout(0.5)(np.ones(3))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.8])
def test_dropout_rate_and_scale(p):
    dt.manual_seed(1)
    x = dt.ones((100, 100), F64, mesh=dt.ProcessMesh([0]))
    y = dt.nn.Dropout(p)(x).numpy()
    kept = y != 0
    assert abs(1 - kept.mean() - p) < 0.03
    _close(y[kept], np.full(kept.sum(), 1 / (1 - p)))
    z = dt.nn.Dropout(p)(x).numpy()  # the next call draws another mask
    assert not np.array_equal(kept, z != 0)


def _dropout_masks(x, shape, p):
    mesh = dt.init_mesh(shape)
    out = []
    layouts = [[S0], [S1], [R]] if len(shape) == 1 else [[S0, S1], [S1, R], [R, S0]]
    for placements in layouts:
        dt.manual_seed(5)
        out.append(dt.nn.Dropout(p)(dt.shard_tensor(x, mesh, placements)).numpy())
    # a Partial(sum) input: the mask is drawn Replicate, the kept sum is scaled
    dt.manual_seed(5)
    parts = dt.dtensor_from_local(x / mesh.size, mesh, [P] * mesh.ndim)
    out.append(dt.nn.Dropout(p)(parts).numpy())
    return out


def test_dropout_mask_same_on_every_layout():
    x = np.random.default_rng(14).uniform(1, 2, (7, 6))
    dt.manual_seed(5)
    xt = dt.shard_tensor(x, dt.ProcessMesh([0]), [R])
    want = dt.nn.Dropout(0.4)(xt).numpy()
    kept = want != 0
    assert 0 < kept.sum() < x.size
    _close(want[kept], x[kept] / 0.6)
    for shape in [(1,), (2,), (4,), (2, 2)]:
        for rank_result in dt.simulate(math.prod(shape), _dropout_masks, x, shape, 0.4):
            for y in rank_result:
                np.testing.assert_array_equal(y != 0, kept, err_msg=str(shape))
                _close(y, want, rtol=1e-15, what=shape)


def _dropout_grad(x, cot, shape, placements):
    mesh = dt.init_mesh(shape)
    dt.manual_seed(8)
    xt = dt.shard_tensor(x, mesh, placements, requires_grad=True)
    y = dt.nn.Dropout(0.25)(xt)
    (y * cot).sum().backward()
    return y.numpy(), xt.grad.numpy()


def test_dropout_gradient_through_kept_items():
    rng = np.random.default_rng(15)
    x, cot = rng.uniform(1, 2, (6, 5)), rng.standard_normal((6, 5))
    for shape, placements in [((1,), [R]), ((2,), [S1]), ((4,), [S0])]:
        for y, g in dt.simulate(shape[0], _dropout_grad, x, cot, shape, placements):
            kept = y != 0
            assert 0 < kept.sum() < x.size
            _close(g, np.where(kept, cot / 0.75, 0.0), rtol=1e-15)
    dt.manual_seed(0)
    xt = dt.shard_tensor(x, dt.ProcessMesh([0]), [R], requires_grad=True)
    (dt.nn.Dropout(1.0)(xt) * cot).sum().backward()
    np.testing.assert_array_equal(xt.grad.numpy(), np.zeros_like(x))


# -- shard_layer and the plans -----------------------------------------------------------------
def _plan_placements():
    mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
    out = {}
    for key, md in [("mp", "mp"), ("idx0", 0), ("default", None)]:
        net = dt.nn.Sequential(
            dt.nn.Embedding(5, 4, seed=0, dtype=F64),
            dt.nn.Linear(4, 6, seed=1, dtype=F64),
            dt.nn.Linear(6, 4, seed=2, dtype=F64),
            dt.nn.LayerNorm(4, dtype=F64),
        )
        plan = {
            "0": dt.nn.VocabParallel(md),
            "1": dt.nn.ColwiseParallel(md),
            "2": dt.nn.RowwiseParallel(md),
        }
        dt.shard_layer(net, mesh, dt.nn.plan_shard_fn(plan))
        for n, p in net.named_parameters():
            assert p.is_leaf and p.requires_grad and p.mesh == mesh, n
        out[key] = {n: list(p.placements) for n, p in net.named_parameters()}
    with pytest.raises(ValueError, match="no dim 'tp'"):
        dt.shard_layer(
            dt.nn.Linear(2, 2), mesh, dt.nn.plan_shard_fn({"": dt.nn.ColwiseParallel("tp")})
        )
    with pytest.raises(TypeError, match="Module"):
        dt.shard_layer(lambda x: x, mesh)
    return out


def test_plan_placements():
    got = every_rank(dt.simulate(4, _plan_placements))

    def expect(m):
        def on(p):
            return [p, R] if m == 0 else [R, p]

        return {
            "0.weight": on(S0),
            "1.weight": on(S1),
            "1.bias": on(S0),
            "2.weight": on(S0),
            "2.bias": [R, R],
            "3.weight": [R, R],
            "3.bias": [R, R],
        }

    assert got["mp"] == expect(1)
    assert got["default"] == expect(1)
    assert got["idx0"] == expect(0)
    assert repr(dt.nn.ColwiseParallel("mp")) == "ColwiseParallel(mesh_dim='mp')"


def _megatron_placements(wrap):
    mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
    block = dt.nn.TransformerBlock(8, 2, seed=0, dtype=F64)
    if wrap:
        model = dt.nn.ModuleList([block])
        plan = dt.nn.megatron_plan(mesh_dim="mp")  # prefix "*" matches "0"
    else:
        model, plan = block, dt.nn.megatron_plan(mesh_dim="mp")
    dt.shard_layer(model, mesh, dt.nn.plan_shard_fn(plan))
    return {n: list(p.placements) for n, p in block.named_parameters()}


MEGATRON = {
    "ln1.weight": [R, R],
    "ln1.bias": [R, R],
    **{f"attn.{m}.weight": [R, S1] for m in "qkv"},
    **{f"attn.{m}.bias": [R, S0] for m in "qkv"},
    "attn.proj.weight": [R, S0],
    "attn.proj.bias": [R, R],
    "ln2.weight": [R, R],
    "ln2.bias": [R, R],
    "mlp.fc1.weight": [R, S1],
    "mlp.fc1.bias": [R, S0],
    "mlp.fc2.weight": [R, S0],
    "mlp.fc2.bias": [R, R],
}


def test_megatron_plan_nested_block():
    assert every_rank(dt.simulate(4, _megatron_placements, True)) == MEGATRON


def test_megatron_plan_bare_block():
    assert every_rank(dt.simulate(4, _megatron_placements, False)) == MEGATRON


def _untouched_and_io(x):
    mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
    net = dt.nn.Sequential(
        dt.nn.LayerNorm(4, dtype=F64),
        dt.nn.Linear(4, 8, seed=1, dtype=F64),
        dt.nn.GELU(),
        dt.nn.Linear(8, 4, seed=2, dtype=F64),
    )
    ref = net(x).numpy()
    calls = []

    def input_fn(args, mesh):
        calls.append("in")
        return (dt.shard_tensor(args[0], mesh, [S0, R]),)

    def output_fn(out, mesh):
        calls.append("out")
        assert out.placements[0] == S0
        return dt.reshard(out, mesh, [R, R])

    plan = {"1": dt.nn.ColwiseParallel("mp"), "3": dt.nn.RowwiseParallel("mp")}
    assert dt.shard_layer(net, mesh, dt.nn.plan_shard_fn(plan), input_fn, output_fn) is net
    ln = net[0]
    assert ln.weight.mesh == mesh and list(ln.weight.placements) == [R, R]
    assert ln.weight.is_leaf and ln.weight.requires_grad
    with dt.CommCounter() as cc:
        y = net(x)
    assert calls == ["in", "out"]
    assert list(y.placements) == [R, R]
    # the forward itself communicates nothing (the row-parallel output stays Partial over
    # mp); output_fn's reshard does the MLP's one reduction and the gather over dp
    assert cc.counts == {"all_reduce": 1, "all_gather": 1}, cc.counts
    _close(y.numpy(), ref, rtol=1e-12)
    # shard_layer again with no shard_fn: parameters already on the mesh stay put
    before = {n: (id(p), list(p.placements)) for n, p in net.named_parameters()}
    dt.shard_layer(net, mesh)
    assert {n: (id(p), list(p.placements)) for n, p in net.named_parameters()} == before
    return True


def test_shard_layer_replicates_untouched_and_applies_io_fns():
    x = np.random.default_rng(16).standard_normal((4, 4))
    assert all(dt.simulate(4, _untouched_and_io, x))


# -- moves between meshes send only what a rank does not hold ----------------------------------
def _rows(n: int, ranks: list[int], rank: int) -> set[int]:
    """The rows of n that ``rank`` holds when Shard(0) over the 1-D mesh ``ranks`` (the
    independent oracle's box) or, for a rank outside, none."""
    if rank not in ranks:
        return set()
    (box,) = oracle.local_box((n,), (len(ranks),), (S0,), (ranks.index(rank),))
    return set(range(n)[box])


# name: (source ranks, source placement, target ranks, target placement), in a world of 4
MOVES = {
    "R all -> S0 [2, 3]": ([0, 1, 2, 3], R, [2, 3], S0),
    "R all -> S0 [3, 1, 0]": ([0, 1, 2, 3], R, [3, 1, 0], S0),
    "R [0, 1] -> S0 [1, 0, 2, 3]": ([0, 1], R, [1, 0, 2, 3], S0),
    "S0 [0, 1] -> S0 [0, 1, 2, 3]": ([0, 1], S0, [0, 1, 2, 3], S0),
    "S0 [0, 1, 2, 3] -> R [1, 2]": ([0, 1, 2, 3], S0, [1, 2], R),
}


def _sends_between_meshes(n: int) -> dict:
    """Per move, what this rank sent: (messages, bytes, other collectives)."""
    g = np.arange(n * 3.0).reshape(n, 3)
    out = {}
    for name, (a, pa, b, pb) in MOVES.items():
        x = dt.shard_tensor(g, dt.ProcessMesh(a), [pa])
        with dt.CommCounter() as cc:
            y = dt.reshard(x, dt.ProcessMesh(b), [pb])
        if dt.get_rank() in b:
            np.testing.assert_array_equal(y.numpy(), g)
        out[name] = (cc["send"], cc.bytes.get("send", 0), cc.total - cc["send"])
    return out


def _expected_sends(n: int, a, pa, b, pb) -> tuple[int, int]:
    """Messages and rows all ranks together must send: each target rank receives, for each
    source piece overlapping its target rows, the rows it does not hold itself, once."""
    every = set(range(n))
    held = {r: (every if pa == R else _rows(n, a, r)) if r in a else set() for r in range(4)}
    pieces = [every] if pa == R else [_rows(n, a, r) for r in a]
    messages = rows = 0
    for t in b:
        need = every if pb == R else _rows(n, b, t)
        for piece in pieces:
            missing = (need & piece) - held[t]
            messages += bool(missing)
            rows += len(missing)
    return messages, rows


@pytest.mark.parametrize("n", [8, 7, 2])
def test_moves_between_meshes_send_nothing_from_a_ranks_own_copy(n):
    """A rank that already holds its target piece gets nothing; what moves is sent once."""
    per_rank = dt.simulate(4, _sends_between_meshes, n)
    for name, move in MOVES.items():
        messages, rows = _expected_sends(n, *move)
        sent = [r[name] for r in per_rank]
        assert sum(m for m, _, _ in sent) == messages, (name, sent)
        assert sum(nbytes for _, nbytes, _ in sent) == rows * 3 * 8, (name, sent)
        assert all(other == 0 for _, _, other in sent), (name, sent)  # no collectives


def _shard_layer_sends(target_ranks) -> dict:
    dt.manual_seed(3)
    block = dt.nn.TransformerBlock(8, 2, dtype=np.float64)
    mesh = dt.ProcessMesh(np.asarray(target_ranks), ["dp", "mp"][-np.ndim(target_ranks) :])
    with dt.CommCounter() as cc:
        dt.shard_layer(block, mesh, dt.nn.plan_shard_fn(dt.nn.megatron_plan(mesh_dim="mp")))
    return cc.counts


@pytest.mark.parametrize("target", [[[0, 1], [2, 3]], [2, 3], [3, 1]], ids=str)
def test_shard_layer_moves_nothing(target):
    """Layers start Replicate on every rank, so each rank of the target mesh takes its piece
    from its own copy: no rank sends anything, nor runs a collective."""
    assert dt.simulate(4, _shard_layer_sends, target) == [{}] * 4
