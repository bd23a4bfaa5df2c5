"""The docs are true: every code block in README.md and docs/ runs as its marker says and prints
what the page shows; docs/ops.md is what ``python -m disttensor.oplist`` writes; every relative
link and anchor resolves; every ``dt.`` name and ``disttensor`` import shown is real; no doc,
docstring or comment cites a file that is not in the repository.

Marking a code block. Every fenced block has a marker, an HTML comment on the line just before
its fence (the page does not show it); an unmarked block fails the test:

- ``<!-- run: simulate N -->``: a python block run on N simulated ranks (``dt.simulate``), in
  a fresh namespace that holds ``np`` and ``dt``, in a temporary directory, compiled as
  ``script.py`` (so ``dt.explain`` names its lines as a script of the block would).
- ``<!-- run: simulate N, continue -->``: goes on from the page's previous ``simulate N``
  block, on the same ranks with the same names (one ``dt.simulate`` call runs the chain).
- ``<!-- run: mpiexec N -->`` (and ``, continue``): the same under ``mpiexec -n N``; every such
  block of every page with that N runs in one launch, one block after the other.
- ``<!-- run: doctest -->``: a ``>>>`` session, run statement by statement as at a prompt
  (compiled as ``<stdin>``), each output compared with the lines under it.
- ``<!-- run: shell -->``: a bash block run from the repository root with ``bash -e -o
  pipefail``, the virtual environment's ``python`` and ``mpiexec`` first on PATH and
  ``OMP_NUM_THREADS=1``; only blocks that are quick and change nothing outside a temporary
  directory. They show the ``mpiexec`` of the mpich wheel (MPICH's hostfile option is ``-f``)
  and are skipped, saying so, where another MPI's ``mpiexec`` runs the tests.
- ``<!-- run: no (REASON) -->``: not run, and REASON says why (it installs, needs a cluster,
  runs for minutes, is run by another test: say which).
- ``<!-- output -->``: the block right before it (the page's previous block: a simulate,
  mpiexec or shell block) printed this on rank 0 (stdout; a shell block's stdout and
  stderr). ``<!-- output: every rank -->``: every rank's stdout, rank after rank;
  ``<!-- output: stderr, every rank -->`` their stderr. A ``...`` matches any text (doctest's
  ELLIPSIS); trailing spaces are ignored.
- ``<!-- text -->``: not code (a listing, a file format, a message); its fence says ``text``
  or nothing.
"""

from __future__ import annotations

import contextlib
import difflib
import doctest
import importlib
import io
import json
import linecache
import os
import re
import subprocess
import sys
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mpirun import implementation, mpiexec, run

import disttensor as dt
from disttensor import oplist

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [
    p
    for d in ("disttensor", "tests", "bench", "demos", "docs")
    for p in sorted((ROOT / d).rglob("*"))
    if p.suffix in (".py", ".md")
] + [ROOT / "README.md", ROOT / "pyproject.toml"]

