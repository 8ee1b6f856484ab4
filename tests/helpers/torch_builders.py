"""Crafted PyTorch / safetensors inputs for the tests, built for real: pickles assembled opcode
by opcode, zip archives written by ``zipfile`` the way torch lays them out, bytes of the
committed fixtures (written by torch itself) copied and changed. Nothing here imports torch.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import struct
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
TORCH_FIXTURES = ROOT / "fixtures" / "torch"


# -- pickles, opcode by opcode ----------------------------------------------------------------
def unicode(s: str) -> bytes:
    raw = s.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def global_(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def int_(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)
    if -(1 << 31) <= n < (1 << 31):
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def tuple_(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def tensor(key: str, numel: int, offset: int, shape: tuple[int, ...], stride: tuple[int, ...],
           storage: str = "FloatStorage", location: str = "cpu") -> bytes:
    """``torch._utils._rebuild_tensor_v2`` of a persistent storage, as torch pickles it."""
    pid = tuple_(unicode("storage"), global_("torch", storage), unicode(key), unicode(location), int_(numel))
    return (
        global_("torch._utils", "_rebuild_tensor_v2")
        + tuple_(
            pid + b"Q",  # BINPERSID
            int_(offset),
            tuple_(*(int_(d) for d in shape)),
            tuple_(*(int_(s) for s in stride)),
            b"\x89",  # requires_grad False
            global_("collections", "OrderedDict") + b")R",
        )
        + b"R"
    )


def dict_pickle(items: dict[str, bytes]) -> bytes:
    """A protocol-2 pickle of a dict of already-pickled values."""
    body = b"".join(unicode(k) + v for k, v in items.items())
    return b"\x80\x02}(" + body + b"u."


def system_call(command: str, protocol4: bool = False) -> bytes:
    """A pickle calling ``os.system(command)`` (GLOBAL, or STACK_GLOBAL with protocol 4)."""
    if protocol4:
        return b"\x80\x04" + unicode("os") + unicode("system") + b"\x93" + unicode(command) + b"\x85R."
    return b"\x80\x02" + global_("os", "system") + unicode(command) + b"\x85R."


def nested_lists(depth: int) -> bytes:
    """``[[[...]]]`` nested ``depth`` deep."""
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def shared_lists(levels: int) -> bytes:
    """``l[i] = [l[i-1], l[i-1]]``: 2**levels leaves through the memo (a billion-laughs bomb)."""
    out = b"\x80\x02]q\x00"
    for i in range(1, levels + 1):
        out += b"](h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + b"eq" + bytes([i])
    return out + b"."


# -- torch zip archives ------------------------------------------------------------------------
def torch_zip(path: pathlib.Path, data_pkl: bytes, records: dict[str, bytes], root: str = "archive",
              compress: bool = False) -> pathlib.Path:
    """A zip laid out as torch writes it: data.pkl first, then byteorder, data/<key>, version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{root}/data.pkl", data_pkl)
        zf.writestr(f"{root}/byteorder", "little")
        for key, data in records.items():
            zf.writestr(f"{root}/data/{key}", data, compress_type=mode)
        zf.writestr(f"{root}/version", "3\n")
    return path


def rewrite_zip(src: pathlib.Path, dest: pathlib.Path, drop: str | None = None,
                replace: dict[str, bytes] | None = None) -> pathlib.Path:
    """A copy of a torch zip without member ``drop`` / with members replaced (stored)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if info.filename == drop:
                continue
            data = (replace or {}).get(info.filename, zin.read(info))
            zout.writestr(info.filename, data)
    return dest


def legacy_file(path: pathlib.Path, main_pickle: bytes, keys: list[str], storages: list[bytes],
                counts: list[int]) -> pathlib.Path:
    """A legacy torch.save stream: magic, protocol, sys_info, the object, the key list, storages."""
    magic = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little") + b"."
    protocol = b"\x80\x02M\xe9\x03."
    sys_info = (b"\x80\x02}(" + unicode("protocol_version") + b"M\xe9\x03" + unicode("little_endian") + b"\x88"
                + unicode("type_sizes") + b"}(" + unicode("short") + b"K\x02" + unicode("int") + b"K\x04"
                + unicode("long") + b"K\x04uu.")
    key_list = b"\x80\x02](" + b"".join(unicode(k) for k in keys) + b"e."
    body = b"".join(struct.pack("<q", n) + data for n, data in zip(counts, storages))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(magic + protocol + sys_info + main_pickle + key_list + body)
    return path


# -- safetensors -----------------------------------------------------------------------------
def safetensors_file(path: pathlib.Path, header: dict, data: bytes, pad: bool = True,
                     length: int | None = None) -> pathlib.Path:
    raw = json.dumps(header).encode()
    if pad:
        raw += b" " * (-(len(raw) + 8) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def copy_fixture(name: str, d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    src = TORCH_FIXTURES / name
    if src.is_dir():
        shutil.copytree(src, d / name)
    else:
        shutil.copy(src, d / name)
    return d / name
