"""Crafting TF bundle inputs for tests, with the project's own wire helpers.

A real bundle is written by TensorFlow (``tf.raw_ops.SaveV2``, ``tf.train.Checkpoint``); its
``.index`` is then read back with ``formats._sstable.iter_table``, its entries decoded with
``formats._protos``, changed, and written out again as a valid SSTable (one data block, one
index block, an empty meta-index block, the 48-byte footer, masked crc32c block trailers), so
that TensorFlow's own table reader accepts it and the change reaches the bundle reader.
"""

from __future__ import annotations

import pathlib
import struct
import subprocess
import sys
import textwrap
from typing import Callable, Iterable

from ckptinspect.formats import _protos
from ckptinspect.formats._crc import mask, masked_crc32c, crc32c_module
from ckptinspect.formats._sstable import FOOTER_SIZE, TABLE_MAGIC, iter_table

Entry = tuple[bytes, bytes]  # (raw key, serialized value)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _block(entries: Iterable[Entry]) -> bytes:
    """A table block without prefix compression (every entry is a restart point)."""
    body = bytearray()
    restarts = []
    for key, value in entries:
        restarts.append(len(body))
        body += _varint(0) + _varint(len(key)) + _varint(len(value)) + key + value
    if not restarts:
        restarts = [0]
    for r in restarts:
        body += struct.pack("<I", r)
    body += struct.pack("<I", len(restarts))
    return bytes(body)


def write_table(entries: list[Entry]) -> bytes:
    """An SSTable holding ``entries`` (sorted by key here), as TensorFlow's reader expects."""
    entries = sorted(entries, key=lambda kv: kv[0])
    out = bytearray()

    def put(block: bytes) -> tuple[int, int]:
        offset = len(out)
        out.extend(block)
        out.append(0)  # no compression
        out.extend(struct.pack("<I", masked_crc32c(block + b"\x00")))
        return offset, len(block)

    data_handle = put(_block(entries))
    meta_handle = put(_block([]))
    last_key = entries[-1][0] if entries else b""
    index_handle = put(_block([(last_key, _varint(data_handle[0]) + _varint(data_handle[1]))]))
    footer = _varint(meta_handle[0]) + _varint(meta_handle[1]) + _varint(index_handle[0]) + _varint(index_handle[1])
    footer += bytes(FOOTER_SIZE - 8 - len(footer)) + struct.pack("<Q", TABLE_MAGIC)
    out += footer
    return bytes(out)


def read_entries(index: pathlib.Path) -> list[Entry]:
    return list(iter_table(index.read_bytes()))


def parse_entry(value: bytes):
    e = _protos.BundleEntryProto()
    e.ParseFromString(value)
    return e


def rewrite_index(prefix: pathlib.Path | str, fn: Callable[[list[Entry]], list[Entry]]) -> None:
    """Replace ``PREFIX.index`` by ``fn(entries)`` written as a table."""
    index = pathlib.Path(f"{prefix}.index")
    index.write_bytes(write_table(fn(read_entries(index))))


def edit_entry(prefix: pathlib.Path | str, key: bytes, **fields) -> None:
    """Set fields of one entry (``dtype=99``, ``size=10**12``, ``dims=[...]``, ``offset=...``)."""

    def fn(entries: list[Entry]) -> list[Entry]:
        out = []
        found = False
        for k, v in entries:
            if k == key:
                found = True
                e = parse_entry(v)
                dims = fields.pop("dims", None)
                if dims is not None:
                    e.shape.ClearField("dim")
                    for d in dims:
                        e.shape.dim.add(size=d)
                for name, value in fields.items():
                    setattr(e, name, value)
                v = e.SerializeToString()
            out.append((k, v))
        assert found, key
        return out

    rewrite_index(prefix, fn)


def string_scalar_bytes(value: bytes) -> bytes:
    """A scalar string tensor as a bundle stores it: varint length, masked crc32c of the
    length (as uint32), the bytes."""
    crc = crc32c_module().value(struct.pack("<I", len(value)))
    return _varint(len(value)) + struct.pack("<I", mask(crc)) + value


def string_tensor_crc(value: bytes) -> int:
    """The masked crc32c TensorFlow records for a scalar string tensor holding ``value``."""
    from ckptinspect.formats.tf_data import tensor_crc32c

    return tensor_crc32c("string", (), string_scalar_bytes(value))


SAVE_SCRIPT = textwrap.dedent("""
    import sys, json, numpy as np, os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    spec = json.loads(sys.argv[2])
    names = [bytes.fromhex(n) for n in spec["names"]]
    values = [tf.constant(np.array(v, dtype=d)) for v, d in zip(spec["values"], spec["dtypes"])]
    tf.raw_ops.SaveV2(prefix=sys.argv[1], tensor_names=names, shape_and_slices=[""] * len(names), tensors=values)
""")


def save_tensors(prefix: pathlib.Path | str, tensors: dict[bytes, tuple[list, str]]) -> pathlib.Path:
    """Write a name-based (TF1-style) bundle with TensorFlow's SaveV2, in a subprocess (so a
    test process need not import TensorFlow). Keys are raw bytes."""
    import json

    spec = {
        "names": [k.hex() for k in tensors],
        "values": [v for v, _ in tensors.values()],
        "dtypes": [d for _, d in tensors.values()],
    }
    proc = subprocess.run([sys.executable, "-c", SAVE_SCRIPT, str(prefix), json.dumps(spec)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return pathlib.Path(prefix)


TF_PROBE = textwrap.dedent("""
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    r = tf.train.load_checkpoint(sys.argv[1])
    shapes = r.get_variable_to_shape_map()
    print("listed", len(shapes), flush=True)
    for k in sorted(shapes):
        r.get_tensor(k)
    print("read all", flush=True)
""")


def tf_reads(prefix: pathlib.Path | str) -> tuple[int, str]:
    """What TensorFlow itself does with a bundle: (exit code, last stdout/stderr line) of a
    subprocess that lists it with ``tf.train.load_checkpoint`` and reads every tensor (a
    subprocess, since TensorFlow may abort: -6 is SIGABRT)."""
    proc = subprocess.run([sys.executable, "-c", TF_PROBE, str(prefix)], capture_output=True, text=True, timeout=120)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode, lines[-1] if lines else ""
