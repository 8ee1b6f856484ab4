"""PyTorch and safetensors checkpoints: read without torch, values as torch.load gives them.

The fixtures in fixtures/torch were written by torch 2.13 and safetensors
(fixtures/torch/make_fixtures.py); their expected values (expected.npz / expected.json) are
what ``torch.load(weights_only=True)`` and ``safetensors.torch.load_file`` returned. These
tests need neither torch nor safetensors.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from torch_builders import TORCH_FIXTURES, copy_fixture, dict_pickle, legacy_file, tensor, torch_zip

runner = CliRunner()
EXPECTED = json.loads((TORCH_FIXTURES / "expected.json").read_text())
READABLE = [name for name, facts in EXPECTED.items() if "refused" not in facts]
BITS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


@pytest.fixture(scope="module")
def expected_values() -> dict[str, np.ndarray]:
    with np.load(TORCH_FIXTURES / "expected.npz") as npz:
        return {k: npz[k] for k in npz.files}


def as_expected(value: np.ndarray, dtype: str) -> np.ndarray:
    """Our value in the form expected.npz keeps it (bfloat16/float8 as their bits)."""
    return value.view(BITS[dtype]) if dtype in BITS else value


@pytest.mark.parametrize("name", READABLE)
def test_values_equal_torch_load(name, expected_values):
    facts = EXPECTED[name]
    with ckptinspect.open(TORCH_FIXTURES / name) as ckpt:
        assert ckpt.format == facts["format"]
        assert {v.key for v in ckpt.variables} == set(facts["variables"])
        for var in ckpt.variables:
            want = facts["variables"][var.key]
            assert (var.dtype, list(var.shape)) == (want["dtype"], want["shape"]), var.key
            expected = expected_values[f"{name}::{var.key}"]
            value = ckpt.read(var)
            assert value.shape == expected.shape and value.flags.c_contiguous
            assert np.array_equal(as_expected(value, var.dtype), expected), var.key
            blocks = [np.array(b) for b in ckpt.iter_blocks(var, 3)]
            flat = np.concatenate(blocks) if blocks else np.zeros(0, value.dtype)
            assert np.array_equal(as_expected(flat, var.dtype), expected.reshape(-1)), var.key
        if "step" in facts:
            assert ckpt.step == facts["step"]
        if "step_source" in facts:
            assert ckpt.step_source == facts["step_source"]
        if "number" in facts:  # an epoch a training dict records: its number, not a training step
            assert (ckpt.number, ckpt.number_source) == (facts["number"], facts["number_source"])
        if "num_shards" in facts:
            assert ckpt.num_shards == facts["num_shards"]


def test_training_checkpoint_roles_names_and_prefix():
    with ckptinspect.open(TORCH_FIXTURES / "training.pt") as ckpt:
        roles = {v.key: v.role for v in ckpt.variables}
        assert roles["model_state_dict/fc1.weight"] == "model"
        assert roles["model_state_dict/bn.num_batches_tracked"] == "model"
        assert roles["optimizer_state_dict/state/0/exp_avg"] == "optimizer"
        assert roles["optimizer_state_dict/state/0/step"] == "optimizer"
        assert roles["optimizer_state_dict/param_groups/0/lr"] == "optimizer"
        assert roles["epoch"] == roles["loss"] == "metadata"
        assert ckpt.totals()["model"]["count"] == 9
        assert ckpt.info["state_dict_prefix"] == "model_state_dict/"
        assert sorted(ckpt.info["pickle_globals"]) == ["collections.OrderedDict", "torch.FloatStorage",
                                                       "torch.LongStorage", "torch._utils._rebuild_tensor_v2"]
        assert ckpt.read("epoch") == 3 and ckpt["loss"].shape == ()


def test_tied_weights_and_views_share_storage():
    for name in ("tied.pt", "tied_legacy.pt"):
        with ckptinspect.open(TORCH_FIXTURES / name) as ckpt:
            assert ckpt.info["tied"] == EXPECTED[name]["tied"], name
            assert np.array_equal(ckpt.read("embed.weight"), ckpt.read("lm_head.weight"))
    for name in ("views.pt", "views_legacy.pt"):
        with ckptinspect.open(TORCH_FIXTURES / name) as ckpt:
            base = ckpt.read("base")
            assert np.array_equal(ckpt.read("transposed"), base.T)
            assert np.array_equal(ckpt.read("rows"), base[1:3])
            assert np.array_equal(ckpt.read("strided"), base[:, ::2])
            assert np.array_equal(ckpt.read("column"), base[:, 5])
            assert np.array_equal(ckpt.read("only_slice"), np.arange(90, 95, dtype=np.float32))
            assert "tied" not in ckpt.info  # views of one storage at other offsets are not ties


def test_safetensors_metadata_and_header():
    with ckptinspect.open(TORCH_FIXTURES / "model.safetensors") as ckpt:
        assert ckpt.info["metadata"] == {"format": "pt", "note": "ckptinspect fixture"}
        assert ckpt.info["header_bytes"] % 8 == 0
        assert all(v.role == "model" for v in ckpt.variables)
    doc = json.loads(runner.invoke(app, ["ls", "-f", "json", str(TORCH_FIXTURES / "model.safetensors")]).stdout)
    assert doc["info"]["metadata"]["note"] == "ckptinspect fixture"
    table = runner.invoke(app, ["ls", str(TORCH_FIXTURES / "model.safetensors")]).stdout
    line = next(line for line in table.splitlines() if line.startswith("metadata:"))
    assert sorted(line.split(None, 1)[1].split(", ")) == ["format=pt", "note=ckptinspect fixture"], line
    table = runner.invoke(app, ["ls", str(TORCH_FIXTURES / "tied.pt")]).stdout
    assert "tied:    embed.weight = lm_head.weight" in table


SAFETENSORS_FILES = sorted(str(p.relative_to(TORCH_FIXTURES.parent)) for p in TORCH_FIXTURES.parent.glob("*/**/*.safetensors"))


@pytest.mark.parametrize("relpath", SAFETENSORS_FILES)
def test_values_equal_safetensors_numpy(relpath):
    """Every committed .safetensors file against the safetensors package's own numpy reader
    (bfloat16, which numpy cannot hold, is checked against expected.npz above)."""
    from safetensors import safe_open

    path = TORCH_FIXTURES.parent / relpath
    compared = 0
    with safe_open(str(path), framework="np") as theirs, ckptinspect.open(path) as ours:
        assert {v.key for v in ours.variables} == set(theirs.keys())
        assert ours.info.get("metadata") == theirs.metadata()
        for key in theirs.keys():
            try:
                want = theirs.get_tensor(key)
            except TypeError:  # bfloat16: "data type 'bfloat16' not understood"
                assert ours[key].dtype == "bfloat16", key
                continue
            got = ours.read(key)
            assert got.dtype == want.dtype and got.shape == want.shape, key
            assert np.array_equal(got, want), key
            compared += 1
    assert compared, relpath


@pytest.mark.parametrize("folder", ["hf_sharded", "hf_bin_sharded"])
def test_sharded_folders(folder, expected_values):
    index = {"hf_sharded": "model.safetensors.index.json", "hf_bin_sharded": "pytorch_model.bin.index.json"}[folder]
    weight_map = json.loads((TORCH_FIXTURES / folder / index).read_text())["weight_map"]
    for path in (TORCH_FIXTURES / folder, TORCH_FIXTURES / folder / index):
        with ckptinspect.open(path) as ckpt:
            assert ckpt.path == str(TORCH_FIXTURES / folder / index)
            files = ckpt.info["shard_files"]
            for v in ckpt.variables:
                assert files[v.shards[0]] == weight_map[v.key]
            assert set(ckpt.files()) == {str(TORCH_FIXTURES / folder / n) for n in (index, *files)}
    result = runner.invoke(app, ["verify", str(TORCH_FIXTURES / folder)])
    assert result.exit_code == 0, result.output


def test_cli_ls_stats_verify_diff():
    for name in READABLE:
        path = str(TORCH_FIXTURES / name)
        for args in (["ls", path], ["ls", "--stats", path], ["verify", path], ["diff", path, path]):
            result = runner.invoke(app, args)
            assert result.exit_code == 0, (args, result.output)
    same = runner.invoke(app, ["diff", str(TORCH_FIXTURES / "state_dict.pt"), str(TORCH_FIXTURES / "state_dict.safetensors")])
    assert same.exit_code == 0 and "all 9 variables equal" in same.stdout, same.output
    legacy = runner.invoke(app, ["diff", str(TORCH_FIXTURES / "training.pt"), str(TORCH_FIXTURES / "training_legacy.pt")])
    assert legacy.exit_code == 0 and "all 39 variables equal" in legacy.stdout, legacy.output
    stats = json.loads(runner.invoke(app, ["ls", "--stats", "-f", "json", str(TORCH_FIXTURES / "views.pt")]).stdout)
    base = {v["name"]: v["stats"] for v in stats["variables"]}["transposed"]
    assert (base["min"], base["max"], base["mean"]) == (0.0, 23.0, 11.5)


def test_verify_reports_a_flipped_byte_by_crc(tmp_path):
    path = copy_fixture("state_dict.pt", tmp_path)
    raw = bytearray(path.read_bytes())
    import zipfile

    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("state_dict/data/1")
    name_len, extra_len = struct.unpack_from("<2H", raw, info.header_offset + 26)  # the local header's lengths
    start = info.header_offset + 30 + name_len + extra_len
    raw[start + 1] ^= 0x40
    path.write_bytes(bytes(raw))
    result = runner.invoke(app, ["verify", str(path), "-f", "json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    damaged = doc["checkpoints"][0]["damaged"]
    assert [d["kind"] for d in damaged] == ["checksum"]
    assert "storage record 'state_dict/data/1' has CRC-32" in damaged[0]["problem"]
    assert runner.invoke(app, ["ls", str(path)]).exit_code == 0  # listing reads no tensor bytes
    stats = runner.invoke(app, ["ls", "--stats", str(path)])
    assert stats.exit_code == 2 and "has CRC-32" in stats.stderr


@pytest.mark.parametrize("source,keys", [
    ("training.pt", 9), ("training_legacy.pt", 9), ("hf_sharded", 7), ("hf_bin_sharded", 7), ("dtypes.pt", 14),
    ("model.safetensors", 6),
])
def test_extract_to_safetensors(source, keys, tmp_path, expected_values):
    out = tmp_path / "out.safetensors"
    result = runner.invoke(app, ["extract", str(TORCH_FIXTURES / source), "-o", str(out), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["output_format"] == "safetensors" and report["verified"] == keys
    with ckptinspect.open(TORCH_FIXTURES / source) as src, ckptinspect.open(out) as written:
        assert written.format == "safetensors"
        assert written.info["metadata"]["format"] == "pt"
        assert written.info["metadata"]["source"] == src.path
        assert (written.step, written.number) == (src.step, src.number)
        prefix = src.info.get("state_dict_prefix", "")
        model = [v for v in src.variables if v.role == "model"]
        assert sorted(written.keys()) == sorted(v.key[len(prefix):] for v in model)
        for v in model:
            a, b = src.read(v), written.read(v.key[len(prefix):])
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert (out.read_bytes()[8:9], int.from_bytes(out.read_bytes()[:8], "little") % 8) == (b"{", 0)


@pytest.mark.slow  # TensorFlow reads the source
def test_extract_tf_checkpoint_to_safetensors(tmp_path):
    src = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "run"
    out = tmp_path / "tf.safetensors"
    result = runner.invoke(app, ["extract", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with ckptinspect.open(src) as a, ckptinspect.open(out) as b:
        assert b.step == a.step == 8
        for v in a.variables:
            if v.role == "model":
                assert np.array_equal(a.read(v), b.read(v.name))


def test_safetensors_package_reads_our_output(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    out = tmp_path / "o.safetensors"
    assert runner.invoke(app, ["extract", str(TORCH_FIXTURES / "state_dict.pt"), "-o", str(out)]).exit_code == 0
    loaded = st.load_file(out)
    with ckptinspect.open(TORCH_FIXTURES / "state_dict.pt") as src:
        assert set(loaded) == set(src.keys())
        for k, v in loaded.items():
            assert np.array_equal(v, src.read(k))


# -- nothing runs: the malicious pickle ---------------------------------------------------------------
AUDITED = textwrap.dedent("""
    import json, os, sys
    events = []
    FORBIDDEN = ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                 "os.forkpty", "pickle.find_class", "ctypes.dlopen")
    def hook(event, args):
        if event.startswith(FORBIDDEN):
            events.append(event)
            raise RuntimeError("audit: " + event)
    import numpy, ckptinspect, ckptinspect.cli, ckptinspect.formats.torch.reader  # noqa  (the reader loads numpy lazily)
    from click.testing import CliRunner
    from ckptinspect.cli import app
    sys.addaudithook(hook)
    results = []
    path, out = sys.argv[1], sys.argv[2]
    for args in (["ls", path], ["ls", "--stats", path], ["verify", path], ["diff", path, path],
                 ["extract", path, "-o", out], ["transplant", path, out + ".weights.h5", "--builder", "m:f"],
                 ["doctor", path, "--builder", "m:f"], ["diff", path, path, "--transpose-dense", "--conv-layout", "oihw"],
                 ["extract", path, "-o", out + ".weights.h5", "--transpose-dense"],
                 ["rewrite", path, "-o", out + "_rewritten"], ["plan", path]):
        r = CliRunner().invoke(app, args)
        results.append([args[0], r.exit_code, r.stdout, r.stderr])
    for name, call in (("open", lambda: ckptinspect.open(path)), ("verify", lambda: ckptinspect.verify(path)),
                       ("diff", lambda: ckptinspect.diff(path, path)),
                       ("extract", lambda: ckptinspect.extract(path, out)),
                       ("rewrite", lambda: ckptinspect.rewrite(path, out + "_rewritten")),
                       ("plan", lambda: ckptinspect.plan(path))):
        try:
            call()
            results.append(["api-" + name, 0, "", ""])
        except ckptinspect.UnsafeFileError as e:
            results.append(["api-" + name, 2, "", str(e)])
    print(json.dumps({"results": results, "events": events}))
