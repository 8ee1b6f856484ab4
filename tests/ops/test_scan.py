"""`ckptinspect scan`: every checkpoint of a run, NaN onset, drift, directory health.

Ground truth comes from TensorFlow and Keras: runs written by ``tf.train.CheckpointManager``
(in the test) and by the trainer (``ckptinspect train --nan-at``), values read back with
``tf.train.load_checkpoint`` and Keras' ``load_weights``, figures computed with numpy.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from scan_precision import scan_close  # noqa: E402 - tests/helpers is on sys.path
from ckptinspect.cli import app
from ckptinspect.ops.scan import operation as scan_mod

tf = pytest.importorskip("tensorflow")

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"
runner = CliRunner()
NAN_STEP = 3
NAN_VARIABLE = "net/dense_b/kernel"
STEPS = (1, 2, 3, 4, 5)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


class _Dense(tf.Module):
    def __init__(self, name: str, n_in: int, n_out: int, seed: int):
        super().__init__(name=name)
        rng = np.random.default_rng(seed)
        self.kernel = tf.Variable(rng.normal(size=(n_in, n_out)).astype("float32"), name="kernel")
        self.bias = tf.Variable(np.zeros(n_out, "float32"), name="bias")


class _Net(tf.Module):
    def __init__(self):
        super().__init__(name="net")
        self.dense_a = _Dense("dense_a", 6, 300, 0)  # 1,800 values: several blocks at a small block size
        self.dense_b = _Dense("dense_b", 300, 4, 1)
        self.frozen = _Dense("frozen", 4, 4, 2)


def write_run(directory: pathlib.Path, *, nan_step: int | None = None, jump_step: int | None = None) -> list[str]:
    """A CheckpointManager run: every step changes dense_a and dense_b a little (frozen never);
    at ``nan_step`` dense_b's kernel is set to NaN (after which it stays NaN); at ``jump_step``
    dense_a's kernel jumps."""
    net = _Net()
    step = tf.Variable(0, dtype=tf.int64, name="step")
    ckpt = tf.train.Checkpoint(net=net, step=step)
    manager = tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=None)
    rng = np.random.default_rng(7)
    paths = []
    for s in STEPS:
        step.assign(s)
        scale = 1.0 if s == jump_step else 1e-2
        net.dense_a.kernel.assign_add(scale * rng.normal(size=(6, 300)).astype("float32"))
        net.dense_a.bias.assign_add(1e-2 * rng.normal(size=300).astype("float32"))
        net.dense_b.kernel.assign_add(1e-2 * rng.normal(size=(300, 4)).astype("float32"))
        if s == nan_step:
            net.dense_b.kernel.assign(tf.fill((300, 4), float("nan")))
        paths.append(manager.save(checkpoint_number=s))
    return paths


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("scan") / "nan_run"
    write_run(d, nan_step=NAN_STEP)
    return d


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("scan") / "healthy"
    write_run(d, jump_step=4)
    return d


def test_nan_onset_exact_step_and_variable(nan_run):
    result = invoke("scan", nan_run, "--format", "json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["first_nonfinite"] == {"step": NAN_STEP, "number": NAN_STEP, "path": str(nan_run / f"ckpt-{NAN_STEP}"),
                                      "variables": [NAN_VARIABLE]}
    assert [s["step"] for s in doc["steps"]] == list(STEPS)
    assert doc["health"] == []
    by_step = {s["step"]: {v["name"]: v for v in s["variables"]} for s in doc["steps"]}
    assert by_step[NAN_STEP][NAN_VARIABLE]["nan"] == 300 * 4
    assert by_step[NAN_STEP - 1][NAN_VARIABLE]["nan"] == 0


