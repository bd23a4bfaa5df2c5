"""dt.explain: every collective attributed to an entry, the counts equal dt.CommCounter's, the
source lines are the user's statements, fallbacks say why, and one report word for word."""

from __future__ import annotations

import inspect
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import disttensor as dt
from disttensor.accounting import NO_RULE
from disttensor.dispatch import Op
from disttensor.explain import HOOKS, _local

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "demos"))  # the demos' models
import gpt_dp_mp  # noqa: E402
import mlp_dp_mp  # noqa: E402

HERE = Path(__file__).resolve()


def line_of(marker: str, path: Path = HERE) -> int:
    """The line of ``path`` that ends with the comment ``# <marker>`` (not in GOLDEN's text)."""
    lines = path.read_text().splitlines()
    hits = [
        i
        for i, text in enumerate(lines, 1)
        if text.rstrip().endswith(f"# {marker}") and not text.startswith("{path}")
    ]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def forward_lines(cls) -> tuple[str, set[int]]:
    """(file, lines) of a demo model's forward."""
    lines, start = inspect.getsourcelines(cls.forward)
    return inspect.getsourcefile(cls), set(range(start, start + len(lines)))


def summed(report) -> dict[str, int]:
    total: Counter[str] = Counter()
    for e in report.entries:
        total.update(e.counts)
    return dict(total)


def attributed(report) -> int:
    """Collectives the entries hold: in reshards and outside them."""
    return sum(len(m.collectives) for e in report.entries for m in e.moves) + sum(
        len(e.collectives) for e in report.entries
    )


def train_step(model, plan, batch, placements):
    """One data- and tensor-parallel step of a demo model on a 2x2 mesh, explained and counted
    at once; returns (report, counter, the step's source lines by name)."""
    mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
    dt.manual_seed(0)
    net = model()
    dt.shard_layer(net, mesh, dt.nn.plan_shard_fn(plan))
    wrapped = dt.DataParallel(net, mesh, dim="dp")
    opt = dt.optim.Adam(net.parameters(), lr=1e-2)
    with dt.CommCounter() as cc, dt.explain() as report:
        x, y = (dt.shard_tensor(a, mesh, placements) for a in batch)  # step: shard
        out = wrapped(x)  # step: forward
        loss = loss_of(out, y)  # step: loss
        loss.backward()  # step: backward
        opt.step()  # step: optimizer
        value = float(loss)  # step: float
    assert np.isfinite(value)
    names = ("shard", "forward", "loss", "backward", "optimizer", "float")
    lines = {n: line_of(f"step: {n}") for n in names}
    return report, cc, lines


def loss_of(out, y):
    if y.dtype.kind == "i":
        return dt.cross_entropy(out, y)  # loss: cross entropy
    return dt.nn.MSELoss()(out, y)  # loss: mse


def check_step(reports, model_cls):
    """On every rank: the report's counts, bytes and checks are CommCounter's; the entries
    add up to them; each entry's source line is a statement of train_step or the model's
    forward, and the big pieces sit where they belong."""
    file, fwd = forward_lines(model_cls)
    for report, cc, lines in reports:
        assert report.counts == cc.counts and report.bytes == cc.bytes
        assert report.checks == cc.checks and report.fallbacks == cc.fallbacks
        assert summed(report) == report.counts
        assert attributed(report) == sum(cc.counts.values())
        assert sum(e.checks for e in report.entries) == cc.checks
        losses = {line_of("loss: cross entropy"), line_of("loss: mse")}  # inside loss_of
        allowed = {(str(HERE), n) for n in [*lines.values(), *losses]} | {(file, n) for n in fwd}
        for e in report.entries:
            assert (e.file, e.line) in allowed, (e.what, e.where, e.source)
        by_line: dict[int, list] = {}
        for e in report.entries:
            if e.file == str(HERE):
                by_line.setdefault(e.line, []).append(e)
        backward = by_line[lines["backward"]]
        assert any("DataParallel bucket" in e.what for e in backward)
        grads = [e for e in backward if e.op and e.shown]
        assert grads and all(e.context == "backward" for e in grads)
        assert [e.what for e in by_line[lines["float"]]] == ["float() > numpy()"]
        assert all(not e.shown for e in by_line[lines["shard"]])  # agreement checks only
        text = str(report)
        assert f"{HERE.relative_to(ROOT)}:{lines['backward']}  loss.backward()" in text
        n = sum(report.counts.values())
        assert f"total: {n} collectives" in text


