"""Issue 11, the TF bundle reader: index entries TensorFlow cannot read, raw key bytes, deep and
damaged object graphs, and roles (Keras 2 metrics, BERT slots, --optimizer-pattern).

Each test builds its input for real (bundles written by TensorFlow, index entries rewritten with
the project's own protobuf declarations, object graphs serialised here, a tf_keras SavedModel, a
TF1 graph saved by ``tf.compat.v1.train.Saver``). Commands that TensorFlow could abort on run in
a subprocess: a regression then fails the test instead of killing the test run.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from bundle_craft import DEEP_KEY, chain_graph, edit_entry, graph_checkpoint, read_entries, tf_reads
from cases_bundle import CASES, KEY, NAME, TF_OUTCOME, non_utf8_keys
from catalogue import RUN, _copy_prefix
import limits
from ckptinspect.cli import app
from ckptinspect.errors import CorruptCheckpointError, UsageError
from ckptinspect.formats.tf import index as _bundle_index
from ckptinspect.formats.tf import object_graph as tf_object_graph
from ckptinspect.formats.tf.wire import MalformedError
from ckptinspect.model import display_name

runner = CliRunner()
ROOT = pathlib.Path(__file__).resolve().parents[2]


# -- what TensorFlow does with each crafted input ----------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_what_tensorflow_does(case, tmp_path):
    """The outcome each catalogue case states for TensorFlow itself (load_checkpoint, then
    get_tensor of every key, in a subprocess since it may abort)."""
    prefix = case.make(tmp_path / case.id)
    outcome = tf_reads(prefix)
    assert outcome.startswith(TF_OUTCOME[case.id]), outcome


# -- 1. entries TensorFlow cannot read: found when the index is parsed --------------------------
ENTRY_EDITS = {  # edit of frozen/kernel's entry -> (kind, problem)
    "dtype99": ({"dtype": 99}, "dtype", "unknown dtype 99: TensorFlow cannot read it"),
    "resource": ({"dtype": 20}, "dtype", "dtype resource: a resource handle, not a stored value; TensorFlow cannot read it"),
    "overflow": ({"dims": [2**62, 4]}, "size", "shape [4611686018427387904, 4] holds more elements than int64 can count"),
    "size": ({"size": 10**12}, "size",
             "the index records 1000000000000 bytes, a float32 tensor of shape [16, 16] takes 1024"),
}


@pytest.fixture(scope="module")
def entry_cases(tmp_path_factory) -> dict[str, pathlib.Path]:
    base = tmp_path_factory.mktemp("entries")
    out = {}
    for name, (fields, _, _) in ENTRY_EDITS.items():
        prefix = _copy_prefix(RUN / "ckpt-8", base / name)
        edit_entry(prefix, KEY.encode(), **dict(fields))
        out[name] = prefix
    return out


def test_entries_are_checked_when_the_index_is_parsed(entry_cases):
    for name, (_, kind, problem) in ENTRY_EDITS.items():
        index = _bundle_index.read_index(str(entry_cases[name]))
        bad = {e.key: e.problem for e in index.entries if e.problem is not None}
        assert bad == {KEY: (kind, problem)}, name


def test_entry_problem_rules():
    ok = _bundle_index.entry_problem
    assert ok(1, (16, 16), 1024, holds_data=True) is None
    assert ok(29, (6,), 6, holds_data=True) is None  # int4: one byte per element, as TF stores it
    assert ok(29, (6,), 24, holds_data=True)[0] == "size"
    assert ok(33, (4,), 4, holds_data=True) is None  # float4_e2m1fn, known to TF 2.21
    assert ok(7, (3,), 20, holds_data=True) is None  # strings: sizes vary
    assert ok(7, (30,), 20, holds_data=True)[0] == "size"  # 30 strings cannot fit in 20 bytes
    assert ok(1, (2**62, 4), 0, holds_data=False)[0] == "size"  # sliced entries: the shape still counts
    assert ok(1, (16, 16), 0, holds_data=False) is None
    assert ok(101, (1,), 4, holds_data=True)[0] == "dtype"  # reference dtypes are never stored


def test_verify_names_the_damaged_entry(entry_cases):
    for name, (_, kind, problem) in ENTRY_EDITS.items():
        report = ckptinspect.verify(str(entry_cases[name]))
        assert not report.intact
        (damage,) = report.checkpoints[0].damaged
        assert (damage.key, damage.name, damage.kind, damage.problem) == (KEY, NAME, kind, problem), name
        assert damage.file == f"{entry_cases[name]}.data-00000-of-00001"
        assert report.checkpoints[0].tensors == 26  # every other tensor is checked


COMMANDS_RUNNER = textwrap.dedent("""
    import json, sys
    from click.testing import CliRunner
    from ckptinspect.cli import app
    out = []
    for args in json.loads(sys.argv[1]):
        r = CliRunner().invoke(app, args)
        out.append([r.exit_code, r.stdout, r.stderr])
    print(json.dumps(out))
