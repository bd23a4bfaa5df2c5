"""Device arrays (disttensor/backend.py, Note [Array backends]): device selection, host and
device data that must not mix, and the op, reshard and training grids on device shards.

Without a GPU the device is tests/fake_device.py's stand-in for CuPy ("fake"): arrays that
refuse numpy as CuPy's do, so a numpy-only call left on device data fails here. The grids
run on simulated ranks, each of which selects the device first; every op's result must be a
device array (``checked``) and equal numpy's, the training run must equal the host run bit
for bit (the stand-in computes with numpy). The MPI backend's host staging runs under
mpiexec with the stand-in. The GPU section runs the same grids, the training run (against
the host within rounding) and an mpiexec run with CuPy on a real GPU; it is skipped, with
the reason, where CuPy or a GPU is missing.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import sys

import fake_device
import numpy as np
import op_cases
import pytest
import spmd_cases as cases
import test_ops_elementwise as t_ew
import test_ops_linalg as t_la
import test_ops_nn as t_nn
import test_ops_reduction as t_red
import test_ops_shape as t_sh
from mpirun import ROOT, run
from op_cases import assert_grid, every_rank, mesh_of

import disttensor as dt
from disttensor import backend

S0, S1, R = dt.Shard(0), dt.Shard(1), dt.Replicate()
FAKE = fake_device.install()


def _gpu_reason() -> str | None:
    """Why the GPU section cannot run here (None: it can)."""
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install '.[gpu]')"
    try:
        backend.select("gpu")
    except RuntimeError as e:
        return str(e)
    return None


GPU_REASON = _gpu_reason()
gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs CuPy and a GPU: {GPU_REASON}")
DEVICES = ["fake", pytest.param("gpu", marks=gpu)]


def on(device: str, n: int, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on ``n`` simulated ranks that first select ``device``: every
    result."""

    def program():
        dt.set_device(device)
        return fn(*args, **kwargs)

    return dt.simulate(n, program)


def on_mesh(device: str, mesh_shape, fn, *args):
    """``fn(mesh, *args)`` on the ranks of a mesh of that shape, on ``device``."""
    mesh = mesh_of(mesh_shape)
    return on(device, mesh.size, fn, mesh, *args)


def _device_outputs(name: str, out) -> None:
    """Every DistTensor in ``out`` holds a shard of the selected device's array type."""
    want = backend.current().array_type
    for o in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(o, dt.DistTensor) and type(o.to_local()) is not want:
            raise AssertionError(f"dt.{name} gave a {type(o.to_local()).__name__} shard")


CHECKED_NAMES = (
    "exp log sigmoid gelu relu tanh abs add multiply divide less maximum subtract where clip "
    "sum mean max min prod argmax any all softmax logsumexp var matmul linear einsum dot "
    "outer reshape transpose getitem concatenate stack split broadcast_to layer_norm "
    "cross_entropy embedding reshard"
)
CHECKED = CHECKED_NAMES.split()


@pytest.fixture
def checked(monkeypatch):
    """dt's functions (looked up by name by the grids) wrapped to check that their results
    live on the selected device."""
    for name in CHECKED:
        f = getattr(dt, name)

        @functools.wraps(f)
        def wrapper(*args, _f=f, _name=name, **kwargs):
            out = _f(*args, **kwargs)
            _device_outputs(_name, out)
            return out

        monkeypatch.setattr(dt, name, wrapper)


# -- device selection ------------------------------------------------------------------------------
def test_cpu_is_the_default_and_makes_numpy_shards():
    def program():
        assert dt.get_device() == "cpu"
        x = dt.ones((4, 3), mesh=dt.ProcessMesh([0, 1]), placements=[S0])
        return type(x.to_local()), x.device

    assert on("cpu", 2, program) == [(np.ndarray, "cpu")] * 2


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is present: auto selects it")
def test_auto_without_a_gpu_is_the_cpu_and_gpu_is_a_clear_error():
    assert on("auto", 1, dt.get_device) == ["cpu"]
    with pytest.raises(RuntimeError, match="device='gpu' needs CuPy with a visible GPU"):
        dt.simulate(1, dt.set_device, "gpu")
    with pytest.raises(RuntimeError, match="needs CuPy"):
        dt.simulate(1, lambda: dt.init_mesh((1,), device="gpu"))