""")


def _malicious_legacy(path: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    evil = b"\x80\x02cos\nsystem\nX" + len(f"touch {marker}").to_bytes(4, "little") + f"touch {marker}".encode() + b"\x85R."
    return legacy_file(path, evil, [], [], [])


@pytest.mark.parametrize("kind", ["committed", "zip", "stack-global", "legacy", "in-dict"])
def test_malicious_pickle_runs_nothing(kind, tmp_path):
    from torch_builders import system_call

    marker = tmp_path / "pwned-marker"
    if kind == "committed":
        path = copy_fixture("malicious.pt", tmp_path)
    elif kind == "legacy":
        path = _malicious_legacy(tmp_path / "evil_legacy.pt", marker)
    elif kind == "in-dict":  # a real tensor first, the call inside the state dict
        four = np.arange(4, dtype="<f4").tobytes()
        call = system_call(f"touch {marker}")[2:-1]  # the GLOBAL/REDUCE without PROTO/STOP
        path = torch_zip(tmp_path / "evil.pt", dict_pickle({"w": tensor("0", 4, 0, (4,), (1,)), "x": call}), {"0": four})
    else:
        path = torch_zip(tmp_path / "evil.pt", system_call(f"touch {marker}", protocol4=kind == "stack-global"), {})
    before = path.read_bytes()
    proc = subprocess.run([sys.executable, "-c", AUDITED, str(path), str(tmp_path / "out.safetensors")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.splitlines()[-1])
    assert doc["events"] == []
    assert not marker.exists() and not (tmp_path / "ckptinspect-pwned-marker").exists()
    assert path.read_bytes() == before
    assert len(doc["results"]) == 17
    for name, code, stdout, stderr in doc["results"]:
        assert code == 2, (name, stdout, stderr)
        assert "refusing to unpickle: it would call os.system" in stderr, (name, stderr)
        if not name.startswith("api-"):
            assert stdout == "" and stderr.count("\n") == 1 and stderr.startswith(f"Error: {path}: "), (name, stderr)
    assert os.listdir(tmp_path) == [path.name]  # no output, no temporary file


def test_whole_model_is_refused_with_the_state_dict_hint():
    result = runner.invoke(app, ["ls", str(TORCH_FIXTURES / "whole_module.pt")])
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: {TORCH_FIXTURES / 'whole_module.pt'}: refusing to unpickle: it would call"
        " torch.nn.modules.container.Sequential, which is not a tensor, storage or container that"
        " torch.load(weights_only=True) accepts (nothing was run); this is a whole model saved with"
        " torch.save(model): save model.state_dict() instead\n"
    )


# -- torch and safetensors absent ------------------------------------------------------------------
WITHOUT = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None
    sys.modules["safetensors"] = None
    from click.testing import CliRunner
    from ckptinspect.cli import app
    fixtures, out = sys.argv[1], sys.argv[2]
    for args in (["ls", "--stats", fixtures + "/training.pt"], ["verify", fixtures + "/training_legacy.pt"],
                 ["diff", fixtures + "/state_dict.pt", fixtures + "/state_dict.safetensors"],
                 ["verify", fixtures + "/hf_sharded"],
                 ["extract", fixtures + "/dtypes.pt", "-o", out]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, (args, r.output)
    assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
    print("ok")
""")


