"""Hardening: a catalogue of bad inputs, run through every command, and nothing lost.

Each bad input gives one ``Error:`` line on stderr naming the file and the problem and exit 2
(``verify``: a report and exit 1 when the checkpoint is damaged), never a traceback; the input
is byte-for-byte unchanged afterwards; a command that writes leaves no output and no temporary
file behind when it fails. Inputs that are merely unusual (string, bool, bfloat16, float16, int,
0-d, 0-size tensors, unicode names) list and read correctly, checked against TensorFlow.
A write killed mid-way leaves nothing under the final name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from typing import Callable

import numpy as np
import pytest
from typer.testing import CliRunner

from ckptinspect.cli import app

tf = pytest.importorskip("tensorflow")
h5py = pytest.importorskip("h5py")

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
RUN = FIXTURES / "run"
SHARDED = FIXTURES / "sharded"
KERAS = FIXTURES / "keras"
runner = CliRunner()


# -- building the bad inputs ---------------------------------------------------------------
def _copy_prefix(prefix: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    dest.mkdir(parents=True, exist_ok=True)
    for f in prefix.parent.iterdir():
        if f.name.startswith(prefix.name + ".") and (f.name.endswith(".index") or ".data-" in f.name):
            shutil.copy(f, dest / f.name)
    return dest / prefix.name


def _rewrite(path: pathlib.Path, fn: Callable[[bytearray], bytes | bytearray]) -> None:
    path.write_bytes(bytes(fn(bytearray(path.read_bytes()))))


def truncated_index(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(RUN / "ckpt-8", d)
    _rewrite(prefix.with_name("ckpt-8.index"), lambda b: b[:700])
    return prefix


def wrong_magic(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(RUN / "ckpt-8", d)
    index = prefix.with_name("ckpt-8.index")

    def zero_magic(b: bytearray) -> bytearray:
        b[-8:] = bytes(8)
        return b

    _rewrite(index, zero_magic)
    return index


def missing_shard(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(SHARDED / "ckpt-4", d)
    os.remove(f"{prefix}.data-00003-of-00005")  # holds a slice of frozen/kernel and frozen/bias
    return prefix


def truncated_shard(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(SHARDED / "ckpt-4", d)
    _rewrite(pathlib.Path(f"{prefix}.data-00002-of-00005"), lambda b: b[:300])
    return prefix


FLIP_AT = 2000
FLIPPED_KEY = "optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"  # bytes 1980..2492 of ckpt-8


def flipped_bit(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(RUN / "ckpt-8", d)

    def flip(b: bytearray) -> bytearray:
        b[FLIP_AT] ^= 0x10  # inside encoder/enc_dense/kernel, a model weight every command needs
        return b

    _rewrite(pathlib.Path(f"{prefix}.data-00000-of-00001"), flip)
    return prefix


def state_names_deleted(d: pathlib.Path) -> pathlib.Path:
    shutil.copytree(RUN, d, dirs_exist_ok=True)
    for n in (4, 8):  # the oldest and the newest, which the state file calls latest
        for f in d.glob(f"ckpt-{n}.*"):
            f.unlink()
    return d


def state_names_only_deleted(d: pathlib.Path) -> pathlib.Path:
    shutil.copytree(RUN, d, dirs_exist_ok=True)
    for f in d.glob("ckpt-*"):
        f.unlink()
    return d


def state_from_another_machine(d: pathlib.Path) -> pathlib.Path:
    shutil.copytree(RUN, d, dirs_exist_ok=True)
    (d / "checkpoint").write_text(
        'model_checkpoint_path: "/mnt/cluster/job-17/run/ckpt-8"\n'
        + "".join(f'all_model_checkpoint_paths: "/mnt/cluster/job-17/run/ckpt-{n}"\n' for n in (4, 6, 8))
    )
    return d


def data_file(d: pathlib.Path) -> pathlib.Path:
    prefix = _copy_prefix(RUN / "ckpt-8", d)
    return pathlib.Path(f"{prefix}.data-00000-of-00001")


def state_file(d: pathlib.Path) -> pathlib.Path:
    shutil.copytree(RUN, d, dirs_exist_ok=True)
    return d / "checkpoint"


def empty_directory(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    return d


def fake_h5(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.h5").write_text("this is not HDF5\n")
    return d / "model.h5"


def truncated_h5(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    raw = (KERAS / "model.weights.h5").read_bytes()
    (d / "model.weights.h5").write_bytes(raw[: len(raw) // 2])
    return d / "model.weights.h5"


def h5_external_link(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    with h5py.File(d / "secret.h5", "w") as f:
        f["data"] = np.arange(4.0)
    path = d / "model.weights.h5"
    shutil.copy(KERAS / "model.weights.h5", path)
    with h5py.File(path, "a") as f:
        f["layers/evil"] = h5py.ExternalLink(str(d / "secret.h5"), "/data")
    return path


def _keras_zip(path: pathlib.Path, extra: dict[str, bytes]) -> None:
    with zipfile.ZipFile(KERAS / "model.keras") as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        for name, data in extra.items():
            dst.writestr(name, data)


def zip_traversal(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.keras"
    _keras_zip(path, {"../../evil.sh": b"echo pwned\n"})
    return path


def zip_bomb(d: pathlib.Path) -> pathlib.Path:
    """A .keras whose weights member declares 4 GiB in its central directory entry."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.keras"
    with zipfile.ZipFile(KERAS / "model.keras") as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    raw = bytearray(path.read_bytes())
    pos = 0
    while (pos := raw.find(b"PK\x01\x02", pos)) != -1:
        name_len = int.from_bytes(raw[pos + 28 : pos + 30], "little")
        if raw[pos + 46 : pos + 46 + name_len] == b"model.weights.h5":
            raw[pos + 24 : pos + 28] = (0xFFFFFFF0).to_bytes(4, "little")  # uncompressed size
        pos += 4
    path.write_bytes(bytes(raw))
    return path


