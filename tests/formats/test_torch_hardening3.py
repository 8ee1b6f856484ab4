"""Issue 27, items 1-8: torch files built opcode by opcode (no torch) that crashed, bypassed a
check or cost unbounded time or memory; each must now be a clean refusal or damage, quickly."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile
import zlib

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.errors import CorruptCheckpointError, UnsafeFileError
from ckptinspect.formats import _fs
from ckptinspect.formats.torch import unpickle as tu
import limits
from torch_builders import dict_pickle, global_, int_, legacy_file, tensor, torch_zip, tuple_, unicode

runner = CliRunner()
FOUR = np.arange(4, dtype="<f4").tobytes()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


# -- 1. a deep tuple used as a dict key (SIGSEGV in CPython's unpickler) ---------------------------
def deep_tuple_key(depth: int) -> bytes:
    return b"\x80\x02}" + b")" + b"\x85" * depth + b"Ns."


def test_deep_tuple_key_is_refused_not_a_crash(tmp_path):
    path = torch_zip(tmp_path / "deepkey.pt", deep_tuple_key(300_000), {})
    for command in ("ls", "verify"):
        proc = subprocess.run([sys.executable, "-m", "ckptinspect", command, str(path)], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, (command, proc.returncode, proc.stderr[-300:])
        assert proc.stderr == f"Error: {path}: the pickle nests more than 200 levels deep; refusing\n"


# -- 2. BUILD on the tensor stand-ins after they were checked ------------------------------------
@pytest.mark.parametrize("state", [
    b"}" + unicode("offset") + int_(-20) + b"s",
    b"}" + unicode("dtype") + unicode("nope") + b"s",
    b"}" + unicode("shape") + tuple_(int_(1 << 40)) + b"s",
    b"N}" + unicode("offset") + int_(-20) + b"s\x86",  # (None, slot state): setattr
], ids=["offset", "dtype", "shape", "slots"])
def test_build_of_a_tensor_is_refused(state, tmp_path):
    data = dict_pickle({"w": tensor("0", 4, 0, (4,), (1,)) + state + b"b"})
    path = torch_zip(tmp_path / "build.pt", data, {"0": FOUR})
    message = "pickle BUILD of a tensor, which torch.load(weights_only=True) would not build; refusing"
    with pytest.raises(UnsafeFileError, match=re.escape(message)):
        ckptinspect.open(path)
    for args in (["verify", path], ["ls", "--stats", path], ["extract", path, "-o", tmp_path / "o.safetensors"]):
        result = cli(*args)
        assert result.exit_code == 2 and result.stderr == f"Error: {path}: {message}\n", result.output
    assert not (tmp_path / "o.safetensors").exists()


def test_build_of_a_storage_or_a_global_is_refused():
    body = global_("torch._utils", "_rebuild_tensor_v2") + b"}b"
    with pytest.raises(UnsafeFileError, match="pickle BUILD of a function|pickle BUILD of a "):
        tu.unpickle(b"\x80\x02" + body + b".", lambda pid: None, "t.pkl")


# -- 3. allow-listed calls on a memoised argument, again and again -------------------------------
MIB = 1 << 20


def amplifier(kind: str, calls: int) -> bytes:
    """A pickle keeping ``calls`` results of one allowed call on a memoised 1 MiB argument."""
    if kind == "encode":
        arg, call = unicode("x" * MIB), lambda: global_("_codecs", "encode") + b"h\x00" + unicode("latin1") + b"\x86R"
    elif kind == "bytearray":
        arg, call = b"B" + struct.pack("<I", MIB) + b"x" * MIB, lambda: global_("builtins", "bytearray") + b"h\x00\x85R"
    elif kind == "size":
        arg = b"(" + b"K\x01" * (MIB // 16) + b"t"
        call = lambda: global_("torch", "Size") + b"h\x00\x85R"  # noqa: E731
    else:  # OrderedDict of a list of pairs
        arg = b"(" + b"".join(b"(" + int_(i) + b"Nt" for i in range(MIB // 256)) + b"l"
        call = lambda: global_("collections", "OrderedDict") + b"h\x00\x85R"  # noqa: E731
    return b"\x80\x02](" + arg + b"q\x000" + b"".join(call() for _ in range(calls)) + b"e."


@pytest.mark.parametrize("kind", ["encode", "bytearray", pytest.param("size", marks=pytest.mark.slow),
                                  pytest.param("ordereddict", marks=pytest.mark.slow)])
def test_calls_cannot_amplify_memory(kind):
    data = amplifier(kind, 300)
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeFileError, match="need more memory than its size allows; refusing a possible memory bomb"):
            tu.unpickle(data, lambda pid: None, "amp.pkl")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 * len(data) + 48 * MIB, peak


def test_calls_within_the_budget_still_work():
    obj, _ = tu.unpickle(amplifier("encode", 3), lambda pid: None, "ok.pkl")
    assert [len(x) for x in obj] == [MIB] * 3


# -- 4. duplicate zip members --------------------------------------------------------------------
def duplicated(path, member_data: list[tuple[str, bytes]]):
    path.parent.mkdir(parents=True, exist_ok=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in member_data:
                zf.writestr(name, data)
    return path


@pytest.mark.parametrize("member", ["archive/data.pkl", "archive/data/0"])
def test_duplicate_members_are_refused(member, tmp_path):
    evil = b"\x80\x02" + global_("os", "system") + unicode("true") + b"\x85R."
    good = dict_pickle({"w": tensor("0", 4, 0, (4,), (1,))})
    if member == "archive/data.pkl":
        members = [("archive/data.pkl", evil), ("archive/data.pkl", good), ("archive/data/0", FOUR)]
    else:
        members = [("archive/data.pkl", good), ("archive/data/0", FOUR[::-1]), ("archive/data/0", FOUR)]
    path = duplicated(tmp_path / "dup.pt", [*members, ("archive/version", b"3\n")])
    message = f"archive member {member!r} appears 2 times"
    with pytest.raises(CorruptCheckpointError, match=message):
        ckptinspect.open(path)
    verify = cli("verify", path)
    assert verify.exit_code == 1 and "DAMAGED" in verify.stdout and message in verify.stdout, verify.output
    for args in (["ls", path], ["diff", path, path]):
        result = cli(*args)
        assert result.exit_code == 2 and result.stderr.startswith(f"Error: {path}: {message}"), result.output


# -- 5. the legacy reader reading a growing prefix -----------------------------------------------
MAGIC = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little") + b"."


@pytest.mark.parametrize("second", [b"\x80\x02\xff", b"\x80\x02\x8e" + (1 << 31).to_bytes(8, "little")],
                         ids=["unknown-opcode", "declares-2-gib"])
def test_legacy_reader_stops_at_the_first_hopeless_failure(second, tmp_path, monkeypatch):
    path = tmp_path / "sparse.pt"
    with open(path, "wb") as f:
        f.write(MAGIC + second)
        f.truncate(300 << 20)  # sparse: reads cost memory, not disk
    reads = []
    real = _fs.read_range

    def counting(p, offset, size, *a, **k):
        reads.append(size)
        return real(p, offset, size, *a, **k)

    monkeypatch.setattr(_fs, "read_range", counting)
    start = time.process_time()  # CPU time: the bound is the work done, whatever the machine's load
    with pytest.raises(CorruptCheckpointError, match="the legacy protocol pickle is damaged"):
        ckptinspect.open(path)
    assert time.process_time() - start < 5
    assert sum(reads) <= 2 << 20, reads


def test_legacy_reader_still_grows_for_a_long_pickle(tmp_path):
    big = "y" * (3 << 20)  # a string longer than the first read
    main = dict_pickle({"note": unicode(big), "epoch": int_(7)})
    path = legacy_file(tmp_path / "long.pt", main, [], [], [])
    with ckptinspect.open(path) as ckpt:
        assert ckpt.read("epoch") == 7 and ckpt.info["strings"]["note"].startswith("yyy")


# -- 6. a deflated pickle of no-op opcodes; too many opcodes --------------------------------------
def deflated_pickle(path, data_pkl: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", data_pkl, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        zf.writestr("archive/version", "3\n")
    return path


def test_a_deflated_no_op_pickle_is_refused_quickly(tmp_path):
    path = deflated_pickle(tmp_path / "noops.pt", b"\x80\x02" + b"N0" * (8 << 20) + b"N.")
    assert path.stat().st_size < 40_000
    start = time.process_time()  # CPU time: the bound is the work done, whatever the machine's load
    result = cli("ls", path)
    assert result.exit_code == 2 and "(more than 100:1; torch stores it uncompressed); refusing a possible zip bomb" \
        in result.stderr, result.output
    assert time.process_time() - start < 3


def test_too_many_opcodes_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(tu, "MAX_OPCODES", 100_000)
    path = torch_zip(tmp_path / "ops.pt", b"\x80\x02" + b"N0" * 50_010 + b"N.", {})
    with pytest.raises(UnsafeFileError, match="the pickle has more than 100000 opcodes; refusing"):
        ckptinspect.open(path)


@pytest.mark.slow  # 4 M opcodes: a few seconds
def test_the_real_opcode_limit_is_reached_within_seconds(tmp_path):
    path = torch_zip(tmp_path / "ops.pt", b"\x80\x02" + b"N0" * (tu.MAX_OPCODES // 2 + 10) + b"N.", {})
    start = time.process_time()
    with pytest.raises(UnsafeFileError, match=f"the pickle has more than {tu.MAX_OPCODES} opcodes; refusing"):
        ckptinspect.open(path)
    assert time.process_time() - start < 8


# -- 7. broadcast views adding up ----------------------------------------------------------------
def broadcasts(n: int, each: int) -> bytes:
    return dict_pickle({f"b{i}": tensor("0", 1, 0, (each // 4,), (0,)) for i in range(n)})


def test_broadcast_views_have_a_total_cap(tmp_path, monkeypatch):
    path = torch_zip(tmp_path / "bcast.pt", broadcasts(8, 256 << 20), {"0": FOUR[:4]})
    assert path.stat().st_size < 4000
    result = cli("ls", path)
    assert result.exit_code == 2 and "bytes beyond what they cover, over the limit of 268435456 for a file (set" \
        " CKPTINSPECT_MAX_BROADCAST_BYTES to allow more); refusing a possible size bomb" in result.stderr, result.output
    out = tmp_path / "out.safetensors"
    assert cli("extract", path, "-o", out).exit_code == 2 and not out.exists()
    verify = cli("verify", path)
    assert verify.exit_code == 1 and "refusing a possible size bomb" in verify.stdout
    one = torch_zip(tmp_path / "one.pt", broadcasts(1, 1 << 20), {"0": FOUR[:4]})
    assert cli("ls", one).exit_code == 0  # one broadcast view within the cap is fine
    monkeypatch.setenv("CKPTINSPECT_MAX_BROADCAST_BYTES", str(4 << 30))  # for people who mean it
    assert cli("ls", path).exit_code == 0


# -- 8. numbers Python cannot print, floats that overflow ----------------------------------------
def long4(n: int) -> bytes:
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8b" + struct.pack("<i", len(raw)) + raw


@pytest.mark.parametrize("body,what", [
    (tensor("0", 4, 0, (4,), (1,)).replace(int_(0) + tuple_(int_(4)), long4(10**5000) + tuple_(int_(4)), 1),
     "an int of"),
    (tensor("0", 4, 0, (4,), (1,)).replace(tuple_(int_(4)), tuple_(b"L" + b"9" * 5000 + b"L\n"), 1), "an int of 5000 digits"),
    (tensor("0", 4, 0, (4,), (1,)).replace(tuple_(int_(4)), tuple_(long4(10**30)), 1), "in [0, 2**63)"),
    (global_("builtins", "complex") + long4(10**400) + b"\x85R", "complex of an int too large for a float"),
], ids=["offset-5000-digits", "dim-5000-digits", "dim-10**30", "complex-10**400"])
def test_big_numbers_are_damage(body, what, tmp_path):
    path = torch_zip(tmp_path / "big.pt", dict_pickle({"w": body}), {"0": FOUR})
    with pytest.raises(CorruptCheckpointError, match=re.escape(what)):
        ckptinspect.open(path)
    verify = cli("verify", path)
    assert verify.exit_code == 1 and "DAMAGED" in verify.stdout, verify.output
    ls = cli("ls", path)
    assert ls.exit_code == 2 and ls.stderr.startswith(f"Error: {path}: ") and "unexpected" not in ls.stderr, ls.output


PEAK_SCRIPT = """
import resource, sys
from ckptinspect.formats.torch import unpickle as tu
data = b"\\x80\\x02" + b"]" * (3 << 20) + b"."
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    tu.unpickle(data, lambda pid: None, "lists.pkl")
except Exception as e:
    print(str(e))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


@pytest.mark.slow  # ~3 s: 3 M objects in a subprocess
def test_memory_of_the_machine_is_bounded_per_byte():
    """Every bound holds together: a pickle of empty containers (the cheapest objects to ask
    for, one byte each) is refused by its budget before it costs much."""
    start = limits.children_cpu_seconds()  # CPU time: the bound is the work done, whatever the machine's load
    proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT], capture_output=True, text=True, timeout=120)
    message, growth = proc.stdout.splitlines()
    assert message == "lists.pkl: the objects it builds need more memory than its size allows; refusing a possible memory bomb"
    assert int(growth) < 300 * MIB, growth
    assert limits.children_cpu_seconds() - start < 30


def test_zlib_is_what_deflate_means():  # the helper writes real deflate streams
    assert zlib.decompress(zlib.compress(b"N0" * 10)) == b"N0" * 10
    assert os.path.exists(sys.executable)
