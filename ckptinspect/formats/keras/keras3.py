"""The Keras 3 ``.weights.h5`` layout: positional ``<object path>/vars/<i>`` datasets named
after their layers (see :mod:`.keras_h5`). Part of :mod:`.keras_h5`.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from ... import model as m
from .h5_walk import VARS_GROUP, _Dataset, _make_variables, _Walk, _join

OPTIMIZER_GROUP = "optimizer"
# Path components that only hold other objects (Keras 3 ``layers``, tf.keras 2.13+
# ``_layer_checkpoint_dependencies``); readable names skip them.
CONTAINER_GROUPS = frozenset({"layers", "_layer_checkpoint_dependencies"})

LAYOUT_KERAS3 = "keras3"

# (path components, number of stored vars) -> variable names, or None for vars/N.
VarNamer = Callable[[tuple[str, ...], int], "Sequence[str] | None"]


_DIGITS = re.compile(r"(\d+)")


def _natural_key(key: str) -> tuple:
    parts: list = _DIGITS.split(key)  # text, digits, text, ...: the digit runs compare as numbers
    parts[1::2] = [int(p) for p in parts[1::2]]
    return tuple(parts)


def _split_component(component: str) -> list[str]:
    """A path component, split at the backslashes of Windows-written files, containers dropped."""
    if "\\" not in component:  # (most components)
        return [component] if component and component not in CONTAINER_GROUPS else []
    return [p for p in component.split("\\") if p and p not in CONTAINER_GROUPS]


def _keras3_variables(
    walks: Sequence[_Walk], namer: VarNamer | None, shard_of: dict[str, int] | None = None
) -> list[m.Variable]:
    vars_names: dict[str, str] = {}
    for w in walks:
        for g, n in w.vars_names.items():
            vars_names.setdefault(g, n)
    datasets: dict[str, _Dataset] = {}
    for w in walks:
        for key, ds in w.datasets.items():
            datasets.setdefault(key, ds)

    # Group the datasets of each vars group; groups and vars in natural order (dense_2 < dense_10).
    by_group: dict[str, list[str]] = {}
    loose: list[str] = []
    for key in datasets:
        parent, _, leaf = key.rpartition("/")
        if parent.rpartition("/")[2] == VARS_GROUP or parent == VARS_GROUP:
            by_group.setdefault(parent, []).append(key)
        else:
            loose.append(key)

    out: list[tuple[str, str, str]] = []
    for vars_group in sorted(by_group, key=_natural_key):
        keys = by_group[vars_group]
        if len(keys) > 1:
            start = len(vars_group) + 1
            if all(k[start:].isdecimal() for k in keys):  # vars/0, vars/1...: one parent, numbers
                keys.sort(key=lambda k: int(k[start:]))
            else:
                keys.sort(key=_natural_key)
        owner = vars_group[: -len(VARS_GROUP)].rstrip("/")
        components = owner.split("/") if owner else []
        if components and _split_component(components[0])[:1] == [OPTIMIZER_GROUP]:
            role = m.ROLE_OPTIMIZER
            path = [p for c in components for p in _split_component(c)]
        else:
            role = m.ROLE_MODEL
            path = []
            for i, component in enumerate(components):
                named = vars_names.get("/".join(components[: i + 1]) + "/" + VARS_GROUP)
                if named is not None and "\\" not in component:
                    path.append(named)
                else:
                    path.extend(_split_component(component))
        indices = [k.rpartition("/")[2] for k in keys]
        names = None
        if namer is not None and role == m.ROLE_MODEL and indices == [str(i) for i in range(len(keys))]:
            names = namer(tuple(path), len(keys))
            if names is not None and len(names) != len(keys):
                names = None
        prefix = _join(*path)  # the path once per group, each variable's leaf added to it
        for j, key in enumerate(keys):
            leaf = names[j] if names else f"{VARS_GROUP}/{indices[j]}"
            out.append((key, (prefix + "/" + leaf if prefix else leaf) if leaf else prefix, role))
    for key in loose:
        out.append((key, "/".join(p for c in key.split("/") for p in _split_component(c)), m.ROLE_METADATA))
    return _make_variables(out, None, datasets=datasets, shard_of=shard_of)


def _keras3_info(walks: Sequence[_Walk]) -> dict[str, Any]:
    info: dict[str, Any] = {"layout": LAYOUT_KERAS3}
    for w in walks:
        if VARS_GROUP in w.vars_names:
            info.setdefault("model_name", w.vars_names[VARS_GROUP])
        opt = w.vars_names.get(f"{OPTIMIZER_GROUP}/{VARS_GROUP}")
        if opt is not None:
            info.setdefault("optimizer_name", opt)
    return info
