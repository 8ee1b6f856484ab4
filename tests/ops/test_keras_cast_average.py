"""Issue 25 item 14: ``rewrite --cast`` of Keras HDF5 files (Keras 3 ``.weights.h5``, legacy ``.h5``)
and ``average`` of legacy ``.h5`` files, both refused before.

The inputs are files the real libraries wrote (``fixtures/keras``: Keras 3 ``save_weights`` and
``model.save("model.h5")``, tf_keras' full model; ``fixtures/series``: tf_keras ``ModelCheckpoint``
series, weights only and full models; see their ``make_fixtures.py``). The outputs hold exactly
numpy's cast / float64 mean of the source values (read with h5py), and the slow tests load them
with ``model.load_weights`` in Keras 3 and tf_keras.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import ckptinspect
from ckptinspect.errors import UsageError

h5py = pytest.importorskip("h5py")
ml_dtypes = pytest.importorskip("ml_dtypes")

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERAS = ROOT / "fixtures" / "keras"
SERIES = ROOT / "fixtures" / "series"
TFKERAS_WEIGHTS = sorted((SERIES / "tfkeras_h5").glob("weights.*.h5"))
TFKERAS_MODELS = sorted((SERIES / "tfkeras_models").glob("model.*.h5"))
NUMPY = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def datasets(path) -> dict[str, np.ndarray]:
    """Every dataset of an HDF5 file by path; Keras 3's bfloat16 (opaque, dtype attribute) as bfloat16."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                value = obj[()]
                if obj.attrs.get("dtype") == "bfloat16":
                    value = np.asarray(value).view(ml_dtypes.bfloat16)
                out[name] = value
        f.visititems(visit)
    return out


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# -- rewrite --cast --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_weights_h5_is_cast_to_numpys_values(tmp_path, dtype):
    src = KERAS / "model.weights.h5"
    out = tmp_path / f"model_{dtype}.weights.h5"
    report = ckptinspect.rewrite(src, out, cast=dtype)
    before, after = datasets(src), datasets(out)
    assert before.keys() == after.keys()
    cast = {v.key for v in report.variables if v.new_dtype == dtype}
    assert cast == {k for k in before if not k.startswith("optimizer/") and before[k].dtype == np.float32}
    assert len(cast) == 10
    for key, value in before.items():
        want = value.astype(NUMPY[dtype]) if key in cast else value
        assert same_bits(after[key], want), key
    with h5py.File(out, "r") as f:  # stored as Keras 3 stores the dtype
        marks = {k for k in cast if f[k].attrs.get("dtype") == "bfloat16"}
        assert marks == (cast if dtype == "bfloat16" else set())
        with h5py.File(src, "r") as s:
            assert dict(f.attrs) == dict(s.attrs)
            assert all(dict(f[k].parent.attrs) == dict(s[k].parent.attrs) for k in cast)
    assert any(f"keras.mixed_precision.set_global_policy('{dtype}')" in n for n in report.notes), report.notes


@pytest.mark.parametrize("name", ["model.h5", "keras2_model.h5", "keras2_weights.h5"])
def test_a_legacy_h5_is_cast_to_float16(tmp_path, name):
    src = KERAS / name
    if not src.exists():
        pytest.skip(f"{name} is written only where tf_keras is importable")
    out = tmp_path / "half.h5"
    report = ckptinspect.rewrite(src, out, cast="float16")
    before, after = datasets(src), datasets(out)
    assert before.keys() == after.keys()
    cast = {v.key for v in report.variables if v.new_dtype == "float16"}
    assert cast and {k for k in cast if not k.startswith("optimizer_weights/")}  # the model's weights at least
    for key, value in before.items():
        assert same_bits(after[key], value.astype(np.float16) if key in cast else value), key
    with h5py.File(out, "r") as f, h5py.File(src, "r") as s:
        assert set(f.attrs) == set(s.attrs)  # model_config, layer_names, keras_version... kept
        for key in cast:
            assert dict(f[key].parent.attrs).keys() == dict(s[key].parent.attrs).keys()


def test_a_legacy_h5_is_not_cast_to_bfloat16(tmp_path):
    """tf_keras cannot load its own bfloat16 .h5 ("No cast function available"): refused, said why."""
    with pytest.raises(UsageError, match="cannot read bfloat16 values back, not even from their own files"):
        ckptinspect.rewrite(KERAS / "model.h5", tmp_path / "b.h5", cast="bfloat16")
    assert list(tmp_path.iterdir()) == []


