"""The checkpoint *series* fixtures (``fixtures/series``): expected.json against the files.

``fixtures/series/make_fixtures.py`` had the libraries' own training callbacks write folders of
checkpoints (Keras 3 and Keras 2 ``ModelCheckpoint``, Lightning's ``ModelCheckpoint``) and
recorded what the reference readers see in ``expected.json``. These tests read the committed
files again with those reference readers (h5py, and a zip listing of the ``.ckpt`` files; in the
slow run also ``torch.load(weights_only=True)``, in a child process, where torch is installed), so
the expectations that ckptinspect's series support will be held to are themselves checked. They
do not use ckptinspect.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import pathlib
import re
import subprocess
import sys
import zipfile

import h5py
import numpy as np
import pytest

SERIES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "series"
EXPECTED = json.loads((SERIES / "expected.json").read_text())
FOLDERS = EXPECTED["folders"]
STEPS_PER_EPOCH = EXPECTED["training"]["steps_per_epoch"]
MAX_BYTES = 300_000

# What each folder's names look like (the writer's pattern), and where the optimizer's
# iteration count lives in its HDF5 files.
NAME_RE = {
    "keras3_weights": r"weights\.(?P<epoch>\d+)\.weights\.h5",
    "keras3_models": r"model\.(?P<epoch>\d+)\.keras",
    "tfkeras_h5": r"weights\.(?P<epoch>\d+)\.h5",
    "tfkeras_models": r"model\.(?P<epoch>\d+)-(?P<loss>\d+\.\d\d)\.h5",
    "lightning": r"epoch=(?P<epoch>\d+)-step=(?P<step>\d+)\.ckpt",
}
ITERATIONS = {
    "keras3_weights": "optimizer/vars/0",
    "keras3_models": "optimizer/vars/0",
    "tfkeras_models": "optimizer_weights/iteration:0",
}
FIRST_EPOCH = {"lightning": 0}  # Lightning names count epochs from 0, Keras' from 1
UNNUMBERED = {"last.ckpt"}
HDF5_FOLDERS = ("keras3_weights", "keras3_models", "tfkeras_h5", "tfkeras_models")


def entries(*folders: str) -> list[tuple[str, str]]:
    return [(folder, name) for folder in folders for name in FOLDERS[folder]["files"]]


def sha256(arr: np.ndarray) -> str:
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return hashlib.sha256(arr.tobytes()).hexdigest()


def attr(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return [attr(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


@contextlib.contextmanager
def open_hdf5(folder: str, name: str):
    """The file's HDF5 (for a ``.keras`` zip, its ``model.weights.h5`` member) with h5py."""
    path = SERIES / folder / name
    entry = FOLDERS[folder]["files"][name]
    if "weights_member" not in entry:
        with h5py.File(path, "r") as f:
            yield f
        return
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == entry["zip_members"]
        assert json.loads(zf.read("metadata.json"))["keras_version"] == entry["keras_version"]
        assert json.loads(zf.read("config.json"))["class_name"] == entry["config_class"]
        data = zf.read(entry["weights_member"])
    with h5py.File(io.BytesIO(data), "r") as f:
        yield f


def test_the_folders_hold_exactly_the_listed_files():
    assert sorted(p.name for p in SERIES.iterdir()) == sorted([*FOLDERS, "expected.json", "make_fixtures.py"])
    assert list(FOLDERS) == list(NAME_RE)
    for folder, entry in FOLDERS.items():
        assert sorted(p.name for p in (SERIES / folder).iterdir()) == sorted(entry["files"]), folder
        assert entry["versions"], folder


def test_the_series_folder_stays_small():
    total = sum(p.stat().st_size for p in SERIES.rglob("*") if p.is_file())
    assert total < MAX_BYTES, total


@pytest.mark.parametrize("folder", list(FOLDERS))
def test_names_carry_the_recorded_epoch_step_and_metric(folder):
    for name, entry in FOLDERS[folder]["files"].items():
        if name in UNNUMBERED:
            assert entry["name"] == {}, name
            continue
        m = re.fullmatch(NAME_RE[folder], name)
        assert m, name
        parsed = {k: (v if k == "loss" else int(v)) for k, v in m.groupdict().items()}
        assert parsed == entry["name"], name
        if "loss" in parsed:
            assert parsed["loss"] == f"{entry['train_loss']:.2f}", name


@pytest.mark.parametrize("folder", list(FOLDERS))
def test_each_series_is_one_run_saved_every_epoch(folder):
    """Consecutive epochs, the optimizer ``STEPS_PER_EPOCH`` steps further at each, weights that
    change from one file to the next."""
    files = {n: e for n, e in FOLDERS[folder]["files"].items() if n not in UNNUMBERED}
    first = FIRST_EPOCH.get(folder, 1)
    epochs = [e["name"]["epoch"] for e in files.values()]
    assert epochs == list(range(first, first + len(files)))
    assert len(files) >= 2
    for entry in files.values():
        done = entry["name"]["epoch"] + 1 - first
        if "step" in entry["name"]:
            assert entry["name"]["step"] == done * STEPS_PER_EPOCH
        if entry["optimizer_iterations"] is not None:
            assert entry["optimizer_iterations"] == done * STEPS_PER_EPOCH
    for path in next(iter(files.values()))["sha256"]:
        digests = [e["sha256"][path] for e in files.values()]
        assert len(set(digests)) == len(digests), path