def test_unknown_devices_and_bad_values_raise():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        dt.simulate(1, dt.set_device, "tpu")
    with pytest.raises(TypeError, match="must be a string"):
        dt.simulate(1, dt.set_device, 0)


def test_selection_is_per_simulated_rank_and_init_mesh_selects():
    def program():
        mesh = dt.init_mesh((2,), device="fake")
        x = dt.zeros((3,), mesh=mesh, placements=[S0])
        return dt.get_device(), type(x.to_local()), x.device

    assert dt.simulate(2, program) == [("fake", fake_device.FakeArray, "fake:0")] * 2
    assert dt.get_device() == "cpu"  # the simulated ranks' choice stays theirs


def test_environment_variable_selects_the_process_device(monkeypatch):
    monkeypatch.setenv("DISTTENSOR_DEVICE", "fake")
    monkeypatch.setattr(backend, "_process", [None])  # not decided yet: read the variable
    assert dt.get_device() == "fake" and backend.current() is FAKE
    monkeypatch.setenv("DISTTENSOR_DEVICE", "gpu")
    monkeypatch.setattr(backend, "_process", [None])
    if GPU_REASON is not None:
        with pytest.raises(RuntimeError, match="needs CuPy"):
            backend.current()


# -- host and device data --------------------------------------------------------------------------
def test_numpy_is_host_to_local_is_the_device_array_and_printing_matches():
    g = cases.global_value((7, 5), np.float64)
    big = cases.global_value((60, 40), np.float32)

    def program(device):
        dt.set_device(device)
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(g, mesh, [S1])
        p = cases.make_source(big, mesh, [dt.Partial()])  # summarized: only shown items move
        return type(x.to_local()), type(x.numpy()), x.numpy(), repr(x), repr(p), x.device

    dev, host = dt.simulate(2, program, "fake")[0], dt.simulate(2, program, "cpu")[0]
    assert dev[0] is fake_device.FakeArray and dev[1] is np.ndarray
    assert np.array_equal(dev[2], g) and dev[3] == host[3] and dev[4] == host[4]
    assert dev[5] == "fake:0"


def test_to_device_copies_each_shard_and_a_device_array_is_taken_as_it_is():
    g = cases.global_value((6, 4), np.float64)

    def program():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(g, mesh, [S0])  # the CPU is selected here
        d = x.to_device("fake")
        back = d.to_device("cpu")
        local = fake_device.MODULE.asarray(g[:3] if dt.get_rank() == 0 else g[3:])
        y = dt.dtensor_from_local(local, mesh, [S0])  # a device shard: wrapped, no copy
        z = dt.shard_tensor(fake_device.MODULE.asarray(g), mesh, [S1])
        return (
            type(d.to_local()),
            d.to_device("fake") is d,
            type(back.to_local()),
            np.array_equal(back.numpy(), g),
            y.to_local() is local,
            type(z.to_local()),
            np.array_equal(z.numpy(), g),
        )

    fa = fake_device.FakeArray
    assert every_rank(dt.simulate(2, program)) == (fa, True, np.ndarray, True, True, fa, True)


def test_host_and_device_operands_in_one_op_are_a_clear_error():
    g = cases.global_value((4, 3), np.float64)

    def program():
        mesh = dt.ProcessMesh([0, 1])
        x = dt.shard_tensor(g, mesh, [S0])
        d = x.to_device("fake")  # the same spec object as x: the decision cache is shared
        errors = []
        y = d + d
        y = d + d  # cached: the fast path
        for call in (
            lambda: d + x,
            lambda: x + d,
            lambda: dt.matmul(d, np.ones((3, 2))),  # a host array among device tensors
            lambda: dt.where(d > 0, x, d),
            lambda: dt.linear(x, d.T, d[0]),
        ):
            with pytest.raises(TypeError, match="different devices") as e:
                call()
            errors.append(str(e.value))
        scalar = d * np.array(2.0)  # a 0-d host array is a scalar, as for numpy
        # in place, a Partial device operand into a host target and the other way round
        u = dt.dtensor_from_local(d.to_local()[:1], mesh, [dt.Partial()], global_shape=(1, 3))
        w = dt.shard_tensor(np.zeros((1, 3)), mesh, [dt.Replicate()])
        hu = dt.shard_tensor(np.ones((1, 3)), mesh, [dt.Partial()])
        wd = w.to_device("fake")
        for call in (lambda: w.__iadd__(u), lambda: wd.__isub__(hu)):
            with pytest.raises(TypeError, match="different devices") as e:
                call()
            errors.append(str(e.value))
        return errors, type(y.to_local()), np.array_equal(scalar.numpy(), 2 * g)

    errors, kind, ok = every_rank(dt.simulate(2, program))
    assert kind is fake_device.FakeArray and ok
    assert "add: operands on different devices (fake and numpy)" in errors[0]
    assert "never copies between them silently" in errors[2]
    assert "add: operands on different devices (numpy and fake)" in errors[5], errors[5]
    assert "subtract: operands on different devices (fake and numpy)" in errors[6], errors[6]


