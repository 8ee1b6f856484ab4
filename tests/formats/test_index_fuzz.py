"""Property-based tests: random corruptions of real ``.index`` files fed to the index parser.

The parser (``formats._bundle_index.parse_index``) must either return a well-typed
:class:`BundleIndex` or raise :class:`MalformedError`: no other exception (no IndexError or
struct.error from reading past a buffer, no TypeError from a field of the wrong wire type), and
no hang. Block checksums would reject almost every random change before any decoding, so half
of the corruptions are "re-signed": the block checksums are recomputed over the corrupted bytes,
which sends the corruption on into the block, protobuf, ordered-code and snappy decoders.
"""

from __future__ import annotations

import contextlib
import pathlib
import signal
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptinspect.formats.tf import sstable as _sstable
from ckptinspect.formats.tf.wire import MalformedError
from ckptinspect.formats.tf.index import BundleIndex, _decode_slice_key, parse_index
from ckptinspect.formats.tf.data import decode_string_scalar
from ckptinspect.formats.tf.object_graph import parse_object_graph

ROOT = pathlib.Path(__file__).resolve().parents[2]
REALWORLD = ROOT.parent / "shared" / "realworld"

# Real index files written by TensorFlow: one shard, five shards with sliced variables, a
# Keras 2 TF-format checkpoint, and (when the corpus is present) snappy-compressed and TF1 ones.
INDEX_FILES = [
    ROOT / "fixtures" / "run" / "ckpt-8.index",
    ROOT / "fixtures" / "sharded" / "ckpt-4.index",
    ROOT / "fixtures" / "keras" / "keras2_tf" / "ckpt.index",
    ROOT / "fixtures" / "tables" / "snappy" / "compressed" / "ckpt-1.index",  # snappy blocks, our own fixture
] + [
    p
    for p in (
        REALWORLD / "savedmodel-tf1-half-plus-two/saved_model_half_plus_two_cpu/00000123/variables/variables.index",
        REALWORLD / "tf1-estimator-linear-2shard/model.ckpt-5000.index",
        REALWORLD / "tf2-seq2seq-tf112-eager/training_checkpoints/ckpt-11.index",
    )
    if p.is_file()
]
SAMPLES = [p.read_bytes() for p in INDEX_FILES]
OBJECT_GRAPH = (ROOT / "fixtures" / "run" / "ckpt-8.data-00000-of-00001").read_bytes()[4172:]

SECONDS_PER_EXAMPLE = 5  # a hard stop: the hypothesis deadline only measures, it cannot interrupt
FUZZ = settings(
    max_examples=150,
    deadline=1000,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextlib.contextmanager
def hard_timeout(seconds: int):
    def fail(*_):
        raise AssertionError(f"the parser ran for more than {seconds} s (a hang?)")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def block_layout(data: bytes) -> list[tuple[int, int]]:
    """(offset, size) of every block (index block last) of an intact table."""
    footer = data[-_sstable.FOOTER_SIZE :]
    _, _, pos = _sstable._block_handle(footer, 0)
    index_off, index_size, _ = _sstable._block_handle(footer, pos)
    index = _sstable._read_block(data, index_off, index_size, True)
    blocks = [_sstable._block_handle(handle, 0)[:2] for _, handle in _sstable._iter_block(index)]
    return blocks + [(index_off, index_size)]


LAYOUTS = [block_layout(d) for d in SAMPLES]


def resign(data: bytearray, layout: list[tuple[int, int]]) -> None:
    """Recompute each block's masked crc32c over its (corrupted) bytes and compression byte."""
    for off, size in layout:
        end = off + size
        if end + _sstable.BLOCK_TRAILER_SIZE <= len(data):
            struct.pack_into("<I", data, end + 1, _sstable.masked_crc32c(bytes(data[off : end + 1])))


@st.composite
def corrupted_index(draw) -> bytes:
    i = draw(st.integers(0, len(SAMPLES) - 1))
    data = bytearray(SAMPLES[i])
    kind = draw(st.sampled_from(["flip", "overwrite", "truncate", "splice", "foreign"]))
    n = len(data)
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, n - 1))] ^= 1 << draw(st.integers(0, 7))
    elif kind == "overwrite":  # same length: the block layout still holds
        start = draw(st.integers(0, n - 1))
        chunk = draw(st.binary(min_size=1, max_size=min(64, n - start)))
        data[start : start + len(chunk)] = chunk
    elif kind == "truncate":
        del data[draw(st.integers(0, n - 1)) :]
    elif kind == "splice":
        start = draw(st.integers(0, n))
        end = draw(st.integers(start, min(n, start + 64)))
        data[start:end] = draw(st.binary(max_size=64))
    else:  # a range of another real index spliced in
        other = SAMPLES[draw(st.integers(0, len(SAMPLES) - 1))]
        a = draw(st.integers(0, len(other) - 1))
        piece = other[a : a + draw(st.integers(1, 256))]
        start = draw(st.integers(0, n))
        data[start : start + len(piece)] = piece
    if len(data) == n and draw(st.booleans()):
        resign(data, LAYOUTS[i])
    return bytes(data)


def check_index(index: BundleIndex) -> None:
    """A parse that succeeds gives well-typed, consistent entries."""
    assert isinstance(index.num_shards, int) and 1 <= index.num_shards <= 1_000_000
    entries = list(index.entries) + [se for slices in index.slice_entries.values() for *_, se in slices]
    for e in entries:
        assert isinstance(e.key, str) and isinstance(e.dtype, str)
        assert all(isinstance(d, int) and d >= 0 for d in e.shape)
        for value in (e.shard_id, e.offset, e.size):
            assert isinstance(value, int) and value >= 0
        assert 0 <= e.shard_id < index.num_shards
        assert e.crc32c is None or isinstance(e.crc32c, int)


def test_samples_parse():
    assert len(SAMPLES) >= 3
    for data in SAMPLES:
        check_index(parse_index(data))


@FUZZ
@given(corrupted_index())
def test_corrupted_index_raises_only_malformed(data):
    with hard_timeout(SECONDS_PER_EXAMPLE):
        try:
            index = parse_index(data)
        except MalformedError:
            return
    check_index(index)


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_with_a_table_footer(tail):
    """Arbitrary bytes that end in a valid-looking footer get past the magic-number check."""
    data = tail + SAMPLES[0][-_sstable.FOOTER_SIZE :]
    with hard_timeout(SECONDS_PER_EXAMPLE):
        with contextlib.suppress(MalformedError):
            check_index(parse_index(data))


@FUZZ
@given(st.data())
def test_corrupted_object_graph_and_slice_keys(data):
    """The decoders build_variables runs on bytes from data shards and index keys."""
    blob = bytearray(OBJECT_GRAPH)
    for _ in range(data.draw(st.integers(1, 6))):
        blob[data.draw(st.integers(0, len(blob) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    if data.draw(st.booleans()):
        del blob[data.draw(st.integers(0, len(blob))) :]
    key = data.draw(st.binary(max_size=64))
    with hard_timeout(SECONDS_PER_EXAMPLE):
        with contextlib.suppress(MalformedError):
            parse_object_graph(decode_string_scalar(bytes(blob)))
        with contextlib.suppress(MalformedError):
            assert isinstance(_decode_slice_key(b"\x00" + key), str)


@pytest.mark.parametrize("size", [0, 1, 47, 48])
def test_tiny_files(size):
    with pytest.raises(MalformedError):
        parse_index(SAMPLES[0][-size:] if size else b"")