def test_cast_and_rename_together(tmp_path):
    out = tmp_path / "renamed.weights.h5"
    ckptinspect.rewrite(KERAS / "model.weights.h5", out, rename=["^head/=out/"], cast="float16")
    with ckptinspect.open(out) as ckpt:
        names = {v.name: v.dtype for v in ckpt.variables}
    assert names["out/vars/0"] == "float16" and "head/vars/0" not in names
    assert names["optimizer/vars/0"] == "int64"


def keras_zip_weights(path, tmp_path) -> dict[str, np.ndarray]:
    import zipfile  # noqa: PLC0415

    with zipfile.ZipFile(path) as z:
        inner = tmp_path / f"{pathlib.Path(path).name}.weights.h5"
        inner.write_bytes(z.read("model.weights.h5"))
        return datasets(inner)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_keras_archive_is_cast_into_a_keras_archive(tmp_path, dtype):
    import zipfile  # noqa: PLC0415

    src = KERAS / "model.keras"
    out = tmp_path / "half.keras"
    report = ckptinspect.rewrite(src, out, cast=dtype)
    before, after = keras_zip_weights(src, tmp_path), keras_zip_weights(out, tmp_path)
    cast = {v.key for v in report.variables if v.new_dtype == dtype}
    assert len(cast) == 10 and before.keys() == after.keys()
    for key, value in before.items():
        assert same_bits(after[key], value.astype(NUMPY[dtype]) if key in cast else value), key
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(out) as b:
        assert a.namelist() == b.namelist()
        for name in ("config.json", "metadata.json"):  # the config as it was
            assert a.read(name) == b.read(name)
    with pytest.raises(UsageError, match="rewritten with --cast only"):
        ckptinspect.rewrite(src, tmp_path / "renamed.keras", rename=["^head/=out/"], cast=dtype)


# -- average of legacy .h5 -------------------------------------------------------------------
def expected_mean(files) -> dict[str, np.ndarray]:
    inputs = [datasets(f) for f in files]
    out = {}
    for key, value in inputs[-1].items():
        if value.dtype.kind == "f":
            out[key] = np.mean(np.stack([d[key] for d in inputs]).astype(np.float64), axis=0).astype(value.dtype)
        else:
            out[key] = value  # the newest's
    return out


@pytest.mark.parametrize("files", [TFKERAS_WEIGHTS, TFKERAS_MODELS], ids=["weights-only", "full-models"])
def test_legacy_h5_files_average_into_a_legacy_h5(tmp_path, files):
    assert len(files) == 2
    out = tmp_path / "avg.h5"
    report = ckptinspect.average(files, out)
    assert report.files == (str(out),)
    got, want = datasets(out), expected_mean(files)
    assert got.keys() == want.keys()
    for key in want:
        assert same_bits(got[key], want[key]), key
    with h5py.File(out, "r") as f, h5py.File(files[-1], "r") as newest:
        assert dict(f.attrs).keys() == dict(newest.attrs).keys()


def test_legacy_h5_inputs_need_a_legacy_h5_output(tmp_path):
    with pytest.raises(UsageError, match="legacy .h5 inputs into a .h5"):
        ckptinspect.average(TFKERAS_MODELS, tmp_path / "avg.weights.h5")
    with pytest.raises(UsageError, match="legacy .h5 inputs into a .h5"):
        ckptinspect.average(sorted((SERIES / "keras3_weights").glob("*.weights.h5")), tmp_path / "avg.h5")


# -- loaded by Keras itself ------------------------------------------------------------------
KERAS3_LOAD = """
import json, sys
import numpy as np, keras
from ckptinspect.trainer import build_model
out = {}
for path, policy in json.loads(sys.argv[1]):
    if policy == "load_model":  # a .keras archive: the model its config describes
        keras.mixed_precision.set_global_policy("float32")
        model = keras.models.load_model(path)
    else:
        keras.mixed_precision.set_global_policy(policy)
        model = build_model(0)
        model.load_weights(path)
    out[path + " " + policy] = [[w.path, str(w.dtype), np.asarray(w.numpy(), np.float64).tolist()] for w in model.weights]
print(json.dumps(out))
"""

TFKERAS_LOAD = """
import json, sys
import numpy as np, tf_keras
out = {}
for model_file, path in json.loads(sys.argv[1]):
    model = tf_keras.models.load_model(model_file, compile=False)
    model.load_weights(path)
    out[path] = [np.asarray(w, np.float64).tolist() for w in model.get_weights()]
print(json.dumps(out))
"""