def test_mlp_step_explained(monkeypatch):
    """demos/mlp_dp_mp.py's model: column- then row-parallel over mp, batch over dp."""
    monkeypatch.chdir(ROOT)  # paths in the text relative to the repository
    batch = next(mlp_dp_mp.batches(1, np.float64))

    def step():
        return train_step(
            lambda: mlp_dp_mp.Net(np.float64),
            mlp_dp_mp.PLAN,
            batch,
            [dt.Shard(0), dt.Replicate()],
        )

    reports = dt.simulate(4, step)
    check_step(reports, mlp_dp_mp.Net)
    report, _, lines = reports[0]
    # the forward's all-reduces of the row-parallel output, on the demo's forward line
    file, fwd = forward_lines(mlp_dp_mp.Net)
    forward = [e for e in report.entries if e.file == file and e.shown]
    assert {e.line for e in forward} == {max(fwd)}  # return self.fc2(self.norm(self.fc1(x)))
    assert {c.dim for e in forward for c in e.all_collectives()} == {"mp"}
    # the optimizer's gathers of the LayerNorm parameters' gradients, named by mesh dim
    opt = [e for e in report.entries if e.line == lines["optimizer"]]
    assert [e.what for e in opt] == ["Optimizer.step"]


def test_gpt_step_explained(monkeypatch):
    """demos/gpt_dp_mp.py's model: vocabulary-parallel embedding and cross entropy,
    Megatron blocks."""
    monkeypatch.chdir(ROOT)
    batch = next(gpt_dp_mp.batches(1))

    def step():
        return train_step(
            lambda: gpt_dp_mp.GPT(np.float64), gpt_dp_mp.PLAN, batch, [dt.Shard(0), dt.Replicate()]
        )

    reports = dt.simulate(4, step)
    check_step(reports, gpt_dp_mp.GPT)
    report = reports[0][0]
    loss = [e for e in report.entries if e.line == line_of("loss: cross entropy") and e.shown]
    assert "cross_entropy" in [e.what for e in loss]  # its own reshard of the row maxima


def test_function_form_and_nesting():
    """dt.explain(fn, ...) returns fn's value in .result; the hooks switch off afterwards,
    also when the code raises; a second explain on the same thread is refused."""

    def f():
        mesh = dt.ProcessMesh([0, 1], dim_names=["x"])
        a = dt.shard_tensor(np.arange(8.0).reshape(4, 2), mesh, [dt.Shard(0)])
        with dt.CommCounter() as cc:
            report = dt.explain(lambda t: (t @ t.T).sum(), a)
        assert report.counts == cc.counts == {"all_gather": 1}
        assert isinstance(report.result, dt.DistTensor)
        with pytest.raises(RuntimeError, match="already recording"), dt.explain():
            dt.explain(dt.reshard, a, mesh, [dt.Replicate()])
        with pytest.raises(ZeroDivisionError), dt.explain():
            raise ZeroDivisionError
        return _local.report  # this thread records nothing now

    assert dt.simulate(2, f) == [None, None]
    assert HOOKS.active == 0  # no thread explains: dispatch's general path is as before
    with pytest.raises(TypeError, match="only after a function"):
        dt.explain(None, 1)


