"""What a user sees: names shown safely, tables that fit the terminal, clean help, and the
small CLI/API rough edges of issue 11 (``--debug`` anywhere, dry runs, ``open(None)``,
unknown output suffixes).

Names with escapes are real: a TF2 checkpoint written by ``tf.train.Checkpoint``, a bundle
with crafted keys written by SaveV2 through the project's own writer, and Keras 3 files with
such layer names (the builders of ``cases_ux``). The progress line is drawn on a real pty.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import pathlib
import pty
import re
import select
import shutil
import struct
import sys
import termios

import click
import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from cases_ux import (
    FORMULA_KEYS,
    KERAS_LAYER_NAMES,
    TF2_NAMES,
    formula_keys,
    keras_h5_with_escapes,
    keras_weights_with_escapes,
    keras_zip_with_escapes,
    tf2_names_with_escapes,
)
from catalogue import KERAS, RUN, SHARDED
from ckptinspect import cli, render
from ckptinspect.cli import Progress, app

tf = pytest.importorskip("tensorflow")
h5py = pytest.importorskip("h5py")

runner = CliRunner()
ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILDERS = "tests.helpers.transplant_builders"
# What a terminal would act on: C0/C1 controls (a newline ends a line, it is not in a cell),
# DEL and the bidirectional overrides.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def invoke(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": None, **(env or {})})


def csv_rows(result) -> list[dict[str, str]]:
    """The CSV rows exactly as written (``result.stdout`` turns a CR LF inside a cell into LF)."""
    return list(csv.DictReader(io.StringIO(result.stdout_bytes.decode("utf-8"), newline="")))


@pytest.fixture(scope="module")
def named(tmp_path_factory) -> dict[str, pathlib.Path]:
    base = tmp_path_factory.mktemp("named")
    return {
        "tf2": tf2_names_with_escapes(base / "tf2"),
        "formulas": formula_keys(base / "formulas"),
        "weights": keras_weights_with_escapes(base / "weights"),
        "h5": keras_h5_with_escapes(base / "h5"),
        "keras": keras_zip_with_escapes(base / "keras"),
    }


# -- names are shown, never acted on -------------------------------------------------------
@pytest.mark.parametrize("which", ["tf2", "formulas", "weights", "h5", "keras"])
def test_tables_show_control_characters_escaped_one_row_per_variable(named, which):
    path = named[which]
    with ckptinspect.open(path) as ckpt:
        names = [v.name for v in ckpt.variables]
    for args in (["ls", path], ["ls", "--tree", path], ["ls", "--stats", path], ["verify", path],
                 ["diff", path, RUN]):
        result = invoke(*args)
        assert result.exit_code in (0, 1), result.output
        assert not RAW_CONTROL.search(result.stdout), (args, result.stdout)
        if args[0] == "ls" and "--tree" not in args:
            lines = result.stdout.splitlines()
            dashes = max(i for i, line in enumerate(lines) if line and set(line) <= {"-", " "})
            rows = lines[dashes + 1:]  # the variables table is the last one
            assert len(rows) == len(names), rows
            assert sorted(row.split("  ")[0] for row in rows) == sorted(render.escape_controls(n) for n in names)


def test_escapes_are_visible_and_json_exact(named):
    table = invoke("ls", named["tf2"]).stdout
    for shown in ("model/clear\\x1b[2J\\x1b[Hscreen", "model/bell\\x07", "model/cr\\rover", "model/line\\nbreak",
                  "model/tab\\tname", "model/bidi\\u202eevil"):
        assert shown in table
    doc = json.loads(invoke("ls", named["tf2"], "-f", "json").stdout)
    assert {v["name"] for v in doc["variables"]} == {f"model/{n}" for n in TF2_NAMES}
    doc = json.loads(invoke("ls", named["formulas"], "-f", "json").stdout)
    assert {v["key"] for v in doc["variables"]} == set(FORMULA_KEYS)


def test_damaged_tensor_with_an_escaped_name_in_verify(named, tmp_path):
    src = named["formulas"]
    for f in src.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    data = tmp_path / "formulas.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF  # the first tensor's bytes
    data.write_bytes(bytes(raw))
    result = invoke("verify", tmp_path / "formulas")
    assert result.exit_code == 1, result.output
    assert not RAW_CONTROL.search(result.stdout), result.stdout
    assert "damaged tensors:" in result.stdout and "checksum does not match" in result.stdout


def test_csv_cells_that_start_a_formula_are_neutralised(named):
    result = invoke("ls", named["formulas"], "--stats", "-f", "csv")
    assert result.exit_code == 0, result.output
    rows = csv_rows(result)
    by_key = {}
    for row in rows:
        key = row["key"]
        if key.startswith("'"):
            assert key[1:] in FORMULA_KEYS and key[1] in "=+-@", key
            key = key[1:]
        by_key[key] = row
    assert set(by_key) == set(FORMULA_KEYS)
    for key, row in by_key.items():
        assert row["name"] == ("'" + key if key[0] in "=+-@" else key)
    # Numbers stay numbers: -2.5 is a minimum, not a formula.
    assert by_key['=HYPERLINK("http://evil.example/x","click")']["min"] == "-2.5"
    assert by_key["-2+3"]["min"] == "-1.5"
    assert all(row["shards"] == "0" for row in rows)


def test_csv_neutralises_keras_names_and_diff_and_verify_cells(named):
    weights = csv_rows(invoke("ls", named["h5"], "-f", "csv"))
    assert {row["name"].split("/")[0] for row in weights} == {"'" + n for n in KERAS_LAYER_NAMES}
    diff = csv_rows(invoke("diff", named["formulas"], named["formulas"], "-f", "csv"))
    assert sorted(row["name"] for row in diff) == sorted(("'" if k[0] in "=+-@" else "") + k for k in FORMULA_KEYS)


def test_csv_safe_rules():
    for value, expected in [("=1+1", "'=1+1"), ("+cmd", "'+cmd"), ("-cmd", "'-cmd"), ("@SUM(A1)", "'@SUM(A1)"),
                            ("\tx", "'\tx"), ("\rx", "'\rx"), ("-2.5", "-2.5"), ("+3", "+3"), ("-1e-05", "-1e-05"),
                            ("-inf", "-inf"), ("-", "-"), ("-1+2", "'-1+2"), ("a=b", "a=b"), (-2.5, -2.5)]:
        assert render.csv_safe(value) == expected, value


def test_error_line_escapes_control_characters(tmp_path):
    missing = tmp_path / "gone\x1b[2J\r\nError: fake"
    for args in (["ls", missing], ["verify", missing], ["diff", missing, RUN], ["extract", missing, "-o", tmp_path / "o"]):
        result = invoke(*args)
        assert result.exit_code == 2
        assert result.stderr == f"Error: {tmp_path}/gone\\x1b[2J\\r\\nError: fake: no such file, directory or checkpoint prefix\n"


# -- tables fit the terminal ---------------------------------------------------------------
def widths(text: str) -> list[int]:
    return [render.display_width(line) for line in text.splitlines()]


@pytest.mark.parametrize("columns", [80, 100, 60])
@pytest.mark.parametrize(
    "args",
    [["ls", RUN], ["ls", "--tree", RUN], ["ls", SHARDED], ["diff", RUN / "ckpt-4", RUN / "ckpt-8"],
     ["diff", RUN / "ckpt-8", KERAS / "model.weights.h5"], ["verify", RUN], ["ls", KERAS / "model.h5"]],
    ids=["ls", "ls-tree", "ls-sharded", "diff", "diff-keras", "verify", "ls-h5"],
)
def test_tables_fit_columns(args, columns, monkeypatch):
    # Paths as a user types them, relative to the checkout: the tables' widths must not depend
    # on where the checkout lives.
    monkeypatch.chdir(ROOT)
    args = [a.relative_to(ROOT) if isinstance(a, pathlib.Path) else a for a in args]
    wide = invoke(*args)
    fitted = invoke(*args, env={"COLUMNS": str(columns)})
    assert fitted.exit_code == wide.exit_code
    if columns >= 80:  # every fixture table fits 80 columns
        assert max(widths(fitted.stdout)) <= columns, fitted.stdout
    else:  # at 60, names are shortened to their floor; a few tables stay wider, none is wider than before
        assert max(widths(fitted.stdout)) <= max(widths(wide.stdout))
    if max(widths(wide.stdout)) > columns:  # fitted: names shortened, a column left out, or header lines wrapped
        assert fitted.stdout != wide.stdout
    assert render.ELLIPSIS not in wide.stdout  # piped, COLUMNS unset: full names for scripts


def test_the_issue_widths_before_and_after():
    """The issue measured ``ls fixtures/run`` at 88 columns and a fixture ``diff`` at 137."""
    assert max(widths(invoke("ls", RUN).stdout)) > 80
    assert max(widths(invoke("diff", RUN / "ckpt-4", RUN / "ckpt-8").stdout)) > 80
    ls80 = invoke("ls", RUN, env={"COLUMNS": "80"}).stdout
    diff80 = invoke("diff", RUN / "ckpt-4", RUN / "ckpt-8", env={"COLUMNS": "80"}).stdout
    assert max(widths(ls80)) <= 80 and max(widths(diff80)) <= 80
    assert "totals:  model 10 (2.1 KiB), optimizer 14 (1.9 KiB), metadata 2 (16 B)," in ls80
    # issue 25 item 16: columns go before a name is shortened
    assert "(left out to fit 80 columns: differing, dtype, cosine; all in --format csv)" in diff80


def test_damage_report_fits_and_keeps_every_word_of_the_problem(tmp_path):
    d = tmp_path / "a_rather_long_directory_name_for_a_sharded_training_run"
    shutil.copytree(SHARDED, d)
    shard = d / "ckpt-4.data-00002-of-00005"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 1
    shard.write_bytes(bytes(raw))
    wide = invoke("verify", d)
    problem = next(line for line in wide.stdout.splitlines() if line.startswith("first:")).split(": ", 2)[2]
    for columns in (80, 120):
        fitted = invoke("verify", d, env={"COLUMNS": str(columns)})
        assert fitted.exit_code == 1
        assert max(widths(fitted.stdout)) <= columns, fitted.stdout
        damaged = fitted.stdout.split("damaged tensors:\n", 1)[1]
        assert " ".join(damaged.split()).count(problem) == 1, damaged  # wrapped, not cut
        first = fitted.stdout.split("first:", 1)[1].split("newest intact:", 1)[0]
        assert problem in " ".join(first.split())


def test_json_and_csv_never_shortened():
    for fmt in ("json", "csv"):
        wide = invoke("ls", RUN, "-f", fmt).stdout
        assert invoke("ls", RUN, "-f", fmt, env={"COLUMNS": "40"}).stdout == wide
        assert render.ELLIPSIS not in wide


def test_middle_ellipsis_and_wide_characters():
    assert render.middle_ellipsis("encoder/enc_dense/kernel", 16) == "encod…nse/kernel"
    assert render.middle_ellipsis("short", 16) == "short"
    cjk = "poids_é_核核核核核核核核/kernel"
    cut = render.middle_ellipsis(cjk, 16)
    assert render.display_width(cut) <= 16 and cut.endswith("/kernel")
    table = render.simple_table(["name", "x"], [[cjk, "1"], ["a", "2"]], width=20, squeeze=[0])
    assert max(widths(table)) <= 20


def test_progress_line_fits_a_real_terminal(monkeypatch):
    """Drawn on a pty 50 columns wide: every update, and the clearing, stay within 49 columns."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 50, 0, 0))
    tty = os.fdopen(slave, "w", encoding="utf-8")
    try:
        monkeypatch.setattr(sys, "stderr", tty)
        progress = Progress("verify", min_seconds=0)
        assert progress.enabled

        class Item:
            name = "encoder/a_very_long_layer_name_that_goes_on/\x1b[2Jkernel"

        for done in range(1, 4):
            progress(done, 3, Item())
        progress.close()
        tty.flush()
        chunks = []
        while select.select([master], [], [], 0.5)[0]:
            chunks.append(os.read(master, 65536))
        out = b"".join(chunks).decode("utf-8")
    finally:
        tty.close()
        os.close(master)
    segments = [s for s in out.split("\r") if s]
    assert len(segments) == 4  # three updates and the clearing
    assert all(render.display_width(s) <= 49 for s in segments), segments
    assert "\x1b" not in out and all(s.endswith("[2Jkernel") for s in segments[:3])
    assert segments[2].startswith("verify [") and "3/3" in segments[2]