def test_device_shards_are_not_handed_to_numpy_functions():
    x = fake_device.MODULE.asarray([1.0, 2.0])
    for call in (lambda: np.asarray(x), lambda: np.exp(x), lambda: np.concatenate([x, x])):
        with pytest.raises(TypeError):
            call()
    with pytest.raises(TypeError, match="Unsupported type"):
        x + np.ones(2)


def _writes() -> list:
    """Basic writes and in-place operators (ops/mutation.py) on a split tensor."""
    g = cases.global_value((7, 4), np.float64)
    mesh = dt.ProcessMesh([0, 1])
    x = dt.shard_tensor(g, mesh, [S0])
    y = dt.shard_tensor(g * 2, mesh, [S1])
    x += 1
    x *= y  # another layout: resharded, written back
    x[1:3] = 0.5
    x[-1] = np.arange(4.0)  # a host value is copied in: an explicit write
    x[:, 0] = y[:, 1]
    s = x[2:5]  # a slice of the split axis moves rows: a copy written through to x
    s -= 10
    _device_outputs("write", [x, s])
    return [x.numpy(), s.numpy()]


@pytest.mark.parametrize("device", DEVICES)
def test_writes_and_in_place_operators_on_device(device):
    host = every_rank(on("cpu", 2, _writes))
    assert op_cases.same(every_rank(on(device, 2, _writes)), host)


UNSUPPORTED = {  # what CuPy's arrays lack: no device implementation to call
    "getfield": lambda x: x.getfield(np.float32),
    "setfield": lambda x: x.setfield(1.0, np.float64),
    "byteswap": lambda x: x.byteswap(),
}


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unreached_families_raise_not_implemented_naming_the_op(name):
    g = cases.global_value((6, 4), np.float64)

    def program():
        x = dt.shard_tensor(g, dt.ProcessMesh([0, 1]), [S0])
        with pytest.raises(NotImplementedError, match="not implemented on GPU") as e:
            UNSUPPORTED[name](x)
        return str(e.value)

    text = every_rank(on("fake", 2, program))
    assert name.split(" (")[0].removeprefix("np.") in text, text


# -- the op grid on device shards ------------------------------------------------------------------
def _selected(device, fn):
    """``fn(mesh, *args)`` on ranks that select ``device`` first."""

    def program(mesh, *args):
        dt.set_device(device)
        return fn(mesh, *args)

    return program


