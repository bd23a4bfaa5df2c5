"""The autograd tape (disttensor/autograd.py): accumulation, graph reuse and freeing, no_grad
and enable_grad, detach, explicit output gradients, hooks, unsupported ops, differentiable
reshard and multi-output ops. Each test runs on simulated ranks; the gradients of the op
set themselves are tests/test_grad.py's grid."""

from __future__ import annotations

import math

import numpy as np
import pytest
from op_cases import every_rank, make_input

import disttensor as dt

S0, S1, R, P = dt.Shard(0), dt.Shard(1), dt.Replicate(), dt.Partial()
RNG = np.random.default_rng(50)
A = RNG.normal(size=(5, 3))  # uneven on 2 ranks
COT = RNG.normal(size=(5, 3))


def on(mesh_shape, fn):
    """``fn(mesh)`` on simulated ranks of a mesh of that shape; rank 0's result."""
    n = math.prod(mesh_shape)
    return every_rank(dt.simulate(n, lambda: fn(dt.ProcessMesh(np.arange(n).reshape(mesh_shape)))))


def leaf(mesh, value=A, placements=(S0,)):
    return dt.shard_tensor(value, mesh, list(placements), requires_grad=True)


# -- accumulation --------------------------------------------------------------------------------
def test_gradients_accumulate_across_backward_calls():
    def body(mesh):
        x = leaf(mesh)
        (x * COT).sum().backward()
        first = x.grad.numpy()
        (dt.sin(x) * COT).sum().backward()
        return first, x.grad.numpy()

    first, second = on((2,), body)
    np.testing.assert_allclose(first, COT)
    np.testing.assert_allclose(second, COT + np.cos(A) * COT)


def test_a_tensor_used_twice_gets_both_contributions():
    def body(mesh):
        x = leaf(mesh)
        y = dt.exp(x)
        ((y * y + y * x) * COT).sum().backward()  # x and y each used twice
        return x.grad.numpy()

    e = np.exp(A)
    np.testing.assert_allclose(on((2,), body), (2 * e * e + e * A + e) * COT)


def test_the_same_input_twice_in_one_op():
    def body(mesh):
        x = leaf(mesh)
        (dt.multiply(x, x) * COT).sum().backward()
        return x.grad.numpy()

    np.testing.assert_allclose(on((2,), body), 2 * A * COT)


# -- recording on and off ------------------------------------------------------------------------
def test_no_grad_records_nothing():
    def body(mesh):
        x = leaf(mesh)
        with dt.no_grad():
            assert not dt.is_grad_enabled()
            y = x * 2
        assert dt.is_grad_enabled()
        assert not y.requires_grad and y.is_leaf and y.grad_fn is None
        with pytest.raises(RuntimeError, match="does not require a gradient"):
            y.sum().backward()

        @dt.no_grad()
        def double(t):
            return t * 2

        assert not double(x).requires_grad and dt.is_grad_enabled()
        assert x.grad is None

    on((2,), body)


def test_enable_grad_inside_no_grad():
    def body(mesh):
        x = leaf(mesh)
        with dt.no_grad():
            with dt.enable_grad():
                y = x * 3
            z = y * 2  # not recorded: y's gradient stops here
        assert y.requires_grad and not y.is_leaf and not z.requires_grad
        (y * COT).sum().backward()
        return x.grad.numpy()

    np.testing.assert_allclose(on((2,), body), 3 * COT)


def test_detach_cuts_the_graph():
    def body(mesh):
        x = leaf(mesh)
        d = x.detach()
        assert not d.requires_grad and d.is_leaf and d.placements == x.placements
        assert np.array_equal(d.to_local(), x.to_local())
        (x * d * COT).sum().backward()  # d is a constant: the gradient is d, not 2x
        return x.grad.numpy()

    np.testing.assert_allclose(on((2,), body), A * COT)


def test_integer_results_are_constants():
    def body(mesh):
        x = leaf(mesh)
        assert not x.astype(np.int64).requires_grad
        assert not (x > 0).requires_grad and not dt.argmax(x, 0).requires_grad
        assert not dt.floor(x).requires_grad  # autograd.NOT_DIFFERENTIABLE

    on((2,), body)


@pytest.mark.parametrize("dtype", [np.int64, np.bool_])
def test_requires_grad_on_a_non_float_tensor_raises(dtype):
    def body(mesh):
        x = dt.shard_tensor(np.ones((4, 2), dtype), mesh, [S0])
        with pytest.raises(TypeError, match="only floating tensors"):
            x.requires_grad_()
        assert x.requires_grad_(False) is x and not x.requires_grad

    on((2,), body)


