"""The format registry: detection, kinds, format names and the "expected" text come from it, and
a format registered from outside the package works with ls, diff and verify (the "adding a
format" recipe of docs/ARCHITECTURE.md, kept true)."""

from __future__ import annotations

import json
import pathlib
import struct

import numpy as np
import pytest
from click.testing import CliRunner

from ckptinspect import formats
from ckptinspect import model as m
from ckptinspect.cli import app
from ckptinspect.errors import CorruptCheckpointError, NotACheckpointError
from ckptinspect.formats import _registry

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"

# -- a small format of our own: "TOY1", a JSON header's length (8 bytes), the header, raw little-endian values
TOY_MAGIC = b"TOY1"
TOY_LENGTH = struct.Struct("<Q")


def write_toy(path: pathlib.Path, arrays: dict[str, np.ndarray]) -> None:
    header, offset, body = {}, 0, b""
    for name, value in arrays.items():
        raw = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()
        header[name] = {"shape": list(value.shape), "dtype": value.dtype.name, "offset": offset, "nbytes": len(raw)}
        offset += len(raw)
        body += raw
    text = json.dumps(header).encode()
    path.write_bytes(TOY_MAGIC + TOY_LENGTH.pack(len(text)) + text + body)


def sniff_toy(probe: _registry.Probe) -> str | None:
    return probe.path if probe.head(len(TOY_MAGIC)) == TOY_MAGIC else None


class ToySource(m.BaseSource):
    def __init__(self, path: str, start: int, header: dict):
        self._path, self._start, self._header = path, start, header

    def read(self, variable: m.Variable) -> np.ndarray:
        entry = self._header[variable.key]
        with open(self._path, "rb") as f:
            f.seek(self._start + entry["offset"])
            raw = f.read(entry["nbytes"])
        if len(raw) != entry["nbytes"]:
            raise CorruptCheckpointError(f"{self._path}: {variable.key!r} is cut short ({len(raw)} of {entry['nbytes']} bytes)")
        return np.frombuffer(raw, dtype=np.dtype(entry["dtype"]).newbyteorder("<")).reshape(entry["shape"])

    def files(self) -> tuple[str, ...]:
        return (self._path,)


def open_toy(path: str) -> m.Checkpoint:
    with open(path, "rb") as f:
        f.read(len(TOY_MAGIC))
        (length,) = TOY_LENGTH.unpack(f.read(TOY_LENGTH.size))
        header = json.loads(f.read(length))
    variables = tuple(m.Variable(key=k, name=k, shape=tuple(e["shape"]), dtype=e["dtype"], nbytes=e["nbytes"])
                      for k, e in header.items())
    return m.Checkpoint(path=path, format="toy", variables=variables, source=ToySource(path, len(TOY_MAGIC) + TOY_LENGTH.size + length, header))


@pytest.fixture
def toy_format():
    spec = _registry.register(_registry.FormatSpec(
        "toy", "toy", _registry.AT_FILE, sniff_toy, open=open_toy, formats=("toy",), describe="a toy file"))
    try:
        yield spec
    finally:
        _registry.unregister("toy")


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_a_registered_format_works_with_ls_diff_and_verify(toy_format, tmp_path):
    a, b = tmp_path / "a.toy", tmp_path / "b.toy"
    kernel = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_toy(a, {"dense/kernel": kernel, "dense/bias": np.zeros(4, np.float32)})
    write_toy(b, {"dense/kernel": kernel + 1, "dense/bias": np.zeros(4, np.float32)})

    assert formats.detect(str(a)) == (toy_format, str(a))
    listed = _run("ls", "--format", "json", str(a))
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.stdout)
    assert doc["format"] == "toy"
    assert sorted((v["name"], v["shape"], v["dtype"]) for v in doc["variables"]) == [
        ("dense/bias", [4], "float32"), ("dense/kernel", [3, 4], "float32")]

    diffed = _run("diff", "--format", "json", str(a), str(b))
    assert diffed.exit_code == 1, diffed.output  # differences found
    statuses = {row["name"]: row["status"] for row in json.loads(diffed.stdout)["variables"]}
    assert statuses == {"dense/kernel": "changed", "dense/bias": "equal"}

    verified = _run("verify", "--format", "json", str(a))
    assert verified.exit_code == 0, verified.output
    assert json.loads(verified.stdout)["checkpoints"][0]["status"] == m.STATUS_INTACT

    b.write_bytes(b.read_bytes()[:-8])  # the bias cut short: damage, found by reading every value
    damaged = _run("verify", "--format", "json", str(b))
    assert damaged.exit_code == 1, damaged.output
    result = json.loads(damaged.stdout)["checkpoints"][0]
    assert result["status"] == m.STATUS_DAMAGED
    assert [d["key"] for d in result["damaged"]] == ["dense/bias"]


