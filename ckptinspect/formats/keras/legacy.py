"""The legacy Keras ``.h5`` layout (``model.save('m.h5')``, Keras 2 ``save_weights('w.h5')``):
variable names from the ``layer_names`` / ``weight_names`` attributes, header facts from the
root attributes. Part of :mod:`.keras_h5`.
"""

from __future__ import annotations

from typing import Any

from ... import model as m
from ...errors import CorruptCheckpointError
from typing import Protocol

from .h5_walk import _h5py, _make_variables, _split_attr, _strip_index, _text, _Walk, _join

# Legacy layout names.
MODEL_WEIGHTS = "model_weights"
OPTIMIZER_WEIGHTS = "optimizer_weights"
TOP_LEVEL_MODEL_WEIGHTS = "top_level_model_weights"
LAYER_NAMES_ATTR = "layer_names"
WEIGHT_NAMES_ATTR = "weight_names"
MODEL_CONFIG_ATTR = "model_config"
TRAINING_CONFIG_ATTR = "training_config"
KERAS_VERSION_ATTR = "keras_version"
BACKEND_ATTR = "backend"

LAYOUT_LEGACY_FULL = "legacy-full"
LAYOUT_LEGACY_WEIGHTS = "legacy-weights"


def _legacy_model_name(layer: str, weight_name: str) -> str:
    """``dense`` + ``dense/kernel:0`` -> ``dense/kernel``; ``sequential/dense/kernel`` -> ``dense/kernel``."""
    wn = _strip_index(weight_name)
    if layer == TOP_LEVEL_MODEL_WEIGHTS:
        return wn
    parts = wn.split("/")
    if layer in parts:
        return "/".join(parts[parts.index(layer) :])
    return f"{layer}/{wn}"


class Attrs(Protocol):
    """The attributes of a file's groups, by the group's path (``""``: the root)."""

    def has(self, group: str, name: str) -> bool: ...

    def text(self, group: str, name: str) -> str:
        """The attribute as text (``_text`` of its value as h5py reads it)."""

    def split(self, group: str, name: str) -> list[str]:
        """A list attribute, whole or split into ``name0``, ``name1``... (:func:`_split_attr`)."""


class H5pyAttrs:
    """:class:`Attrs` of an open ``h5py.File``."""

    def __init__(self, h5: Any):
        self.h5 = h5

    def _obj(self, group: str) -> Any:
        return self.h5[group] if group else self.h5

    def has(self, group: str, name: str) -> bool:
        return name in self._obj(group).attrs

    def text(self, group: str, name: str) -> str:
        return _text(self._obj(group).attrs[name])

    def split(self, group: str, name: str) -> list[str]:
        if not group:
            return _split_attr(self.h5, name)
        return _split_attr(_h5py().h5o.open(self.h5["/"].id, group.encode()), name)


def _legacy_variables(attrs: Attrs, walk: _Walk, base: str, label: str) -> list[m.Variable]:
    layer_names = attrs.split(base, LAYER_NAMES_ATTR)
    if TOP_LEVEL_MODEL_WEIGHTS not in layer_names and _join(base, TOP_LEVEL_MODEL_WEIGHTS) in walk.groups:
        layer_names.append(TOP_LEVEL_MODEL_WEIGHTS)
    out: list[tuple[str, str, str]] = []  # (key, name, role)
    claimed: set[str] = set()

    def claim(key: str, name: str, role: str, owner: str) -> None:
        if key not in walk.datasets:
            raise CorruptCheckpointError(f"{label}: {owner} names weight {key!r} but the file has no such dataset")
        if key in claimed:
            raise CorruptCheckpointError(f"{label}: weight {key!r} is named twice in {owner}")
        claimed.add(key)
        out.append((key, name, role))

    for layer in layer_names:
        layer_path = _join(base, layer)
        if layer_path not in walk.groups:
            raise CorruptCheckpointError(
                f"{label}: {LAYER_NAMES_ATTR} lists layer {layer!r} but the file has no group {layer_path!r}"
            )
        for wn in attrs.split(layer_path, WEIGHT_NAMES_ATTR):
            claim(_join(layer_path, wn), _legacy_model_name(layer, wn), m.ROLE_MODEL, f"layer {layer!r}")

    if base and OPTIMIZER_WEIGHTS in walk.groups:
        for wn in attrs.split(OPTIMIZER_WEIGHTS, WEIGHT_NAMES_ATTR):
            claim(_join(OPTIMIZER_WEIGHTS, wn), "optimizer/" + _strip_index(wn), m.ROLE_OPTIMIZER, OPTIMIZER_WEIGHTS)

    # Datasets no attribute names: optimizer ones stay optimizer state; anything else is
    # listed as metadata (Keras would not load it into the model).
    for key in walk.datasets:
        if key in claimed:
            continue
        if base and key.startswith(OPTIMIZER_WEIGHTS + "/"):
            out.append((key, "optimizer/" + _strip_index(key[len(OPTIMIZER_WEIGHTS) + 1 :]), m.ROLE_OPTIMIZER))
        else:
            out.append((key, _strip_index(key), m.ROLE_METADATA))
    return _make_variables(out, walk)


