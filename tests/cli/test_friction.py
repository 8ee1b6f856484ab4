"""Issue 25, "A new user's frictions" (items 15-17 and 19): conventions a new user expects
(``--version``, ``diff -q``, plain choice errors, an empty path, one CSV spelling of shapes,
a builder's prints kept off stdout), diff tables that keep names whole, a short strict
``transplant`` refusal in the command line's words, and ``plan`` under a job limit.
Every input is a real checkpoint (the fixture run, written by the fixture trainer)."""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import pathlib

import pytest
from click.testing import CliRunner

from ckptinspect import render
from ckptinspect.cli import app

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"
FRICTION = "tests.helpers.friction_builders"
runner = CliRunner()


def invoke(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": None, **(env or {})})


def csv_rows(result):
    return list(csv.DictReader(io.StringIO(result.stdout)))


# -- item 15: conventions ------------------------------------------------------------------
def test_version_is_the_installed_packages():
    result = invoke("--version")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"ckptinspect {importlib.metadata.version('ckptinspect')}\n"


def test_diff_quiet_prints_nothing_and_answers_by_exit_code():
    same = invoke("diff", "-q", RUN / "ckpt-4", RUN / "ckpt-4")
    assert (same.exit_code, same.stdout) == (0, ""), same.output
    different = invoke("diff", "--quiet", RUN / "ckpt-4", RUN / "ckpt-8", "--format", "json")
    assert (different.exit_code, different.stdout) == (1, ""), different.output
    missing = invoke("diff", "-q", RUN / "ckpt-4", RUN / "nosuch")
    assert missing.exit_code == 2 and missing.stderr.startswith("Error: ")


def equal_rows(text):
    return [line for line in text.splitlines() if line.split()[1:2] == ["equal"]]


def test_diff_hide_equal_shows_only_the_differences():
    full = invoke("diff", RUN / "ckpt-4", RUN / "ckpt-4")
    assert len(equal_rows(full.stdout)) == 26  # the 26 "equal" rows
    same = invoke("diff", "--hide-equal", RUN / "ckpt-4", RUN / "ckpt-4")
    assert same.exit_code == 0 and equal_rows(same.stdout) == [], same.stdout
    assert same.stdout.endswith("all 26 variables equal (atol=0, rtol=0)\n")  # the verdict counts them all
    moved = invoke("diff", "--hide-equal", RUN / "ckpt-4", RUN / "ckpt-8", "--format", "csv")
    rows = csv_rows(moved)
    assert moved.exit_code == 1 and rows and all(r["status"] != "equal" for r in rows)
    assert "frozen/kernel" not in {r["name"] for r in rows}  # the frozen layer never changes
    doc = json.loads(invoke("diff", "--hide-equal", RUN / "ckpt-4", RUN / "ckpt-8", "-f", "json").stdout)
    assert len(doc["variables"]) == len(rows) == doc["summary"]["changed"]
    assert doc["summary"]["equal"] == 26 - len(rows)  # the summary still counts every variable


def test_an_invalid_choice_is_said_in_plain_words():
    result = invoke("ls", RUN, "--format", "yaml")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == "Error: --format must be table, json or csv, not 'yaml' (see 'ckptinspect ls --help')\n"


@pytest.mark.parametrize("args,name", [(["ls", ""], "PATH"), (["diff", RUN, ""], "B"),
                                       (["scan", RUN / "ckpt-4", ""], "DIR|PATHS")])
def test_an_empty_path_is_said_to_be_empty(args, name):
    result = invoke(*args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(f"Error: {name} is empty: give a path (see 'ckptinspect "), result.stderr
    assert result.stderr.count("\n") == 1


def test_csv_shapes_have_one_spelling():
    ls_rows = {r["name"]: r["shape"] for r in csv_rows(invoke("ls", RUN, "-f", "csv"))}
    scan_rows = [r for r in csv_rows(invoke("scan", RUN, "-f", "csv")) if r["name"] == "encoder/enc_dense/kernel"]
    diff_rows = {r["name"]: r for r in csv_rows(invoke("diff", RUN / "ckpt-4", RUN / "ckpt-8", "-f", "csv"))}
    assert ls_rows["encoder/enc_dense/kernel"] == "[8,16]"
    assert scan_rows and {r["shape"] for r in scan_rows} == {"[8,16]"}
    assert diff_rows["encoder/enc_dense/kernel"]["shape_a"] == diff_rows["encoder/enc_dense/kernel"]["shape_b"] == "[8,16]"
    assert diff_rows["step"]["shape_a"] == ls_rows["step"] == "[]"


# -- item 16: names are what people read ---------------------------------------------------
def test_diff_at_80_columns_keeps_names_whole():
    result = invoke("diff", RUN / "ckpt-4", RUN / "ckpt-8", env={"COLUMNS": "80"})
    table = result.stdout.split("\n\n")[1]
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert render.ELLIPSIS not in table, table
    assert "adam/encoder_enc_dense_kernel_momentum" in table or "adam/head_bias_momentum" in table
    assert "(left out to fit 80 columns: differing, dtype, cosine; all in --format csv)" in result.stdout


# -- item 17: the strict transplant refusal ------------------------------------------------
def test_strict_transplant_refusal_is_short_and_names_the_flags(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow")
    monkeypatch.chdir(ROOT)
    result = invoke("transplant", RUN, tmp_path / "out", "--builder", f"{FRICTION}:stranger_model")
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    lines = lines[lines.index(next(line for line in lines if line.startswith("Error: "))):]  # after the builder's print
    assert lines[0].startswith(f"Error: {RUN}") and "cannot transplant into 'stranger'" in lines[0]
    assert "nothing written" in lines[0] and len(lines[0]) < 200, lines[0]
    assert len(lines) <= 10 and all(len(line) < 240 for line in lines), result.stderr
    assert any(line.startswith("  ... and ") and line.endswith(" more") for line in lines)
    text = result.stderr
    assert "--no-strict" in text and "--map" in text and "--by-order" in text
    assert f"ckptinspect doctor {RUN} --builder {FRICTION}:stranger_model" in text
    assert "strict=False" not in text and "skip_mismatch=True" not in text and "mapping rules" not in text
    assert list(tmp_path.iterdir()) == []


# -- item 15: a builder's prints stay off stdout -------------------------------------------
def test_a_builders_prints_do_not_land_in_json(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow")
    monkeypatch.chdir(ROOT)
    builder = f"{FRICTION}:chatty_model"
    runs = {
        "doctor": invoke("doctor", RUN, "--builder", builder, "-f", "json"),
        "transplant": invoke("transplant", RUN, tmp_path / "t", "--builder", builder, "--dry-run", "-f", "json"),
        "extract": invoke("extract", RUN, "-o", tmp_path / "e.weights.h5", "--builder", builder, "-f", "json"),
    }
    for name, result in runs.items():
        assert result.exit_code == 0, (name, result.output)
        json.loads(result.stdout)  # one document, nothing else
        assert "building the model" in result.stderr, (name, result.stderr)
