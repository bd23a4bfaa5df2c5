"""The replicate fallback on device tensors (disttensor/dispatch.py, Note [The replicate
fallback on a device]): numpy functions disttensor does not implement, on the "fake" device
(tests/fake_device.py) against the same program on the CPU.

ON_DEVICE are functions the stand-in's module has (and CuPy documents): they run on the
gathered device values. ON_HOST are functions CuPy documents but the stand-in lacks (its
module has no ``polyval``, no ``fft``, no ufunc methods...): numpy's runs on
host copies, accounted under NO_DEVICE_FUNCTION and warned about once per function. Either
way every array result is a device shard, equal to the host run's bit for bit (the stand-in
computes with numpy), and the collectives are the host run's.
"""

from __future__ import annotations

import math
import warnings

import fake_device
import numpy as np
import pytest
from op_cases import every_rank, make_input, mesh_of, same
from test_device import on

import disttensor as dt
from disttensor import dispatch

fake_device.install()  # the "fake" device
pytestmark = pytest.mark.filterwarnings("ignore:disttensor.*on host copies:RuntimeWarning")
S0, S1, R, PSUM = dt.Shard(0), dt.Shard(1), dt.Replicate(), dt.Partial()

# name as accounted -> call on a DistTensor (or on numpy's global value, for the reference)
ON_DEVICE = {
    "rot90": lambda x: np.rot90(x),
    "diagflat": lambda x: np.diagflat(x[0]),
    "append": lambda x: np.append(x, np.arange(3.0)),  # a host array: copied onto the device
    "average": lambda x: np.average(x, axis=0, weights=np.arange(1.0, x.shape[0] + 1)),
    "array_split": lambda x: np.array_split(x, 3, axis=1),  # a list of tensors
    "rint": lambda x: np.rint(x),  # a ufunc dt has no op for
    "nanmean": lambda x: np.nanmean(x, axis=1),
    "np.linalg.inv": lambda x: np.linalg.inv(x),
}
ON_HOST = {
    "polyval": lambda x: np.polyval(x[0], x),
    "kron": lambda x: np.kron(x[:2, :2], x),
    "convolve": lambda x: np.convolve(x[0], x[:, 1]),
    "np.fft.fft": lambda x: np.fft.fft(x),
    "add.reduceat": lambda x: np.add.reduceat(x, [0, 2], axis=1),
    "np.linalg.matrix_power": lambda x: np.linalg.matrix_power(x, 3),
    "shares_memory": lambda x: np.shares_memory(x, x),  # a Python bool, as numpy returns it
}
CASES = {**ON_DEVICE, **ON_HOST}
PLACEMENTS = {1: [[S0], [S1], [R], [PSUM]], 2: [[S0, S1], [S1, R], [PSUM, S0]]}
MESHES = [(1,), (2,), (2, 2)]
SHAPES = [(4, 4), (5, 5)]  # even and uneven shards


def test_the_stand_in_has_the_device_functions_and_lacks_the_host_ones():
    m = fake_device.MODULE
    for name in ("rot90", "diagflat", "append", "average", "array_split", "rint", "nanmean"):
        assert callable(getattr(m, name)), name
    assert callable(m.linalg.inv)
    for name in ("polyval", "kron", "convolve", "fft", "shares_memory"):
        assert not hasattr(m, name), f"the stand-in now has {name}: move it to ON_DEVICE"
    assert not hasattr(m.add, "reduceat") and not hasattr(m.linalg, "matrix_power")


def _value(shape: tuple[int, ...]) -> np.ndarray:
    """Multiples of 1/4 in [-1, 1] plus 8 on the diagonal: invertible, exact Partial sums."""
    rng = np.random.default_rng(sum(shape))
    return rng.integers(-4, 5, shape) / 4 + 8 * np.eye(*shape)


def _host(out):
    """(kinds, values) of a result: per DistTensor its shard's type and its global value."""
    if isinstance(out, (tuple, list)):
        parts = [_host(o) for o in out]
        return [k for k, _ in parts], [v for _, v in parts]
    if isinstance(out, dt.DistTensor):
        return type(out.to_local()), (out.numpy(), out.placements)
    return type(out), out


def _calls(mesh_shape, shape):
    """Every case on every placement: kinds, values, and the collectives and fallbacks."""
    mesh, g = mesh_of(mesh_shape), _value(shape)
    kinds, values = [], []
    with dt.CommCounter() as cc:
        for pls in PLACEMENTS[len(mesh_shape)]:
            x = make_input(g, mesh, pls)
            for call in CASES.values():
                k, v = _host(call(x))
                kinds.append(k)
                values.append(v)
    return kinds, values, cc.counts, cc.fallbacks