def run_loader(code: str, jobs) -> dict:
    done = subprocess.run([sys.executable, "-c", code, json.dumps([list(map(str, j)) for j in jobs])],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "",
                               "KERAS_BACKEND": "tensorflow", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # Keras 3 builds the model eight times (~20 s)
def test_keras3_loads_the_cast_weights_under_any_policy(tmp_path):
    jobs, wants = [], {}
    for dtype in ("float16", "bfloat16"):
        out = tmp_path / f"{dtype}.weights.h5"
        ckptinspect.rewrite(KERAS / "model.weights.h5", out, cast=dtype, role="model")
        cast = datasets(out)
        for policy in ("float32", f"mixed_{dtype}", dtype):
            jobs.append((out, policy))
            wants[f"{out} {policy}"] = (dtype if policy == dtype else "float32", cast)
    legacy = tmp_path / "legacy.h5"
    ckptinspect.rewrite(KERAS / "model.h5", legacy, cast="float16")
    jobs.append((legacy, "float32"))
    wants[f"{legacy} float32"] = ("float32", None)
    archive = tmp_path / "half.keras"
    ckptinspect.rewrite(KERAS / "model.keras", archive, cast="float16")
    jobs.append((archive, "load_model"))
    wants[f"{archive} load_model"] = ("float32", {k: v for k, v in keras_zip_weights(archive, tmp_path).items()
                                                  if not k.startswith("optimizer/")})
    got = run_loader(KERAS3_LOAD, jobs)
    for job, (dtype, cast) in wants.items():
        weights = got[job]
        assert {d for _, d, _ in weights} == {dtype}, job
        if cast is not None:  # the values are the cast ones, in the variables' dtype
            values = sorted(np.asarray(v, np.float64).ravel().tolist() for v in cast.values())
            loaded = sorted(np.asarray(w, np.float64).ravel().tolist() for _, _, w in weights)
            assert loaded == values, job
    half = datasets(legacy)
    loaded = sorted(np.asarray(w, np.float64).ravel().tolist() for _, _, w in got[f"{legacy} float32"])
    assert loaded == sorted(np.asarray(v, np.float64).ravel().tolist() for k, v in half.items()
                            if k.startswith("model_weights/"))


@pytest.mark.slow  # tf_keras loads three models (~15 s)
def test_tf_keras_loads_the_cast_and_the_averaged_files(tmp_path):
    pytest.importorskip("tf_keras")
    half = tmp_path / "keras2_half.h5"
    ckptinspect.rewrite(KERAS / "keras2_model.h5", half, cast="float16")
    avg_weights, avg_models = tmp_path / "avg_weights.h5", tmp_path / "avg_models.h5"
    ckptinspect.average(TFKERAS_WEIGHTS, avg_weights)
    ckptinspect.average(TFKERAS_MODELS, avg_models)
    got = run_loader(TFKERAS_LOAD, [(KERAS / "keras2_model.h5", half), (TFKERAS_MODELS[-1], avg_weights),
                                    (TFKERAS_MODELS[-1], avg_models)])

    def model_values(path, group=""):
        with h5py.File(path, "r") as f:
            holder = f[group] if group else f
            names = [n.decode() if isinstance(n, bytes) else n for n in holder.attrs["layer_names"]]
            out = []
            for layer in names:
                for w in holder[layer].attrs["weight_names"]:
                    out.append(np.asarray(holder[layer][w.decode() if isinstance(w, bytes) else w][()], np.float64))
            return out

    def flat(values):
        return [np.asarray(v, np.float64).ravel().tolist() for v in values]

    assert flat(got[str(half)]) == flat(model_values(half, "model_weights"))
    assert flat(model_values(half, "model_weights")) == flat(
        [v.astype(np.float16) for v in model_values(KERAS / "keras2_model.h5", "model_weights")])
    assert flat(got[str(avg_weights)]) == flat(model_values(avg_weights))
    assert flat(got[str(avg_models)]) == flat(model_values(avg_models, "model_weights"))
    mean = [np.mean([a, b], axis=0, dtype=np.float64).astype(np.float32)
            for a, b in zip(*(model_values(f) for f in TFKERAS_WEIGHTS))]
    assert flat(model_values(avg_weights)) == flat(mean)


def test_average_last_of_a_tf_keras_modelcheckpoint_folder(tmp_path):
    from click.testing import CliRunner  # noqa: PLC0415

    from ckptinspect.cli import app  # noqa: PLC0415

    out = tmp_path / "avg.h5"
    result = CliRunner().invoke(app, ["average", "--last", "2", str(SERIES / "tfkeras_models"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    got, want = datasets(out), expected_mean(TFKERAS_MODELS)
    assert got.keys() == want.keys() and all(same_bits(got[k], want[k]) for k in want)
