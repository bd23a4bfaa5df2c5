"""dt.explain: every collective attributed to an entry, the counts equal dt.CommCounter's, the
source lines are the user's statements, fallbacks say why, an op's moved inputs say why (the
rule's priced alternatives), and one report word for word."""

from __future__ import annotations

import inspect
import itertools
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import disttensor as dt
from disttensor.accounting import NO_RULE
from disttensor.dispatch import Op
from disttensor.explain import HOOKS, _local
from disttensor.spmd import TensorSpec, core, get_rule

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
            if e.op and e.rule is not None:  # a Choice per mesh dim where an input moved
                needs = [need.placements for _, _, need, _ in e.inputs]
                moved = [
                    m
                    for m in range(2)
                    if any(h.placements[m] != n[m] for (_, h, *_), n in zip(e.inputs, needs))
                ]
                assert [c.mesh_dim for c in e.why] == moved, e
                for c in e.why:
                    assert c.reason
                    if c.taken is not None:  # the rule's answer, the cheapest it priced
                        assert c.taken.inputs == tuple(n[c.mesh_dim] for n in needs)
                        assert all(r.cost >= c.taken.cost for r in c.rejected)
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
    why over dp: add's rule has no way to run on in 0 S(0), in 1 P(sum) as they are; it took the cheapest of the 3 it priced (131,072 bytes a collective + the bytes a rank sends)
      chose    in 0 S(0), in 1 R -> out S(0): 131,084 bytes (in 1 all_reduce 12 bytes)
      rejected in 0 R, in 1 R -> out R: 262,180 bytes (in 0 all_gather 24 bytes, in 1 all_reduce 12 bytes)
      rejected in 0 S(1), in 1 S(0) -> out S(1): 524,372 bytes (in 0 all_gather over mp first 48 bytes, in 0 all_to_all 12 bytes, in 1 all_gather over mp first 12 bytes, in 1 all_reduce 12 bytes)
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


# -- why an op's inputs moved ------------------------------------------------------------------
S0, S1, R, PSUM = dt.Shard(0), dt.Shard(1), dt.Replicate(), dt.Partial("sum")
LATENCY = core.LATENCY


def one_op(fn, *values_and_placements):
    """fn on DistTensors of a 2-rank mesh "x", explained on rank 0: (the op entry, the text)."""

    def f():
        mesh = dt.ProcessMesh([0, 1], dim_names=["x"])
        ts = [dt.shard_tensor(v, mesh, [p]) for v, p in values_and_placements]
        return dt.explain(fn, *ts)

    report = dt.simulate(2, f)[0]
    (e,) = [e for e in report.entries if e.shown]
    return e, str(report)


def test_why_matmul():
    """x [S(0)] @ w [S(0)] (the contraction split in w): the rule gathers w (128 bytes, half
    on the wire) rather than move x to S(1) to keep the contraction split (an all-to-all of
    x's 512 bytes and a Partial out); the report gives both with their prices."""
    x, w = np.arange(64.0).reshape(16, 4), np.ones((4, 4))
    e, text = one_op(lambda a, b: a @ b, (x, S0), (w, S0))
    assert e.what == "matmul" and [need.placements for _, _, need, _ in e.inputs] == [(S0,), (R,)]
    (why,) = e.why
    assert why.dim == "x" and why.mesh_dim == 0 and why.current == (S0, S0)
    assert "matmul's rule has no way to run on in 0 S(0), in 1 S(0) as they are" in why.reason
    assert "it took the cheapest of the 4 it priced" in why.reason
    taken = why.taken
    assert (taken.inputs, taken.output) == ((S0, R), S0)
    assert taken.cost == LATENCY + 64 and taken.moves == ((1, "all_gather", 64.0, None),)
    keep_split = next(c for c in why.rejected if c.output == PSUM)
    assert keep_split.inputs == (S1, S0) and keep_split.cost == LATENCY + 128
    assert keep_split.moves == ((0, "all_to_all", 128.0, None),)
    assert all(c.cost > taken.cost for c in why.rejected)
    assert [c.cost for c in why.rejected] == sorted(c.cost for c in why.rejected)
    assert (
        "    in 1: (4, 4) float64 [S(0)] -> [R]: all_gather over x 64 bytes\n"
        "    out: (16, 4) float64 [S(0)]\n"
        "    why over x: matmul's rule has no way to run on in 0 S(0), in 1 S(0) as they are; "
        "it took the cheapest of the 4 it priced (131,072 bytes a collective + the bytes a "
        "rank sends)\n"
        "      chose    in 0 S(0), in 1 R -> out S(0): 131,136 bytes (in 1 all_gather 64 bytes)\n"
        "      rejected in 0 S(1), in 1 S(0) -> out P(sum): 131,200 bytes "
        "(in 0 all_to_all 128 bytes)\n"
    ) in text, text