@pytest.mark.parametrize("make", ["shard_tensor", "zeros"])
def test_creating_a_non_float_tensor_that_requires_grad_raises(make):
    def body(mesh):
        with pytest.raises(TypeError, match="floating"):
            if make == "zeros":
                dt.zeros((4,), np.int64, mesh=mesh, placements=[S0], requires_grad=True)
            else:
                dt.shard_tensor(np.arange(4), mesh, [S0], requires_grad=True)

    on((2,), body)


# -- backward's arguments ------------------------------------------------------------------------
def test_backward_of_a_non_scalar_needs_a_gradient():
    def body(mesh):
        y = leaf(mesh) * 2
        with pytest.raises(RuntimeError, match=r"shape \(5, 3\) needs an explicit gradient"):
            y.backward()
        with pytest.raises(ValueError, match="grad has shape"):
            y.backward(grad=np.ones((3, 5)))

    on((2,), body)


@pytest.mark.parametrize("kind", ["DistTensor", "ndarray"])
def test_backward_with_an_explicit_gradient(kind):
    def body(mesh):
        x = leaf(mesh)
        y = dt.tanh(x)
        if kind == "ndarray":
            y.backward(grad=COT)
        else:  # laid out unlike y, and Partial: its global value is what counts
            y.backward(
                grad=dt.shard_tensor(COT, mesh, [S1]) * 0.5 + dt.shard_tensor(COT * 0.5, mesh, [P])
            )
        return x.grad.numpy()

    np.testing.assert_allclose(on((2,), body), (1 - np.tanh(A) ** 2) * COT)


def test_backward_of_a_one_element_tensor_defaults_to_one():
    def body(mesh):
        x = leaf(mesh)
        dt.reshape(x.sum(), (1, 1)).backward()
        return x.grad.numpy()

    np.testing.assert_allclose(on((2,), body), np.ones_like(A))


def test_backward_on_a_leaf_sets_its_gradient():
    def body(mesh):
        x = leaf(mesh)
        x.backward(grad=COT)
        return x.grad.numpy()

    np.testing.assert_allclose(on((2,), body), COT)


def test_retain_graph_allows_a_second_backward():
    def body(mesh):
        x = leaf(mesh)
        loss = (dt.exp(x) * COT).sum()
        loss.backward(retain_graph=True)
        loss.backward()
        got = x.grad.numpy()
        with pytest.raises(RuntimeError, match="second time"):
            loss.backward()
        return got

    np.testing.assert_allclose(on((2,), body), 2 * np.exp(A) * COT)


def test_a_second_backward_through_a_freed_graph_raises():
    def body(mesh):
        x = leaf(mesh)
        y = dt.exp(x)
        (y * COT).sum().backward()
        with pytest.raises(RuntimeError, match="retain_graph=True"):
            (y * 2).sum().backward()  # shares y's freed node

    on((2,), body)


# -- hooks ---------------------------------------------------------------------------------------
def test_hook_on_a_leaf_replaces_its_gradient():
    def body(mesh):
        x = leaf(mesh)
        seen = []

        def hook(g):
            seen.append(g.numpy())
            return g * 2

        remove = x.register_hook(hook)
        (x * COT).sum().backward()
        first = x.grad.numpy()
        remove()
        (x * COT).sum().backward()
        return seen, first, x.grad.numpy()

    seen, first, second = on((2,), body)
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], COT)
    np.testing.assert_allclose(first, 2 * COT)
    np.testing.assert_allclose(second, 3 * COT)


def test_hook_on_a_non_leaf_replaces_the_gradient_flowing_back():
    def body(mesh):
        x = leaf(mesh)
        y = x * 3
        seen = []
        y.register_hook(lambda g: seen.append(g.numpy()))  # None: keeps the gradient
        y.register_hook(lambda g: g + 1)
        ((y + y) * COT).sum().backward()  # the hooks see y's whole gradient, once
        return seen, x.grad.numpy(), y.grad

    seen, got, ygrad = on((2,), body)
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], 2 * COT)
    np.testing.assert_allclose(got, 3 * (2 * COT + 1))
    assert ygrad is None  # only leaves keep .grad


def test_register_hook_needs_a_gradient():
    def body(mesh):
        with pytest.raises(RuntimeError, match="does not require a gradient"):
            dt.shard_tensor(A, mesh, [S0]).register_hook(lambda g: g)

    on((2,), body)


def test_post_accumulate_grad_hook_runs_once_per_backward_after_the_update():
    def body(mesh):
        x = leaf(mesh)
        calls = []
        x.register_post_accumulate_grad_hook(lambda t: calls.append(t.grad.numpy()))
        (x * x * COT + x).sum().backward()  # x reaches the loss along three paths
        (x * COT).sum().backward()
        with pytest.raises(RuntimeError, match="only leaf tensors"):
            (x * 2).register_post_accumulate_grad_hook(print)
        return calls

    calls = on((2,), body)
    assert len(calls) == 2
    np.testing.assert_allclose(calls[0], 2 * A * COT + 1)
    np.testing.assert_allclose(calls[1], 2 * A * COT + 1 + COT)


