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
    assert len(lines) <= 12 and all(len(line) < 160 for line in lines), result.stderr
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


# -- item 19: plan under a job limit; a probe far smaller than the checkpoint --------------
def plan_json(*args):
    result = invoke("plan", *args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_plan_says_how_many_jobs_and_the_work_lost_at_their_limits():
    # 7 d of training, a save every 30 min taking 20 s, 24 h jobs: 47 saves per job keep
    # 23.5 h each; a job's last 860 s (after its 47th save) are lost at the limit. Jobs 1-7
    # keep 164.5 h, the 8th finishes the last 3.5 h: 8 jobs, 7 x 860 s lost.
    doc = plan_json("--train-time", "7d", "--every", "30m", "--save-seconds", "20", "--job-limit", "24h")
    assert (doc["saves_per_job"], doc["jobs_needed"]) == (47, 8)
    assert doc["lost_hours_at_limit"] * 3600 == pytest.approx(860)
    assert doc["lost_hours_at_limits_total"] * 3600 == pytest.approx(7 * 860)
    # a run that fits in one job loses nothing at a limit
    one = plan_json("--train-time", "20h", "--every", "30m", "--save-seconds", "20", "--job-limit", "24h")
    assert (one["jobs_needed"], one["lost_hours_at_limits_total"]) == (1, 0.0)
    # exact fit: 5 h + 1 h save, 4 per 24 h job keep 20 h; 168 h need 9 jobs
    exact = plan_json("--train-time", "7d", "--every", "5h", "--save-seconds", "1h", "--job-limit", "24h")
    assert (exact["jobs_needed"], exact["lost_hours_at_limits_total"]) == (9, 0.0)
    table = invoke("plan", "--train-time", "7d", "--every", "30m", "--save-seconds", "20", "--job-limit", "24h").stdout
    assert "jobs needed" in table and "lost at job limits         1.67 h" in table


def test_plan_warns_when_the_probe_wrote_far_less_than_the_checkpoint(tmp_path, monkeypatch):
    import functools
    import shutil

    from ckptinspect.ops.plan import operation
    from ckptinspect.ops.plan.measure import probe_write

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    whole = plan_json(str(run), "--probe")
    assert whole["warnings"] == [] and whole["probe"]["capped"] is False
    # the real probe, capped at 256 bytes (1 GiB against a checkpoint of several GiB)
    monkeypatch.setattr(operation, "probe_write", functools.partial(probe_write, max_bytes=256))
    small = plan_json(str(run), "--probe")
    assert small["probe"]["bytes_written"] == 256 and small["probe"]["capped"] is True
    assert len(small["warnings"]) == 1 and small["warnings"][0].startswith("the probe wrote 256 bytes, 1/")
    assert "--save-seconds" in small["warnings"][0]
    table = invoke("plan", str(run), "--probe").stdout
    assert "warning:    the probe wrote 256 bytes" in table
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in RUN.iterdir())  # nothing left behind
