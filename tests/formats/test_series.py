"""The series seam: folders of checkpoint files written by training callbacks (Keras 3 and
tf_keras ModelCheckpoint, Lightning) are series for ls, verify, scan and average --last, read
through the one listing (formats.list_directory). Fixtures: fixtures/series (written by the real
callbacks, see its make_fixtures.py); the expectations come from its expected.json."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from ckptinspect import formats
from ckptinspect.cli import app
from ckptinspect.errors import NotACheckpointError
from ckptinspect.formats.series import SERIES_KERAS, SERIES_TORCH, name_numbers

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERIES = ROOT / "fixtures" / "series"
EXPECTED = json.loads((SERIES / "expected.json").read_text())["folders"]
KINDS = {"keras3_weights": SERIES_KERAS, "keras3_models": SERIES_KERAS, "tfkeras_h5": SERIES_KERAS,
         "tfkeras_models": SERIES_KERAS, "lightning": SERIES_TORCH}


def _run(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def _numbered(folder: str) -> list[tuple[int, str]]:
    """(the number the writer put in the name, file name), in series order, from expected.json."""
    out = []
    for name, facts in EXPECTED[folder]["files"].items():
        numbers = facts["name"]
        if numbers:
            out.append((numbers.get("step", numbers.get("epoch")), name))
    return sorted(out)


@pytest.mark.parametrize("name,numbers", [
    ("weights.03.weights.h5", (None, None, 3)),
    ("model.02-1.06.h5", (None, None, 2)),
    ("ckpt_7.keras", (None, None, 7)),
    ("epoch=1-step=8.ckpt", (1, 8, None)),
    ("ckpt-8", (None, None, 8)),
    ("keras2_model.h5", (None, None, None)),
    ("last.ckpt", (None, None, None)),
])
def test_name_numbers(name, numbers):
    found = name_numbers(name)
    assert (found.epoch, found.step, found.number) == numbers


@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_the_listing_is_the_series_the_callback_wrote(folder):
    listing = formats.list_directory(str(SERIES / folder))
    expected = _numbered(folder)
    assert listing.kind == KINDS[folder]
    assert [(c.number, pathlib.Path(c.path).name) for c in listing.checkpoints] == expected
    # the training step each file's variables record (the step rule), not the name's number
    files = EXPECTED[folder]["files"]
    assert [c.step for c in listing.checkpoints] == [
        files[n].get("global_step", files[n].get("optimizer_iterations")) for _, n in expected]
    assert listing.latest == str(SERIES / folder / expected[-1][1])
    assert [c.latest for c in listing.checkpoints] == [False] * (len(expected) - 1) + [True]
    unnumbered = sorted(n for n, f in EXPECTED[folder]["files"].items() if not f["name"])
    assert [pathlib.Path(p).name for p in listing.unordered] == unnumbered


@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_ls_and_verify_of_the_folder(folder):
    listed = _run("ls", "--format", "json", SERIES / folder)
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.stdout)
    expected = _numbered(folder)
    assert doc["path"] == str(SERIES / folder / expected[-1][1])
    assert [pathlib.Path(c["path"]).name for c in doc["checkpoints"]] == [n for _, n in expected]

    verified = _run("verify", "--format", "json", SERIES / folder)
    assert verified.exit_code == 0, verified.output
    report = json.loads(verified.stdout)
    assert report["format"] == KINDS[folder]
    assert [(pathlib.Path(c["path"]).name, c["status"]) for c in report["checkpoints"]] == [
        (n, "intact") for _, n in expected]


def test_verify_names_the_damaged_file_of_a_series(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(SERIES / "keras3_weights", folder)
    cut = folder / "weights.02.weights.h5"
    cut.write_bytes(cut.read_bytes()[:4096])
    result = _run("verify", "--format", "json", folder)
    assert result.exit_code == 1, result.output
    statuses = {pathlib.Path(c["path"]).name: c["status"] for c in json.loads(result.stdout)["checkpoints"]}
    assert statuses == {"weights.01.weights.h5": "intact", "weights.02.weights.h5": "damaged",
                        "weights.03.weights.h5": "intact"}


def test_average_last_two_of_a_modelcheckpoint_folder(tmp_path):
    out = tmp_path / "avg.weights.h5"
    result = _run("average", "--last", "2", SERIES / "keras3_weights", "-o", out)
    assert result.exit_code == 0, result.output
    with h5py.File(SERIES / "keras3_weights" / "weights.02.weights.h5") as a, \
            h5py.File(SERIES / "keras3_weights" / "weights.03.weights.h5") as b, h5py.File(out) as got:
        for path in ("layers/dense/vars/0", "layers/dense/vars/1", "layers/dense_1/vars/0", "layers/dense_1/vars/1"):
            mean = ((a[path][()].astype(np.float64) + b[path][()].astype(np.float64)) / 2).astype(np.float32)
            np.testing.assert_array_equal(got[path][()], mean)


def test_scan_goes_through_a_lightning_folder_in_step_order():
    result = _run("scan", "--format", "json", SERIES / "lightning")
    doc = json.loads(result.stdout)
    assert doc["series"] == SERIES_TORCH
    assert [(s["step"], pathlib.Path(s["path"]).name) for s in doc["steps"]] == [
        (4, "epoch=0-step=4.ckpt"), (8, "epoch=1-step=8.ckpt")]


def test_keras_files_without_numbers_are_not_a_series():
    with pytest.raises(NotACheckpointError, match="with no epoch or step in their names, not a series"):
        formats.list_directory(str(ROOT / "fixtures" / "keras"))
    result = _run("ls", ROOT / "fixtures" / "keras")
    assert result.exit_code == 2 and "pass one of them" in result.output


def test_a_lightning_callbacks_inf_sentinel_is_not_divergence():
    """Lightning's ModelCheckpoint keeps kth_value at inf (metadata): scan stays healthy."""
    result = _run("scan", "--format", "json", SERIES / "lightning")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["healthy"] and doc["first_nonfinite"] is None
    kth = [v for v in doc["steps"][0]["variables"] if v["name"].endswith("/kth_value")]
    assert kth and kth[0]["role"] == "metadata" and kth[0]["inf"] == 1


def test_plan_reads_the_cadence_of_a_series_from_its_files(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(SERIES / "keras3_weights", folder)
    for i, name in enumerate(("weights.01.weights.h5", "weights.02.weights.h5", "weights.03.weights.h5")):
        os.utime(folder / name, (1_700_000_000 + 600 * i, 1_700_000_000 + 600 * i))  # a save every 10 minutes
    result = _run("plan", "--format", "json", folder)
    assert result.exit_code == 0, result.output
    measured = json.loads(result.stdout)["measured"]
    assert measured["retained"] == 3
    assert measured["checkpoint"] == str(folder / "weights.03.weights.h5")
    cadence = measured["cadence"]
    assert cadence["time_source"] == "mtime" and cadence["interval_seconds"] == 600
    assert [p["step"] for p in cadence["points"]] == [4, 8, 12]  # the optimizer's iterations: training steps
