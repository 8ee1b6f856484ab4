"""issue 25 items 6 and 9: an index whose data files are not there.

Inputs are real: the trainer's TF index (``fixtures/run``, written by a CheckpointManager) and
the Hugging Face sharded folders of ``fixtures/torch`` (``torch.save`` / safetensors shards with
their index, written by ``fixtures/torch/make_fixtures.py``), copied without their data files
as an index uploaded alone would be.

Before: ``ls --stats`` of a TF index alone loaded TensorFlow (4-7 s) and then said the
checkpoint was "deleted while being read (rotated out ...)"; ``ls`` of an HF index without its
shards listed nothing (exit 2) and ``verify`` named only the first missing shard.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

from click.testing import CliRunner

from ckptinspect.cli import app

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"
TORCH = ROOT / "fixtures" / "torch"
runner = CliRunner()


def _index_alone(tmp_path: pathlib.Path) -> pathlib.Path:
    d = tmp_path / "uploaded"
    d.mkdir()
    shutil.copy(RUN / "ckpt-8.index", d / "ckpt-8.index")
    return d


def test_ls_stats_of_an_index_alone_says_the_data_file_is_missing(tmp_path):
    d = _index_alone(tmp_path)
    data = d / "ckpt-8.data-00000-of-00001"
    for path in (d / "ckpt-8", d):  # the prefix, and the directory resolving to it
        result = runner.invoke(app, ["ls", "--stats", str(path)])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"Error: {data}: data file is missing ({d}/ckpt-8.index names it;"), result.stderr
        assert "rotated" not in result.stderr and result.stderr.count("\n") == 1


def test_the_missing_data_file_is_said_without_loading_tensorflow(tmp_path):
    """At once: TensorFlow (seconds to import) is never loaded for it."""
    d = _index_alone(tmp_path)
    code = ("import sys\nfrom ckptinspect.cli import app\n"
            f"try:\n    app(['ls', '--stats', {str(d)!r}])\nexcept SystemExit as e:\n    code = e.code\n"
            "print(code, 'tensorflow' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stderr.splitlines()[-1] == "2 False", proc.stderr
    assert "data file is missing" in proc.stderr


def _hf_index_alone(tmp_path: pathlib.Path, folder: str, index: str) -> pathlib.Path:
    d = tmp_path / folder
    d.mkdir()
    shutil.copy(TORCH / folder / index, d / index)
    return d


def test_ls_of_an_hf_bin_index_without_shards_lists_its_names(tmp_path):
    d = _hf_index_alone(tmp_path, "hf_bin_sharded", "pytorch_model.bin.index.json")
    index = d / "pytorch_model.bin.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    result = runner.invoke(app, ["ls", str(d), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert sorted(v["name"] for v in doc["variables"]) == sorted(weight_map)
    assert doc["num_shards"] == 2 and doc["format"] == "torch-zip"
    assert {v["dtype"] for v in doc["variables"]} == {"unknown"}
    for n in (1, 2):
        shard = d / f"pytorch_model-0000{n}-of-00002.bin"
        line = f"warning: {shard}: shard {n} of 2 named by {index} is missing"
        assert line in result.stderr, result.stderr
    assert doc["info"]["missing_shards"] == ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    # diff compares nothing it cannot read: each name differs, and a note says why
    diff = runner.invoke(app, ["diff", str(d), str(TORCH / "hf_bin_sharded")])
    assert diff.exit_code == 1 and f"note: A: {d}/pytorch_model-00001-of-00002.bin: shard 1 of 2" in diff.stdout, diff.output


def test_verify_names_every_missing_shard(tmp_path):
    d = _hf_index_alone(tmp_path, "hf_bin_sharded", "pytorch_model.bin.index.json")
    result = runner.invoke(app, ["verify", str(d), "--format", "json"])
    assert result.exit_code == 1, result.output
    (ckpt,) = json.loads(result.stdout)["checkpoints"]
    index = d / "pytorch_model.bin.index.json"
    assert ckpt["problems"] == [f"{d}/pytorch_model-0000{n}-of-00002.bin: shard {n} of 2 named by {index} is missing"
                                for n in (1, 2)]
    assert {x["kind"] for x in ckpt["damaged"]} == {"missing-shard"} and len(ckpt["damaged"]) == 7


def test_one_missing_safetensors_shard_keeps_the_others_readable(tmp_path):
    d = tmp_path / "hf_sharded"
    shutil.copytree(TORCH / "hf_sharded", d)
    (d / "model-00002-of-00003.safetensors").unlink()
    result = runner.invoke(app, ["ls", "--stats", str(d), "--format", "json"])
    assert result.exit_code == 0, result.output
    by_name = {v["name"]: v for v in json.loads(result.stdout)["variables"]}
    assert by_name["lm_head.weight"]["shape"] == [5, 4] and by_name["lm_head.weight"]["stats"] is not None
    assert [n for n, v in by_name.items() if v["dtype"] == "unknown"] == sorted(
        n for n, f in json.loads((d / "model.safetensors.index.json").read_text())["weight_map"].items()
        if f == "model-00002-of-00003.safetensors")
    verify = runner.invoke(app, ["verify", str(d)])
    assert verify.exit_code == 1 and "shard 2 of 3 named by" in verify.stdout