# -- unsupported ops -----------------------------------------------------------------------------
def test_a_replicate_fallback_op_has_no_gradient():
    def body(mesh):
        x = leaf(mesh)
        y = np.unwrap(x, axis=0)  # no dt op: the replicate fallback
        assert isinstance(y, dt.DistTensor) and y.requires_grad
        np.testing.assert_allclose(y.numpy(), np.unwrap(A, axis=0))
        with pytest.raises(NotImplementedError, match=r"unwrap.*no gradient.*dt\.no_grad"):
            (y * COT).sum().backward()

    on((2,), body)


# -- reshard -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mesh_shape,src,dst",
    [
        ((2,), [S0], [S1]),
        ((2,), [S0], [R]),
        ((2,), [R], [P]),
        ((2,), [P], [S0]),
        ((3,), [P], [R]),
        ((2, 2), [S0, S1], [S1, R]),
        ((2, 2), [P, S1], [R, S0]),
        ((2, 2), [S1, P], [P, P]),
    ],
    ids=str,
)
def test_reshard_sends_the_gradient_back_to_the_source_placements(mesh_shape, src, dst):
    """Partial source dims read as Replicate (Note [Partial gradients])."""

    def body(mesh):
        x = make_input(A, mesh, src).requires_grad_()  # Partials: asymmetric splits
        y = dt.reshard(x, mesh, dst)
        assert y.placements == dst and not y.is_leaf
        (dt.sin(y) * COT).sum().backward()
        return x.grad.placements, x.grad.numpy()

    pls, got = on(mesh_shape, body)
    assert pls == [R if p.is_partial() else p for p in src]
    np.testing.assert_allclose(got, np.cos(A) * COT)


def test_reshard_between_meshes_is_differentiable():
    def body():
        a, b = dt.ProcessMesh([0, 1]), dt.ProcessMesh([2, 3])
        x = dt.shard_tensor(A, a, [S0], requires_grad=True)
        y = dt.reshard(x, b, [S1])
        (dt.sin(y) * COT).sum().backward()
        if dt.get_rank() in a:
            return x.grad.mesh == a, x.grad.placements, x.grad.numpy()
        return None

    results = dt.simulate(4, body)
    assert results[2:] == [None, None]  # ranks 2 and 3 hold no x
    same_mesh, pls, got = every_rank(results[:2])
    assert same_mesh and pls == [S0]
    np.testing.assert_allclose(got, np.cos(A) * COT)


# -- multi-output ops ----------------------------------------------------------------------------
def test_split_with_only_one_output_used():
    def body(mesh):
        x = leaf(mesh, placements=(S1,))
        pieces = dt.split(x, [1, 4], 0)
        (pieces[1] * COT[1:4]).sum().backward()
        return x.grad.numpy()

    want = np.zeros_like(A)
    want[1:4] = COT[1:4]
    np.testing.assert_allclose(on((2,), body), want)


# -- found in review: layouts off the mesh, memory, refusals, aliasing ----------------------------
def test_pipeline_gradient_through_a_rank_outside_the_first_mesh():
    """Gradient functions see the same (resharded) specs on every rank, also off the mesh, so a
    backward that sends a gradient from one mesh to another plans the same transfers."""
    w0 = np.arange(12.0).reshape(4, 3) / 10
    v0 = np.arange(15.0).reshape(3, 5) / 10

    def body():
        a, b = dt.ProcessMesh([0]), dt.ProcessMesh([1, 2])
        w = dt.shard_tensor(w0, a, [R], requires_grad=True)
        h = dt.reshard(dt.tanh(w), b, [S1])
        (h @ dt.shard_tensor(v0, b, [S1])).sum().backward()
        return w.grad.numpy() if dt.get_rank() == 0 else None

    want = (1 - np.tanh(w0) ** 2) * v0.sum(axis=1)
    got, *others = dt.simulate(3, body)  # only rank 0 holds w
    assert others == [None, None]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_graph_memory_is_freed_without_the_cyclic_collector():
    import gc
    import weakref

    def body(mesh):
        x = leaf(mesh)
        was = gc.isenabled()
        gc.disable()
        try:
            # e is an argument of the product, whose gradient reads it: the graph holds it
            # (what a node keeps: tests/test_autograd.py's node-keeps tests)
            e = dt.exp(x)
            ref = weakref.ref(e)
            loss = (e * x).sum()
            del e
            alive_before = ref() is not None  # the graph holds it
            del loss  # a forward that is never backpropagated: freed by reference counts
            freed_unused = ref() is None
            e = dt.exp(x)
            ref = weakref.ref(e)
            loss = (e * x).sum()
            del e
            loss.backward()  # backward frees the graph while the loss lives on
            freed_after_backward = ref() is None
        finally:
            if was:
                gc.enable()
        return alive_before, freed_unused, freed_after_backward

    assert on((2,), body) == (True, True, True)