LINK = re.compile(r"\]\(([^)\s]+)\)")
DT_NAME = re.compile(r"(?<![\w.])dt\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
IMPORT = re.compile(r"^\s*(?:>>> )?from (disttensor(?:\.\w+)*) import ([\w, ]+)", re.M)
FILE = re.compile(r"(?<![\w/.-])((?:\.\./)*(?:[\w-]+/)*[\w-]+\.(?:md|py|toml|ipynb))\b")
# file names that stand for the user's own files in examples, or files a test writes itself
EXAMPLE_FILES = {"script.py", "train.py", "crash.py", "rank1.py", "driver.py", "page.md"}
# every file in the repository by name: a tree listing (docs/architecture.md) names them bare
IN_REPO = {
    p.name for d in ("disttensor", "tests", "bench", "demos", "docs") for p in (ROOT / d).rglob("*")
}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor in the same page
        if not (doc.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{doc.name} links to missing files: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_dt_names_exist(doc: Path) -> None:
    missing = []
    for name in sorted(set(DT_NAME.findall(doc.read_text()))):
        obj = dt
        for part in name.split("."):
            if not hasattr(obj, part):
                missing.append(f"dt.{name}")
                break
            obj = getattr(obj, part)
    assert not missing, f"{doc.name} shows names disttensor does not have: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_imports_shown_exist(doc: Path) -> None:
    missing = []
    for module, names in IMPORT.findall(doc.read_text()):
        mod = importlib.import_module(module)
        missing += [
            f"{module}.{n}" for n in re.split(r"[,\s]+", names) if n and not hasattr(mod, n)
        ]
    assert not missing, f"{doc.name} imports names that do not exist: {missing}"


def test_no_file_cites_a_missing_file() -> None:
    """A path in the README, docs/, a docstring or a comment must be a file of the repository
    (relative to the root, the package, the citing file's folder or one above it, or a bare
    name from a tree listing)."""
    missing = []
    for source in SOURCES:
        for token in set(FILE.findall(source.read_text())):
            name = Path(token).name
            if name in EXAMPLE_FILES or ("/" not in token and name in IN_REPO):
                continue
            here = [ROOT / token, ROOT / "disttensor" / token]
            here += [
                d / token
                for d in (source.parent, *source.parent.parents)
                if ROOT in (d, *d.parents)
            ]
            if not any(p.resolve().is_file() for p in here):
                missing.append(f"{source.relative_to(ROOT)}: {token}")
    assert not missing, "files cited that are not in the repository:\n" + "\n".join(missing)


# -- anchors -------------------------------------------------------------------------------------
def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks), with GitHub's -1, -2 suffixes."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in doc.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            base = _slug(m.group(1))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_anchors_resolve(doc: Path) -> None:
    """``page.md#section`` and ``#section`` name a heading of that page."""
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or "#" not in target:
            continue
        page, anchor = target.split("#", 1)
        path = doc if not page else doc.parent / page
        if path.suffix == ".md" and path.exists() and anchor not in anchors(path):
            broken.append(target)
    assert not broken, f"{doc.name} links to sections that do not exist: {broken}"


# -- code blocks: parsing (the markers are described at the top of this file) -------------------
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")
RUN = re.compile(
    r"run: (?:(?P<kind>simulate|mpiexec) (?P<n>\d+)(?P<cont>, continue)?|(?P<doctest>doctest)"
    r"|(?P<shell>shell)|no \((?P<reason>.+)\))"
)
OUTPUT = re.compile(r"output(?:: (?P<opts>(?:stderr, )?every rank))?")
PYTHON, SHELL, TEXT = {"python", "py", "pycon"}, {"bash", "sh", "shell"}, {"text", ""}


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    info: str
    body: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def run(self) -> re.Match | None:
        return RUN.fullmatch(self.marker or "")

    @property
    def output(self) -> re.Match | None:
        return OUTPUT.fullmatch(self.marker or "")


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of a page, each with the marker on the line before its fence."""
    lines = doc.read_text().splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.groups()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        body = "\n".join(x[len(indent) :] if x.startswith(indent) else x.lstrip()
                         for x in lines[i + 1 : end])  # fmt: skip
        before = MARKER.match(lines[i - 1]) if i > 0 else None
        found.append(Block(doc, i + 1, info, body + "\n", before.group(1) if before else None))
        i = end + 1
    return found


ALL_BLOCKS = [b for doc in DOCS for b in blocks(doc)]


def _previous_run(block: Block) -> Block | None:
    """The run block an output or a continue block belongs to: the page's previous block for
    an output, the page's previous block of the same kind and N for a continue."""
    same = [b for b in ALL_BLOCKS if b.doc == block.doc and b.line < block.line]
    if block.output:
        return same[-1] if same and same[-1].run else None
    kind = block.run.group("kind"), block.run.group("n")
    runs = [b for b in same if b.run and (b.run.group("kind"), b.run.group("n")) == kind]
    return runs[-1] if runs else None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_block_is_marked(doc: Path) -> None:
    bad = []
    for b in blocks(doc):
        run_, out = b.run, b.output
        if b.marker is None:
            bad.append(f"{b.where}: no marker (<!-- run: ... -->, <!-- output -->, <!-- text -->)")
        elif not (run_ or out or b.marker == "text"):
            bad.append(f"{b.where}: unknown marker <!-- {b.marker} -->")
        elif b.marker == "text" and b.info not in TEXT:
            bad.append(f"{b.where}: a text block fenced as {b.info!r}: run it, or say why not")
        elif out and _previous_run(b) is None:
            bad.append(f"{b.where}: an output block that follows no run block")
        elif out and _kind(_previous_run(b)) not in ("simulate", "mpiexec", "shell"):
            bad.append(f"{b.where}: the output of a block that does not run, or of a doctest")
        elif run_ and (run_.group("kind") or run_.group("doctest")) and b.info not in PYTHON:
            bad.append(f"{b.where}: python marker on a block fenced as {b.info!r}")
        elif run_ and run_.group("shell") and b.info not in SHELL:
            bad.append(f"{b.where}: shell marker on a block fenced as {b.info!r}")
        elif run_ and run_.group("doctest") and ">>> " not in b.body:
            bad.append(f"{b.where}: a doctest block without >>> prompts")
        elif run_ and run_.group("cont") and _previous_run(b) is None:
            bad.append(f"{b.where}: continues no earlier {run_.group('kind')} block on the page")
    assert not bad, "\n".join(bad)


def _expected(block: Block) -> Block | None:
    """The output block that follows ``block``, if any."""
    after = [b for b in ALL_BLOCKS if b.doc == block.doc and b.line > block.line]
    return after[0] if after and after[0].output else None


def _check_output(block: Block, per_rank: list[tuple[str, str]]) -> None:
    """Compare what the ranks printed, (stdout, stderr) per rank, with the output block."""
    want_block = _expected(block)
    if want_block is None:
        return
    opts = want_block.output.group("opts") or ""
    stream = 1 if "stderr" in opts else 0
    ranks = per_rank if "every rank" in opts else per_rank[:1]
    got = "".join(r[stream] for r in ranks)
    _compare(want_block, got)


def _compare(want_block: Block, got: str) -> None:
    def clean(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"

    want, got = clean(want_block.body), clean(got)
    if not doctest.OutputChecker().check_output(want, got, doctest.ELLIPSIS):
        diff = "\n".join(
            difflib.unified_diff(want.splitlines(), got.splitlines(), "page", "run", lineterm="")
        )
        pytest.fail(f"{want_block.where}: the output shown is not what the block printed:\n{diff}")


def _kind(b: Block) -> str:
    r = b.run
    if r is None:
        return ""
    return r.group("kind") or ("doctest" if r.group("doctest") else "shell" if r.group("shell")
                               else "no")  # fmt: skip


def _docs_with(kind: str) -> list[Path]:
    return sorted({b.doc for b in ALL_BLOCKS if _kind(b) == kind})


# -- code blocks: simulated ranks ----------------------------------------------------------------
class _PerThread(io.TextIOBase):
    """sys.stdout or sys.stderr while simulated ranks run: each rank thread writes into the
    buffer it registered, every other thread into the stream it replaced."""

    def __init__(self, target) -> None:
        self.target = target
        self.buffers: dict[int, io.StringIO] = {}

    def write(self, text: str) -> int:
        return self.buffers.get(threading.get_ident(), self.target).write(text)

    def flush(self) -> None:
        if threading.get_ident() not in self.buffers:
            self.target.flush()

    def writable(self) -> bool:
        return True


def _chains(doc: Path, kind: str) -> list[list[Block]]:
    """The page's blocks of ``kind``, a chain per fresh block and the blocks that continue it."""
    chains: list[list[Block]] = []
    for b in blocks(doc):
        if _kind(b) == kind:
            if b.run.group("cont"):
                head = _previous_run(b)
                next(c for c in chains if head in c).append(b)
            else:
                chains.append([b])
    return chains


def _namespace() -> dict:
    return {"np": np, "dt": dt, "__name__": "__main__"}


def _compiled(b: Block):
    """The block as ``script.py``, its lines where tracebacks and ``dt.explain`` read them."""
    linecache.cache["script.py"] = (len(b.body), None, b.body.splitlines(True), "script.py")
    return compile(b.body, "script.py", "exec")


def _run_chain(chain: list[Block], out: _PerThread, err: _PerThread) -> list[tuple[str, str]]:
    """One rank: every block of the chain in one namespace; (stdout, stderr) per block."""
    ns = _namespace()
    printed = []
    me = threading.get_ident()
    for i, b in enumerate(chain):
        if i:
            dt.barrier()  # every rank is done with the last block before script.py changes
        out.buffers[me], err.buffers[me] = io.StringIO(), io.StringIO()
        try:
            exec(_compiled(b), ns)
        except dt.RankAborted:
            raise  # another rank failed: its error is the one to show
        except Exception as e:
            raise AssertionError(
                f"the block at {b.where} raised on rank {dt.get_rank()}: {type(e).__name__}: {e}"
            ) from e
        finally:
            printed.append((out.buffers.pop(me).getvalue(), err.buffers.pop(me).getvalue()))
    return printed


@pytest.mark.parametrize("doc", _docs_with("simulate"), ids=lambda p: p.name)
def test_simulated_blocks(doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    for chain in _chains(doc, "simulate"):
        out, err = _PerThread(sys.stdout), _PerThread(sys.stderr)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            per_rank = dt.simulate(int(chain[0].run.group("n")), _run_chain, chain, out, err)
        for i, b in enumerate(chain):
            _check_output(b, [r[i] for r in per_rank])


# -- code blocks: a session at the prompt --------------------------------------------------------
def _run_session(b: Block) -> None:
    """Each ``>>>`` statement compiled as ``<stdin>`` and run as the prompt runs it (an
    expression's value is shown); its output compared with the lines under it."""
    ns = _namespace()
    for ex in doctest.DocTestParser().get_examples(b.body):
        got = io.StringIO()
        with contextlib.redirect_stdout(got):
            try:
                exec(compile(ex.source, "<stdin>", "single"), ns)
            except Exception as e:
                pytest.fail(f"{b.where}, line {b.line + 1 + ex.lineno}: {ex.source}raised {e!r}")
        want = Block(b.doc, b.line + 1 + ex.lineno, "", ex.want, "output")
        if ex.want or got.getvalue():
            _compare(want, got.getvalue())


@pytest.mark.parametrize("doc", _docs_with("doctest"), ids=lambda p: p.name)
def test_prompt_sessions(doc: Path) -> None:
    for b in blocks(doc):
        if _kind(b) == "doctest":
            _run_session(b)


# -- code blocks: shell --------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("doc", _docs_with("shell"), ids=lambda p: p.name)
def test_shell_blocks(doc: Path) -> None:
    """The shell blocks show the mpich wheel's ``mpiexec`` (a hostfile is ``-f``), the one the
    README installs; under another MPI they are not run."""
    launcher = mpiexec()
    if implementation(launcher) != "MPICH":
        pytest.skip(
            f"the shell blocks use MPICH's mpiexec; {launcher} is {implementation(launcher)}"
        )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for b in blocks(doc):
        if _kind(b) != "shell":
            continue
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", b.body],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"{b.where} exited {proc.returncode}:\n{proc.stdout}"
        _check_output(b, [(proc.stdout, "")])


# -- code blocks: mpiexec ------------------------------------------------------------------------
DRIVER = """
import io, json, linecache, os, sys
import numpy as np
import disttensor as dt

blocks = json.load(open(sys.argv[1]))
os.chdir(sys.argv[2])  # blocks that write files write them here
rank = dt.get_rank()
printed, ns = [], None
for b in blocks:
    if not b["continue"] or ns is None:
        ns = {"np": np, "dt": dt, "__name__": "__main__"}
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    linecache.cache["script.py"] = (len(b["code"]), None, b["code"].splitlines(True), "script.py")
    try:
        exec(compile(b["code"], "script.py", "exec"), ns)
    except BaseException:
        sys.stdout, sys.stderr = saved
        print(f"the block at {b['where']} raised on rank {rank}:", flush=True)
        raise  # the abort hook ends every rank
    sys.stdout, sys.stderr = saved
    printed.append([out.getvalue(), err.getvalue()])
with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:
    json.dump(printed, f)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n", sorted({int(b.run.group("n")) for b in ALL_BLOCKS
                                      if _kind(b) == "mpiexec"}))  # fmt: skip
def test_mpiexec_blocks(n: int, tmp_path: Path) -> None:
    """Every ``mpiexec n`` block of every page, in one launch."""
    chosen = [b for b in ALL_BLOCKS if _kind(b) == "mpiexec" and int(b.run.group("n")) == n]
    spec = [{"code": b.body, "where": b.where, "continue": bool(b.run.group("cont"))}
            for b in chosen]  # fmt: skip
    (tmp_path / "blocks.json").write_text(json.dumps(spec))
    (tmp_path / "driver.py").write_text(DRIVER)
    args = [str(tmp_path / "driver.py"), str(tmp_path / "blocks.json"), str(tmp_path)]
    code, out = run(n, args, timeout=120, env={"DISTTENSOR_TIMEOUT": "60"})
    assert code == 0, out
    per_rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    for i, b in enumerate(chosen):
        _check_output(b, [tuple(r[i]) for r in per_rank])


# -- docs/ops.md ---------------------------------------------------------------------------------
OPS_MD = ROOT / "docs" / "ops.md"


def _drift(part: str, want: list[str]) -> None:
    """Fail, with the command that rewrites it, where the page's ``part`` ("ops": up to the
    numpy section, "numpy": from it) differs from ``want``, the generator's lines."""
    text = OPS_MD.read_text()
    cut = text.find("## numpy functions\n")
    have = text[:cut] if part == "ops" else text[cut:]
    want_text = "\n".join(want) + "\n"
    if cut < 0 or have != want_text:
        diff = "\n".join(difflib.unified_diff(have.splitlines(), want_text.splitlines(),
                                              "docs/ops.md", "the code", lineterm=""))  # fmt: skip
        pytest.fail(f"docs/ops.md differs from the code; run `{oplist.COMMAND}`:\n{diff}")


def test_op_list_matches_the_code() -> None:
    """Every exported op, its rule and gradient, and the internal ops, as the code has them."""
    _drift("ops", oplist.ops_part())


def test_op_list_numpy_part_matches_numpy() -> None:
    """Which numpy functions run dt ops: compared where numpy is the version the page lists."""
    listed = re.search(r"<!-- numpy (\S+) -->", OPS_MD.read_text())
    assert listed, "docs/ops.md names no numpy version"
    if listed.group(1) != oplist.numpy_version():
        pytest.skip(
            f"docs/ops.md lists numpy {listed.group(1)}'s functions, this is numpy "
            f"{oplist.numpy_version()} (`{oplist.COMMAND}` lists its own)"
        )
    _drift("numpy", oplist.numpy_part())


# -- the figure of docs/performance.md -----------------------------------------------------------
@pytest.mark.mpi
def test_reshard_plot(tmp_path: Path) -> None:
    """``bench/reshard.py --plot FILE.png`` draws the figure where matplotlib is installed (an
    optional extra), and says what to install where it is not, before any timing."""
    png = tmp_path / "reshard.png"
    args = ["bench/reshard.py", "--quick", "--sizes", "64K", "--plot", str(png)]
    code, out = run(2, args, timeout=120)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert code != 0 and "--plot needs matplotlib: pip install matplotlib" in out, out
        return
    assert code == 0, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", out