@dataclasses.dataclass(frozen=True)
class Case:
    """A bad input and, per command, (exit code, what the message says)."""

    id: str
    make: Callable[[pathlib.Path], pathlib.Path]
    expect: dict[str, tuple[int, str]]


# {p}: the path given; {d}: the case directory; " … " separates parts that must all appear. Exit 0 means the command copes (e.g. ls of a
# directory whose newest checkpoint is gone lists the newest that exists).
CATALOGUE = [
    Case("truncated-index", truncated_index, {
        "ls": (2, "Error: {p}.index: not a valid checkpoint index: not an sstable (bad magic number)"),
        "ls-stats": (2, "Error: {p}.index: not a valid checkpoint index: not an sstable (bad magic number)"),
        "verify": (1, "{p}.index: not a valid checkpoint index: not an sstable (bad magic number)"),
        "diff": (2, "Error: {p}.index: not a valid checkpoint index"),
        "extract": (2, "Error: {p}.index: not a valid checkpoint index"),
    }),
    Case("wrong-magic", wrong_magic, {
        "ls": (2, "Error: {p}: not a valid checkpoint index (1585 bytes, no table footer: truncated or not an index)"),
        "verify": (1, "{p}: not a valid checkpoint index: not an sstable (bad magic number)"),
        "diff": (2, "Error: {p}: not a valid checkpoint index"),
        "extract": (2, "Error: {p}: not a valid checkpoint index"),
    }),
    Case("missing-shard", missing_shard, {
        "ls": (0, ""),
        "ls-stats": (2, "Error: {p}: cannot read ' … ': {p}.data-00003-of-00005; No such file or directory"),
        "verify": (1, "{p}.data-00003-of-00005: data shard is missing (named by {p}.index)"),
        "diff": (2, "{p}.data-00003-of-00005; No such file or directory"),
        "extract": (2, "{p}.data-00003-of-00005"),
    }),
    Case("truncated-shard", truncated_shard, {
        "ls": (0, ""),
        "ls-stats": (2, "Error: {p}: cannot read ' … ': Read less bytes than requested"),
        "verify": (1, "{p}.data-00002-of-00005: truncated: 300 bytes, the index needs 976"),
        "diff": (2, "Error: {p}: cannot read"),
        "extract": (2, "Error: {p}: cannot read"),
    }),
    Case("flipped-bit", flipped_bit, {
        "ls": (0, ""),
        "ls-stats": (2, f"Error: {{p}}: cannot read '{FLIPPED_KEY}': … TensorBundle at {{p}} shard 0 (512 bytes): Checksum does not match"),
        "verify": (1, "first:   encoder/enc_dense/kernel in {p}.data-00000-of-00001: checksum does not match: stored 0x"),
        "diff": (2, f"Error: {{p}}.data-00000-of-00001: checksum mismatch for '{FLIPPED_KEY}'"),
        "extract": (2, f"Error: {{p}}: cannot read '{FLIPPED_KEY}': … TensorBundle at {{p}} shard 0 (512 bytes): Checksum does not match"),
    }),
    Case("state-names-deleted", state_names_deleted, {
        "ls": (0, "path:    {p}/ckpt-6 … {p}/ckpt-8  8 … MISSING"),
        "verify": (1, "INCOMPLETE: 0 damaged, 2 missing of 3 checkpoints"),
    }),
    Case("state-names-only-deleted", state_names_only_deleted, {
        "ls": (2, "Error: {p}: no checkpoint found in the directory"),
        "verify": (1, "INCOMPLETE: 0 damaged, 3 missing of 3 checkpoints … listed by {p}/checkpoint but its files are missing"),
        "diff": (2, "Error: {p}: no checkpoint found in the directory"),
        "extract": (2, "Error: {p}: no checkpoint found in the directory"),
    }),
    Case("state-from-another-machine", state_from_another_machine, {
        "ls": (0, "path:    {p}/ckpt-8"),
        "ls-stats": (0, "path:    {p}/ckpt-8"),
        "verify": (0, "verdict: INTACT: 3 of 3 checkpoints whole"),
    }),
    Case("data-file", data_file, {
        cmd: (2, "Error: {p}: is a data shard, not a checkpoint; pass the prefix {d}/ckpt-8 (or {d}/ckpt-8.index)")
        for cmd in ("ls", "ls-stats", "verify", "diff", "extract")
    }),
    Case("state-file", state_file, {
        cmd: (2, "Error: {p}: is the checkpoint state file, not a checkpoint; pass its directory {d}")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
    Case("empty-directory", empty_directory, {
        cmd: (2, "Error: {p}: no checkpoint found in the directory")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
    Case("not-hdf5-named-h5", fake_h5, {
        cmd: (2, "Error: {p}: has a Keras suffix but is neither HDF5 nor a zip archive")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
    Case("truncated-hdf5", truncated_h5, {
        "ls": (2, "Error: {p}: not a readable HDF5 file (17912 bytes), truncated or damaged"),
        "verify": (1, "path:    {p} … DAMAGED … not a readable HDF5 file (17912 bytes), truncated or damaged"),
        "diff": (2, "Error: {p}: not a readable HDF5 file"),
        "extract": (2, "Error: {p}: not a readable HDF5 file"),
    }),
    Case("hdf5-external-link", h5_external_link, {
        cmd: (2, "Error: {p}: external link 'layers/evil' -> {d}/secret.h5:/data; refusing to follow links")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
    Case("zip-path-traversal", zip_traversal, {
        cmd: (2, "Error: {p}: archive member '../../evil.sh' escapes the archive (path traversal); refusing")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
    Case("zip-bomb", zip_bomb, {
        cmd: (2, "Error: {p}: archive member 'model.weights.h5' declares 4294967280 bytes but stores only")
        for cmd in ("ls", "verify", "diff", "extract")
    }),
]

COMMANDS = {
    "ls": lambda p, out: ["ls", p],
    "ls-stats": lambda p, out: ["ls", "--stats", p],
    "verify": lambda p, out: ["verify", p],
    "diff": lambda p, out: ["diff", p, str(RUN)],
    "extract": lambda p, out: ["extract", p, "-o", out],
    # The source is opened before the builder is imported, so a bad source fails first.
    "transplant": lambda p, out: ["transplant", p, out + ".weights.h5", "--builder", "no_such_module:build"],
}
# transplant opens its source exactly as ls does: wherever ls fails, transplant fails the same way.
for _case in CATALOGUE:
    if _case.expect.get("ls", (0, ""))[0] == 2:
        _case.expect["transplant"] = _case.expect["ls"]


def tree_digest(root: pathlib.Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (or of ``root`` itself)."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory) -> dict[str, tuple[pathlib.Path, pathlib.Path]]:
    """Every bad input, built once: id -> (case directory, path to pass)."""
    base = tmp_path_factory.mktemp("catalogue")
    built = {}
    for case in CATALOGUE:
        d = base / case.id
        built[case.id] = (d, case.make(d))
    return built


PAIRS = [(case, cmd) for case in CATALOGUE for cmd in case.expect]


@pytest.mark.parametrize("case,command", PAIRS, ids=[f"{c.id}:{cmd}" for c, cmd in PAIRS])
def test_bad_input(case, command, catalogue, tmp_path):
    d, path = catalogue[case.id]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    before = tree_digest(d) | tree_digest(RUN)
    result = runner.invoke(app, COMMANDS[command](str(path), str(out_dir / "extracted")))
    code, message = case.expect[command]
    message = message.format(p=path, d=d)
    assert tree_digest(d) | tree_digest(RUN) == before, "an input was modified"
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if code == 2:
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: "), result.stderr
        assert all(part in result.stderr for part in message.split(" … ")), result.stderr
        assert os.listdir(out_dir) == [], "a failed command left files behind"
    else:
        assert result.stderr == ""
        assert all(part in result.stdout for part in message.split(" … ")), result.stdout


UNREADABLE_RUNNER = textwrap.dedent("""
    import json, sys
    from typer.testing import CliRunner
    from ckptinspect.cli import app
    out = []
    for args in json.loads(sys.argv[1]):
        r = CliRunner().invoke(app, args)
        out.append([r.exit_code, r.stdout, r.stderr])
    print(json.dumps(out))
""")
# Root reads a chmod 000 file anyway (CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH); without those
# two capabilities it is refused like any other user, so root runs the checks with them dropped.
DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def test_unreadable_files(tmp_path):
    index_prefix = _copy_prefix(RUN / "ckpt-8", tmp_path / "index-locked")
    shard_prefix = _copy_prefix(RUN / "ckpt-8", tmp_path / "shard-locked")
    index = pathlib.Path(f"{index_prefix}.index")
    shard = pathlib.Path(f"{shard_prefix}.data-00000-of-00001")
    keras_file, h5_file = tmp_path / "model.keras", tmp_path / "model.h5"
    shutil.copy(KERAS / "model.keras", keras_file)
    shutil.copy(KERAS / "model.h5", h5_file)
    cases = [  # (command, path given, the unreadable file the message must name)
        (cmd, str(path), blocked)
        for path, blocked in ((index_prefix, index), (shard_prefix, shard), (keras_file, keras_file), (h5_file, h5_file))
        for cmd in ("ls", "verify")
    ]
    locked = [index, shard, keras_file, h5_file]
    before = {p: p.read_bytes() for p in locked}
    for p in locked:
        p.chmod(0)
    try:
        prefix_cmd: list[str] = []
        try:
            index.read_bytes()
        except PermissionError:
            pass
        else:
            if shutil.which("setpriv") is None or subprocess.run(
                [*DROP_DAC, "cat", str(index)], capture_output=True).returncode == 0:
                pytest.skip("chmod 000 does not stop reads here (root) and setpriv cannot drop the capabilities")
            prefix_cmd = DROP_DAC
        args = [[cmd, path] for cmd, path, _ in cases]
        proc = subprocess.run([*prefix_cmd, sys.executable, "-c", UNREADABLE_RUNNER, json.dumps(args)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results = json.loads(proc.stdout)
        assert len(results) == len(cases)
        for (cmd, path, blocked), (code, stdout, stderr) in zip(cases, results):
            assert (code, stdout, stderr) == (2, "", f"Error: {blocked}: permission denied\n"), (cmd, path)
    finally:
        for p in locked:
            p.chmod(0o644)
    assert {p: p.read_bytes() for p in locked} == before


def test_no_traceback_in_a_real_process(catalogue):
    """As a subprocess: stderr holds exactly the one Error line, for a parse error and a refusal
    (a TensorFlow read error: in the next test), and verify's report goes to stdout alone."""
    for case_id, args, code in (
        ("truncated-index", ["ls"], 2),
        ("hdf5-external-link", ["verify"], 2),
        ("flipped-bit", ["verify"], 1),
    ):
        d, path = catalogue[case_id]
        proc = subprocess.run([sys.executable, "-m", "ckptinspect", *args, str(path)], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == code, (case_id, proc.stderr)
        assert "Traceback" not in proc.stderr
        if code == 2:
            assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"Error: {path}"), proc.stderr
        else:
            assert proc.stderr == "" and "DAMAGED" in proc.stdout


def test_reads_after_a_failed_sliced_read_do_not_abort(catalogue):
    """TF's reader aborts the process on the lookup after a failed sliced read; ours reopens it.
    Then, in the same process (one TensorFlow start-up), ``ls --stats`` on the checkpoint: one
    Error line on the real stderr, nothing from TensorFlow's C++ logging."""
    _, prefix = catalogue["missing-shard"]
    code = textwrap.dedent("""
        import sys, ckptinspect
        from ckptinspect.cli import main
        ok = bad = 0
        with ckptinspect.open(sys.argv[1]) as ckpt:
            for var in ckpt:
                try:
                    ckpt.read(var)
                    ok += 1
                except ckptinspect.CorruptCheckpointError:
                    bad += 1
        print(ok, bad, flush=True)
        sys.argv = ["ckptinspect", "ls", "--stats", sys.argv[1]]
        main()
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(prefix)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"Error: {prefix}: cannot read "), proc.stderr
    assert "Traceback" not in proc.stderr
    ok, bad = map(int, proc.stdout.split())
    reader_keys = tf.train.load_checkpoint(str(SHARDED / "ckpt-4")).get_variable_to_shape_map()
    assert bad == 2 and ok + bad == len(reader_keys) - 1  # frozen/kernel and frozen/bias live in shard 3


# -- unusual but valid: dtypes, shapes, names ------------------------------------------------
UNICODE_NAME = "poids_é_核"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("zoo")
    root = tf.Module()
    root.strings = tf.Variable(["héllo", "", "wörld" * 60])
    root.flags = tf.Variable([True, False, True])
    root.bf16 = tf.Variable(tf.constant([1.5, -2.0, 3.25], dtype=tf.bfloat16))
    root.f16 = tf.Variable(np.array([1.5, 2.5, -0.5], dtype=np.float16))
    root.i32 = tf.Variable(np.array([1, -2, 3], dtype=np.int32))
    root.i64 = tf.Variable(np.int64(-7))
    root.scalar = tf.Variable(3.0)
    root.empty = tf.Variable(np.zeros((0, 4), np.float32))
    setattr(root, UNICODE_NAME, tf.Variable([[1.0, 2.0], [3.0, 4.5]]))
    return pathlib.Path(tf.train.Checkpoint(model=root).write(str(d / "ckpt")))


EXPECTED_DTYPES = {
    "strings": "string", "flags": "bool", "bf16": "bfloat16", "f16": "float16", "i32": "int32",
    "i64": "int64", "scalar": "float32", "empty": "float32", UNICODE_NAME: "float32",
}


def test_unusual_tensors_list_and_read(zoo):
    before = tree_digest(zoo.parent)
    reader = tf.train.load_checkpoint(str(zoo))
    shapes = reader.get_variable_to_shape_map()
    result = runner.invoke(app, ["ls", "--stats", str(zoo), "-f", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    by_name = {v["name"]: v for v in doc["variables"]}
    assert set(by_name) == {f"model/{n}" for n in EXPECTED_DTYPES}
    for short, dtype in EXPECTED_DTYPES.items():
        var = by_name[f"model/{short}"]
        assert var["dtype"] == dtype and var["shape"] == shapes[var["key"]], var
        value = reader.get_tensor(var["key"])
        if dtype == "string":
            assert var["stats"] is None
            continue
        numeric = np.asarray(value, dtype=np.float64)
        stats = var["stats"]
        if numeric.size == 0:
            assert stats == {"min": None, "max": None, "mean": None, "std": None, "nan": 0, "inf": 0}
            continue
        assert stats["min"] == pytest.approx(numeric.min()) and stats["max"] == pytest.approx(numeric.max())
        assert stats["mean"] == pytest.approx(numeric.mean()) and stats["nan"] == 0
    assert by_name["model/i64"]["shape"] == [] and by_name["model/empty"]["nbytes"] == 0
    table = runner.invoke(app, ["ls", str(zoo)])
    assert table.exit_code == 0
    row = next(line for line in table.stdout.splitlines() if line.startswith(f"model/{UNICODE_NAME}"))
    assert row.split()[:3] == [f"model/{UNICODE_NAME}", "[2,2]", "float32"]
    csv_out = runner.invoke(app, ["ls", str(zoo), "-f", "csv"])
    assert f"model/{UNICODE_NAME}/.ATTRIBUTES/VARIABLE_VALUE,model/{UNICODE_NAME}," in csv_out.stdout
    assert runner.invoke(app, ["verify", str(zoo)]).exit_code == 0
    same = runner.invoke(app, ["diff", str(zoo), str(zoo)])
    assert same.exit_code == 0, same.output
    assert tree_digest(zoo.parent) == before


def test_unicode_names_in_keras_files(tmp_path):
    keras = pytest.importorskip("keras")
    inp = keras.Input((3,))
    model = keras.Model(inp, keras.layers.Dense(2, name="dénse_核")(inp))
    model.save_weights(tmp_path / "u.weights.h5")
    model.save(tmp_path / "u.keras")
    kernel = model.get_layer("dénse_核").kernel.numpy()
    for path in (tmp_path / "u.weights.h5", tmp_path / "u.keras"):
        result = runner.invoke(app, ["ls", "--stats", str(path), "-f", "json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        kernels = [v for v in doc["variables"] if "dénse_核" in v["name"] and v["shape"] == [3, 2]]
        assert len(kernels) == 1, [v["name"] for v in doc["variables"]]
        assert kernels[0]["stats"]["min"] == pytest.approx(float(kernel.min()))
        table = runner.invoke(app, ["ls", str(path)])
        assert "dénse_核" in table.stdout
        assert runner.invoke(app, ["verify", str(path)]).exit_code == 0


# -- nothing lost: interrupted writes --------------------------------------------------------
SLOW_WRITER = textwrap.dedent("""
    import sys, time
    from ckptinspect import _atomic
    dest, mode = sys.argv[1], sys.argv[2]
    if mode == "file":
        with _atomic.atomic_file(dest, force=True) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"x" * 4096); f.flush()
                print("writing", flush=True)
                time.sleep(60)
    else:
        with _atomic.atomic_prefix(dest, force=True) as tmp:
            open(tmp + ".data-00000-of-00001", "wb").write(b"x" * 4096)
            print("writing", flush=True)
            time.sleep(60)
""")


@pytest.mark.parametrize("mode", ["file", "prefix"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_write_leaves_nothing_under_the_final_name(tmp_path, mode, sig):
    """A writer killed mid-write (SIGKILL: no cleanup at all; SIGINT: KeyboardInterrupt) leaves
    the previous output untouched and no partial output under the final name."""
    dest = tmp_path / ("model.weights.h5" if mode == "file" else "ckpt")
    old = {dest: b"old output"} if mode == "file" else {
        pathlib.Path(f"{dest}.index"): b"old index", pathlib.Path(f"{dest}.data-00000-of-00001"): b"old data"}
    for p, data in old.items():
        p.write_bytes(data)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(dest), mode], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode != 0
    for p, data in old.items():
        assert p.read_bytes() == data
    names = sorted(os.listdir(tmp_path))
    finals = [n for n in names if not n.startswith(".ckptinspect-tmp-")]
    assert finals == sorted(p.name for p in old)
    leftovers = [n for n in names if n.startswith(".ckptinspect-tmp-")]
    assert bool(leftovers) == (sig == signal.SIGKILL)  # SIGINT runs the cleanup


def test_killed_extract_leaves_no_output(tmp_path):
    """The real extract command, killed while it writes: no file under the output name."""
    out = tmp_path / "out" / "model"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptinspect", "extract", str(SHARDED), "-o", str(out), "--max-shard-size", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    # Wait until the output directory has its temporary folder, then kill.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if out.parent.is_dir() and any(n.startswith(".ckptinspect-tmp-") for n in os.listdir(out.parent)):
            break
        time.sleep(0.01)
    proc.kill()
    proc.wait(timeout=30)
    if proc.returncode == 0:
        pytest.skip("extract finished before it could be killed")
    leftovers = os.listdir(out.parent) if out.parent.is_dir() else []
    assert [n for n in leftovers if not n.startswith(".ckptinspect-tmp-")] == []