def test_why_elementwise():
    """a [S(0)] + b [S(1)]: the inputs disagree, so one moves. Splitting rows or columns
    costs the same all-to-all (a tie: the rule takes the first, rows); replicating both costs
    two all-gathers."""
    a = np.arange(16.0).reshape(4, 4)
    e, text = one_op(lambda x, y: x + y, (a, S0), (a.T.copy(), S1))
    (why,) = e.why
    assert "add's rule has no way to run on in 0 S(0), in 1 S(1) as they are" in why.reason
    assert "it took the cheapest (the first of equals) of the 3 it priced" in why.reason
    assert (why.taken.inputs, why.taken.output) == ((S0, S0), S0)
    assert why.taken.cost == LATENCY + 32 and why.taken.moves == ((1, "all_to_all", 32.0, None),)
    tie, both = why.rejected
    assert (tie.inputs, tie.output, tie.cost) == ((S1, S1), S1, why.taken.cost)
    assert tie.moves == ((0, "all_to_all", 32.0, None),)
    assert (both.inputs, both.cost) == ((R, R), 2 * LATENCY + 128)
    assert (
        "      chose    in 0 S(0), in 1 S(0) -> out S(0): 131,104 bytes "
        "(in 1 all_to_all 32 bytes)\n"
        "      rejected in 0 S(1), in 1 S(1) -> out S(1): 131,104 bytes "
        "(in 0 all_to_all 32 bytes)\n"
        "      rejected in 0 R, in 1 R -> out R: 262,272 bytes "
        "(in 0 all_gather 64 bytes, in 1 all_gather 64 bytes)\n"
    ) in text, text


def test_why_without_priced_alternatives():
    """A rule that prices nothing on a mesh dim (reshape) and a bool Partial reduced before
    the rule sees it (dispatch's _decide) say so."""

    def f():
        mesh = dt.ProcessMesh([0, 1], dim_names=["x"])
        a = dt.shard_tensor(np.arange(16.0).reshape(4, 4), mesh, [S1])
        m = dt.shard_tensor(np.ones((4, 4), bool), mesh, [S0]).any(axis=0)  # Partial(max)
        b = dt.shard_tensor(np.ones(4, bool), mesh, [R])
        with dt.explain() as report:
            a.reshape(16)
            np.logical_and(m, b)
        return report

    report = dt.simulate(2, f)[0]
    reshape, logical_and = (e for e in report.entries if e.shown)
    (why,) = reshape.why
    assert (
        why.reason
        == "rule reshape requires in 0 R here (it prices no alternatives on this mesh dim)"
    )
    assert why.taken is None and why.rejected == []
    (why,) = logical_and.why
    assert why.reason == "in 0 is a bool Partial, reduced first (a logical or/and, not a sum)"
    assert "    why over x: rule reshape requires in 0 R here" in str(report)