@pytest.mark.parametrize(("folder", "name"), entries(*HDF5_FOLDERS))
def test_hdf5_files_as_h5py_reads_them(folder, name):
    entry = FOLDERS[folder]["files"][name]
    with open_hdf5(folder, name) as f:
        found = []
        f.visititems(
            lambda path, obj: found.append({"path": path, "shape": list(obj.shape), "dtype": obj.dtype.name})
            if isinstance(obj, h5py.Dataset)
            else None
        )
        assert sorted(found, key=lambda v: v["path"]) == entry["variables"]
        assert sorted(f.attrs) == entry["root_attrs"]
        for key, value in entry.get("attrs", {}).items():
            assert attr(f.attrs[key]) == value, key
        if "model_weights_layer_names" in entry:
            assert attr(f["model_weights"].attrs["layer_names"]) == entry["model_weights_layer_names"]
            assert attr(f["optimizer_weights"].attrs["weight_names"]) == entry["optimizer_weight_names"]
        for path, digest in entry["sha256"].items():
            assert sha256(f[path][()]) == digest, path
        if folder in ITERATIONS:
            assert int(f[ITERATIONS[folder]][()]) == entry["optimizer_iterations"]
        else:
            assert entry["optimizer_iterations"] is None


def test_a_keras_zip_holds_the_weights_file_of_its_epoch():
    """``keras3_models`` and ``keras3_weights`` come from one ``fit``."""
    weights = FOLDERS["keras3_weights"]["files"]
    for name, entry in FOLDERS["keras3_models"]["files"].items():
        twin = weights[f"weights.{entry['name']['epoch']:02d}.weights.h5"]
        assert entry["variables"] == twin["variables"], name
        assert entry["sha256"] == twin["sha256"], name


@pytest.mark.parametrize(("folder", "name"), entries("lightning"))
def test_lightning_files_are_torch_zips(folder, name):
    """Without torch: the zip's records and storages are those recorded."""
    entry = FOLDERS[folder]["files"][name]
    prefix = entry["zip_prefix"]
    with zipfile.ZipFile(SERIES / folder / name) as zf:
        names = zf.namelist()
        assert zf.read(f"{prefix}/byteorder") == b"little"
    expected = {f"{prefix}/{r}" for r in entry["zip_records"]}
    expected |= {f"{prefix}/data/{i}" for i in range(entry["zip_storages"])}
    assert sorted(names) == sorted(expected)


# torch reads the .ckpt files in a child process: imported here, torch would stay in
# sys.modules for the rest of the run, and other tests check that ckptinspect never imports it.
TORCH_READ = """
import hashlib, json, pathlib, sys
import numpy as np, torch
out = {}
for path in sys.argv[1:]:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    sd = ckpt["state_dict"]
    (opt,) = ckpt["optimizer_states"]
    out[pathlib.Path(path).name] = {
        "top_level_keys": sorted(ckpt),
        "epoch": ckpt["epoch"],
        "global_step": ckpt["global_step"],
        "pytorch-lightning_version": ckpt["pytorch-lightning_version"],
        "hparams_name": ckpt["hparams_name"],
        "hyper_parameters": dict(ckpt["hyper_parameters"]),
        "callbacks": sorted(ckpt["callbacks"]),
        "optimizer_steps": sorted({float(s["step"]) for s in opt["state"].values()}),
        "optimizer_param_groups": [{"lr": g["lr"], "params": list(g["params"])} for g in opt["param_groups"]],
        "lr_schedulers": [{"last_epoch": s["last_epoch"], "_last_lr": list(s["_last_lr"])} for s in ckpt["lr_schedulers"]],
        "variables": [{"path": k, "shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")} for k, v in sd.items()],
        "sha256": {k: hashlib.sha256(np.ascontiguousarray(v.numpy()).tobytes()).hexdigest() for k, v in sd.items()},
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def torch_read() -> dict:
    """What ``torch.load(weights_only=True)`` returns for each Lightning file (skips without torch)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    paths = [str(SERIES / "lightning" / name) for name in FOLDERS["lightning"]["files"]]
    proc = subprocess.run([sys.executable, "-c", TORCH_READ, *paths], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.slow  # importing torch alone takes 1.5-3 s; CI runs it with -m slow where torch is installed
@pytest.mark.parametrize(("folder", "name"), entries("lightning"))
def test_lightning_files_as_torch_loads_them(folder, name, torch_read):
    entry = FOLDERS[folder]["files"][name]
    read = torch_read[name]
    for key in ("top_level_keys", "epoch", "global_step", "pytorch-lightning_version", "hparams_name",
                "hyper_parameters", "callbacks", "optimizer_param_groups", "lr_schedulers", "variables"):
        assert read[key] == entry[key], key
    for key, digest in entry["sha256"].items():
        assert read["sha256"][key] == digest, key
    assert read["optimizer_steps"] == [float(entry["optimizer_iterations"])]


def test_last_ckpt_repeats_the_last_epoch():
    files = FOLDERS["lightning"]["files"]
    last = files["last.ckpt"]
    final = max((e for n, e in files.items() if n not in UNNUMBERED), key=lambda e: e["global_step"])
    assert last["global_step"] == final["global_step"] and last["epoch"] == final["epoch"]
    assert last["sha256"] == final["sha256"]