OP_MESHES = [(2,), (2, 2)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", OP_MESHES, ids=str)
def test_elementwise_grid(device, mesh_shape, checked):
    n = 0
    for name in ("exp", "sigmoid", "gelu", "abs"):
        n += assert_grid(t_ew.simulate_on(mesh_shape, _selected(device, t_ew._unary), name))
    for name in ("add", "divide", "less"):
        n += assert_grid(t_ew.simulate_on(mesh_shape, _selected(device, t_ew._binary), name))
    n += assert_grid(t_ew.simulate_on(mesh_shape, _selected(device, t_ew._broadcast), "add"))
    assert n > 300


@pytest.mark.filterwarnings("ignore:.*(empty slice|Degrees of freedom):RuntimeWarning")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", OP_MESHES, ids=str)
def test_reduction_grid(device, mesh_shape, checked):
    for name in ("sum", "mean", "max", "argmax", "any"):
        assert_grid(t_red.simulate_on(mesh_shape, _selected(device, t_red._reduction), name))
    for name in ("softmax", "logsumexp", "var"):
        assert_grid(t_red.simulate_on(mesh_shape, _selected(device, t_red._composite), name))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", OP_MESHES, ids=str)
def test_linalg_grid(device, mesh_shape, checked):
    cases_ = ("2-D", "batch broadcast", "trans_y")
    assert_grid(t_la.simulate_on(mesh_shape, _selected(device, t_la._matmul), np.float64, cases_))
    assert_grid(t_la.simulate_on(mesh_shape, _selected(device, t_la._linear), np.float32))
    assert_grid(t_la.simulate_on(mesh_shape, _selected(device, t_la._dot_outer)))
    einsums = t_la.EQUATIONS[7:]
    assert_grid(t_la.simulate_on(mesh_shape, _selected(device, t_la._einsum), einsums))


def _shape_case(mesh) -> int:
    k = max(mesh.shape)
    n = 0
    for src, dst in t_sh.reshape_cases(k)[:6]:
        n += t_sh.check_unary(mesh, src, [t_sh.same("reshape", dst), t_sh.same("transpose")])
    shape = (2 * k + 1, 5)
    keys = t_sh.keys(shape)[:8]
    n += t_sh.check_unary(mesh, shape, [t_sh.getitem_call(mesh.shape, shape, key) for key in keys])
    n += t_sh.check_unary(mesh, (2, k + 1), [t_sh.same("broadcast_to", (3, 2, k + 1))])
    n += t_sh.check_unary(mesh, (2 * k, 3), [t_sh.same("split", 2, 0)])
    n += t_sh.check_join(mesh, [(2 * k + 1, 3), (1, 3)], 0, limit=40)
    n += t_sh.check_join(mesh, [(2 * k + 1, 3), (2 * k + 1, 3)], 1, limit=40)
    return n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", OP_MESHES, ids=str)
def test_shape_grid(device, mesh_shape, checked):
    assert every_rank(on_mesh(device, mesh_shape, _shape_case)) > 100


def _layer_norm_case(mesh) -> int:
    """test_ops_nn's layer norm grid, with the weight and bias as DistTensors (a host array
    would not mix with device tensors)."""
    k, n = max(mesh.shape), 0
    rng = np.random.default_rng(0)
    for shape, begin in [((2 * k, 4), -1), ((k + 1, 5), 1), ((3, k + 1, 2), 1), ((0, 3), 1)]:
        g = rng.normal(2, 3, shape)
        w, b = rng.normal(size=g.shape[begin:]), rng.normal(size=g.shape[begin:])
        for src in t_nn._grid(g.ndim, mesh):
            affine = n % 2
            wt = dt.shard_tensor(w, mesh, [(R, S0)[n % 3 == 1]] * mesh.ndim) if affine else None
            bt = dt.shard_tensor(b, mesh, [R] * mesh.ndim) if affine else None
            x = cases.make_source(g, mesh, src, seed=n)
            got = dt.layer_norm(x, wt, bt, begin_norm_axis=begin, epsilon=1e-3)
            want = t_nn.ref_layer_norm(g, w if affine else None, b if affine else None,
                                       begin % g.ndim, 1e-3)  # fmt: skip
            t_nn._close(got.numpy(), want, (mesh.shape, shape, begin, src))
            n += 1
    return n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh_shape", OP_MESHES, ids=str)
def test_nn_grid(device, mesh_shape, checked):
    for case in (_layer_norm_case, t_nn.case_cross_entropy, t_nn.case_embedding):
        assert every_rank(on_mesh(device, mesh_shape, case)) > 0


def _gradients(mesh) -> list:
    """A small forward and backward through every device op family: the gradients."""
    rng = np.random.default_rng(1)
    x = dt.shard_tensor(rng.normal(size=(6, 5)), mesh, [S0] + [R] * (mesh.ndim - 1))
    w = dt.shard_tensor(rng.normal(size=(5, 4)), mesh, [R] * mesh.ndim, requires_grad=True)
    table = dt.shard_tensor(rng.normal(size=(7, 4)), mesh, [S0] * mesh.ndim, requires_grad=True)
    ids = dt.shard_tensor(np.array([0, 6, 3, 3, 1, 5]), mesh, [R] * mesh.ndim)
    labels = dt.shard_tensor(np.array([1, 0, 3, 2, 2, 1]), mesh, [R] * mesh.ndim)
    h = dt.layer_norm(dt.tanh(x @ w) + dt.embedding(ids, table))
    loss = dt.cross_entropy(dt.concatenate([h[:, :2], h[:, 2:]], axis=1), labels)
    loss = loss + dt.sigmoid(dt.reshape(h, (4, 6))).sum() / 10
    block = dt.nn.TransformerBlock(4, 2, dropout=0.1, seed=0, dtype=np.float64, mesh=mesh)
    loss = loss + block(dt.reshape(h, (2, 3, 4))).mean()  # causal mask, softmax, dropout
    loss.backward()
    grads = [w.grad, table.grad, block.attn.q.weight.grad]
    for t in grads:
        _device_outputs("backward", t)
    return [float(loss), *(g.numpy() for g in grads)]


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_on_device_equal_the_hosts(device):
    host = every_rank(on_mesh("cpu", (2, 2), _gradients))
    dev = every_rank(on_mesh(device, (2, 2), _gradients))
    for a, b in zip(dev, host):
        if device == "fake":
            assert op_cases.same(a, b)  # the stand-in computes with numpy: bit for bit
        else:
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


# -- the reshard grid on device shards -------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "mesh_shape,extra",
    [
        ((1,), {}),
        ((2,), {}),
        ((4,), {"dtypes": [np.float64, np.int64]}),
        ((2, 2), {"nd_shapes": 3}),
    ],
    ids=str,
)
def test_reshard_grid(device, mesh_shape, extra, checked, monkeypatch):
    exact = cases.assert_value

    def on_host(got, want, exact_, what):  # the shards themselves are compared too
        if not isinstance(got, np.ndarray):
            assert type(got) is backend.current().array_type, what
            got = backend.to_host(got)
        exact(got, want, exact_, what)

    monkeypatch.setattr(cases, "assert_value", on_host)
    world = math.prod(mesh_shape)
    n = on(device, world, cases.case_reshard_grid, world, mesh_shapes=(mesh_shape,), **extra)
    assert n[0] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_cross_mesh_and_print_on_device(device, checked):
    for case in (cases.case_cross_mesh, cases.case_print):
        on(device, 4, case, 4)