""")


def run_commands(commands: list[list[str]]) -> list[tuple[int, str, str]]:
    """CLI commands in one subprocess (TensorFlow imported once); an abort fails the test."""
    proc = subprocess.run([sys.executable, "-c", COMMANDS_RUNNER, json.dumps(commands)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"the process died ({proc.returncode}): {proc.stderr[-2000:]}"
    return [tuple(r) for r in json.loads(proc.stdout)]


def test_reading_an_entry_tf_cannot_read_is_a_clean_error(entry_cases, tmp_path):
    """diff P P, extract and (for numeric dtypes, which it reads) ls --stats each give one
    Error line naming the entry, before TensorFlow is handed its key (for dtype 99 and the
    overflowing shape TF aborts the process; for the 1e12 size, diff compared shape x itemsize
    bytes and said 'equal'). ls --stats does not read non-numeric values: it lists them, marked."""
    commands, expected = [], []
    for name, (_, _, problem) in ENTRY_EDITS.items():
        p = str(entry_cases[name])
        error = f"cannot read '{NAME}' (key '{KEY}'): {problem} (`ckptinspect verify` reports it)\n"
        numeric = name in ("overflow", "size")
        commands += [["ls", "--stats", p], ["diff", p, p], ["extract", p, "-o", str(tmp_path / name / "out")],
                     ["ls", "--stats", "-k", "^frozen/bias$", p]]
        expected += [(2, f"Error: {p}.index: {error}") if numeric else (0, "(unreadable)"),
                     (2, f"Error: {p}.index: {error}"), (2, f"Error: {p}: {error}"), (0, "0.1")]
    for (code, stdout, stderr), want, args in zip(run_commands(commands), expected, commands):
        assert code == want[0], (args, stderr)
        if code == 2:
            assert (stdout, stderr) == ("", want[1]), args
        else:  # the other entries still read (even with a shape TF's CheckpointReader aborts on)
            assert want[1] in stdout and stderr.startswith("warning: "), (args, stdout, stderr)
    assert not (tmp_path / "dtype99" / "out.index").exists()


def test_ls_lists_and_marks_the_entry(entry_cases):
    p = str(entry_cases["dtype99"])
    result = runner.invoke(app, ["ls", p])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith(NAME + " "))
    assert row.split()[:4] == [NAME, "[16,16]", "dtype99", "(unreadable)"]
    assert result.stderr == (f"warning: {p}.index: '{NAME}': unknown dtype 99: TensorFlow cannot read it "
                             "(`ckptinspect verify` reports it)\n")
    doc = json.loads(runner.invoke(app, ["ls", p, "-f", "json"]).stdout)
    assert doc["info"]["unreadable"] == {KEY: "unknown dtype 99: TensorFlow cannot read it"}
    assert [v["dtype"] for v in doc["variables"] if v["key"] == KEY] == ["dtype99"]  # JSON stays exact


def test_size_field_disagreeing_with_shape_is_never_read_raw(entry_cases):
    """The raw block reader refuses the entry, and so does the TensorFlow fallback."""
    with ckptinspect.open(str(entry_cases["size"])) as ckpt:
        var = ckpt[NAME]
        with pytest.raises(CorruptCheckpointError, match="takes 1024"):
            next(ckpt.iter_blocks(var, 64))
        with pytest.raises(CorruptCheckpointError, match="takes 1024"):
            ckpt.read(var)
        assert var.nbytes == 1024  # what shape x dtype takes, not the 1e12 the index records


# -- 3. keys that are not UTF-8 --------------------------------------------------------------
@pytest.fixture(scope="module")
def raw_keys(tmp_path_factory) -> pathlib.Path:
    return non_utf8_keys(tmp_path_factory.mktemp("rawkeys"))


def test_raw_key_bytes_are_the_identity(raw_keys):
    with ckptinspect.open(str(raw_keys)) as ckpt:
        keys = {v.key.encode("utf-8", "surrogateescape") for v in ckpt}
        assert keys == {b"w\xff", b"w\xfe", b"global_step"}
        assert ckpt["w\udcff"].shape == (2,) and ckpt["w\udcfe"].shape == (1, 3)
        np.testing.assert_array_equal(ckpt.read("w\udcff"), [1.0, 2.0])
        np.testing.assert_array_equal(ckpt.read("w\udcfe"), [[1.0, 2.0, 3.0]])
    assert display_name("w\udcff") == "w\\xff" and display_name("poids_é") == "poids_é"


def test_raw_keys_through_every_command(raw_keys, tmp_path):
    p = str(raw_keys)
    table = runner.invoke(app, ["ls", p])
    assert table.exit_code == 0
    rows = {line.split()[0]: line.split()[1] for line in table.stdout.splitlines()[-3:]}
    assert rows == {"global_step": "[]", "w\\xfe": "[1,3]", "w\\xff": "[2]"}
    csv_out = runner.invoke(app, ["ls", p, "-f", "csv"]).stdout
    assert "w\\xff,w\\xff,[2]" in csv_out
    doc = json.loads(runner.invoke(app, ["ls", p, "-f", "json"]).stdout)
    assert sorted(v["key"].encode("utf-8", "surrogateescape") for v in doc["variables"]) == [
        b"global_step", b"w\xfe", b"w\xff"]
    same = runner.invoke(app, ["diff", p, p])
    assert same.exit_code == 0, same.output
    assert "all 3 variables equal" in same.stdout
    stats = runner.invoke(app, ["ls", "--stats", p])
    assert stats.exit_code == 0 and "1.5" in stats.stdout, stats.output
    out = tmp_path / "out" / "model.ckpt"
    result = runner.invoke(app, ["extract", p, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert {k for k, _ in read_entries(pathlib.Path(f"{out}.index"))} == {b"", b"w\xff", b"w\xfe"}
    tf = pytest.importorskip("tensorflow")
    reader = tf.train.load_checkpoint(str(out))
    np.testing.assert_array_equal(reader.get_tensor(b"w\xff"), [1.0, 2.0])  # TensorFlow reads them by bytes
    for suffix in (".npz", ".safetensors"):  # text names: a clear refusal, not UnicodeEncodeError
        refused = runner.invoke(app, ["extract", p, "-o", str(tmp_path / f"out{suffix}")])
        assert refused.exit_code == 2
        assert refused.stderr == (f"Error: {p}: 'w\\xfe' is not valid UTF-8 (its key holds raw bytes), and a"
                                  f" {suffix} output names its tensors with text; write a TF checkpoint instead\n")


# -- 4. deep object graphs: linear walks ---------------------------------------------------------
@pytest.mark.slow  # ~2.5 s: in CI's slow run
def test_object_graph_walk_is_linear():
    """300,000 chained objects: parsed and analysed in a few seconds (the old walk stored a
    path tuple per node: 14 GB for 40,000)."""
    start = time.process_time()  # CPU time: the bound is the work done, whatever the machine's load
    nodes = tf_object_graph.parse_object_graph(chain_graph(300_000))
    facts = tf_object_graph.analyse_object_graph(nodes)
    assert time.process_time() - start < 20
    (fact,) = facts.values()
    assert fact.role == "model" and fact.name == "deep/v"
    assert fact.graph_path == "/".join(["c"] * 300_000)


def test_graph_objects_are_counted_before_decoding():
    assert tf_object_graph.count_graph_objects(chain_graph(10)) == 22  # 11 nodes, 10 child references, 1 attribute
    start = time.process_time()  # CPU time: the bound is the work done, whatever the machine's load
    with pytest.raises(MalformedError, match="object graph holds more than 1000000 objects"):
        tf_object_graph.parse_object_graph(b"\n\x00" * 8_000_000)  # decoded: ~400 MB in protobuf alone
    assert time.process_time() - start < 10


def test_graph_object_count_is_what_tensorflow_decodes():
    """The wire count of a real graph (Keras model + Adam, written by tf.train.Checkpoint) is the
    objects TensorFlow's own proto decodes: nodes, child references, attributes, slot
    references, and each node's message fields that are set (has_checkpoint_values)."""
    tf = pytest.importorskip("tensorflow")
    from tensorflow.core.protobuf import trackable_object_graph_pb2  # noqa: PLC0415

    blob = tf.train.load_checkpoint(str(RUN / "ckpt-8")).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")
    graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(blob)
    expected = sum(1 + len(n.children) + len(n.attributes) + len(n.slot_variables)
                   + n.HasField("registered_saver") + n.HasField("has_checkpoint_values") for n in graph.nodes)
    assert len(graph.nodes) > 20 and all(n.HasField("has_checkpoint_values") for n in graph.nodes)
    assert tf_object_graph.count_graph_objects(blob) == expected
    with pytest.raises(MalformedError, match=f"more than {expected - 1} objects"):
        tf_object_graph.count_graph_objects(blob, limit=expected - 1)
    for cut in range(1, len(blob)):  # every truncation: a count or one MalformedError, never IndexError
        try:
            assert tf_object_graph.count_graph_objects(blob[:cut]) <= expected
        except MalformedError as e:
            assert "truncated varint" in str(e) or "runs past the end" in str(e), e


