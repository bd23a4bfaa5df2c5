"""The state tree as JSON, and matching a template against it.

A state is nested dicts, lists and tuples whose leaves are tensors (DistTensors, numpy arrays
and numpy scalars) or Python values (int, float, str, bool, None). In the metadata every node
is one JSON object: ``{"dict": [[key, node], ...]}`` (keys keep their type: str, int, float,
bool or None), ``{"list": [...]}``, ``{"tuple": [...]}``, ``{"value": x}``, or
``{"tensor": i}`` for entry i of the tensor table.

>>> node, leaves = flatten({"w": np.zeros(2), "step": 3, "betas": (0.9, 0.99)})
>>> node
{'dict': [['w', {'tensor': 0}], ['step', {'value': 3}], ['betas', {'tuple': [{'value': 0.9}, \
{'value': 0.99}]}]]}
>>> leaves
[(('w',), array([0., 0.]))]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensor import DistTensor

SCALARS = (int, float, str, bool, type(None))  # exact types: JSON gives back exactly these
KEYS = SCALARS


def path_str(path: tuple) -> str:
    """``state['a'][0]``: where an entry sits.

    >>> path_str(("optim", "state", 0, "exp_avg"))
    "state['optim']['state'][0]['exp_avg']"
    """
    return "state" + "".join(f"[{k!r}]" for k in path)


def flatten(state: Any) -> tuple[dict[str, Any], list[tuple[tuple, Any]]]:
    """The JSON node of ``state`` and its tensors in order, as (path, tensor); TypeError,
    naming the entry, for anything a checkpoint cannot hold."""
    leaves: list[tuple[tuple, Any]] = []

    def walk(x: Any, path: tuple) -> dict[str, Any]:
        if isinstance(x, (DistTensor, np.ndarray, np.generic)):
            if x.dtype.hasobject:
                raise TypeError(
                    f"dt.save: {path_str(path)} is an array of Python objects ({x.dtype}), "
                    "which has no file format; convert it to a numeric or string dtype"
                )
            leaves.append((path, x))
            return {"tensor": len(leaves) - 1}
        if isinstance(x, dict):
            items = []
            for k, v in x.items():
                if type(k) not in KEYS:
                    raise TypeError(
                        f"dt.save: {path_str(path)} has a key {k!r} of type {type(k).__name__}; "
                        "keys must be str, int, float, bool or None"
                    )
                items.append([k, walk(v, (*path, k))])
            return {"dict": items}
        if isinstance(x, (list, tuple)):
            kind = "tuple" if isinstance(x, tuple) else "list"
            return {kind: [walk(v, (*path, i)) for i, v in enumerate(x)]}
        if type(x) in SCALARS:
            return {"value": x}
        raise TypeError(
            f"dt.save: {path_str(path)} is a {type(x).__name__}, which a checkpoint cannot hold; "
            "use DistTensors, numpy arrays, dicts, lists and tuples of them, and int, float, "
            "str, bool or None (convert the value first, e.g. to a numpy array or a str)"
        )

    return walk(state, ()), leaves


class Slot:
    """Where the ``index``-th tensor read goes in a matched structure."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


ANY = object()  # a template that takes whatever was saved


def match(
    template: Any, node: dict[str, Any], tensors: list[dict], requests: list, path: tuple = ()
) -> Any:
    """The structure ``load`` returns, with a Slot per tensor to read; appends (tensor table
    entry, target, path) to ``requests``, where target is the template DistTensor, "numpy"
    (the whole value as an array) or "default" (Note [Loading without a template tensor]).
    Raises KeyError/ValueError/TypeError, naming the entry, for templates that do not fit.

    >>> reqs = []
    >>> match({"step": 0}, {"dict": [["step", {"value": 7}], ["x", {"tensor": 0}]]}, [], reqs)
    {'step': 7}
    """
    if "tensor" in node:
        rec = tensors[node["tensor"]]
        if _container(template):
            raise TypeError(
                f"dt.load: {path_str(path)} is a tensor in the checkpoint but the template has "
                f"{_describe(template)}"
            )
        if isinstance(template, DistTensor):
            saved = (tuple(rec["shape"]), np.dtype(rec["dtype"]))
            if saved != (template.shape, template.dtype):
                raise ValueError(
                    f"dt.load: {path_str(path)} is {saved[0]} {saved[1]} in the checkpoint but "
                    f"the template has {template.shape} {template.dtype}; build the template "
                    "tensor with the saved shape and dtype (cast after loading if needed)"
                )
            target: Any = template
        elif rec["kind"] == "dtensor" and not isinstance(template, np.ndarray):
            target = "default"
        else:
            target = "numpy"
        requests.append((rec, target, path))
        return Slot(len(requests) - 1)
    if isinstance(template, DistTensor):
        raise TypeError(
            f"dt.load: {path_str(path)} is a DistTensor in the template but "
            f"{_kind(node)} in the checkpoint"
        )
    takes_all = not _container(template) or (isinstance(template, dict) and not template)
    if "dict" in node:
        saved = {k: child for k, child in node["dict"]}
        if takes_all:
            return {k: match(ANY, c, tensors, requests, (*path, k)) for k, c in saved.items()}
        if not isinstance(template, dict):
            raise TypeError(
                f"dt.load: {path_str(path)} is a dict in the checkpoint but the template has "
                f"{_describe(template)}"
            )
        out = {}
        for k, t in template.items():
            if k not in saved:
                keys = list(saved)
                raise KeyError(
                    f"dt.load: the checkpoint has no {path_str((*path, k))}; "
                    f"{path_str(path)} has the keys {keys[:20]}{' ...' if len(keys) > 20 else ''}"
                )
            out[k] = match(t, saved[k], tensors, requests, (*path, k))
        return out
    for kind in ("list", "tuple"):
        if kind in node:
            items = node[kind]
            if takes_all:
                kids = [match(ANY, c, tensors, requests, (*path, i)) for i, c in enumerate(items)]
                return tuple(kids) if kind == "tuple" else kids
            if isinstance(template, dict) or len(template) != len(items):
                raise ValueError(
                    f"dt.load: {path_str(path)} is a {kind} of {len(items)} items in the "
                    f"checkpoint but the template has {_describe(template)}"
                )
            kids = [
                match(t, c, tensors, requests, (*path, i))
                for i, (t, c) in enumerate(zip(template, items))
            ]
            return tuple(kids) if isinstance(template, tuple) else kids
    if _container(template):
        raise TypeError(
            f"dt.load: {path_str(path)} is a Python value in the checkpoint but the template "
            f"has {_describe(template)}"
        )
    return node["value"]


def _container(template: Any) -> bool:
    return isinstance(template, (dict, list, tuple))


def _kind(node: dict[str, Any]) -> str:
    if "tensor" in node:
        return "a tensor"
    return "a Python value" if "value" in node else f"a {next(iter(node))}"


def _describe(template: Any) -> str:
    if isinstance(template, (list, tuple)):
        return f"a {type(template).__name__} of {len(template)} items"
    return f"a {type(template).__name__}"


def fill(structure: Any, values: list[Any]) -> Any:
    """``structure`` with every Slot replaced by its value.

    >>> fill({"a": [Slot(0), 2]}, ["x"])
    {'a': ['x', 2]}
    """
    if isinstance(structure, Slot):
        return values[structure.index]
    if isinstance(structure, dict):
        return {k: fill(v, values) for k, v in structure.items()}
    if isinstance(structure, list):
        return [fill(v, values) for v in structure]
    if isinstance(structure, tuple):
        return tuple(fill(v, values) for v in structure)
    return structure