def _draws() -> list:
    """rand and randn (seeded, and from the default stream) on meshes and placements."""
    out = []
    for mesh in (dt.ProcessMesh([0, 1, 2, 3]), mesh_of((2, 2))):
        for pl in ([S0], [S1], [R]) if mesh.ndim == 1 else ([S0, S1], [S1, S1], [R, S0]):
            for draw in (dt.rand, dt.randn):
                x = draw((7, 5), seed=11, mesh=mesh, placements=pl, dtype=np.float32)
                _device_outputs(draw.__name__, x)
                out.append(x.numpy())
    dt.manual_seed(3)
    out.append(dt.randn((5, 3), mesh=mesh_of((2, 2)), placements=[S0, R]).numpy())
    return out


def _made() -> list:
    """Every factory, on Shard, Replicate and Partial placements (Partial: made locally)."""
    mesh = mesh_of((2, 2))
    g = cases.global_value((5, 3), np.float64)
    out = []
    for pl in ([S0, S1], [dt.Partial(), R], [R, dt.Partial("max")]):
        x = dt.shard_tensor(g, mesh, pl)
        made = [
            x,
            dt.zeros((5, 3), mesh=mesh, placements=pl),
            dt.ones((5, 3), np.float32, mesh=mesh, placements=pl),
            dt.full((5, 3), 2.5, mesh=mesh, placements=pl),
            dt.arange(1, 12, 2, mesh=mesh, placements=[pl[0], R] if pl[0] != S1 else [R, R]),
            dt.zeros_like(x),
            dt.full_like(x, np.arange(3.0)),
            dt.empty((5, 3), mesh=mesh, placements=pl).shape,
        ]
        _device_outputs("factory", made)
        out += [m.numpy() if isinstance(m, dt.DistTensor) else m for m in made]
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_factories_on_device_are_the_hosts(device):
    host = every_rank(on("cpu", 4, _made))
    assert op_cases.same(every_rank(on(device, 4, _made)), host)