def test_path_budget_is_a_clear_error():
    nodes = tf_object_graph.parse_object_graph(chain_graph(3_000, every_node_holds=True))
    with pytest.raises(MalformedError, match="object graph paths add up to more than 4000000 elements"):
        tf_object_graph.analyse_object_graph(nodes)


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("deep")
    return graph_checkpoint(d / "ckpt-1", chain_graph(300_000), {DEEP_KEY: np.arange(3, dtype=np.float32)})


MEASURED_LS = textwrap.dedent("""
    import sys
    from ckptinspect.cli import main
    sys.argv = ["ckptinspect", "ls", sys.argv[1]]
    try:
        main()
    except SystemExit as e:
        code = e.code
    # VmHWM: this process's peak RSS (ru_maxrss would count the forking parent's, before exec).
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print("peak-kib", int(hwm.split()[1]), file=sys.stderr)
""")


@pytest.mark.slow  # ~2 s with its fixture: in CI's slow run
def test_ls_of_a_300k_deep_graph_in_bounded_time_and_memory(deep):
    start = limits.children_cpu_seconds()  # CPU time: the bound is the work done, whatever the machine's load
    proc = subprocess.run([sys.executable, "-c", MEASURED_LS, str(deep)], capture_output=True, text=True, timeout=120)
    seconds = limits.children_cpu_seconds() - start
    assert proc.returncode == 0, proc.stderr
    assert "deep/v" in proc.stdout
    peak_kib = int(proc.stderr.split("peak-kib")[-1])
    assert seconds < 10 and peak_kib < 500 * 1024, (seconds, peak_kib)