def test_alternatives_only_inside_explain(monkeypatch):
    """Note [Explain hooks]: without dt.explain no rule runs again and the einsum core prices
    no alternatives (its recorder stays off); inside, the op that moves asks once."""
    asked, priced = [], []
    considered, record = core.considered, core._considered
    monkeypatch.setattr(core, "considered", lambda *a, **k: asked.append(1) or considered(*a, **k))
    monkeypatch.setattr(core, "_considered", lambda *a: priced.append(1) or record(*a))

    def f():
        mesh = dt.ProcessMesh([0, 1], dim_names=["x"])
        a = dt.shard_tensor(np.ones((6, 10)), mesh, [S0])  # shapes no other test decides
        b = dt.shard_tensor(np.ones((6, 10)), mesh, [S1])
        a + b
        a @ b.T
        before = (len(asked), len(priced), core._recording.log)
        dt.barrier()  # every rank counted before any explains
        with dt.explain():
            a * b
        return before, core._recording.log

    (before, after), _ = dt.simulate(2, f)
    assert before == (0, 0, None) and after is None
    assert len(asked) == 2 and len(priced) == 2  # one op, one mesh dim, on each rank


def _grid():
    """(op, specs, attrs, mesh shape): einsum-core rules over placements on 1-D and 2-D
    meshes."""
    ps = [R, S0, S1, PSUM, dt.Partial("max")]
    ops = [
        ("matmul", [(8, 6), (6, 4)], {}),
        ("add", [(8, 6), (8, 6)], {}),
        ("add", [(8, 6), (6,)], {}),
        ("multiply", [(8, 6), (8, 6)], {}),
        ("sum", [(8, 6)], {"axis": 0}),
        ("softmax", [(8, 6)], {"axis": -1}),
        ("concatenate", [(8, 6), (8, 6)], {"axis": 0}),
        ("linear", [(8, 6), (6, 4), (4,)], {}),
    ]
    for name, shapes, attrs in ops:
        for mesh_shape in ((2,), (3,), (2, 2)):
            for combo in itertools.product(ps, repeat=len(shapes) * len(mesh_shape)):
                if len(shapes) * len(mesh_shape) > 4 and hash(combo) % 7:
                    continue  # a sample of the larger grids
                placements = [
                    combo[i * len(mesh_shape) : (i + 1) * len(mesh_shape)]
                    for i in range(len(shapes))
                ]
                specs = []
                for shape, pl in zip(shapes, placements):
                    if any(isinstance(p, dt.Shard) and p.dim >= len(shape) for p in pl):
                        break
                    specs.append(TensorSpec(shape, list(pl)))
                else:
                    yield name, tuple(specs), attrs, mesh_shape


def test_considered_is_the_rule_s_decision():
    """Recording changes no decision; on each mesh dim the chosen candidate is the first of
    the cheapest and is what the rule returned; each price is its moves' sum (a collective's
    LATENCY plus its bytes, a byte a local move: Note [Price of a reshard])."""
    n = 0
    for name, specs, attrs, mesh_shape in _grid():
        rule = get_rule(name)
        try:
            want = rule(specs, mesh_shape, **attrs)
        except ValueError:  # a Partial the op refuses
            continue
        got, log = core.considered(rule, specs, mesh_shape, **attrs)
        assert got == want, (name, specs)
        assert core._recording.log is None
        # every mesh dim of more than one rank, but those a rule decides without pricing (a
        # split softmax axis stays split: Note [Row-wise rules])
        assert {c.mesh_dim for c in log} <= {m for m, k in enumerate(mesh_shape) if k > 1}
        n += bool(log)
        for c in log:
            costs = [x.cost for x in c.candidates]
            assert c.chosen == costs.index(min(costs))
            assert c.current == tuple(s.placements[c.mesh_dim] for s in specs)
            taken = c.candidates[c.chosen]
            assert taken.inputs == tuple(p[c.mesh_dim] for p in got.inputs), (name, specs)
            assert taken.output == got.outputs[0][c.mesh_dim]
            for x in c.candidates:
                price = sum(w + (1.0 if kind == "local" else LATENCY) for _, kind, w, _ in x.moves)
                assert math.isclose(price, x.cost), (name, specs, x)
    assert n > 500