def test_progress_line_width():
    for width in (30, 50, 80, 200):
        line = render.progress_line("extract", 7, 1000, "encoder/enc_dense/kernel" * 5, width)
        assert render.display_width(line) == width - 1


# -- help ----------------------------------------------------------------------------------
COMMANDS = ["ls", "diff", "verify", "extract", "transplant", "train"]
ARTEFACTS = re.compile(r"\{[a-z_]+\}|<(str|bool|int|float|list\[[a-z]+\]|path|table\|json\|csv)>")


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_has_clean_usage_and_metavars(command):
    args = [command, "--help"] if command else ["--help"]
    result = invoke(*args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert not ARTEFACTS.search(result.stdout), result.stdout
    usage = next(line for line in result.stdout.splitlines() if "Usage:" in line)
    expected = {
        None: "[OPTIONS] COMMAND [ARGS]...", "ls": "ls [OPTIONS] PATH", "diff": "diff [OPTIONS] A B",
        "verify": "verify [OPTIONS] PATH", "extract": "extract [OPTIONS] SRC", "transplant": "transplant [OPTIONS] SRC DST",
        "train": "train [OPTIONS] OUT",
    }[command]
    assert usage.strip().endswith(expected), usage


def test_every_option_has_help_text_and_a_metavar():
    group = app
    ctx = group.make_context("ckptinspect", ["ls", "x"], resilient_parsing=True)
    commands = [group, *(group.get_command(ctx, name) for name in COMMANDS)]
    for command in commands:
        for param in command.get_params(ctx):
            assert (param.help or "").strip(), (command.name, param.name)
            if param.param_type_name == "argument":
                assert param.metavar and param.metavar.isupper(), (command.name, param.name)
            elif not getattr(param, "is_flag", False):
                assert param.metavar, (command.name, param.name)


@pytest.mark.parametrize("args,message", [
    (["ls", "--bogus", "x"], "No such option: --bogus (see 'ckptinspect ls --help')"),
    (["ls"], "Missing argument 'PATH' (see 'ckptinspect ls --help')"),
    (["diff", "a"], "Missing argument 'B' (see 'ckptinspect diff --help')"),
    (["ls", "x", "--format", "xml"], "--format must be table, json or csv, not 'xml'"),
    (["average", "--last", "x", "d", "-o", "o"], "Invalid value for '--last'"),
    (["nosuch"], "No such command 'nosuch' (see 'ckptinspect --help')"),
    (["ls", "--\x1b[31mred", "x"], "No such option: --\\x1b[31mred"),  # the terminal escape shown, not obeyed
])
def test_bad_arguments_are_one_error_line(args, message):
    """The contract's exit 2 for bad arguments: one ``Error:`` line, as for every other error
    (click's own display is a usage line, a hint and a message)."""
    result = invoke(*args)
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.startswith(f"Error: {message}") and result.stderr.count("\n") == 1, result.stderr


def test_bad_arguments_one_line_in_a_real_process():
    import subprocess  # noqa: PLC0415

    proc = subprocess.run([sys.executable, "-m", "ckptinspect", "verify", "--nope", "x"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "Error: No such option: --nope (see 'python -m ckptinspect verify --help')\n"
    bare = subprocess.run([sys.executable, "-m", "ckptinspect"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bare.returncode == 2 and "Usage:" in bare.stdout + bare.stderr and "Error" not in bare.stdout + bare.stderr


def test_help_names_the_metavars():
    text = invoke("diff", "--help", env={"COLUMNS": "200"}).stdout
    for metavar in ("FLOAT", "REGEX=REPLACEMENT", "ROLE", "[table|json|csv]"):
        assert metavar in text, metavar
    text = invoke("extract", "--help", env={"COLUMNS": "200"}).stdout
    for metavar in ("OUT", "SIZE", "MODULE:FUNCTION", "[tf|weights-h5|h5|npz|safetensors]"):
        assert metavar in text, metavar


# -- --debug anywhere, dry runs, open(), output suffixes ------------------------------------
def test_debug_is_accepted_after_the_command(tmp_path):
    missing = tmp_path / "nope"
    for args in (["ls", RUN, "--debug"], ["--debug", "ls", RUN], ["verify", "--debug", RUN]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    plain = invoke("ls", missing)
    assert plain.exit_code == 2 and plain.stderr.startswith("Error: ")
    for args in (["ls", missing, "--debug"], ["--debug", "ls", missing], ["diff", "--debug", missing, RUN]):
        result = invoke(*args)  # the traceback is shown; exit code and Error line as without --debug (issue 25)
        assert result.exit_code == 2 and "Traceback" in result.stderr and "CheckpointNotFoundError" in result.stderr, args
        assert result.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1], args
    assert invoke("ls", missing).exit_code == 2  # --debug does not stick to the next command


def test_transplant_dry_run_does_not_care_that_dst_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    dst = tmp_path / "existing"
    for f in RUN.glob("ckpt-8.*"):
        shutil.copy(f, tmp_path / ("existing" + f.name[len("ckpt-8"):]))
    (tmp_path / "plain").write_text("mine\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for target in (dst, tmp_path / "plain"):
        result = invoke("transplant", RUN, target, "--builder", f"{BUILDERS}:fixture_model", "--dry-run")
        assert result.exit_code == 0, result.output
        assert "dry run: nothing assigned or written" in result.stdout
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    real = invoke("transplant", RUN, dst, "--builder", f"{BUILDERS}:fixture_model")
    assert real.exit_code == 2 and "output exists; pass --force" in real.stderr


@pytest.mark.parametrize("bad", [None, 123, 1.5, ["a"], b"fixtures/run"])
def test_open_refuses_what_is_not_a_path(bad):
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        ckptinspect.open(bad)


def test_open_takes_pathlike():
    with ckptinspect.open(RUN) as ckpt:
        assert ckpt.step == 8
    with ckptinspect.open(os.fspath(RUN)) as ckpt:
        assert ckpt.step == 8


@pytest.mark.parametrize(
    "name, message",
    [
        ("out.onnx", "unknown output suffix '.onnx'"),  # (.safetensors is an extract output)
        ("model.pt", "unknown output suffix '.pt'"),
        ("weights.bin", "unknown output suffix '.bin'"),
        ("out.index", "give the prefix"),
        ("out.data-00000-of-00001", "give the prefix"),
    ],
)
def test_extract_refuses_unknown_suffixes(tmp_path, name, message):
    result = invoke("extract", RUN, "-o", tmp_path / name)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"Error: {tmp_path / name}: ") and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["model.ckpt", "model.ckpt-100", "ckpt-5", "sub/model", "weights.05-0.32"])
def test_extract_keeps_tf_prefix_shapes(tmp_path, name):
    result = invoke("extract", RUN, "-o", tmp_path / name, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["output_format"] == "tf"
    assert (tmp_path / f"{name}.index").is_file()


def test_extract_unknown_suffix_with_format(tmp_path):
    tf_out = invoke("extract", RUN, "-o", tmp_path / "out.safetensors", "--to", "tf")
    assert tf_out.exit_code == 0, tf_out.output
    assert (tmp_path / "out.safetensors.index").is_file()
    npz_out = invoke("extract", RUN, "-o", tmp_path / "weights.bin", "--to", "npz")
    assert npz_out.exit_code == 0, npz_out.output
    with np.load(tmp_path / "weights.bin") as npz:
        assert len(npz.files) == 10


def test_extract_unknown_suffix_names_to(tmp_path):
    result = invoke("extract", RUN, "-o", tmp_path / "out.onnx")
    assert result.exit_code == 2
    assert "; pass --to tf, weights-h5, h5, npz or safetensors (format=...) to write one under this name" in result.stderr


# -- one --format, one declaration of each shared option ------------------------------------
REPORTING = ["ls", "diff", "verify", "extract", "rewrite", "transplant", "doctor", "plan", "scan", "average"]


def _options(name: str) -> dict[str, click.Option]:
    ctx = click.Context(app)
    return {opt: p for p in app.commands[name].get_params(ctx) if isinstance(p, click.Option) for opt in p.opts}


@pytest.mark.parametrize("name", REPORTING)
def test_format_is_the_report_format_on_every_command(name):
    help_text = invoke(name, "--help", env={"COLUMNS": "200"}).stdout
    metavar = "[table|json]" if name == "plan" else "[table|json|csv]"
    assert f"-f, --format {metavar}" in help_text, help_text
    option = _options(name)["--format"]
    assert sorted(option.opts) == ["--format", "-f"] and option.secondary_opts == []
    assert option.help == "Format of the report on stdout." and option.type.enum_type is render.OutputFormat


def test_extract_output_type_is_to_and_its_report_is_format(tmp_path):
    out = tmp_path / "weights.bin"
    result = invoke("extract", RUN, "-o", out, "--to", "npz", "-f", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["output_format"] == "npz" and doc["output"] == str(out)
    rows = csv_rows(invoke("extract", RUN, "-o", tmp_path / "again.npz", "--format", "csv"))
    assert len(rows) == len(doc["variables"])
    old = invoke("extract", RUN, "-o", tmp_path / "x.npz", "--report", "json")
    assert old.exit_code == 2 and old.stderr.startswith("Error: No such option: --report"), old.stderr
    as_type = invoke("extract", RUN, "-o", tmp_path / "y", "--format", "npz")  # no longer a file type
    assert as_type.exit_code == 2 and "--format must be table, json or csv, not 'npz'" in as_type.stderr
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "y").exists()


def test_shared_options_have_one_declaration():
    """--force, --format, --debug, --optimizer-pattern, --builder, --map, --transpose-dense and
    --conv-layout read the same on every command that has them (up to what names the side)."""
    helps: dict[str, set[str]] = {}
    for name in app.commands:
        for opt, param in _options(name).items():
            helps.setdefault(opt, set()).add(param.help)
    for opt in ("--force", "--format", "--debug", "--optimizer-pattern"):
        assert len(helps[opt]) == 1, (opt, helps[opt])
    def common(text: str) -> str:  # what the factories vary: whose names, and a clause on when it applies
        text = text.replace("A's", "The source's").replace("every name of A", "every source name")
        return re.sub(r"(; needed for .*(?=\.$)| \((\.weights\.h5 with --builder|called inside the strategy scope)\))", "", text)

    for opt in ("--transpose-dense", "--conv-layout", "--map", "--builder"):
        assert len(helps[opt]) > 1 and len({common(h) for h in helps[opt]}) == 1, (opt, helps[opt])
    text = " ".join(invoke("diff", "--help", env={"COLUMNS": "200"}).stdout.split())
    assert "A's 2-D kernels are [out,in] (PyTorch Linear): read transposed, as Keras' [in,out]." in text  # no markup


def test_conv_layout_is_given_in_any_case(tmp_path, monkeypatch):
    seen = {}
    from ckptinspect.ops.diff import operation as diff_mod  # noqa: PLC0415

    def fake(*args, **kwargs):
        seen.update(kwargs)
        raise ckptinspect.errors.UsageError("stop")

    monkeypatch.setattr(diff_mod, "diff", fake)
    assert invoke("diff", RUN, RUN, "--conv-layout", "OIHW").exit_code == 2
    assert seen["conv_layout"] == "oihw"


def test_progress_is_a_context_manager(monkeypatch):
    closed = []
    monkeypatch.setattr(Progress, "close", lambda self: closed.append(self.label))
    with pytest.raises(ValueError), cli.progress("scan") as shown:
        assert isinstance(shown, Progress) and shown.label == "scan"
        raise ValueError
    with cli.progress("stats", when=False) as shown:
        assert shown is None
    assert closed == ["scan"]


def test_transplant_refuses_unknown_suffixes(tmp_path):
    result = invoke("transplant", RUN, tmp_path / "out.safetensors", "--builder", "no_such_module_xyz:build")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {tmp_path / 'out.safetensors'}: unknown output suffix '.safetensors'")
    assert list(tmp_path.iterdir()) == []