@pytest.mark.slow
def test_prune_object_graph_is_linear(deep):
    """extract's pruning of a 300,000-deep chain: linear, and every node keeps its path."""
    pytest.importorskip("tensorflow")
    from ckptinspect.formats.tf.write.through_tf import prune_object_graph

    blob = chain_graph(300_000)
    start = time.process_time()  # CPU time: the bound is the work done, whatever the machine's load
    pruned = prune_object_graph(blob, {DEEP_KEY.decode()})
    assert time.process_time() - start < 30
    assert pruned.num_nodes == 300_001
    assert pruned.paths == {DEEP_KEY.decode(): "/".join(["c"] * 300_000)}
    assert pruned.key_map[DEEP_KEY.decode()] == "/".join(["c"] * 300_000) + "/.ATTRIBUTES/VARIABLE_VALUE"
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    out = trackable_object_graph_pb2.TrackableObjectGraph.FromString(pruned.blob)
    assert all(n.has_checkpoint_values.value for n in out.nodes)


# -- 5. object graph unreadable: names from the keys ----------------------------------------------
def test_fallback_roles_from_keys_match_the_graph(tmp_path):
    """With its object graph's shard gone, ckpt-8 lists from its keys: the roles guessed from
    the keys are those the graph gives, and the warning says where the names come from."""
    from bundle_craft import graph_in_own_shard

    prefix = graph_in_own_shard(RUN / "ckpt-8", tmp_path)
    with ckptinspect.open(str(prefix)) as intact:
        roles = {v.key: v.role for v in intact}
    pathlib.Path(f"{prefix}.data-00001-of-00002").unlink()
    with ckptinspect.open(str(prefix)) as ckpt:
        assert {v.key: v.role for v in ckpt} == roles
        assert ckpt.info["object_graph"]["error"] == "the data shard is missing"
        assert ckpt["model/_operations/2/_kernel"].graph_path is None
        (warning,) = ckpt.info["warnings"]
        assert "names and roles below come from the keys" in warning
    report = ckptinspect.verify(str(prefix))
    assert [(d.key, d.kind) for d in report.checkpoints[0].damaged] == [("_CHECKPOINTABLE_OBJECT_GRAPH", "missing-shard")]