@pytest.mark.parametrize("device", DEVICES)
def test_random_streams_on_device_are_the_hosts_bit_for_bit(device):
    """Note [Random streams on a device]: drawn on the host, copied: the same bits."""
    host = every_rank(on("cpu", 4, _draws))
    assert op_cases.same(every_rank(on(device, 4, _draws)), host)


# -- training --------------------------------------------------------------------------------------
def _mlp():
    sys.path.insert(0, str(ROOT / "demos"))
    try:
        import mlp_dp_mp
    finally:
        sys.path.remove(str(ROOT / "demos"))
    return mlp_dp_mp


def _train(device: str, dp: str):
    mlp = _mlp()

    def program():
        mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"], device=device)
        result = mlp.train(mesh, 3, np.float64, dp=dp)
        _device_outputs("train", [p for _, p in mlp.Net(np.float64).named_parameters()])
        return result

    return every_rank(dt.simulate(4, program))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dp", ["fused", "plain"])
def test_mlp_dp_mp_training_equals_the_host_run(device, dp):
    """The Linear-LayerNorm-Linear model with Adam on a 2x2 mesh (data and tensor parallel,
    fused gradient buckets or per-gradient reduction): losses, gradients and parameters."""
    dev, host = _train(device, dp), _train("cpu", dp)
    if device == "fake":
        assert op_cases.same(dev, host)
        return
    for key in ("gradients", "parameters"):
        for name, want in host[key].items():
            np.testing.assert_allclose(dev[key][name], want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(list(dev["losses"].values()), list(host["losses"].values()), 1e-9)


def _state_across_devices(param_device: str, state_device: str):
    """Adam's state saved from an optimizer on ``state_device``, loaded into one whose
    parameter lives on ``param_device``: the state's shards are the parameter's kind."""
    mesh = dt.ProcessMesh([0, 1])
    g = cases.global_value((5, 3), np.float64)

    def adam(device):
        dt.set_device(device)
        w = dt.nn.Parameter(dt.shard_tensor(g, mesh, [S0]))
        opt = dt.optim.Adam([w], lr=0.1)
        (w * w).sum().backward()
        opt.step()
        return w, opt

    _, src = adam(state_device)
    w, dst = adam(param_device)
    dst.load_state_dict(src.state_dict())
    kinds = {type(s.to_local()) for st in dst.state.values() for s in st.values()}
    dst.step()  # runs where the parameter lives: a state on the other side would refuse
    return kinds == {type(w.to_local())}, {
        n: s.numpy() for st in dst.state.values() for n, s in st.items()
    }


@pytest.mark.parametrize("param_device, state_device", [("fake", "cpu"), ("cpu", "fake")])
def test_optimizer_state_loads_onto_the_parameters_device(param_device, state_device):
    got = every_rank(dt.simulate(2, _state_across_devices, param_device, state_device))
    want = every_rank(dt.simulate(2, _state_across_devices, "cpu", "cpu"))
    assert got[0], "state shards not on the parameter's device"
    assert op_cases.same(got[1], want[1])


# -- under mpiexec: MPI moves device arrays through host memory (or NCCL on GPUs) ------------------
@pytest.mark.mpi
@pytest.mark.parametrize("device", DEVICES)
def test_under_mpiexec(device, caplog):
    code, out = run(2, ["tests/device_cases.py", device], timeout=300)
    assert code == 0 and "device cases passed" in out, out


def test_device_path_message_is_logged_once(monkeypatch, caplog):
    """A device whose collectives library cannot be imported falls back to MPI staging and
    says so once (Note [Device communicators])."""
    from disttensor import comm

    monkeypatch.setitem(sys.modules, "disttensor.comm.nccl", None)  # the import fails
    monkeypatch.setattr(comm, "_said", set())

    class MPILike:
        backend = "mpi"

    g = MPILike()
    with caplog.at_level(logging.WARNING, logger="disttensor"):
        assert comm.device_communicator(g) is g and comm.device_communicator(g) is g
    said = [r.getMessage() for r in caplog.records if "host staging" in r.getMessage()]
    assert len(said) == 1 and "disttensor.comm.nccl cannot be imported" in said[0]
