"""issue 25 items 1-2: ``scan`` and ``verify`` give one answer about the same checkpoint.

Inputs are the trainer's real run (``fixtures/run``: ``ckptinspect train --steps 8
--save-every 2``, a CheckpointManager directory), damaged or rotated here as a disk or a live
``CheckpointManager`` would.

Before: a newest ``.data`` file cut inside its last entry (the object graph, a string tensor
scan does not read) was ``intact`` for scan (exit 0, "HEALTHY", drift invented from the raw
keys its names fell back to) and DAMAGED for verify; a checkpoint rotated out while scan read
it was ``damaged`` (exit 1) where verify says ``rotated``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"
runner = CliRunner()


def _json(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, [*args, "--format", "json"])
    return result.exit_code, json.loads(result.stdout)


def test_a_cut_object_graph_is_damaged_for_scan_as_for_verify(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    data = run / "ckpt-8.data-00000-of-00001"
    os.truncate(data, data.stat().st_size - 100)  # inside the last entry: the object graph

    code_v, verify = _json("verify", str(run))
    assert code_v == 1 and verify["newest_intact"] == str(run / "ckpt-6")
    code_s, scan = _json("scan", str(run))
    assert code_s == 1 and not scan["healthy"]
    by_step = {s["step"]: s for s in scan["steps"]}
    assert [by_step[n]["status"] for n in (4, 6, 8)] == ["intact", "intact", "damaged"]
    # the same statuses as verify, and verify's own problems
    assert {c["path"]: c["status"] for c in verify["checkpoints"]} == {s["path"]: s["status"] for s in scan["steps"]}
    (health,) = scan["health"]
    assert health["kind"] == "damaged" and health["path"] == str(run / "ckpt-8")
    assert f"{data}: truncated: " in health["problem"]
    assert any("_CHECKPOINTABLE_OBJECT_GRAPH" in p for p in by_step[8]["problems"])
    # no drift made up from the damaged checkpoint's raw keys
    assert all("_operations" not in d["layer"] and "optimizer" not in d["layer"] for d in scan["drift"]), scan["drift"]


def _state_file(run: pathlib.Path, names: list[str]) -> None:
    lines = [f'model_checkpoint_path: "{names[-1]}"'] + [f'all_model_checkpoint_paths: "{n}"' for n in names]
    (run / "checkpoint").write_text("\n".join(lines) + "\n")


def _writer(run: pathlib.Path, victim: str):
    """A progress callback acting as the process saving into ``run``: at the first call it saves
    ckpt-10 (not looked at: listed after the scan began) and deletes ``victim``, writing the
    state file as a CheckpointManager does."""
    seen = []

    def saves(done, total, item):
        if not seen:
            seen.append(True)
            for f in run.glob("ckpt-8.*"):
                shutil.copy(f, run / f.name.replace("ckpt-8", "ckpt-10"))
            for f in run.glob(victim + ".*"):
                f.unlink()
            _state_file(run, [n for n in ("ckpt-4", "ckpt-6", "ckpt-8", "ckpt-10") if n != victim])

    saves.seen = seen
    return saves


@pytest.mark.parametrize("victim", ["ckpt-4", "ckpt-6"])
def test_a_checkpoint_rotated_out_during_scan_is_rotated_as_in_verify(tmp_path, victim):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    writer = _writer(run, victim)
    report = ckptinspect.scan(str(run), progress=writer)
    assert writer.seen
    expected = [(n, "rotated" if f"ckpt-{n}" == victim else "intact") for n in (4, 6, 8)]
    assert [(s.number, s.status) for s in report.steps] == expected
    assert report.healthy and report.health == ()
    rotated = next(s for s in report.steps if s.status == "rotated")
    assert rotated.problems == (
        f"{run}/{victim}: deleted while scan ran (rotated out by the process saving into {run}); not damage",)
    result = runner.invoke(app, ["scan", str(run)])
    assert result.exit_code == 0, result.output


def test_verify_says_rotated_by_the_same_rule(tmp_path):
    """verify checks ckpt-4 first (its files held open while read: intact); ckpt-6, deleted
    before its turn, is rotated, as scan says."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    report = ckptinspect.verify(str(run), progress=_writer(run, "ckpt-6"))
    assert [c.status for c in report.checkpoints] == ["intact", "rotated", "intact"] and report.intact


def test_an_idle_directory_missing_a_checkpoint_is_still_unhealthy(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    for f in run.glob("ckpt-6.*"):
        f.unlink()
    os.utime(run / "checkpoint", (0, 0))  # nobody is saving here
    report = ckptinspect.scan(str(run))
    assert [(s.number, s.status) for s in report.steps] == [(4, "intact"), (6, "missing"), (8, "intact")]
    assert [p.kind for p in report.health] == ["missing"]


@pytest.mark.parametrize("cut", [1, 3000])
def test_scan_status_is_verify_status_for_any_cut(tmp_path, cut):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    data = run / "ckpt-6.data-00000-of-00001"
    os.truncate(data, data.stat().st_size - cut)
    verify = ckptinspect.verify(str(run))
    scan = ckptinspect.scan(str(run))
    assert [c.status for c in verify.checkpoints] == [s.status for s in scan.steps] == ["intact", "damaged", "intact"]


def test_a_flipped_byte_in_a_value_is_verify_damage_from_scan_s_one_read(tmp_path):
    """issue 28: scan reads each value once and its verify verdict comes from those reads (the
    check is fed the reader's checksums); the answer is verify's, damage for damage."""
    from ckptinspect.formats import prepare_check

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    prefix = str(run / "ckpt-6")
    item = max((it for it in prepare_check(prefix)[1].items if it.dtype == "float32"), key=lambda it: it.size)
    with open(prefix + ".data-00000-of-00001", "r+b") as f:
        f.seek(item.offset + 5)
        byte = f.read(1)
        f.seek(item.offset + 5)
        f.write(bytes([byte[0] ^ 1]))
    verify = ckptinspect.verify(str(run))
    scan = ckptinspect.scan(str(run))
    assert [c.status for c in verify.checkpoints] == [s.status for s in scan.steps] == ["intact", "damaged", "intact"]
    (d,) = verify.checkpoints[1].damaged
    assert d.kind == "checksum" and d.key == item.key
    assert scan.steps[1].problems == (f"{d.name}: {d.problem}",)
