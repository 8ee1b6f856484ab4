"""issue 28: a TF bundle's verify check takes the checksum verdicts of the runs a reader of the
same checkpoint already streamed (``check.run(seen=ckpt)``), so ``scan`` reads every value once.

Input: the trainer's real run (``fixtures/run``, written by TensorFlow), copied and damaged here
as a disk would. Before: ``run`` took no ``seen`` (and scan's verify pass read every byte again).
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from ckptinspect.errors import CorruptCheckpointError
from ckptinspect.formats import open_checkpoint, prepare_check, stream_blocks

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"
BLOCK = 1 << 10


def _copy(tmp_path: pathlib.Path) -> str:
    for f in RUN.glob("ckpt-8.*"):
        shutil.copy(f, tmp_path / f.name)
    return str(tmp_path / "ckpt-8")


def _largest_float(prefix: str):
    """The largest float32 stored run of the checkpoint (from verify's own plan)."""
    _, check = prepare_check(prefix)
    return max((it for it in check.items if it.dtype == "float32"), key=lambda it: it.size)


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


def _read_all(ckpt) -> list[str]:
    """Stream every numeric value as scan does (``stream_blocks``); the keys whose reads failed."""
    failed = []
    for v in ckpt.variables:
        if v.dtype in ("float32", "int64"):
            try:
                for _ in stream_blocks(ckpt, v, BLOCK):
                    pass
            except CorruptCheckpointError:
                failed.append(v.key)
    return failed


@pytest.mark.parametrize("damaged", [False, True])
def test_the_verdict_with_the_readers_runs_is_the_verdict_of_reading_again(tmp_path, damaged):
    prefix = _copy(tmp_path)
    item = _largest_float(prefix)
    if damaged:
        _flip(prefix + ".data-00000-of-00001", item.offset + item.size // 2)
    with open_checkpoint(prefix) as ckpt:
        assert _read_all(ckpt) == ([item.key] if damaged else [])
        seen = prepare_check(prefix)[1].run(seen=ckpt)
    alone = prepare_check(prefix)[1].run()
    assert seen == alone  # the same CheckResult: status, damage (kind, problem, crc), counts
    assert seen.status == ("damaged" if damaged else "intact")
    if damaged:
        (d,) = seen.damaged
        assert (d.key, d.kind) == (item.key, "checksum") and d.actual_crc32c is not None


def test_runs_the_reader_checked_are_not_read_again(tmp_path):
    prefix = _copy(tmp_path)
    data = prefix + ".data-00000-of-00001"
    item = _largest_float(prefix)
    with open_checkpoint(prefix) as ckpt:
        assert _read_all(ckpt) == []
        _flip(data, item.offset)  # after the read, in place (the same size): only a new read sees it
        seen = prepare_check(prefix)[1].run(seen=ckpt)
    assert seen.status == "intact"  # the reader's verdict on the bytes it read
    again = prepare_check(prefix)[1].run()
    assert again.status == "damaged" and [d.key for d in again.damaged] == [item.key]


def test_a_file_whose_size_changed_since_the_read_is_read_again(tmp_path):
    prefix = _copy(tmp_path)
    data = prefix + ".data-00000-of-00001"
    item = _largest_float(prefix)
    with open_checkpoint(prefix) as ckpt:
        assert _read_all(ckpt) == []
        _flip(data, item.offset)
        with open(data, "ab") as f:  # a different file now: the reader's verdicts do not apply
            f.write(b"\0")
        seen = prepare_check(prefix)[1].run(seen=ckpt)
    assert seen.status == "damaged" and [d.key for d in seen.damaged] == [item.key]


def test_a_read_left_unfinished_leaves_no_verdict(tmp_path):
    prefix = _copy(tmp_path)
    data = prefix + ".data-00000-of-00001"
    item = _largest_float(prefix)
    with open_checkpoint(prefix) as ckpt:
        var = next(v for v in ckpt.variables if v.key == item.key)
        blocks = stream_blocks(ckpt, var, BLOCK)
        next(blocks)  # the first block only
        blocks.close()
        _flip(data, item.offset + item.size - 1)  # in the part never read
        seen = prepare_check(prefix)[1].run(seen=ckpt)
    assert [d.key for d in seen.damaged] == [item.key]


def test_other_checks_accept_seen_and_read_their_own_bytes(tmp_path):
    """A check not fed by a reader (safetensors: every value read by the check) takes ``seen``
    and reads anyway: a byte count equal to a plain run's."""
    import numpy as np
    from safetensors.numpy import save_file

    path = str(tmp_path / "m.safetensors")
    save_file({"w": np.arange(12, dtype=np.float32)}, path)
    with open_checkpoint(path) as ckpt:
        seen = prepare_check(path)[1].run(seen=ckpt)
    alone = prepare_check(path)[1].run()
    assert seen == alone and seen.nbytes == 48 and seen.status == "intact"


def test_verify_s_check_of_an_open_checkpoint_uses_its_parsed_index_only_for_the_same_bytes(tmp_path):
    """The index a checkpoint holds open is not parsed again for its check; an index whose bytes
    changed is."""
    from ckptinspect.formats.tf.index import read_index

    prefix = _copy(tmp_path)
    with open_checkpoint(prefix) as ckpt:
        held = read_index(prefix)
        assert read_index(prefix) is held  # the same bytes, the same parse
        index = pathlib.Path(prefix + ".index")
        raw = index.read_bytes()
        index.write_bytes(raw + b"\0")  # other bytes: parsed again (or refused), never the held parse
        try:
            other = read_index(prefix)
        except CorruptCheckpointError:
            other = None
        assert other is not held
        index.write_bytes(raw)
        assert read_index(prefix) is held
        assert ckpt.variables


def test_other_reads_leave_no_verdict(tmp_path):
    """Only scan's streamed reads are recorded (a diff of giant indexes holds no entry per run):
    after ``iter_blocks`` the check reads the bytes itself."""
    prefix = _copy(tmp_path)
    item = _largest_float(prefix)
    with open_checkpoint(prefix) as ckpt:
        var = next(v for v in ckpt.variables if v.key == item.key)
        for _ in ckpt.iter_blocks(var, BLOCK):
            pass
        _flip(prefix + ".data-00000-of-00001", item.offset)
        seen = prepare_check(prefix)[1].run(seen=ckpt)
    assert [d.key for d in seen.damaged] == [item.key]


def _plan(prefix: str):
    """verify's plan as (key, name, slice) of each run, its damage and step."""
    check = prepare_check(prefix)[1]
    return [(it.key, it.name, it.slice) for it in check.items], [(d.key, d.name) for d in check.damaged], check.step


def _counting_builds(monkeypatch) -> list[str]:
    from ckptinspect.formats.tf import bundle

    built = []
    real = bundle.build_variables

    def counting(prefix, index):
        built.append(prefix)
        return real(prefix, index)

    monkeypatch.setattr(bundle, "build_variables", counting)
    return built


def test_the_check_of_an_open_checkpoint_takes_its_variables(tmp_path, monkeypatch):
    """scan opens a checkpoint, reads it, then plans verify's check of it: the plan takes the
    variables the open checkpoint built (same index object, prefix and object graph bytes)
    instead of building them a second time; the plan is the one built afresh."""
    from ckptinspect.formats.tf import bundle

    prefix = _copy(tmp_path)
    with open_checkpoint(prefix) as ckpt:
        assert ckpt.info["kind"] == "tf2-object"  # names from the object graph
        built = _counting_builds(monkeypatch)
        taken = _plan(prefix)
        assert built == []
        with monkeypatch.context() as patch:
            patch.setattr(bundle, "_remembered", lambda *a: None)
            assert _plan(prefix) == taken
        assert built == [prefix]
    assert taken[0] and all(name for _, name, _ in taken[0])


def test_an_object_graph_changed_since_the_open_is_read_again(tmp_path, monkeypatch):
    """The names come from the object graph in the data file: bytes changed there since the
    checkpoint was opened (its index the same) make the plan build the variables again."""
    from ckptinspect.formats.tf import bundle

    prefix = _copy(tmp_path)
    graph = next(it for it in prepare_check(prefix)[1].items if it.key == "_CHECKPOINTABLE_OBJECT_GRAPH")
    with open_checkpoint(prefix) as ckpt:
        built = _counting_builds(monkeypatch)
        _flip(prefix + ".data-00000-of-00001", graph.offset + graph.size // 2)
        changed = _plan(prefix)
        assert built == [prefix]
        with monkeypatch.context() as patch:
            patch.setattr(bundle, "_remembered", lambda *a: None)
            assert _plan(prefix) == changed
        assert ckpt.variables


def test_what_is_kept_for_the_check_goes_with_the_checkpoint(tmp_path):
    import gc
    import weakref

    from ckptinspect.formats.tf import bundle

    prefix = _copy(tmp_path)

    def opened() -> tuple[weakref.ref, int]:
        ckpt = open_checkpoint(prefix)
        index = ckpt.source._index  # noqa: SLF001 - the object the variables are kept by
        assert id(index) in bundle._OPENED  # noqa: SLF001
        ckpt.close()
        return weakref.ref(index), id(index)

    ref, key = opened()
    gc.collect()
    assert ref() is None and key not in bundle._OPENED  # noqa: SLF001


def test_a_remote_bundle_keeps_nothing_for_the_check(tmp_path, monkeypatch):
    """Nothing is kept (so nothing read again) for a remote checkpoint: its reads are requests."""
    from ckptinspect.formats.tf import bundle

    prefix = _copy(tmp_path)
    monkeypatch.setattr(bundle._fs, "is_remote", lambda p: True)  # noqa: SLF001
    monkeypatch.setattr(bundle, "_graph_bytes", lambda *a: pytest.fail("read for the check"))
    ckpt = bundle.open_bundle(prefix)
    try:
        assert id(ckpt.source._index) not in bundle._OPENED  # noqa: SLF001
    finally:
        ckpt.close()