def _json_attr(attrs: Attrs, name: str) -> dict | list | None:
    if not attrs.has("", name):
        return None
    import json  # noqa: PLC0415 - a legacy .h5 file's configs only: ls of a .weights.h5 file imports no json

    try:
        return json.loads(attrs.text("", name))
    except (ValueError, TypeError):
        return None


def summarize_model_config(config: Any) -> dict[str, Any]:
    """Model class, name and layer count from a Keras model config (legacy or Keras 3)."""
    out: dict[str, Any] = {}
    if not isinstance(config, dict):
        return out
    if "class_name" in config:
        out["model_class"] = config["class_name"]
    inner = config.get("config")
    layers = None
    if isinstance(inner, list):  # Keras <= 2.1 Sequential: the config is the layer list
        layers = inner
    elif isinstance(inner, dict):
        if isinstance(inner.get("name"), str):
            out["model_name"] = inner["name"]
        if isinstance(inner.get("layers"), list):
            layers = inner["layers"]
    if layers is not None:
        # As len(model.layers): a Sequential model does not count its InputLayer.
        if out.get("model_class") == "Sequential":
            layers = [x for x in layers if not (isinstance(x, dict) and x.get("class_name") == "InputLayer")]
        out["layer_count"] = len(layers)
    return out


def _legacy_info(attrs: Attrs, walk: _Walk, layout: str) -> dict[str, Any]:
    """Header facts from the attributes of the root (or of ``model_weights``)."""
    info: dict[str, Any] = {"layout": layout}
    has_weights = MODEL_WEIGHTS in walk.groups or MODEL_WEIGHTS in walk.datasets
    src = "" if attrs.has("", KERAS_VERSION_ATTR) or not has_weights else MODEL_WEIGHTS
    for attr in (KERAS_VERSION_ATTR, BACKEND_ATTR):
        if attrs.has(src, attr):
            info[attr] = attrs.text(src, attr)
    model_config = _json_attr(attrs, MODEL_CONFIG_ATTR)
    if model_config is not None:
        info.update(summarize_model_config(model_config))
    elif attrs.has("", MODEL_CONFIG_ATTR):
        info["model_config_error"] = "model_config is not valid JSON"
    names = attrs.split(MODEL_WEIGHTS if layout == LAYOUT_LEGACY_FULL else "", LAYER_NAMES_ATTR)
    info.setdefault("layer_count", len(names))
    training = _json_attr(attrs, TRAINING_CONFIG_ATTR)
    if isinstance(training, dict):
        opt = training.get("optimizer_config")
        if isinstance(opt, dict) and "class_name" in opt:
            info["optimizer_class"] = opt["class_name"]
        if isinstance(training.get("loss"), (str, dict)):
            loss = training["loss"]
            info["loss"] = loss if isinstance(loss, str) else loss.get("class_name")
    return info