def test_works_without_torch_and_safetensors(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WITHOUT, str(TORCH_FIXTURES), str(tmp_path / "o.safetensors")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_package_never_imports_torch():
    src = pathlib.Path(ckptinspect.__file__).parent
    for path in src.rglob("*.py"):
        text = path.read_text()
        assert "import torch" not in text and "from torch" not in text, path
        assert "import safetensors" not in text and "from safetensors" not in text, path


def test_storages_on_other_devices_read(tmp_path):
    four = np.arange(4, dtype="<f4")
    path = torch_zip(tmp_path / "dev.pt", dict_pickle({
        "a": tensor("0", 4, 0, (2, 2), (2, 1), location="cuda:0"),
        "b": tensor("1", 4, 0, (4,), (1,), location="mps"),
    }), {"0": four.tobytes(), "1": (four * 2).tobytes()})
    with ckptinspect.open(path) as ckpt:
        assert np.array_equal(ckpt.read("a"), four.reshape(2, 2))
        assert np.array_equal(ckpt.read("b"), four * 2)
        assert ckpt.info["storage_locations"] == {"cuda:0": 1, "mps": 1}


def test_missing_shard_is_damage_for_verify(tmp_path):
    folder = copy_fixture("hf_sharded", tmp_path)
    (folder / "model-00002-of-00003.safetensors").unlink()
    ls = runner.invoke(app, ["ls", str(folder)])  # issue 25 item 9: listed, with a warning
    assert ls.exit_code == 0 and "warning: " in ls.stderr and "model-00002-of-00003.safetensors: shard 2 of 3 named by" in ls.stderr
    verify = runner.invoke(app, ["verify", str(folder)])
    assert verify.exit_code == 1 and "DAMAGED" in verify.stdout, verify.output
    shutil.rmtree(folder)


STAND_IN_FIXTURES = [name for name, facts in EXPECTED.items() if "needs_first" in facts]


@pytest.mark.parametrize("name", STAND_IN_FIXTURES)
def test_stand_in_fixtures_read_and_name_what_torch_load_needs(name):
    """Issue 25 item 5, files torch 2.13 wrote: a Lightning-style checkpoint (an
    argparse.Namespace of hyper-parameters) and a legacy file holding numpy scalars. torch's
    weights_only load refuses both; here they read (values: test_values_equal_torch_load), and
    ls names the globals a plain torch.load(weights_only=True) would need."""
    facts = EXPECTED[name]
    before = set(sys.modules)
    with ckptinspect.open(TORCH_FIXTURES / name) as ckpt:
        assert ckpt.info["needs"][0] == facts["needs_first"]
        for key, value in facts.get("strings", {}).items():
            assert ckpt.info["strings"][key] == value
    assert not {m for m in set(sys.modules) - before if m.split(".")[0] in ("argparse", "numpy._core", "torch")}
    result = runner.invoke(app, ["ls", str(TORCH_FIXTURES / name)])
    assert result.exit_code == 0
    assert result.stderr.startswith(f"warning: needs: {facts['needs_first']}") and \
        "torch.serialization.add_safe_globals" in result.stderr