def test_object_graph_with_huge_size_is_damage_not_an_error(tmp_path):
    for field, value in (("size", 10**12), ("offset", 2**62)):
        prefix = _copy_prefix(RUN / "ckpt-8", tmp_path / field)
        edit_entry(prefix, b"_CHECKPOINTABLE_OBJECT_GRAPH", **{field: value})
        result = runner.invoke(app, ["verify", str(prefix)])
        assert result.exit_code == 1, result.output
        assert f"first:   _CHECKPOINTABLE_OBJECT_GRAPH in {prefix}.data-00000-of-00001: needs bytes" in result.stdout


# -- 6. roles ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keras2_savedmodel(tmp_path_factory) -> pathlib.Path:
    """A Keras 2 (tf_keras) model compiled with metrics, fitted one epoch, saved as a SavedModel."""
    tf_keras = pytest.importorskip("tf_keras")
    inp = tf_keras.Input((4,))
    out = tf_keras.layers.Dense(2, name="d2")(tf_keras.layers.Dense(3, name="d1")(inp))
    model = tf_keras.Model(inp, out)
    model.compile(optimizer="adam", loss="mse", metrics=["mae", tf_keras.metrics.RootMeanSquaredError()])
    model.fit(np.ones((8, 4)), np.ones((8, 2)), epochs=1, verbose=0)
    path = tmp_path_factory.mktemp("k2sm") / "sm"
    model.save(str(path), save_format="tf")
    assert sorted(w.name for w in model.weights) == ["d1/bias:0", "d1/kernel:0", "d2/bias:0", "d2/kernel:0"]
    return path


def test_keras2_metric_accumulators_are_metadata(keras2_savedmodel, tmp_path):
    with ckptinspect.open(str(keras2_savedmodel)) as ckpt:
        metrics = [v for v in ckpt if "keras_api/metrics/" in v.key]
        assert len(metrics) == 6 and {v.role for v in metrics} == {"metadata"}
        assert sorted(v.name for v in ckpt.filter(role="model")) == ["d1/bias", "d1/kernel", "d2/bias", "d2/kernel"]
    same = ckptinspect.diff(str(keras2_savedmodel), str(keras2_savedmodel), role="model")
    assert sorted(v.name for v in same.variables) == ["d1/bias", "d1/kernel", "d2/bias", "d2/kernel"]
    report = ckptinspect.extract(str(keras2_savedmodel), str(tmp_path / "w"))
    assert report.kept["all"]["count"] == 4
    keys = {k for k, _ in read_entries(tmp_path / "w.index")}
    assert not [k for k in keys if b"metrics" in k]


