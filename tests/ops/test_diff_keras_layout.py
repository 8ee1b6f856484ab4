"""issue 25 item 8: Keras' own layout pairs one model's files without ``--map``.

Inputs: ``fixtures/keras_pairs`` (written by its ``make_fixtures.py`` with tf_keras) and a
Keras 3 model saved both ways here, by the same script's ``keras3``. Before: the ``.keras`` file's ``optimizer/vars/N`` and the legacy ``.h5``'s
``optimizer_weights/adam/...`` were all removed/added (exit 1); a Keras 2 ``weights.03.hdf5``
(``dense``) and the final model saved from a later build (``dense_2``) paired nothing.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import pytest
from click.testing import CliRunner

from ckptinspect.cli import app

PAIRS = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "keras_pairs"
runner = CliRunner()


def _diff(a: pathlib.Path, b: pathlib.Path) -> tuple[int, dict]:
    result = runner.invoke(app, ["diff", str(a), str(b), "--format", "json"])
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture(scope="module")
def keras3_pair(tmp_path_factory) -> pathlib.Path:
    pytest.importorskip("keras")
    spec = importlib.util.spec_from_file_location("keras_pairs_make", PAIRS / "make_fixtures.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    out = tmp_path_factory.mktemp("keras3")
    make.keras3(out)
    return out


def test_one_keras3_model_saved_as_keras_and_as_h5_is_equal(keras3_pair):
    code, doc = _diff(keras3_pair / "keras3.keras", keras3_pair / "keras3.h5")
    assert code == 0 and doc["identical"], doc["notes"]
    assert doc["summary"]["added"] == doc["summary"]["removed"] == 0
    optimizer = [v for v in doc["variables"] if v["key_a"].startswith("optimizer/vars/")]
    assert len(optimizer) == 22 and {v["matched_by"] for v in optimizer} == {"optimizer-positional"}
    by_a = {v["key_a"]: v["key_b"] for v in optimizer}
    assert re.fullmatch(r"optimizer_weights/adam(_\d+)?/iteration", by_a["optimizer/vars/0"]), by_a["optimizer/vars/0"]
    # Keras numbers layer and optimizer names per process (dense_3 and adam alone; higher numbers
    # after other tests built layers and optimizers)
    assert re.search(r"/dense(_\d+)?_kernel_momentum$", by_a["optimizer/vars/2"]), by_a["optimizer/vars/2"]
    assert re.search(r"/dense(_\d+)?_kernel_velocity$", by_a["optimizer/vars/3"]), by_a["optimizer/vars/3"]
    assert by_a["optimizer/vars/2"].rsplit("_", 2)[0] == by_a["optimizer/vars/3"].rsplit("_", 2)[0]
    assert any("by Keras' variable order" in n for n in doc["notes"])


def test_keras2_model_checkpoint_weights_against_the_final_model():
    code, doc = _diff(PAIRS / "keras2" / "weights.03.hdf5", PAIRS / "keras2" / "final.h5")
    pairs = {v["name_a"]: v["name_b"] for v in doc["variables"] if v["name_a"] and v["name_b"]}
    assert pairs["dense/kernel"] == "dense_2/kernel" and pairs["dense_1/bias"] == "dense_3/bias"
    assert pairs["batch_normalization/moving_variance"] == "batch_normalization_1/moving_variance"
    assert len(pairs) == 8 and all(v["status"] == "equal" for v in doc["variables"] if v["name_a"])
    # what only the full model holds is still added (its optimizer): exit 1, as diff says
    assert code == 1 and doc["summary"]["removed"] == 0 and doc["summary"]["added"] >= 1
