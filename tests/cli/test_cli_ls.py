"""`ckptinspect ls` through the CLI: output formats, filters, stats, errors and exit codes."""

from __future__ import annotations

import csv
import io
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from ckptinspect.cli import app

tf = pytest.importorskip("tensorflow")

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    """A CheckpointManager directory with two saves of a small tf.Module, one NaN and one Inf."""
    d = tmp_path_factory.mktemp("cli")

    class Net(tf.Module):
        def __init__(self):
            self.dense = tf.Module()
            self.dense.kernel = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0)
            self.dense.bias = tf.Variable(np.array([1.0, np.nan, np.inf, -2.0], dtype=np.float32))

    net = Net()
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(net=net, step=step), str(d), max_to_keep=3)
    for n in (10, 20):
        step.assign(n)
        manager.save(checkpoint_number=n)
    return d


def test_table_header_and_rows(ckpt_dir):
    result = invoke("ls", str(ckpt_dir))
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"path:    {ckpt_dir}/ckpt-20" in out
    assert "format:  tf-bundle (tf2-object)" in out
    assert "step:    20 (from variable:step)" in out
    assert "model 2 (64 B)" in out
    lines = out.splitlines()
    kernel_row = next(line for line in lines if line.startswith("net/dense/kernel"))
    assert kernel_row.split() == ["net/dense/kernel", "[3,4]", "float32", "48", "B", "0", "model"]
    # The retained checkpoints, newest marked.
    assert any(line.startswith("*") and line.split()[1].endswith("ckpt-20") for line in lines)


def test_json_document(ckpt_dir):
    result = invoke("ls", str(ckpt_dir), "--format", "json")
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert doc["format"] == "tf-bundle" and doc["step"] == 20 and doc["num_shards"] == 1
    assert [c["step"] for c in doc["checkpoints"]] == [10, 20]
    assert all(set(c) >= {"path", "step", "timestamp", "exists"} for c in doc["checkpoints"])
    reader = tf.train.load_checkpoint(str(ckpt_dir))
    shapes = reader.get_variable_to_shape_map()
    shapes.pop("_CHECKPOINTABLE_OBJECT_GRAPH")
    assert {v["key"]: v["shape"] for v in doc["variables"]} == shapes
    for v in doc["variables"]:
        assert set(v) == {"key", "name", "shape", "dtype", "nbytes", "shards", "role"}
        assert v["shards"] == [0]


def test_csv(ckpt_dir):
    result = invoke("ls", str(ckpt_dir), "-f", "csv", "--role", "model")
    assert result.exit_code == 0
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert [r["name"] for r in rows] == ["net/dense/bias", "net/dense/kernel"]
    assert rows[1]["nbytes"] == "48" and rows[1]["shape"] == "[3,4]"


def test_filter_and_role(ckpt_dir):
    result = invoke("ls", str(ckpt_dir), "--filter", "kernel$", "-f", "json")
    assert [v["name"] for v in json.loads(result.output)["variables"]] == ["net/dense/kernel"]
    result = invoke("ls", str(ckpt_dir), "--role", "metadata", "-f", "json")
    assert {v["name"] for v in json.loads(result.output)["variables"]} == {"save_counter", "step"}
    result = invoke("ls", str(ckpt_dir), "--role", "weights")
    assert result.exit_code == 2
    assert result.output.strip().startswith("Error: unknown role 'weights'")
    result = invoke("ls", str(ckpt_dir), "--filter", "(")
    assert result.exit_code == 2 and "bad --filter regex" in result.output


def test_stats_against_numpy(ckpt_dir):
    result = invoke("ls", str(ckpt_dir), "--stats", "-f", "json")
    assert result.exit_code == 0
    doc = {v["name"]: v["stats"] for v in json.loads(result.output)["variables"]}
    reader = tf.train.load_checkpoint(str(ckpt_dir))
    kernel = reader.get_tensor("net/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE")
    assert doc["net/dense/kernel"] == pytest.approx(
        {"min": kernel.min(), "max": kernel.max(), "mean": kernel.mean(), "std": kernel.std(), "nan": 0, "inf": 0}
    )
    bias = reader.get_tensor("net/dense/bias/.ATTRIBUTES/VARIABLE_VALUE")
    finite = bias[np.isfinite(bias)]
    assert doc["net/dense/bias"]["nan"] == 1 and doc["net/dense/bias"]["inf"] == 1
    assert doc["net/dense/bias"]["min"] == pytest.approx(finite.min())
    assert doc["net/dense/bias"]["mean"] == pytest.approx(finite.mean())
    assert doc["step"]["max"] == 20


