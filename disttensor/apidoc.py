"""The API reference of docs/api.md, generated from the code.

    python -m disttensor.apidoc --write     # rewrite docs/api.md
    python -m disttensor.apidoc --check     # exit 1, with a diff, where it is out of date
    python -m disttensor.apidoc             # print the page

For every public name of ``dt`` (``disttensor.__all__``) that is not a numpy-named op (those
are in docs/ops.md, ``disttensor.ops.__all__``), and every public name of ``dt.nn``,
``dt.optim`` and ``dt.spmd`` (their ``__all__``): its signature (``inspect.signature``, with
defaults, without annotations) and the first paragraph of its own docstring, in the sections
of ``SECTIONS``. A top-level name that no section lists, or a name without a docstring of its
own, is an error; tests/test_api_doc.py checks both and that docs/api.md is what this writes.

>>> entry("dt.get_rank")[0]
'`dt.get_rank()`'
>>> entry("dt.spmd.TensorSpec")[0]
'`class dt.spmd.TensorSpec(shape, placements, dtype=None)`'
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

COMMAND = "python -m disttensor.apidoc --write"
PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"
SUBMODULES = ("nn", "optim", "spmd")  # documented name by name, each in a section of its own

# (title, introduction, names in reading order). A section named after a submodule also takes
# that submodule's names that it does not list, after the listed ones, by name.
SECTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Meshes and tensors",
        "A mesh of ranks, placements along its dims, and global tensors laid out by them "
        "([concepts](concepts.md)).",
        (
            "ProcessMesh",
            "init_mesh",
            "Placement",
            "Shard",
            "Replicate",
            "Partial",
            "DistSpec",
            "DistTensor",
            "shard_tensor",
            "dtensor_from_local",
        ),
    ),
    (
        "Ranks, devices and output",
        "Which rank this is, simulated ranks, the device new tensors live on, printing and "
        "logging once, and the errors that stop the ranks together.",
        (
            "get_rank",
            "get_world_size",
            "barrier",
            "simulate",
            "simulated",
            "set_device",
            "get_device",
            "print0",
            "get_logger",
            "RankAborted",
            "RanksDiverged",
        ),
    ),
    (
        "Creation",
        "New global tensors on a mesh: each rank makes only its own shard.",
        (
            "zeros",
            "ones",
            "empty",
            "full",
            "arange",
            "rand",
            "randn",
            "manual_seed",
            "zeros_like",
            "ones_like",
            "empty_like",
            "full_like",
        ),
    ),
    ("Resharding", "Moving a tensor to other placements or another mesh.", ("reshard",)),
    (
        "Compiled steps",
        "A loop's step recorded once and replayed without dispatch's work around each op "
        "([performance](performance.md)).",
        ("compile",),
    ),
    (
        "Autograd",
        "Recording ops for ``backward()`` ([ops](ops.md) says which ops have a gradient).",
        ("no_grad", "enable_grad", "is_grad_enabled"),
    ),
    (
        "nn",
        "",  # the first paragraph of dt.nn's docstring
        (
            "Module",
            "Parameter",
            "Sequential",
            "ModuleList",
            "Linear",
            "Embedding",
            "LayerNorm",
            "Dropout",
            "Identity",
            "GELU",
            "ReLU",
            "Sigmoid",
            "Tanh",
            "Softmax",
            "MLP",
            "MultiHeadAttention",
            "TransformerBlock",
            "CrossEntropyLoss",
            "MSELoss",
            "shard_layer",
            "place",
            "plan_shard_fn",
            "megatron_plan",
            "ColwiseParallel",
            "RowwiseParallel",
            "VocabParallel",
        ),
    ),
    (
        "optim",
        "",
        (
            "Optimizer",
            "SGD",
            "Momentum",
            "Adam",
            "AdamW",
            "cosine",
            "linear_warmup",
            "step_decay",
        ),
    ),
    (
        "Parallelism",
        "Data parallelism and sharded optimizer state ([training](training.md)).",
        (
            "DataParallel",
            "shard_optimizer",
            "ShardingStage1",
            "ShardingStage2",
            "ShardingStage3",
            "memory_report",
        ),
    ),
    (
        "Checkpoints",
        "Saving and loading sharded state ([checkpoints](checkpoints.md)).",
        ("save", "load"),
    ),
    (
        "Inspection and debugging",
        "What moved, where a tensor lives, and what took the fallback "
        "([inspection](inspection.md)).",
        ("explain", "describe", "visualize_sharding", "CommCounter", "fallback_report"),
    ),
    (
        "spmd",
        "",
        ("infer_forward", "TensorSpec", "RuleResult", "registered_ops", "get_rule", "register"),
    ),
)
TITLES = {"nn": "nn", "optim": "optim", "spmd": "SPMD rules"}  # the submodules' section titles


class ApiDocError(Exception):
    """The code cannot be documented as it is: a public name in no section, one without a
    docstring, a default without a stable text."""


def _dt() -> ModuleType:
    import disttensor

    return disttensor


def _ops() -> set[str]:
    from . import ops

    return set(ops.__all__)


def top_level_names() -> list[str]:
    """``disttensor.__all__`` without the numpy-named ops and the submodules."""
    ops = _ops()
    return [n for n in _dt().__all__ if n not in ops and n not in SUBMODULES]


def sections() -> list[tuple[str, str, list[str]]]:
    """(title, introduction, qualified names ``dt.x`` / ``dt.nn.x``) of every section, in page
    order. Raises ApiDocError for a top-level name no section lists, or a listed name that is
    not public."""
    dt = _dt()
    public = set(top_level_names())
    placed: set[str] = set()
    out = []
    for title, intro, names in SECTIONS:
        if title in SUBMODULES:
            module = getattr(dt, title)
            exported = list(module.__all__)
            bad = [n for n in names if n not in exported]
            if bad:
                raise ApiDocError(f"SECTIONS lists names dt.{title} does not export: {bad}")
            rest = sorted((n for n in exported if n not in names), key=str.lower)
            quals = [f"dt.{title}.{n}" for n in (*names, *rest)]
            intro = intro or _first_paragraph(module.__doc__ or "")
            title = TITLES[title]
        else:
            bad = [n for n in names if n not in public]
            if bad:
                raise ApiDocError(f"SECTIONS lists names not in disttensor.__all__: {bad}")
            quals = [f"dt.{n}" for n in names]
            placed.update(names)
        out.append((title, intro, quals))
    # a top-level name that is a submodule's (dt.shard_layer is dt.nn.shard_layer) is there
    aliases = {id(_resolve(q)) for _, _, qs in out for q in qs if q.count(".") == 2}
    missing = [n for n in public - placed if id(getattr(dt, n)) not in aliases]
    if missing:
        raise ApiDocError(
            f"disttensor.__all__ names that no section of docs/api.md lists: {sorted(missing)}; "
            "add each to a section of SECTIONS in disttensor/apidoc.py"
        )
    return out


def _resolve(qual: str) -> Any:
    obj: Any = _dt()
    for part in qual.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def aliases(qual: str) -> list[str]:
    """Other public names of the object ``qual`` names (``dt.shard_layer`` for
    ``dt.nn.shard_layer``)."""
    obj = _resolve(qual)
    dt = _dt()
    return [f"dt.{n}" for n in top_level_names() if getattr(dt, n) is obj and f"dt.{n}" != qual]


# -- one entry ------------------------------------------------------------------------------------
def own_doc(obj: Any) -> str | None:
    """``obj``'s own docstring: a class's from its body only (not inherited, and not the
    signature that ``dataclass`` writes where there is none)."""
    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__")
        if doc and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            return None  # dataclass's stand-in
    else:
        doc = getattr(obj, "__doc__", None)
    doc = inspect.cleandoc(doc) if doc else ""
    return doc or None


def _first_paragraph(doc: str) -> str:
    return inspect.cleandoc(doc).split("\n\n", 1)[0].strip()


class _Default:
    """A parameter default as the page shows it: ``np.float32`` for numpy's scalar types, a
    class by its qualified name, otherwise its repr, which must not hold an address."""

    def __init__(self, value: Any, where: str) -> None:
        if isinstance(value, type):
            module = value.__module__
            self.text = f"np.{value.__name__}" if module == "numpy" else value.__qualname__
        else:
            self.text = repr(value)
            if " at 0x" in self.text:
                raise ApiDocError(f"{where}: default {self.text} differs from run to run")

    def __repr__(self) -> str:
        return self.text


def signature(qual: str) -> str:
    """``qual``'s call with its parameters and defaults, without annotations: ``class`` before
    a class (its constructor's parameters), ``exception`` before an exception class."""
    obj = _resolve(qual)
    try:
        sig = inspect.signature(obj)
    except ValueError:  # a class whose constructor is a builtin's (an exception)
        params = "(*args)"
    else:
        plain = [
            p.replace(
                annotation=inspect.Parameter.empty,
                default=p.default
                if p.default is inspect.Parameter.empty
                else _Default(p.default, qual),
            )
            for p in sig.parameters.values()
        ]
        params = str(sig.replace(parameters=plain, return_annotation=inspect.Signature.empty))
    if isinstance(obj, type):
        kind = "exception " if issubclass(obj, BaseException) else "class "
    else:
        kind = ""
    return f"{kind}{qual}{params}"


def entry(qual: str) -> list[str]:
    """The page's lines for ``qual``: its signature in a code span, then the first paragraph of
    its docstring. Raises ApiDocError where it has no docstring."""
    doc = own_doc(_resolve(qual))
    if doc is None:
        raise ApiDocError(f"{qual} has no docstring")
    lines = [f"`{signature(qual)}`", ""]
    also = aliases(qual)
    if also:
        lines += [f"Also {', '.join(f'`{a}`' for a in also)}.", ""]
    return lines + _first_paragraph(doc).splitlines()


def undocumented() -> list[str]:
    """The documented names (every section's) that have no docstring of their own."""
    return [q for _, _, quals in sections() for q in quals if own_doc(_resolve(q)) is None]


# -- the page -------------------------------------------------------------------------------------
def page() -> str:
    """The whole of docs/api.md. Raises ApiDocError listing every name without a docstring."""
    missing = undocumented()
    if missing:
        raise ApiDocError(
            f"public names without a docstring (docs/api.md shows each one's first paragraph): "
            f"{missing}"
        )
    secs = sections()
    lines = [
        "# API reference",
        "",
        "<!-- generated: do not edit; tests/test_api_doc.py checks it against the code -->",
        f"Generated from the docstrings by `{COMMAND}`;",
        "run it again after adding or changing a public name or its docstring.",
        "",
        "Every public name of `dt` (`import disttensor as dt`) but the numpy-named ops, which",
        "are in [ops.md](ops.md), and every public name of `dt.nn`, `dt.optim` and `dt.spmd`:",
        "its signature with the defaults, and the first paragraph of its docstring.",
        "`help(dt.<name>)` shows the whole docstring, the annotations and a class's methods.",
        "",
        *(f"- [{title}](#{_slug(title)})" for title, _, _ in secs),
        "",
    ]
    for title, intro, quals in secs:
        lines += [f"## {title}", ""]
        if intro:
            lines += [*textwrap.wrap(intro, 100, break_long_words=False, break_on_hyphens=False)]
            lines.append("")
        for qual in quals:
            lines += [f"### {qual}", "", *entry(qual), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _slug(title: str) -> str:
    """GitHub's anchor of a heading made of letters, digits and spaces."""
    return "-".join(title.lower().replace(",", "").split())


def diff(current: str, want: str) -> str:
    return "\n".join(
        difflib.unified_diff(
            current.splitlines(), want.splitlines(), "docs/api.md", "the code", lineterm=""
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m disttensor.apidoc", description=__doc__)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="rewrite docs/api.md")
    what.add_argument("--check", action="store_true", help="exit 1 where docs/api.md differs")
    args = parser.parse_args(argv)
    text = page()
    if args.write:
        PAGE.write_text(text)
        return 0
    if args.check:
        current = PAGE.read_text() if PAGE.exists() else ""
        if current != text:
            sys.stderr.write(f"docs/api.md differs from the code; run `{COMMAND}`:\n")
            sys.stderr.write(diff(current, text) + "\n")
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