def test_fallbacks_show_their_reason():
    """A numpy function without a dt implementation and an op without a rule: both listed
    with accounting's reason, counted as CommCounter counts them."""
    cummax = Op("cummax_demo", lambda x: np.maximum.accumulate(x, axis=0))  # no rule

    def f():
        mesh = dt.ProcessMesh([0, 1], dim_names=["x"])
        a = dt.shard_tensor(np.arange(8.0).reshape(4, 2), mesh, [dt.Shard(0)])
        # another tensor: a's gathered value is remembered (Note [One move per tensor])
        b = dt.shard_tensor(np.arange(8.0).reshape(4, 2), mesh, [dt.Shard(0)])
        with dt.CommCounter() as cc, dt.explain() as report:
            np.unwrap(a)  # fallback: numpy
            cummax(b)  # fallback: op
        assert report.counts == cc.counts and report.fallbacks == cc.fallbacks
        return report

    report = dt.simulate(2, f)[0]
    unwrap, op = (e for e in report.entries if e.shown)
    assert unwrap.what == "unwrap" and not unwrap.op and unwrap.line == line_of("fallback: numpy")
    assert unwrap.fallbacks == [("unwrap", dt.dispatch.fallback.__defaults__[0])]
    assert op.op and op.rule is None and op.line == line_of("fallback: op")
    assert op.fallbacks == [("cummax_demo", NO_RULE)]
    text = str(report)
    assert "  cummax_demo  replicate fallback\n    outside SPMD rules: " + NO_RULE in text
    assert "    in 0: (4, 2) float64 [S(0)] -> [R]: all_gather over x 32 bytes" in text
    assert "; calls outside SPMD rules: 2;" in text


GOLDEN = """\
{path}:{a}  v = float(h.sum())  # golden: float
  float() > numpy()
    reshard () float64 [P(sum), P(sum)] -> [R, R]: all_reduce over dp 8 bytes, all_reduce over mp 8 bytes
{path}:{b}  y = h + h.sum(axis=0)  # golden: add
  add  rule add
    in 0: (4, 3) float64 [S(0), S(1)]
    in 1: (3,) float64 [P(sum), S(0)] -> [R, S(0)]: all_reduce over dp 16 bytes
    out: (4, 3) float64 [S(0), S(1)]
{path}:{c}  g = dt.reshard(h, mesh, [dt.Replicate(), dt.Replicate()])  # golden: gather
  reshard
    reshard (4, 3) float64 [S(0), S(1)] -> [R, R]: all_gather over dp 32 bytes, all_gather over mp 64 bytes
{path}:{d}  u = np.unwrap(g)  # golden: unwrap
  unwrap
    outside SPMD rules: no dt implementation: inputs gathered, computed whole on every rank
total: 5 collectives (all_gather 2, all_reduce 3), 128 bytes; calls outside SPMD rules: 1; agreement checks: 5"""  # noqa: E501

MATMUL = """\
{path}:{line}  h = a @ w  # golden: matmul
  matmul  rule matmul
    in 0: (4, 2) float64 [S(0), R]
    in 1: (2, 3) float64 [R, S(1)]
    out: (4, 3) float64 [S(0), S(1)]"""


def test_golden_report(monkeypatch):
    """A small case word for word (rank 0 of a 2x2 mesh), run twice: the second time the
    dispatch cache is warm, as in a training loop, and the report is the same (the count of
    op calls that moved nothing is not: the cache serves those without dispatch's general
    path, Note [Explain hooks]). With all_ops, a call on fresh tensors is listed too."""
    monkeypatch.chdir(ROOT)

    def f():
        mesh = dt.init_mesh((2, 2), dim_names=["dp", "mp"])
        texts = []
        for _ in range(2):
            a = dt.shard_tensor(np.arange(8.0).reshape(4, 2), mesh, [dt.Shard(0), dt.Replicate()])
            w = dt.shard_tensor(np.ones((2, 3)), mesh, [dt.Replicate(), dt.Shard(1)])
            with dt.explain() as report:
                h = a @ w  # golden: matmul
                v = float(h.sum())  # golden: float
                y = h + h.sum(axis=0)  # golden: add
                g = dt.reshard(h, mesh, [dt.Replicate(), dt.Replicate()])  # golden: gather
                u = np.unwrap(g)  # golden: unwrap
            assert v == 84.0 and u.shape == y.shape == (4, 3)
            texts.append((str(report), report.text(all_ops=True)))
        return texts

    path = HERE.relative_to(ROOT)
    marks = ("float", "add", "gather", "unwrap")
    want = GOLDEN.format(path=path, **{k: line_of(f"golden: {m}") for k, m in zip("abcd", marks)})
    matmul = MATMUL.format(path=path, line=line_of("golden: matmul"))
    for text, everything in dt.simulate(4, f)[0]:
        shown = "\n".join(x for x in text.splitlines() if not x.startswith("not listed: "))
        assert shown == want, text
        assert everything.startswith(matmul + "\n"), everything
