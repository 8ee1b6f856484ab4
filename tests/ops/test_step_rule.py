"""Issue 25 item 4: one step rule in every command.

The training step comes from a variable (``global_step``/``step``, else the optimizer's
iterations) with its source; the number in a name (a ``ModelCheckpoint`` epoch, a
``CheckpointManager`` checkpoint number, Lightning's ``epoch=N``) is shown as such, never as a
step. ``ls``, ``verify``, ``scan`` and ``average`` give the same answer for the same file.

Inputs: the callback series under ``fixtures/series`` (written by Keras 3, tf_keras and
Lightning; ``expected.json`` holds each file's optimizer iterations) and a ``CheckpointManager``
checkpoint written here by TensorFlow whose optimizer has done 9,360 iterations at save 7.
"""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from ckptinspect import model as m
from ckptinspect.cli import app

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "series"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())["folders"]


def run_json(*args: str) -> dict:
    result = CliRunner().invoke(app, [*args, "--format", "json"], catch_exceptions=False)
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def iterations(folder: str) -> dict[str, int | None]:
    return {name: facts.get("optimizer_iterations") for name, facts in EXPECTED[folder]["files"].items()}


@pytest.mark.parametrize("folder", ["keras3_weights", "keras3_models", "tfkeras_models"])
def test_a_keras_file_s_step_is_its_optimizer_iterations_in_ls_and_scan(folder):
    """ls and scan agree: the step is the optimizer's iteration count (not the epoch in the
    name, which scan used to show); scan shows the epoch as the number in the name."""
    expected = iterations(folder)
    for name, its in expected.items():
        doc = run_json("ls", str(FIXTURES / folder / name))
        assert (doc["step"], doc["step_source"].split(":")[0]) == (its, "optimizer"), name
    scan = run_json("scan", str(FIXTURES / folder))
    assert [s["step"] for s in scan["steps"]] == list(expected.values())
    assert [s["number"] for s in scan["steps"]] == [f["name"]["epoch"] for f in EXPECTED[folder]["files"].values()]


def test_a_legacy_weights_file_has_no_step_and_scan_shows_its_epoch_as_a_number():
    """tf_keras save_weights files hold no optimizer: no step anywhere; scan orders them by the
    number in their names and says that is what it is."""
    for name in iterations("tfkeras_h5"):
        assert run_json("ls", str(FIXTURES / "tfkeras_h5" / name))["step"] is None
    scan = run_json("scan", str(FIXTURES / "tfkeras_h5"))
    assert [(s["step"], s["number"], s["number_source"]) for s in scan["steps"]] == [(None, 1, "name"), (None, 2, "name")]
    table = CliRunner().invoke(app, ["scan", str(FIXTURES / "tfkeras_h5")]).stdout
    assert "number 1 in its name" in table and "number 2 in its name" in table


def test_average_lists_the_same_steps_as_ls(tmp_path):
    folder = FIXTURES / "keras3_weights"
    result = CliRunner().invoke(app, ["average", "--last", "2", str(folder), "-o", str(tmp_path / "avg.weights.h5")])
    assert result.exit_code == 0, result.output
    for name, its in list(iterations("keras3_weights").items())[-2:]:
        assert f"{name} (step {its})" in result.stdout


def test_lightning_step_from_global_step_and_epoch_from_the_name():
    doc = run_json("ls", str(FIXTURES / "lightning" / "epoch=1-step=8.ckpt"))
    assert (doc["step"], doc["step_source"], doc["number"], doc["number_source"]) == (8, "variable:global_step", 1, "name:epoch")
    assert "step:    8 (from variable:global_step); epoch 1" in CliRunner().invoke(
        app, ["ls", str(FIXTURES / "lightning" / "epoch=1-step=8.ckpt")]).stdout


@pytest.fixture(scope="module")
def manager_checkpoint(tmp_path_factory) -> pathlib.Path:
    """``ckpt-7`` of a CheckpointManager whose optimizer has done 9,360 iterations (saved by TF)."""
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    directory = tmp_path_factory.mktemp("manager")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    optimizer.iterations.assign(9360)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=3)
    manager.save(checkpoint_number=7)
    return directory


def test_a_checkpoint_manager_s_number_is_not_its_step(manager_checkpoint):
    """ckpt-7 whose optimizer has done 9,360 iterations: step 9360 (the optimizer's), checkpoint 7
    (the name's), in ls, verify and scan alike (ls used to say step 7)."""
    prefix = str(manager_checkpoint / "ckpt-7")
    doc = run_json("ls", prefix)
    assert (doc["step"], doc["number"], doc["number_source"]) == (9360, 7, "name:checkpoint")
    assert doc["step_source"].startswith("optimizer:")
    text = CliRunner().invoke(app, ["ls", prefix]).stdout
    assert f"step:    9360 (from {doc['step_source']}); checkpoint 7" in text
    verify = run_json("verify", str(manager_checkpoint))
    assert [c["step"] for c in verify["checkpoints"]] == [9360]
    scan = run_json("scan", str(manager_checkpoint))
    assert [(s["step"], s["number"]) for s in scan["steps"]] == [(9360, 7)]


def test_run_positions_is_steps_else_numbers_else_nothing():
    assert m.run_positions([5, 3], [1, 2]) == ([5, 3], "step")
    assert m.run_positions([5, None], [1, 2]) == ([1, 2], "number")
    assert m.run_positions([None, None], [1, None]) == ([None, None], None)


def test_place_in_run_says_what_the_number_is():
    assert m.place_in_run(24, 3, "name") == "step 24"
    assert m.place_in_run(None, 7, "name:checkpoint") == "checkpoint 7"
    assert m.place_in_run(None, 3, "name:epoch") == "epoch 3"
    assert m.place_in_run(None, 3, "name") == "number 3 in its name"
    assert m.place_in_run(None, 4, "save_counter") == "save 4"
    assert m.place_in_run(None, None, None) is None


def test_average_of_a_series_without_steps_names_the_numbers_in_the_names(tmp_path):
    """tf_keras weights files hold no step: average --last orders them by the series' numbers
    and says that is what they are (was "step ?")."""
    result = CliRunner().invoke(app, ["average", "--last", "2", str(FIXTURES / "tfkeras_h5"), "-o",
                                      str(tmp_path / "avg.h5")])
    assert result.exit_code == 0, result.output
    assert "weights.01.h5 (number 1 in its name)" in result.stdout
    assert "weights.02.h5 (number 2 in its name)  <- newest" in result.stdout