def test_the_registry_names_the_kinds_formats_and_what_is_expected(toy_format, tmp_path):
    assert "toy" in _registry.format_names()
    assert formats.Kind.TOY is toy_format
    assert formats.expected().endswith("or a toy file")
    other = tmp_path / "x.bin"
    other.write_bytes(b"nothing we know")
    with pytest.raises(NotACheckpointError, match="a toy file"):
        formats.detect(str(other))


def test_unregistered_the_format_is_not_recognised(tmp_path):
    path = tmp_path / "a.toy"
    write_toy(path, {"w": np.ones(2, np.float32)})
    with pytest.raises(NotACheckpointError, match=r"not a checkpoint; expected .* or a \.safetensors file$"):
        formats.detect(str(path))


def test_every_format_name_is_listed_by_the_interface_document():
    text = (ROOT / "docs" / "INTERFACE.md").read_text()
    missing = [name for name in formats.FORMATS if f"`{name}`" not in text]
    assert not missing, f"docs/INTERFACE.md does not list the formats {missing}"


def test_capabilities_are_asked_not_format_names():
    bundle = formats.spec_of(str(FIXTURES / "run" / "ckpt-8"))
    h5 = formats.spec_of(str(FIXTURES / "keras" / "model.h5"))
    assert bundle.can("object-graph") and bundle.can("slices") and bundle.can("checksums")
    assert not h5.can("object-graph") and h5.can("writable")
    with pytest.raises(ValueError, match="unknown capability"):
        bundle.can("teleport")


def test_capabilities_the_writers_ask():
    with formats.open_checkpoint(str(FIXTURES / "run" / "ckpt-8")) as ckpt:
        assert formats.capabilities(ckpt.format) == formats.spec_of(ckpt.path).capabilities
    assert {"tf-restorable", "stored-bytes", "slices"} <= formats.capabilities(m.FORMAT_TF_SAVEDMODEL)
    v1 = formats.capabilities(m.FORMAT_TF_V1)
    assert "tf-restorable" in v1 and "stored-bytes" not in v1 and "slices" not in v1
    assert formats.capabilities(m.FORMAT_KERAS_WEIGHTS_H5) == formats.capabilities(m.FORMAT_KERAS_H5) == {
        "writable", "keras-layout"}
    assert formats.capabilities("no-such-format") == frozenset()


def test_a_kind_registers_once_per_place():
    with pytest.raises(ValueError, match="already registered"):
        _registry.register(_registry.FormatSpec("safetensors", "x", _registry.AT_FILE, sniff_toy, open=open_toy))


def test_capabilities_by_format_name():
    assert "tf-restorable" in formats.capabilities("tf-bundle")
    assert "tf-restorable" in formats.capabilities("tf-v1-table")
    assert "keras-layout" in formats.capabilities("keras-weights-h5")
    assert "keras-layout" in formats.capabilities("keras-zip")
    assert "keras-layout" not in formats.capabilities("safetensors")
    assert formats.capabilities("no-such-format") == frozenset()


def test_the_cli_path_help_is_the_registry_text():
    from ckptinspect import cli

    assert cli.PATH_HELP == f"The checkpoint: {formats.described()}."
    for spec in formats.Kind:
        if spec.describe:
            assert spec.describe in cli.PATH_HELP