def test_healthy_run_exit_0_and_drift(healthy_run):
    result = invoke("scan", healthy_run, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["first_nonfinite"] is None and doc["health"] == []
    kinds = {(d["layer"], d["kind"]) for d in doc["drift"]}
    assert ("net/frozen", "frozen") in kinds
    jumps = [d for d in doc["drift"] if d["kind"] == "jumped"]
    assert [(d["layer"], d["step"]) for d in jumps] == [("net/dense_a", 4)]
    table = invoke("scan", healthy_run)
    assert table.exit_code == 0 and "HEALTHY: 5 checkpoints" in table.stdout
    assert "net/frozen (frozen)" in table.stdout and "net/dense_a (jumped)" in table.stdout


def _expected(cur: np.ndarray, prev: np.ndarray) -> dict[str, float]:
    c = cur.astype(np.float64).ravel()
    p = prev.astype(np.float64).ravel()
    d = c - p
    nc, np_, nd = np.linalg.norm(c), np.linalg.norm(p), np.linalg.norm(d)
    return {
        "norm": float(nc),
        "max_abs_change": float(np.max(np.abs(d))),
        # scan's documented convention for an all-zero previous value: 0 when unchanged, inf otherwise
        "rel_change": float(nd / np_) if np_ > 0 else (0.0 if nd == 0 else float("inf")),
        "cosine": float(np.dot(c, p) / (nc * np_)) if nc > 0 and np_ > 0 else None,
    }


def test_figures_equal_numpy_on_tf_values(healthy_run, monkeypatch):
    monkeypatch.setattr(scan_mod, "BLOCK_ELEMENTS", 256)  # several blocks per tensor, paired block for block
    report = ckptinspect.scan(str(healthy_run))
    checked = 0
    for prev, cur in zip(report.steps, report.steps[1:]):
        r_prev, r_cur = tf.train.load_checkpoint(prev.path), tf.train.load_checkpoint(cur.path)
        for v in cur.variables:
            if v.dtype != "float32":
                continue
            want = _expected(r_cur.get_tensor(v.key), r_prev.get_tensor(v.key))
            got = v.figures.to_dict()
            for k, value in want.items():
                assert got[k] == (value if value is None else scan_close(k, value)), (cur.step, v.name, k)
            checked += 1
        for layer in cur.layers:  # a layer's figures are those of its variables concatenated
            keys = [v.key for v in cur.variables if v.layer == layer.layer and v.dtype == "float32"]
            want = _expected(np.concatenate([r_cur.get_tensor(k).ravel() for k in keys]),
                             np.concatenate([r_prev.get_tensor(k).ravel() for k in keys]))
            got = layer.figures.to_dict()
            for k, value in want.items():
                assert got[k] == (value if value is None else scan_close(k, value)), (cur.step, layer.layer, k)
    assert checked == 4 * 6


def test_explicit_paths_in_step_order(healthy_run):
    paths = [healthy_run / "ckpt-3", healthy_run / "ckpt-1.index", healthy_run / "ckpt-2"]
    report = ckptinspect.scan([str(p) for p in paths])
    assert report.series == "paths"
    assert [s.step for s in report.steps] == [1, 2, 3]
    assert report.steps[1].compared_to == str(healthy_run / "ckpt-1")
    assert report.healthy


def test_role_filter_and_csv(tmp_path):
    result = invoke("scan", RUN, "--role", "model", "--format", "csv")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("step,number,path,status,name,layer,role")
    assert len(lines) == 1 + 3 * 10 and all(",model," in line for line in lines[1:])
    assert invoke("scan", RUN, "--role", "nonsense").exit_code == 2


# -- health ----------------------------------------------------------------------------------
def _plant_everything(d: pathlib.Path) -> dict[str, str]:
    """Each kind of health problem, planted in a copy of the fixture run; kind -> path."""
    (d / "ckpt-4.index").unlink()  # listed, files gone
    os.remove(d / "ckpt-4.data-00000-of-00001")
    shutil.copy(d / "ckpt-6.index", d / "ckpt-7.index")  # on disk, not listed
    shutil.copy(d / "ckpt-6.data-00000-of-00001", d / "ckpt-7.data-00000-of-00001")
    (d / "ckpt-2.data-00000-of-00001").write_bytes(b"\0" * 64)  # no index: stale
    (d / "ckpt-8.data-00000-of-00002").write_bytes(b"\0" * 64)  # not the 1 shard the index names
    (d / ".ckptinspect-tmp-0123456789ab.out.h5").write_bytes(b"x")
    (d / "ckpt-9_temp").mkdir()
    (d / "checkpoint.tmp0123456789abcdef0123456789abcdef").write_text("x")
    data = bytearray((d / "ckpt-8.data-00000-of-00001").read_bytes())  # a flipped byte: crc mismatch
    data[100] ^= 0xFF
    (d / "ckpt-8.data-00000-of-00001").write_bytes(bytes(data))
    state = (d / "checkpoint").read_text().replace('"ckpt-6"', '"/elsewhere/on/another/machine/ckpt-6"')
    (d / "checkpoint").write_text(state)
    return {
        "missing": str(d / "ckpt-4"),
        "unlisted": str(d / "ckpt-7"),
        "stale-shard": str(d / "ckpt-2.data-00000-of-00001"),
        "extra-shard": str(d / "ckpt-8.data-00000-of-00002"),
        "temp-file": str(d / "ckpt-9_temp"),
        "damaged": str(d / "ckpt-8"),
        "foreign-path": str(d / "checkpoint"),
    }


def test_planted_health_problems_all_reported(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    planted = _plant_everything(d)
    result = invoke("scan", d, "--format", "json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    found = {(p["kind"], p["path"]) for p in doc["health"]}
    for kind, path in planted.items():
        assert (kind, path) in found, (kind, path, doc["health"])
    temps = {p["path"] for p in doc["health"] if p["kind"] == "temp-file"}
    assert temps == {str(d / ".ckptinspect-tmp-0123456789ab.out.h5"), str(d / "ckpt-9_temp"),
                     str(d / "checkpoint.tmp0123456789abcdef0123456789abcdef")}
    damaged = next(p for p in doc["health"] if p["kind"] == "damaged")
    assert "crc32c" in damaged["problem"] or "checksum" in damaged["problem"]
    status = {s["path"]: s["status"] for s in doc["steps"]}
    assert status[str(d / "ckpt-8")] == "damaged" and status[str(d / "ckpt-4")] == "missing"
    assert status[str(d / "ckpt-6")] == "intact"  # the foreign spelling is read from the directory
    # verify agrees on the damaged checkpoint
    assert not ckptinspect.verify(str(d / "ckpt-8")).intact


def test_garbage_state_file(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    (d / "checkpoint").write_bytes(b"\x00\xffnot a state file")
    result = invoke("scan", d, "--format", "json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert [p["kind"] for p in doc["health"]] == ["state-file"]
    assert len(doc["steps"]) == 3  # the checkpoints on disk are still scanned


# -- Keras ModelCheckpoint -------------------------------------------------------------------
def test_keras_model_checkpoint_series(tmp_path):
    keras = pytest.importorskip("keras")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="d1"), keras.layers.Dense(2, name="d2")])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = np.random.default_rng(1).normal(size=(32, 2)).astype("float32")
    pattern = str(tmp_path / "weights.{epoch:02d}.weights.h5")
    model.fit(x, y, epochs=3, batch_size=8, verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(pattern, save_weights_only=True)])
    report = ckptinspect.scan(str(tmp_path))
    assert report.series == "keras-files" and report.healthy
    # the step is the optimizer's iterations (4 batches an epoch); the epoch is the name's number
    assert [(s.step, s.number) for s in report.steps] == [(4, 1), (8, 2), (12, 3)]
    weights = []
    for s in report.steps:  # Keras 3 stores layer L's j-th weight as L/vars/j
        model.load_weights(s.path)
        weights.append({f"{layer.name}/vars/{j}": np.asarray(w.numpy())
                        for layer in model.layers for j, w in enumerate(layer.weights)})
    last = {v.name: v for v in report.steps[2].variables if v.role == "model"}
    assert set(last) == set(weights[2])
    assert {x.layer for x in report.steps[2].layers} >= {"d1", "d2"}
    for name, value in weights[2].items():
        want = _expected(value, weights[1][name])
        got = last[name].figures.to_dict()
        for k, expected in want.items():
            assert got[k] == scan_close(k, expected), (name, k)


# -- plot -------------------------------------------------------------------------------------
@pytest.mark.slow  # matplotlib draws for ~3 s
def test_plot_png(nan_run, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "scan.png"
    result = invoke("scan", nan_run, "--plot", out)
    assert result.exit_code == 1, result.output  # the NaN
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    import matplotlib.image  # noqa: PLC0415

    image = matplotlib.image.imread(str(out))
    assert image.shape[0] >= 600 and image.shape[1] >= 900
    assert invoke("scan", nan_run, "--plot", out).exit_code == 2  # exists
    assert invoke("scan", nan_run, "--plot", out, "--force").exit_code == 1
    (tmp_path / "not.png").write_text("mine")
    refused = invoke("scan", nan_run, "--plot", tmp_path / "not.png", "--force")
    assert refused.exit_code == 2 and (tmp_path / "not.png").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["not.png", "scan.png"]


@pytest.fixture
def drawn_figure(nan_run, monkeypatch):
    """The figure ``scan --plot`` saves for the NaN run (matplotlib's Agg backend), kept open."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from ckptinspect import render  # noqa: PLC0415

    monkeypatch.setattr(plt, "close", lambda *a, **k: None)  # keep the figure scan_plot draws
    before = set(plt.get_fignums())
    assert render.scan_plot(ckptinspect.scan(str(nan_run))).startswith(b"\x89PNG")
    (num,) = set(plt.get_fignums()) - before
    fig = plt.figure(num)
    fig.canvas.draw()
    yield fig
    monkeypatch.undo()
    plt.close(fig)


def _marker_boxes(fig):
    """The display boxes of every marker drawn in the axes (line markers and scatter marks)."""
    from matplotlib.transforms import Bbox  # noqa: PLC0415

    boxes = []
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_marker() in (None, "None", "", " "):
                continue
            r = line.get_markersize() * fig.dpi / 72 / 2
            for x, y in ax.transData.transform(line.get_xydata()):
                boxes.append(Bbox([[x - r, y - r], [x + r, y + r]]))
        for coll in ax.collections:
            r = np.sqrt(coll.get_sizes()[0]) * fig.dpi / 72 / 2
            for x, y in coll.get_transform().transform(coll.get_offsets()):
                boxes.append(Bbox([[x - r, y - r], [x + r, y + r]]))
    return boxes


def a_text(artist) -> str:
    text = artist.get_text()
    return text if isinstance(text, str) else ""


@pytest.mark.slow  # matplotlib draws for ~3 s
def test_plot_legend_leads_with_the_largest_change_and_marks_the_unchanged_layer(drawn_figure):
    """Issue 25 item 18: the frozen layer (relative change 0: no line on the log scale below)
    led the legend; it comes last, marked, after the layers that changed most."""
    ax_norm, ax_rel = drawn_figure.axes
    legend = ax_norm.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["net/dense_a", "net/dense_b", "net/frozen (no change)", "first NaN/Inf: step 3",
                      "NaN/Inf (1 layers)"]
    lower = {line.get_color() for line in ax_rel.get_lines() if len(line.get_xdata()) and line.get_linestyle() == "-"}
    for label, handle in zip(labels[:3], legend.legend_handles):
        assert (handle.get_color() in lower) == (not label.endswith("(no change)")), label


@pytest.mark.slow  # matplotlib draws for ~3 s
def test_plot_first_nonfinite_label_is_clear_of_the_markers(drawn_figure):
    renderer = drawn_figure.canvas.get_renderer()
    labels = [t for t in drawn_figure.findobj(lambda a: hasattr(a, "get_text")) if "first NaN/Inf" in a_text(t)]
    assert labels, "the first non-finite step is labelled"
    markers = _marker_boxes(drawn_figure)
    assert len(markers) > 10
    for label in labels:
        box = label.get_window_extent(renderer).expanded(1.1, 1.3)  # a little air around the words
        assert not any(box.overlaps(m) for m in markers), label.get_text()


@pytest.mark.slow  # matplotlib draws for ~3 s
def test_plot_y_ticks_within_two_decades_are_plain_numbers(drawn_figure):
    for ax in drawn_figure.axes:
        low, high = ax.get_ylim()
        shown = [t.get_text() for t in ax.yaxis.get_majorticklabels() + ax.yaxis.get_minorticklabels()
                 if t.get_text() and low <= t.get_position()[1] <= high]
        assert len(shown) >= 2, shown
        for text in shown:
            float(text)  # "4", "0.0105"; not "$\\mathdefault{4\\times10^{0}}$"


def test_plot_output_follows_the_atomic_output_rules_before_the_work(tmp_path, monkeypatch):
    """--plot is checked by _atomic before any checkpoint is read: --force replaces only a PNG
    file; another file, a link to a PNG, an existing plot without --force are refused (exit 2,
    one line, nothing changed or left behind)."""
    monkeypatch.setattr(scan_mod, "scan", lambda *a, **k: pytest.fail("the scan ran"))
    (tmp_path / "not.png").write_text("mine")
    png = tmp_path / "old.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 8)
    (tmp_path / "link.png").symlink_to(png)
    cases = {
        "not.png": (["--force"], "exists and is a regular file (4 bytes), not a PNG image; --force replaces only an "
                                 "earlier output of the same kind, refusing"),
        "link.png": (["--force"], f"is a symbolic link (to {png}); --force replaces only regular files of an earlier "
                                  "output, refusing"),
        "old.png": ([], "output exists; pass --force (force=True) to replace it"),
    }
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for name, (extra, message) in cases.items():
        result = invoke("scan", RUN, "--plot", tmp_path / name, *extra)
        assert result.exit_code == 2, result.output
        assert result.stderr == f"Error: {tmp_path / name}: {message}\n"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.slow  # a process of its own
def test_plot_without_matplotlib_is_one_error_line(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from ckptinspect.cli import main; sys.argv = ['ckptinspect', 'scan', sys.argv[1], '--plot', sys.argv[2]]; main()")
    proc = subprocess.run([sys.executable, "-c", code, str(RUN), str(tmp_path / "p.png")], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("Error: --plot needs matplotlib"), proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "p.png").exists()


# -- the trainer -------------------------------------------------------------------------------
@pytest.mark.slow
def test_trainer_nan_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    run = tmp_path / "run"
    train = subprocess.run([sys.executable, "-m", "ckptinspect", "train", str(run), "--steps", "8", "--save-every", "2",
                            "--max-to-keep", "0", "--nan-at", "6", "--nan-variable", "head/kernel"],
                           capture_output=True, text=True, env=env, timeout=600)
    assert train.returncode == 0, train.stderr
    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "scan", str(run), "--format", "json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["first_nonfinite"]["step"] == 6 and doc["first_nonfinite"]["variables"] == ["head/kernel"]
    assert [s["step"] for s in doc["steps"]] == [2, 4, 6, 8]
    assert doc["health"] == []
    # what TensorFlow reads: the poisoned kernel is NaN at step 6, nothing was at step 4
    key = ckptinspect.open(str(run / "ckpt-6"))["head/kernel"].key
    assert np.isnan(tf.train.load_checkpoint(str(run / "ckpt-6")).get_tensor(key)).all()
    assert np.isfinite(tf.train.load_checkpoint(str(run / "ckpt-4")).get_tensor(key)).all()


def test_windows_of_open_checkpoints_give_the_same_report(healthy_run, monkeypatch):
    whole = ckptinspect.scan(str(healthy_run)).to_dict()
    monkeypatch.setattr(scan_mod, "MAX_OPEN_CHECKPOINTS", 2)  # windows [1,2] [2:3,4] [4:5]
    assert ckptinspect.scan(str(healthy_run)).to_dict() == whole


def test_missing_data_shard_is_verify_damage(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    os.remove(d / "ckpt-6.data-00000-of-00001")
    report = ckptinspect.scan(str(d))
    # the damaged one does not open: no step read from it; the number in its name places it
    assert [(s.number, s.status) for s in report.steps] == [(4, "intact"), (6, "damaged"), (8, "intact")]
    (problem,) = report.health
    assert problem.kind == "damaged" and problem.path == str(d / "ckpt-6")
    assert "data shard is missing" in problem.problem
    assert report.steps[2].compared_to == str(d / "ckpt-4")  # the last readable checkpoint