@pytest.fixture(scope="module")
def bert_tf1(tmp_path_factory) -> pathlib.Path:
    """A TF1 graph with BERT's AdamWeightDecayOptimizer slot names, saved by tf.compat.v1.train.Saver,
    plus a custom accumulator no rule knows."""
    tf = pytest.importorskip("tensorflow")
    d = tmp_path_factory.mktemp("bert")
    tf1 = tf.compat.v1
    with tf.Graph().as_default():
        params = [tf1.get_variable("bert/encoder/layer_0/attention/self/query/kernel", [4, 4]),
                  tf1.get_variable("bert/encoder/layer_0/attention/self/query/bias", [4])]
        step = tf1.train.get_or_create_global_step()
        for v in params:
            for slot in ("adam_m", "adam_v"):
                tf1.get_variable(f"{v.op.name}/{slot}", v.shape, initializer=tf1.zeros_initializer())
        tf1.get_variable("bert/encoder/layer_0/attention/self/query/kernel/grad_accum", [4, 4],
                         initializer=tf1.ones_initializer())
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            return pathlib.Path(tf1.train.Saver().save(sess, str(d / "model.ckpt"), global_step=step))


QUERY = "bert/encoder/layer_0/attention/self/query"


def test_bert_adam_slots_are_optimizer_state(bert_tf1, tmp_path):
    with ckptinspect.open(str(bert_tf1)) as ckpt:
        roles = {v.name: v.role for v in ckpt}
    assert roles == {
        f"{QUERY}/kernel": "model", f"{QUERY}/bias": "model", f"{QUERY}/kernel/grad_accum": "model",
        f"{QUERY}/kernel/adam_m": "optimizer", f"{QUERY}/kernel/adam_v": "optimizer",
        f"{QUERY}/bias/adam_m": "optimizer", f"{QUERY}/bias/adam_v": "optimizer", "global_step": "metadata",
    }
    report = ckptinspect.extract(str(bert_tf1), str(tmp_path / "m"))
    assert sorted(v.name for v in report.variables if v.kept) == [
        f"{QUERY}/bias", f"{QUERY}/kernel", f"{QUERY}/kernel/grad_accum"]


def test_optimizer_pattern(bert_tf1, tmp_path):
    p = str(bert_tf1)
    listed = runner.invoke(app, ["ls", p, "--optimizer-pattern", "grad_accum$", "--role", "optimizer"])
    assert listed.exit_code == 0, listed.output
    assert f"{QUERY}/kernel/grad_accum" in listed.stdout and "totals:  model 2 " in listed.stdout
    diffed = runner.invoke(app, ["diff", p, p, "--role", "model", "--optimizer-pattern", "grad_accum$"])
    assert diffed.exit_code == 0, diffed.output
    assert "grad_accum" not in diffed.stdout.split("note:")[0] and "all 2 variables equal" in diffed.stdout
    assert "--optimizer-pattern 'grad_accum$' marked 1 variable(s) of A and 1 of B as optimizer state" in diffed.stdout
    out = tmp_path / "m"
    extracted = runner.invoke(app, ["extract", p, "-o", str(out), "--optimizer-pattern", "grad_accum$"])
    assert extracted.exit_code == 0, extracted.output
    assert {k for k, _ in read_entries(pathlib.Path(f"{out}.index"))} == {
        b"", f"{QUERY}/kernel".encode(), f"{QUERY}/bias".encode()}
    with ckptinspect.open(p) as ckpt:
        marked = ckptinspect.mark_optimizer(ckpt, "grad_accum$")
        assert marked[f"{QUERY}/kernel/grad_accum"].role == "optimizer"
        assert ckpt[f"{QUERY}/kernel/grad_accum"].role == "model"  # the original is unchanged
        assert marked.info["optimizer_pattern"] == {"pattern": "grad_accum$", "marked": 1}
        np.testing.assert_array_equal(marked.read(f"{QUERY}/kernel/grad_accum"), np.ones((4, 4)))
        with pytest.raises(UsageError, match="bad --optimizer-pattern regex"):
            ckptinspect.mark_optimizer(ckpt, "(")
    bad = runner.invoke(app, ["ls", p, "--optimizer-pattern", "("])
    assert bad.exit_code == 2 and bad.stderr.startswith("Error: bad --optimizer-pattern regex '('")