def test_tree_groups_by_layer(ckpt_dir):
    result = invoke("ls", str(ckpt_dir), "--tree")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    group = next(i for i, line in enumerate(lines) if line.startswith("net/dense/ "))
    assert "2 vars" in lines[group]
    assert lines[group + 1].startswith("  bias") and lines[group + 2].startswith("  kernel")


@pytest.mark.parametrize(
    "make_path, message",
    [
        (lambda d: d / "ckpt-20.data-00000-of-00001", "is a data shard, not a checkpoint; pass the prefix {d}/ckpt-20"),
        (lambda d: d / "checkpoint", "is the checkpoint state file, not a checkpoint; pass its directory {d}"),
        (lambda d: d / "nope", "{d}/nope: no such file, directory or checkpoint prefix"),
    ],
)
def test_errors_name_the_file(ckpt_dir, make_path, message):
    result = invoke("ls", str(make_path(ckpt_dir)))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert message.format(d=ckpt_dir) in lines[0]


def test_missing_shard_and_truncated_index(tmp_path):
    prefix = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])).write(str(tmp_path / "c"))
    index = pathlib.Path(prefix + ".index")
    index.write_bytes(index.read_bytes()[:-10])
    result = invoke("ls", prefix)
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: {prefix}.index: not a valid checkpoint index")
    prefix = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])).write(str(tmp_path / "d"))
    pathlib.Path(prefix + ".data-00000-of-00001").unlink()
    result = invoke("ls", prefix)  # the object graph lives in the missing shard: names come from the keys
    assert result.exit_code == 0, result.output
    assert result.stderr == (f"warning: {prefix}.data-00000-of-00001: the object graph (_CHECKPOINTABLE_OBJECT_GRAPH)"
                             " cannot be read: the data shard is missing; names and roles below come from the keys"
                             " (`ckptinspect verify` checks the files)\n")
    assert "v  " in result.stdout


def test_no_traceback_in_a_real_process(tmp_path):
    bogus = tmp_path / "weights.h5"
    bogus.write_text("not hdf5")
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "ls", str(bogus)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"Error: {bogus}: ")
    assert "Traceback" not in proc.stderr


def test_every_command_has_help():
    for name, command in app.commands.items():
        assert command.help, f"{name} has no help text"
        result = invoke(name, "--help")
        assert result.exit_code == 0, name


def test_simple_table_matches_tabulate():
    from tabulate import tabulate

    from ckptinspect.render import simple_table

    headers = ["name", "shape", "r"]
    rows = [["a", "[1,2]", ""], ["bbbbbbbbbb", "x", "yy"], ["  indented", "", "model"]]
    expected = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True, preserve_whitespace=True)
    assert simple_table(headers, rows) == expected


def test_sort_orders(ckpt_dir):
    def names(*extra):
        result = invoke("ls", str(ckpt_dir), "-f", "json", *extra)
        assert result.exit_code == 0, result.output
        return [(v["name"], v["role"], v["nbytes"]) for v in json.loads(result.output)["variables"]]

    by_role = names()
    assert [r for _, r, _ in by_role] == ["model", "model", "metadata", "metadata"]
    assert [n for n, _, _ in names("--sort", "name")] == sorted(n for n, _, _ in by_role)
    sizes = [b for _, _, b in names("--sort", "size")]
    assert sizes == sorted(sizes, reverse=True)
    reader_order = [k for k in tf.train.load_checkpoint(str(ckpt_dir)).get_variable_to_shape_map()]
    file_keys = [v["key"] for v in json.loads(invoke("ls", str(ckpt_dir), "-f", "json", "--sort", "file").output)["variables"]]
    assert file_keys == sorted(k for k in reader_order if k != "_CHECKPOINTABLE_OBJECT_GRAPH")
    assert invoke("ls", str(ckpt_dir), "--sort", "bogus").exit_code == 2


def test_keras_header(realworld):
    """MANIFEST: Keras 2.0.6 Sequential with Adam, optimizer iterations 3623."""
    result = invoke("ls", str(realworld / "keras2-h5-full-k206/model.h5"))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "step:      3623 (from optimizer:optimizer_weights/iterations:0)" in lines
    assert "model:     Sequential 12 layers" in lines
    assert "optimizer: Adam" in lines
    assert "keras:     2.0.6 (tensorflow backend)" in lines
