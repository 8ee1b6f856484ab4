"""The operations over Keras 3 Orbax checkpoints (fixtures/orbax): scan finds the planted NaN, diff
pairs an Orbax step with the same model's .weights.h5, .keras and TF checkpoint, extract writes the
way out (checked against tensorstore's own reading), average says what it takes."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

ts = pytest.importorskip("tensorstore")

import ckptinspect  # noqa: E402
from ckptinspect import errors  # noqa: E402
from ckptinspect.formats import open_checkpoint  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "orbax"
EXPECTED = json.loads((FIX / "expected.json").read_text())
MP = FIX / "model_parallel"
RUN = MP / "run"


def _oracle(step: pathlib.Path, key: str) -> np.ndarray:
    spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{step / 'pytree'}/", "path": key + "/"}}
    return ts.open(spec, open=True).result().read().result()


def test_scan_finds_the_planted_nan_step():
    report = ckptinspect.scan(str(FIX / "nan_run"))
    assert [s.step for s in report.steps] == [1, 2, 3, 4]
    assert report.first_nonfinite.step == 3
    nan_steps = {s for s, d in EXPECTED["nan_run"].items() if any(a["has_nan"] for a in d["arrays"].values())}
    assert min(int(s) for s in nan_steps) == 3


@pytest.mark.parametrize("other", ["model.weights.h5", "model.keras", "model_tf/ckpt"])
def test_last_step_equals_the_same_model_in_other_formats(other):
    report = ckptinspect.diff(str(RUN / "6"), str(MP / other), role="model")
    pairs = [v for v in report.variables if v.status != "removed" and v.status != "added"]
    assert len(pairs) == 8, [(v.name_a, v.name_b, v.status) for v in report.variables]
    assert report.identical
    kernel = next(v for v in pairs if v.name_a == "sequential/dense_1/kernel")
    assert kernel.shape_b == (32, 32)


def test_diff_between_steps_of_a_run():
    report = ckptinspect.diff(str(RUN / "3"), str(RUN / "6"))
    assert not report.identical
    by_name = {v.name: v for v in report.variables}
    assert by_name["sequential/dense_1/kernel"].status == "changed"
    assert all(v.status in ("changed", "equal") for v in report.variables)
    assert len(report.variables) == 26


@pytest.mark.parametrize("out", ["w.safetensors", "w.npz", "tf/ckpt"])
def test_extract_the_way_out(tmp_path, out):
    target = tmp_path / out
    ckptinspect.extract(str(RUN / "6"), str(target))
    with open_checkpoint(str(target)) as written, open_checkpoint(str(RUN / "6")) as src:
        model_vars = [v for v in src.variables if v.role == "model"]
        assert len(written.variables) == len(model_vars)
        for v in model_vars:
            got = written.read(written[v.name])
            np.testing.assert_array_equal(got, _oracle(RUN / "6", v.key))


def _tensorstore_keys(step: pathlib.Path) -> list[str]:
    tree = json.loads((step / "pytree" / "_METADATA").read_text())["tree_metadata"]
    return [".".join(eval(k)) for k in tree]  # noqa: S307 - our own fixture's keys, tuples of names


@pytest.mark.parametrize("how", ["last", "explicit"])
def test_average_of_orbax_steps_is_numpys_mean_of_tensorstores_reads(tmp_path, how):
    out = tmp_path / "avg" / "ckpt"
    steps = [RUN / "3", RUN / "6"]
    if how == "last":
        report = ckptinspect.average(str(RUN), str(out), last=2)  # the interrupted 9.orbax-checkpoint-tmp is not a step
    else:
        report = ckptinspect.average([str(RUN / "6"), str(RUN / "3")], str(out))  # put in step order
    assert [pathlib.Path(i.path).name for i in report.inputs] == ["3", "6"]
    assert report.verified == 26
    with open_checkpoint(str(out)) as written, open_checkpoint(str(RUN / "6")) as newest:
        assert written.format == "tf-bundle"
        by_key = {v.key: v for v in newest.variables}
        assert {v.key for v in written.variables} == {by_key[k].name for k in _tensorstore_keys(RUN / "6")}
        for key in _tensorstore_keys(RUN / "6"):
            values = [_oracle(s, key) for s in steps]
            got = written.read(written[by_key[key].name])
            if values[0].dtype.kind == "f" and by_key[key].role != "metadata":
                want = np.mean(np.stack(values).astype(np.float64), axis=0).astype(values[0].dtype)
            else:  # the optimizer's iteration count, the metrics: the newest's
                want = values[-1]
            np.testing.assert_array_equal(got, want, err_msg=key)
            assert got.dtype == want.dtype
        assert written.step == 6  # the newest's iterations, copied


def test_average_of_orbax_steps_role_model_and_outputs(tmp_path):
    report = ckptinspect.average(str(RUN), str(tmp_path / "m" / "ckpt"), last=2, role="model")
    with open_checkpoint(str(tmp_path / "m" / "ckpt")) as written:
        assert sorted(v.key for v in written.variables) == sorted(
            v.name for v in report.variables if v.role == "model")
        assert len(written.variables) == 8
    with pytest.raises(errors.UsageError, match="other sources into a TF prefix"):
        ckptinspect.average(str(RUN), str(tmp_path / "w.weights.h5"), last=2)
    with pytest.raises(errors.UsageError, match="do not agree.* is tf-bundle, the newest is orbax|do not agree.* is orbax, the newest is tf-bundle"):
        ckptinspect.average([str(RUN / "6"), str(MP / "model_tf" / "ckpt")], str(tmp_path / "x" / "ckpt"))


@pytest.mark.slow
def test_extracted_weights_h5_loads_with_model_load_weights(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "helpers"))
    out = tmp_path / "w.weights.h5"
    ckptinspect.extract(str(RUN / "6"), str(out), builder="orbax_builders:build_model")
    from orbax_builders import build_model

    model = build_model()
    model.load_weights(str(out))
    for layer, names in (("dense_1", ("kernel", "bias")), ("dense_2", ("kernel", "bias"))):
        for i, name in enumerate(names):
            key = f"trainable_variables.sequential.{layer}.{name}"
            np.testing.assert_array_equal(np.asarray(model.get_layer(layer).weights[i]), _oracle(RUN / "6", key))


@pytest.mark.slow
def test_transplant_an_orbax_step_into_the_keras_model(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "helpers"))
    from orbax_builders import build_model

    model = build_model()
    report = ckptinspect.transplant(str(RUN / "6"), model)
    assert len(report.assigned) == 8
    for layer in ("dense_1", "batch_normalization", "dense_2"):
        for w in model.get_layer(layer).weights:
            key = f"{'non_' if not w.trainable else ''}trainable_variables.sequential.{layer}.{w.name}"
            np.testing.assert_array_equal(np.asarray(w), _oracle(RUN / "6", key))


def test_plan_names_orbax_commit_times():
    from ckptinspect.ops.plan.measure import measure

    measured = measure(str(FIX / "nan_run"))
    cadence = measured.cadence
    assert cadence.time_source == "commit"  # _CHECKPOINT_METADATA's commit_timestamp_nsecs, no state file
    commits = sorted(json.loads((FIX / "nan_run" / s / "_CHECKPOINT_METADATA").read_text())["commit_timestamp_nsecs"] / 1e9
                     for s in "1234")
    assert [p.time for p in cadence.points] == commits
    gaps = sorted(b - a for a, b in zip(commits, commits[1:]))
    assert cadence.interval_seconds == pytest.approx(gaps[1])
