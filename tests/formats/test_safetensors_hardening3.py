"""Issue 27, items 9-11: safetensors headers and Hugging Face indexes built for real (JSON
written byte by byte, a .safetensors written by ``extract`` and its ``__metadata__`` changed)."""

from __future__ import annotations

import json
import pathlib
import shutil
import struct
import time

import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.errors import CorruptCheckpointError
from ckptinspect.formats.safetensors.file import read_header
from torch_builders import TORCH_FIXTURES, safetensors_file

runner = CliRunner()
ROOT = pathlib.Path(__file__).resolve().parents[2]
FOUR = struct.pack("<4f", 1, 2, 3, 4)


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def raw_safetensors(path: pathlib.Path, header: bytes, data: bytes = b"") -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


# -- 9. deeply nested JSON -----------------------------------------------------------------------
@pytest.mark.parametrize("where", ["header", "metadata"])
def test_deep_json_in_a_header_is_damage(where, tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000
    header = b'{"w": ' + deep + b"}" if where == "header" else b'{"__metadata__": {"x": ' + deep + b"}}"
    path = raw_safetensors(tmp_path / "deep.safetensors", header)
    start = time.process_time()  # CPU time: the bound is the work done, whatever the machine's load
    with pytest.raises(CorruptCheckpointError, match="safetensors header nests 65 levels deep"):
        ckptinspect.open(path)
    verify = cli("verify", path)
    assert verify.exit_code == 1 and "DAMAGED" in verify.stdout and "nests 65 levels deep" in verify.stdout, verify.output
    ls = cli("ls", path)
    assert ls.exit_code == 2 and ls.stderr.startswith(f"Error: {path}: safetensors header nests"), ls.output
    assert time.process_time() - start < 5


def test_deep_json_in_an_hf_index_is_damage(tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(TORCH_FIXTURES / "hf_sharded", folder)
    index = folder / "model.safetensors.index.json"
    index.write_bytes(b'{"metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b', "weight_map": {}}')
    for args in (["ls", folder], ["diff", folder, folder]):
        result = cli(*args)
        assert result.exit_code == 2 and result.stderr.startswith(f"Error: {index}: sharded weights index nests"), \
            result.output
    verify = cli("verify", folder)
    assert verify.exit_code == 1 and "nests 65 levels deep" in verify.stdout, verify.output


def test_brackets_inside_strings_do_not_count(tmp_path):
    header = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "__metadata__": {"note": "[" * 500}}
    path = safetensors_file(tmp_path / "ok.safetensors", header, FOUR)
    with ckptinspect.open(path) as ckpt:
        assert ckpt.info["metadata"]["note"] == "[" * 500 and list(ckpt.read("w")) == [1, 2, 3, 4]


# -- 10. one rule for a dimension ----------------------------------------------------------------
@pytest.mark.parametrize("shape", [[0, 10**30], [2**62, 2**62, 0], [0, -1], [0, True], [2**63]],
                         ids=["1e30", "product", "negative", "bool", "2**63"])
def test_dimensions_out_of_int64_are_damage_when_the_header_is_read(shape, tmp_path):
    header = {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}
    path = safetensors_file(tmp_path / "dims.safetensors", header, b"")
    with pytest.raises(CorruptCheckpointError, match=r"has a bad shape .* \(at most 64 ints in \[0, 2\*\*63\)"):
        ckptinspect.open(path)
    verify = cli("verify", path)
    assert verify.exit_code == 1 and "bad shape" in verify.stdout, verify.output
    out = tmp_path / "o.safetensors"
    extract = cli("extract", path, "-o", out)
    assert extract.exit_code == 2 and "bad shape" in extract.stderr and "unexpected" not in extract.stderr
    assert not out.exists()


def test_a_5000_digit_offset_is_damage(tmp_path):
    header = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, ' + b"9" * 5000 + b"]}}"
    path = raw_safetensors(tmp_path / "digits.safetensors", header, FOUR)
    ls = cli("ls", path)
    assert ls.exit_code == 2 and ls.stderr.startswith(f"Error: {path}: safetensors ") and "unexpected" not in ls.stderr, \
        ls.output
    assert cli("verify", path).exit_code == 1


# -- 11. two tensor names mapped to one checkpoint key -------------------------------------------
def test_two_names_to_one_key_are_refused(tmp_path):
    st = tmp_path / "model.safetensors"
    assert cli("extract", ROOT / "fixtures" / "run", "-o", st).exit_code == 0
    raw = st.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    keys = json.loads(header["__metadata__"]["tf_checkpoint_keys"])
    names = sorted(keys)
    kernel = next(k for k in names if k.endswith("head/kernel"))
    bias = next(k for k in names if k.endswith("head/bias"))
    keys[bias] = keys[kernel]  # head/bias would be written over head/kernel
    header["__metadata__"]["tf_checkpoint_keys"] = json.dumps(keys)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    st.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    out = tmp_path / "back" / "ckpt"
    result = cli("extract", st, "-o", out)
    assert result.exit_code == 2, result.output
    assert f"maps both {bias!r} and {kernel!r} to the checkpoint key" in result.stderr \
        or f"maps both {kernel!r} and {bias!r} to the checkpoint key" in result.stderr, result.stderr
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_a_long_string_of_brackets_is_cheap(tmp_path):
    """The nesting check skips strings without keeping state per character (a first version's
    regex took 11 GB and 46 s on a 90 MiB string)."""
    header = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "__metadata__": {"x": "' \
        + b"[" * (16 << 20) + b'\\"' + b"{" * 100 + b'"}}'
    path = raw_safetensors(tmp_path / "brackets.safetensors", header, FOUR)
    start = time.process_time()
    with ckptinspect.open(path) as ckpt:
        assert len(ckpt.info["metadata"]["x"]) == (16 << 20) + 101
    assert time.process_time() - start < 3


# -- issue 28: the header parsed in C; the duplicate-name check by counting names -----------------
def _entry(begin: int) -> str:
    return f'{{"dtype": "F32", "shape": [1], "data_offsets": [{begin}, {begin + 4}]}}'


@pytest.mark.parametrize("header, message", [
    ('{"a": ' + _entry(0) + ', "a": ' + _entry(4) + "}", "names 'a' twice"),
    ('{"a": {"dtype": "F32", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', "names 'dtype' twice"),
    ('{"__metadata__": {"k": "v", "k": "w"}, "a": ' + _entry(0) + "}", "names 'k' twice"),
    ('{"__metadata__": {"k": {"x": 1, "x": 2}}, "a": ' + _entry(0) + "}", "names 'x' twice"),
])
def test_a_name_given_twice_is_damage(header, message, tmp_path):
    """Names given twice anywhere in the header are refused as before (the parse in C counts
    names; a header whose count differs is parsed again with the check that names them)."""
    path = raw_safetensors(tmp_path / "dup.safetensors", header.encode(), FOUR * 2)
    with pytest.raises(CorruptCheckpointError, match=message):
        ckptinspect.open(str(path))


def test_names_with_quotes_brackets_and_colons_read(tmp_path):
    """Names holding escaped quotes and backslashes, brackets, braces and colons do not disturb
    the count of names or the depth check."""
    names = ['a\\"b', 'c\\\\', 'd:[{', 'e\\\\\\"]}:', "f\\u0022:"]
    header = "{" + ", ".join(f'"{n}": {_entry(4 * i)}' for i, n in enumerate(names)) + ', "__metadata__": {"k:[": "v\\\\"}}'
    path = raw_safetensors(tmp_path / "names.safetensors", header.encode(), FOUR * 2)
    with ckptinspect.open(str(path)) as ckpt:
        assert [v.key for v in ckpt.variables] == [json.loads(f'"{n}"') for n in names]
        assert ckpt.info["metadata"] == {"k:[": "v\\"}


def test_a_header_that_is_not_utf8_json_is_refused(tmp_path):
    """JSON in UTF-16 (which Python's json reads from bytes) is not a safetensors header."""
    header = ('{"a": ' + _entry(0) + "}").encode("utf-16")
    path = raw_safetensors(tmp_path / "utf16.safetensors", header, FOUR)
    with pytest.raises(CorruptCheckpointError, match="not valid JSON"):
        read_header(str(path))
