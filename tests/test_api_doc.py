"""docs/api.md is what ``python -m disttensor.apidoc --write`` writes, and it documents every
public name: each of ``disttensor.__all__`` but the numpy-named ops (docs/ops.md has those) and
each of ``dt.nn``, ``dt.optim`` and ``dt.spmd``, with a docstring of its own."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import disttensor as dt
from disttensor import apidoc
from disttensor import ops as dt_ops

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"


def test_api_page_matches_the_code() -> None:
    """Every documented name's signature and first docstring paragraph, as the code has them."""
    want = apidoc.page()
    have = API_MD.read_text() if API_MD.exists() else ""
    if have != want:
        pytest.fail(
            f"docs/api.md differs from the code; run `{apidoc.COMMAND}`:\n"
            + apidoc.diff(have, want)
        )


def test_every_public_name_has_a_docstring() -> None:
    missing = apidoc.undocumented()
    assert not missing, (
        "public names without a docstring of their own (docs/api.md shows the first "
        f"paragraph of each): {missing}"
    )


def _public() -> set[int]:
    """ids of the objects the page must document: worked out here, not by the generator."""
    objs = [getattr(dt, n) for n in dt.__all__ if n not in dt_ops.__all__]
    objs = [o for o in objs if not isinstance(o, types.ModuleType)]
    for module in (dt.nn, dt.optim, dt.spmd):
        objs += [getattr(module, n) for n in module.__all__]
    return {id(o) for o in objs}


def test_every_public_name_is_on_the_page() -> None:
    """Each public object once, under its name, in one section; no numpy-named op."""
    quals = [q for _, _, qs in apidoc.sections() for q in qs]
    assert len(quals) == len(set(quals)), "a name is in two sections"
    shown = {id(apidoc._resolve(q)) for q in quals}
    assert shown == _public()
    text = API_MD.read_text()
    for q in quals:
        assert f"\n### {q}\n" in text, f"docs/api.md has no entry for {q}"
    for op in ("add", "matmul", "softmax"):
        assert f"### dt.{op}\n" not in text


def test_entries_are_one_line_signatures_then_the_docstring() -> None:
    """Each entry: the heading, its signature on one line in a code span, the first paragraph
    of its docstring; defaults shown without addresses."""
    for _, _, quals in apidoc.sections():
        for q in quals:
            lines = apidoc.entry(q)
            sig = lines[0]
            assert re.fullmatch(r"`(class |exception )?" + re.escape(q) + r"\(.*\)`", sig), sig
            assert sig.count("`") == 2 and " at 0x" not in sig, sig
            doc = apidoc.own_doc(apidoc._resolve(q))
            assert doc is not None and lines[-1] in doc, q


def test_signatures_show_defaults() -> None:
    assert apidoc.signature("dt.shard_tensor").startswith("dt.shard_tensor(data, mesh, placements")
    assert "dtype=np.float32" in apidoc.signature("dt.nn.Linear")
    assert apidoc.signature("dt.RankAborted") == "exception dt.RankAborted(*args)"


def test_the_generator_is_deterministic() -> None:
    assert apidoc.page() == apidoc.page()


def test_check_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--check`` exits 0 when the page is current, 1 with the command to run when not;
    ``--write`` writes it."""
    page = tmp_path / "api.md"
    monkeypatch.setattr(apidoc, "PAGE", page)
    page.write_text("# stale\n")
    assert apidoc.main(["--check"]) == 1
    assert apidoc.main(["--write"]) == 0
    assert page.read_text() == apidoc.page()
    assert apidoc.main(["--check"]) == 0
    proc = subprocess.run(
        [sys.executable, "-m", "disttensor.apidoc", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_a_name_without_docstring_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def helper(x, n=3):
        return x

    helper.__doc__ = None
    monkeypatch.setattr(dt.optim, "helper", helper, raising=False)
    monkeypatch.setattr(dt.optim, "__all__", [*dt.optim.__all__, "helper"])
    assert apidoc.undocumented() == ["dt.optim.helper"]
    with pytest.raises(apidoc.ApiDocError, match=r"dt\.optim\.helper"):
        apidoc.page()


def test_a_new_top_level_name_needs_a_section(monkeypatch: pytest.MonkeyPatch) -> None:
    def brand_new():
        """Something new."""

    monkeypatch.setattr(dt, "brand_new", brand_new, raising=False)
    monkeypatch.setattr(dt, "__all__", [*dt.__all__, "brand_new"])
    with pytest.raises(apidoc.ApiDocError, match=r"brand_new.*SECTIONS"):
        apidoc.sections()
