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

import numpy as np

from ckptinspect.formats.tf import protos as _protos
from ckptinspect.formats.tf.crc import mask, masked_crc32c, crc32c_module
from ckptinspect.formats.tf.sstable import FOOTER_SIZE, TABLE_MAGIC, iter_table

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
    from ckptinspect.formats.tf.data import tensor_crc32c

    return tensor_crc32c("string", (), string_scalar_bytes(value))


def save_tensors(prefix: pathlib.Path | str, tensors: dict[bytes, np.ndarray]) -> pathlib.Path:
    """Write a bundle with TensorFlow's own SaveV2 kernel (what every TF save runs); keys are
    raw bytes, values numpy arrays (or ``bytes`` for a scalar string)."""
    import tensorflow as tf

    with tf.device("/cpu:0"):
        tf.raw_ops.SaveV2(
            prefix=str(prefix),
            tensor_names=list(tensors),
            shape_and_slices=[""] * len(tensors),
            tensors=[tf.constant(v) for v in tensors.values()],
        )
    return pathlib.Path(prefix)


def graph_in_own_shard(src: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """A copy of the one-shard TF2 checkpoint ``src`` whose object graph lives alone in a
    second data shard (as a multi-device save can place it): the same bytes, re-indexed."""
    dest.mkdir(parents=True, exist_ok=True)
    prefix = dest / src.name
    data = pathlib.Path(f"{src}.data-00000-of-00001").read_bytes()
    entries = read_entries(pathlib.Path(f"{src}.index"))
    out = []
    graph = b""
    for key, value in entries:
        if key == b"":
            header = _protos.BundleHeaderProto()
            header.ParseFromString(value)
            header.num_shards = 2
            value = header.SerializeToString()
        elif key == b"_CHECKPOINTABLE_OBJECT_GRAPH":
            e = parse_entry(value)
            graph = data[e.offset : e.offset + e.size]
            e.shard_id, e.offset = 1, 0
            value = e.SerializeToString()
        out.append((key, value))
    pathlib.Path(f"{prefix}.data-00000-of-00002").write_bytes(data)
    pathlib.Path(f"{prefix}.data-00001-of-00002").write_bytes(graph)
    pathlib.Path(f"{prefix}.index").write_bytes(write_table(out))
    return prefix


def chain_graph(depth: int, *, every_node_holds: bool = False) -> bytes:
    """A serialized ``TrackableObjectGraph``: the root, then a chain of ``depth`` objects each
    the only child (``c``) of the one before; the last one (or, with ``every_node_holds``,
    every one) holds a variable keyed as TensorFlow keys it (``c/c/.../.ATTRIBUTES/VARIABLE_VALUE``,
    shortened to ``v<i>`` for ``every_node_holds``)."""
    graph = _protos.TrackableObjectGraph()
    for i in range(depth + 1):
        node = graph.nodes.add()
        if i < depth:
            node.children.add(node_id=i + 1, local_name=b"c")
        if i == depth and not every_node_holds:
            node.attributes.add(name=b"VARIABLE_VALUE", full_name=b"deep/v", checkpoint_key=DEEP_KEY)
        elif every_node_holds and i > 0:
            node.attributes.add(name=b"VARIABLE_VALUE", full_name=b"v%d" % i, checkpoint_key=b"v%d/.ATTRIBUTES/VARIABLE_VALUE" % i)
    return graph.SerializeToString()


DEEP_KEY = b"deep/.ATTRIBUTES/VARIABLE_VALUE"


def graph_checkpoint(prefix: pathlib.Path, blob: bytes, values: dict[bytes, np.ndarray]) -> pathlib.Path:
    """A TF2-style bundle holding the object graph ``blob`` and ``values``, written by SaveV2."""
    return save_tensors(prefix, {b"_CHECKPOINTABLE_OBJECT_GRAPH": np.array(blob, dtype=object), **values})


TF_PROBE = textwrap.dedent("""
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    reader = tf.train.load_checkpoint(sys.argv[1])
    print("opened", flush=True)
    for key in sys.argv[2:]:
        reader.get_tensor(bytes.fromhex(key))
    print("read all", flush=True)
""")


def tf_reads(prefix: pathlib.Path | str) -> str:
    """What TensorFlow itself does with a bundle: ``tf.train.load_checkpoint``, then
    ``get_tensor`` of every key of the index (as bytes), in a subprocess, since TensorFlow may
    abort. Returns ``"ok"``, ``"abort"`` (SIGABRT) or ``"error: <last line of the message>"``."""
    keys = [k.hex() for k, _ in read_entries(pathlib.Path(f"{prefix}.index")) if k and k[:1] != b"\x00"]
    proc = subprocess.run([sys.executable, "-c", TF_PROBE, str(prefix), *keys], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode == -6:
        return "abort"
    if proc.returncode == 0 and proc.stdout.strip().endswith("read all"):
        return "ok"
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return "error: " + (lines[-1] if lines else f"exit {proc.returncode}")