def _flat(kinds):
    return [t for k in kinds for t in (_flat(k) if isinstance(k, list) else [k])]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_fallback_on_device_equals_the_host_run(mesh_shape, shape, monkeypatch):
    monkeypatch.setattr(dispatch, "_warned", set())
    n = math.prod(mesh_shape)
    host = on("cpu", n, _calls, mesh_shape, shape)
    dt.fallback_report(reset=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dev = on("fake", n, _calls, mesh_shape, shape)
    report = dt.fallback_report(reset=True)

    every_rank([values for _, values, _, _ in dev])  # every rank has the whole value
    copies = len(PLACEMENTS[len(mesh_shape)])
    outside = {(k, dispatch.NO_DEVICE_FUNCTION): copies for k in ON_HOST}
    for (kinds, values, counts, fallbacks), h in zip(dev, host):
        assert set(_flat(kinds)) == {fake_device.FakeArray, bool}  # bool: shares_memory
        assert set(_flat(h[0])) == {np.ndarray, bool}
        assert same(values, h[1])  # bit for bit, placements too
        assert counts == h[2]  # this rank's collectives are the host run's
        assert fallbacks == {**h[3], **outside}

    rows = {r.op: r for r in report.rows if r.reason == dispatch.NO_DEVICE_FUNCTION}
    assert sorted(rows) == sorted(ON_HOST)
    assert all(r.calls == n * copies and r.bytes == 0 for r in rows.values())
    said = [str(w.message) for w in caught if str(w.message).startswith("disttensor:")]
    assert all(w.category is RuntimeWarning for w in caught if str(w.message) in said)
    assert sorted(s.split()[1] for s in said) == sorted(ON_HOST)  # once per function
    assert "on host copies" in said[0] and "dt.fallback_report()" in said[0]


def test_host_values_are_numpys_on_the_global_value():
    """The reference the device run is held to: the host fallback is numpy's result."""
    g = _value((5, 5))

    def program():
        x = make_input(g, mesh_of((2,)), [S0])
        return [_host(call(x))[1] for call in CASES.values()]

    for got, (name, call) in zip(every_rank(on("cpu", 2, program)), CASES.items()):
        want = call(g)
        if isinstance(want, list):
            assert all(np.array_equal(a, b) for (a, _), b in zip(got, want)), name
        elif isinstance(want, bool):
            assert got is want, name
        else:
            np.testing.assert_allclose(got[0], want, rtol=1e-12, err_msg=name)


def _writes():
    """numpy's writers: into a numpy target (np.copyto), and into a DistTensor (copy, write,
    assign back: np.fill_diagonal, np.add.at)."""
    mesh = dt.ProcessMesh([0, 1])
    x = dt.shard_tensor(_value((5, 4)), mesh, [S0])
    dst = np.zeros((5, 4))
    np.copyto(dst, x)  # written into the user's host array, as numpy writes it
    np.fill_diagonal(x, 5.0)
    np.add.at(x, (np.array([0, 0, 3]),), 1.0)
    return dst, type(x.to_local()), x.numpy()


def test_writers_write_the_users_array_and_the_device_tensor():
    dst, kind, value = every_rank(on("fake", 2, _writes))
    hdst, hkind, hvalue = every_rank(on("cpu", 2, _writes))
    assert kind is fake_device.FakeArray and hkind is np.ndarray
    assert same((dst, value), (hdst, hvalue))


def _gradients():
    """Backward through a fallback result says it has no gradient, on the device as on the
    host (the device function and numpy's on host copies alike)."""
    mesh = dt.ProcessMesh([0, 1])
    x = dt.shard_tensor(_value((4, 4)), mesh, [S0], requires_grad=True)
    out = []
    for y in (np.rot90(x), np.polyval(x[0], x)):
        try:
            y.sum().backward()
            out.append((y.requires_grad, "no error"))
        except NotImplementedError as e:
            out.append((y.requires_grad, str(e)))
    return out


def test_gradient_record_is_the_hosts():
    got = every_rank(on("fake", 2, _gradients))
    assert got == every_rank(on("cpu", 2, _gradients))
    assert got[0][0] and got[1][0]  # recorded, as on the host
    assert "rot90 (replicate fallback) has no gradient" in got[0][1]
    assert "polyval (replicate fallback) has no gradient" in got[1][1]


def _mixed():
    mesh = dt.ProcessMesh([0, 1])
    x = dt.shard_tensor(_value((4, 4)), mesh, [S0])
    d, row = x.to_device("fake"), x[0]
    errors = []
    with dt.CommCounter() as cc:
        for call in (
            lambda: np.polyval(row, d),
            lambda: np.average(d, axis=0, weights=row),  # a keyword argument
            lambda: np.kron(d, [[x]]),  # inside a list
        ):
            with pytest.raises(TypeError, match="different devices") as e:
                call()
            errors.append(str(e.value))
    return errors, cc.counts


def test_host_and_device_tensors_raise_before_communicating():
    errors, counts = every_rank(dt.simulate(2, _mixed))
    assert counts == {}
    assert errors[0].startswith("polyval: operands on different devices (numpy and fake)")
    assert errors[1].startswith("average: operands on different devices")