# Note [What a node keeps]: nodes hold what their gradient reads, nothing more
def test_activations_no_gradient_reads_are_freed_during_the_forward_pass():
    """A product's output feeding softmax, tanh, relu or a sum: the product's node keeps no
    output, theirs keep only an Edge of it, so it is freed when the program drops it; the
    gradients are unchanged."""
    import weakref

    def body(mesh):
        freed, grads = [], []
        for f in (lambda s: dt.softmax(s, axis=-1), dt.tanh, dt.relu, dt.exp,
                  lambda s: s.sum() * 1.0):  # fmt: skip
            x = leaf(mesh)
            s = x @ np.ones((A.shape[1], 4))
            ref = weakref.ref(s._local)
            y = f(s)
            del s
            freed.append(ref() is None)
            (y * 1.5).sum().backward()
            grads.append(x.grad.numpy())
        return freed, grads

    freed, grads = on((2,), body)
    assert freed == [True] * 5
    w = np.ones((A.shape[1], 4))
    s = A @ w
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    want = [
        (1.5 * p * (1 - p.sum(-1, keepdims=True))) @ w.T,  # softmax rows sum to 1: zero
        (1.5 * (1 - np.tanh(s) ** 2)) @ w.T,
        (1.5 * (s > 0)) @ w.T,
        (1.5 * np.exp(s)) @ w.T,
        np.full_like(A, 1.5 * 4),
    ]
    for got, exp in zip(grads, want):
        np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)


def test_a_write_after_an_output_reading_op_leaves_its_gradient_alone():
    """exp reads its output, so writing into its input afterwards (under no_grad: a write
    into a tensor that requires a gradient is refused otherwise) changes nothing, and is not
    refused as a write into a saved tensor would be: the gradient reaches the input's
    producer at the time of use (PyTorch's answer too)."""

    def body(mesh):
        x = leaf(mesh)
        h = x * 2
        y = dt.exp(h)
        with dt.no_grad():
            h += 1
        y.sum().backward()
        return x.grad.numpy()

    np.testing.assert_allclose(on((2,), body), 2 * np.exp(2 * A), rtol=1e-12)


def test_a_node_that_keeps_no_output_refuses_to_read_it():
    from disttensor import autograd

    def body(mesh):
        x = leaf(mesh)
        y = x @ np.ones((A.shape[1], 2))
        node = y._node[0]
        assert node.saved is None and autograd.READS["matmul"] == "inputs"
        try:
            _ = node.out
        except RuntimeError as e:
            return str(e)
        return "no error"

    assert "reads its output, which it declared it does not" in on((1,), body)


def test_a_missing_gradient_refuses_before_any_gradient_is_stored():
    def body(mesh):
        x, w = leaf(mesh, placements=(R,)), leaf(mesh, placements=(R,))
        loss = (np.partition(x, 0, axis=0) * w).sum()  # partition has no gradient
        with pytest.raises(NotImplementedError, match="no gradient"):
            loss.backward()
        return w.grad is None and x.grad is None

    assert on((2,), body)


def test_leaf_gradients_never_share_memory():
    def body(mesh):
        x, y = leaf(mesh), leaf(mesh)
        cot = dt.shard_tensor(COT, mesh, [S0])
        (x + y).backward(cot)
        return (
            x.grad is not y.grad,
            not np.shares_memory(x.grad.to_local(), y.grad.to_local()),
            not np.shares_memory(x.grad.to_local(), cot.to_local()),
        )

    assert on((2,), body) == (True, True, True)


def test_shard_tensor_of_a_graph_tensor_with_a_dtype_keeps_the_graph():
    def body(mesh):
        w = leaf(mesh)
        y = dt.shard_tensor(w * 2, mesh, [R], dtype=np.float32)
        (y * y).sum().backward()
        return y.is_leaf, y.dtype, w.grad.numpy()

    is_leaf, dtype, grad = on((2,), body)
    assert not is_leaf and dtype == np.float32
    np.testing.assert_allclose(grad, 8 * A, rtol=1e-6)


def test_shard_tensor_of_a_leaf_has_its_own_memory():
    def body(mesh):
        w = leaf(mesh)
        w2 = dt.shard_tensor(w, mesh, [S0])  # same placements: still a new leaf
        return w2.is_leaf and w2.requires_grad, np.shares_memory(w.to_local(), w2.to_local())

    assert on((2,), body) == (True, False)
