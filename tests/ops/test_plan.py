"""`ckptinspect plan` / `ckptinspect.plan`: the seed's worked example, Young/Daly against a hand
computation, the job limit, disk for --keep, cadence from real CheckpointManager directories,
--probe leaving nothing behind (also when interrupted or failing), and bad durations."""

from __future__ import annotations

import json
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from limits import default_sigint
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app
from ckptinspect.errors import OutputWriteError, UsageError
from ckptinspect.ops.plan.operation import parse_duration
from ckptinspect.ops.plan.measure import probe_write

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"
runner = CliRunner()
DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def invoke(*args: str):
    return runner.invoke(app, ["plan", *args])


def plan_json(*args: str) -> dict:
    result = invoke(*args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def listing(d: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def run_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    return d


def files_bytes(prefix: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in prefix.parent.glob(prefix.name + ".*"))


# -- the seed's worked example -------------------------------------------------------------
def test_seed_example_json():
    doc = plan_json("--train-time", "7d", "--save-seconds", "20", "--every", "30m")
    assert doc["saves"] == 336  # 7 x 24 x 2
    assert doc["save_seconds"] == 20
    assert doc["overhead_seconds"] == 6720  # 336 x 20 s
    assert round(doc["overhead_hours"], 2) == 1.87  # 6720 / 3600 = 1.8667
    assert round(doc["overhead_percent"], 2) == 1.11  # of the training time: 6720 / 604800
    assert doc["overhead_percent"] == pytest.approx(100 * 6720 / 604800)
    assert doc["run_hours"] == pytest.approx(168 + 6720 / 3600)
    assert doc["lost_hours_expected"] == 0.25 and doc["lost_hours_worst"] == 0.5
    assert doc["disk_bytes"] is None and doc["recommended_every_seconds"] is None
    assert set(doc["missing"]) == {"checkpoint_bytes", "keep", "job_limit_seconds", "mtbf_seconds"}
    assert "--mtbf" in doc["missing"]["mtbf_seconds"]


def test_seed_example_table():
    result = invoke("--train-time", "7d", "--save-seconds", "20", "--every", "30m")
    assert result.exit_code == 0, result.output
    rows = {line[:27].strip(): line[27:] for line in result.stdout.splitlines()}
    assert rows["saves"].split()[0] == "336"
    assert rows["time saving"].startswith("1.87 h (6,720 s)")
    assert rows["share of training time"].split()[0] == "1.11%"
    assert "missing:    pass --mtbf DURATION" in result.stdout


def test_python_api_same_figures():
    report = ckptinspect.plan(train_time=7 * 86400, save_seconds="20s", every=1800)
    assert (report.saves, report.overhead_seconds) == (336, 6720)
    assert round(report.overhead_percent, 2) == 1.11


# -- Young/Daly, by hand -------------------------------------------------------------------
def test_young_daly_hand_computation():
    # save 25 s, MTBF 2 h = 7200 s: T = sqrt(2 x 25 x 7200) = sqrt(360000) = 600 s (10 min).
    # Overhead at T: 25/600 + 600/(2 x 7200) = 0.041667 + 0.041667 = 8.3333%.
    # At every = 30 min (1800 s): 25/1800 + 1800/14400 = 0.013889 + 0.125 = 13.8889%.
    # 7 d: 336 saves x 25 s = 8400 s; failures = (604800 + 8400) / 7200 = 85.1667;
    # lost to failures = 85.1667 x 900 s = 76650 s = 21.2917 h.
    doc = plan_json("--save-seconds", "25", "--mtbf", "2h", "--every", "30m", "--train-time", "7d")
    assert doc["recommended_every_seconds"] == pytest.approx(600.0)
    assert doc["recommended_overhead_percent"] == pytest.approx(8.33333, abs=1e-4)
    assert doc["waste_percent"] == pytest.approx(13.88889, abs=1e-4)
    assert doc["failures_expected"] == pytest.approx(85.16667, abs=1e-4)
    assert doc["lost_hours_total_expected"] == pytest.approx(21.29167, abs=1e-4)
    # the seed's 20 s with a 1-day MTBF: sqrt(3,456,000) = 1859.03 s (1859.03^2 = 3,455,992.5)
    doc = plan_json("--save-seconds", "20", "--mtbf", "1d")
    assert doc["recommended_every_seconds"] == pytest.approx(1859.03, abs=0.01)
    assert doc["recommended_overhead_percent"] == pytest.approx(2.1517, abs=1e-4)
    assert doc["saves"] is None and "train_seconds" in doc["missing"] and "every_seconds" in doc["missing"]


def test_young_daly_in_steps_from_the_directory_cadence(tmp_path):
    d = run_copy(tmp_path)
    state = (d / "checkpoint").read_text()
    state = re.sub(r"all_model_checkpoint_timestamps: .*\n", "", state)
    (d / "checkpoint").write_text(state)
    for step, t in ((4, 1000.0), (6, 1100.0), (8, 1200.0)):  # 100 s per 2 steps
        os.utime(d / f"ckpt-{step}.index", (t, t))
    doc = plan_json(str(d), "--save-seconds", "25", "--mtbf", "2h")  # T = 600 s = 12 steps
    assert doc["recommended_every_steps"] == 12


# -- job limit -----------------------------------------------------------------------------
def test_job_limit_wall_clock():
    # 24 h jobs, 30 min + 20 s per cycle: 47 saves (85,540 s), then 860 s of work lost.
    doc = plan_json("--job-limit", "24h", "--every", "30m", "--save-seconds", "20")
    assert doc["saves_per_job"] == 47
    assert doc["lost_hours_at_limit"] == pytest.approx(860 / 3600)
    assert doc["limit_cuts_save"] is False
    # without a save time: 24 h mod 30 min = 0 (and a note that saves were counted as free)
    doc = plan_json("--job-limit", "24h", "--every", "30m")
    assert (doc["saves_per_job"], doc["lost_hours_at_limit"]) == (48, 0)
    assert any("no time" in n for n in doc["notes"])
    # 1 h jobs, 1750 s + 60 s cycles: one save at 1810 s, the second would end at 3620 s
    doc = plan_json("--job-limit", "1h", "--every", "1750", "--save-seconds", "60")
    assert doc["limit_cuts_save"] is True and doc["saves_per_job"] == 1
    assert doc["lost_hours_at_limit"] == pytest.approx(1750 / 3600)
    assert any("falls inside save 2" in n for n in doc["notes"])
    # an interval longer than the job: the job's whole work is lost
    doc = plan_json("--job-limit", "1h", "--every", "2h", "--save-seconds", "5")
    assert (doc["saves_per_job"], doc["lost_hours_at_limit"]) == (0, 1.0)
    assert any("before its first save" in n for n in doc["notes"])


# -- DIR: size, roles, keep, cadence -------------------------------------------------------
def test_keep_disk_from_the_fixture_run():
    size = files_bytes(RUN / "ckpt-8")
    doc = plan_json(str(RUN), "--keep", "5")
    assert doc["checkpoint_bytes"] == size
    assert (doc["disk_bytes"], doc["disk_bytes_peak"]) == (5 * size, 6 * size)
    assert doc["sources"]["keep"] == "flag"
    doc = plan_json(str(RUN))  # default: the 3 checkpoints the directory keeps
    assert (doc["keep"], doc["sources"]["keep"], doc["disk_bytes"]) == (3, "directory", 3 * size)
    with ckptinspect.open(RUN) as ckpt:
        totals = ckpt.totals()
    assert doc["measured"]["role_bytes"] == {r: totals[r]["nbytes"] for r in ("model", "optimizer", "metadata")}
    assert doc["measured"]["role_bytes"]["optimizer"] > 0


def test_cadence_from_the_state_file_timestamps():
    text = (RUN / "checkpoint").read_text()
    stamps = [float(x) for x in re.findall(r"all_model_checkpoint_timestamps: (\S+)", text)]
    doc = plan_json(str(RUN))
    cadence = doc["measured"]["cadence"]
    assert cadence["time_source"] == "state-file"
    assert [p["step"] for p in cadence["points"]] == [4, 6, 8]
    # the median of two intervals is their mean: (s1 - s0 + s2 - s1) / 2
    assert cadence["interval_seconds"] == pytest.approx((stamps[2] - stamps[0]) / 2)
    assert cadence["interval_steps"] == 2
    assert doc["every_seconds"] == cadence["interval_seconds"] and doc["sources"]["every_seconds"] == "directory"


def test_cadence_from_file_times_when_the_state_file_has_none(tmp_path):
    d = run_copy(tmp_path)
    (d / "checkpoint").unlink()  # read by scanning *.index
    for step, t in ((4, 5000.0), (6, 5600.0), (8, 6500.0)):
        os.utime(d / f"ckpt-{step}.index", (t, t))
    doc = plan_json(str(d), "--train-time", "1d", "--save-seconds", "10")
    cadence = doc["measured"]["cadence"]
    assert cadence["time_source"] == "mtime"
    assert cadence["interval_seconds"] == 750  # median of 600 and 900
    assert cadence["seconds_per_step"] == 375
    assert doc["saves"] == 115  # floor(86400 / 750)


def test_cadence_of_a_checkpoint_manager_directory(tmp_path):
    tf = pytest.importorskip("tensorflow")
    v = tf.Variable([1.0, 2.0])
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v, step=step), str(tmp_path), max_to_keep=3)
    for s in (100, 200, 300, 400):
        step.assign(s)
        manager.save(checkpoint_number=s)
    state = tf.train.get_checkpoint_state(str(tmp_path))  # TF's own reading of its state file
    stamps = list(state.all_model_checkpoint_timestamps)
    assert len(stamps) == 3
    gaps = sorted([stamps[1] - stamps[0], stamps[2] - stamps[1]])
    report = ckptinspect.plan(tmp_path, save_seconds=1, train_time="1h")
    cadence = report.measured.cadence
    assert [p.step for p in cadence.points] == [200, 300, 400]
    assert cadence.time_source == "state-file"
    assert cadence.interval_seconds == pytest.approx((gaps[0] + gaps[1]) / 2)
    assert cadence.interval_steps == 100
    assert report.keep == 3 and report.measured.checkpoint == os.path.join(str(tmp_path), "ckpt-400")
    assert report.checkpoint_bytes == files_bytes(tmp_path / "ckpt-400")


def test_single_checkpoint_has_no_cadence():
    doc = plan_json(str(RUN / "ckpt-6"), "--train-time", "1d", "--save-seconds", "1")
    assert doc["measured"]["cadence"] is None and doc["keep"] is None
    assert doc["checkpoint_bytes"] == files_bytes(RUN / "ckpt-6")
    assert "every_seconds" in doc["missing"] and "keep" in doc["missing"]


def test_not_a_checkpoint_is_one_error(tmp_path):
    result = invoke(str(tmp_path), "--every", "1h")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: ")


# -- --probe ---------------------------------------------------------------------------------
def test_probe_measures_and_leaves_nothing(tmp_path):
    d = run_copy(tmp_path)
    before = listing(d)
    doc = plan_json(str(d), "--probe", "--train-time", "7d", "--every", "30m")
    assert listing(d) == before
    probe = doc["probe"]
    assert probe["bytes_written"] == probe["checkpoint_bytes"] == doc["checkpoint_bytes"]
    assert probe["capped"] is False and probe["max_bytes"] == 1 << 30
    assert probe["seconds"] > 0 and probe["bytes_per_second"] == pytest.approx(probe["bytes_written"] / probe["seconds"])
    assert doc["save_seconds"] == probe["save_seconds"] and doc["sources"]["save_seconds"] == "probe"
    assert doc["overhead_seconds"] == pytest.approx(336 * probe["save_seconds"])


def test_probe_cap_scales_the_time(tmp_path):
    before = listing(tmp_path)
    result = probe_write(str(tmp_path), 4 << 20, max_bytes=1 << 20)
    assert listing(tmp_path) == before
    assert result.capped and result.bytes_written == 1 << 20
    assert result.save_seconds == pytest.approx(4 * result.seconds)


def test_probe_interrupted_leaves_nothing(tmp_path):
    before = listing(tmp_path)
    seen = []

    def interrupt(done, total):
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        probe_write(str(tmp_path), 1 << 20, progress=interrupt)
    assert seen and len(seen[0]) == 1 and seen[0][0].startswith(".ckptinspect-tmp-")  # it existed, ours by name
    assert listing(tmp_path) == before


def test_probe_sigterm_leaves_nothing(tmp_path):
    code = textwrap.dedent(f"""
        import os, signal, sys
        from ckptinspect.ops.plan.measure import probe_write
        from ckptinspect._atomic import Terminated
        try:
            probe_write({str(tmp_path)!r}, 1 << 20, progress=lambda d, t: os.kill(os.getpid(), signal.SIGTERM))
        except Terminated as e:  # the writing commands' one signal mechanism: exit 128 + the signal
            print("terminated", e.code)
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.split() == ["terminated", str(128 + signal.SIGTERM), "True"], done.stderr
    assert listing(tmp_path) == []


def test_probe_write_failure_is_one_error_and_leaves_nothing(tmp_path):
    d = run_copy(tmp_path)
    before = listing(d)
    limit = 4096  # RLIMIT_FSIZE: the probe's write fails part-way with EFBIG (Python ignores SIGXFSZ)
    assert files_bytes(d / "ckpt-8") > limit

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run([sys.executable, "-m", "ckptinspect", "plan", str(d), "--probe"], capture_output=True,
                          text=True, timeout=120, preexec_fn=cap, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"Error: {d}: cannot measure its write speed: File too large")
    assert listing(d) == before


@pytest.mark.skipif(shutil.which("setpriv") is None and os.geteuid() == 0, reason="needs setpriv to drop root's DAC")
def test_probe_read_only_directory_is_one_error(tmp_path):
    d = run_copy(tmp_path)
    before = listing(d)
    d.chmod(0o555)
    try:
        prefix = DROP_DAC if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, sys.executable, "-m", "ckptinspect", "plan", str(d), "--probe"],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        d.chmod(0o755)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr == f"Error: {d}: cannot measure its write speed: Permission denied" \
        " (the probe file was removed)\n"
    assert listing(d) == before


def test_probe_needs_a_path():
    result = invoke("--probe", "--save-seconds", "1")
    assert result.exit_code == 2 and result.stderr == "Error: --probe needs DIR: the checkpoint (or directory)" \
        " whose storage to measure\n"


# -- durations -------------------------------------------------------------------------------
@pytest.mark.parametrize("text,seconds", [
    ("30m", 1800), ("7d", 604800), ("1h30m", 5400), ("20s", 20), ("1800", 1800), ("1.5h", 5400),
    ("2w", 14 * 86400), ("30M", 1800), ("1d12h", 129600), ("0.5", 0.5),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30x", "", "m", "-5", "0", "0s", "1h1h", "1..5m", "nan", "inf", "1e3", "30 m x",
                                  "1h-30m", "99999999999d"])
def test_bad_durations_are_one_error_line(text):
    result = invoke("--every", text, "--train-time", "7d")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: bad --every ")
    with pytest.raises(UsageError):
        parse_duration(text)


@pytest.mark.parametrize("args,message", [
    (["--keep", "0", "--every", "1h"], "bad --keep 0"),
    ([], "nothing to plan"),
    (["--every", "1h", "--format", "csv"], "plan --format: table or json"),
    (["--save-seconds", "abc"], "bad --save-seconds 'abc'"),
])
def test_usage_errors(args, message):
    result = invoke(*args)
    assert result.exit_code == 2 and result.stderr.startswith(f"Error: {message}"), result.output


def test_probe_error_type_is_an_oserror(tmp_path):
    assert issubclass(OutputWriteError, OSError)
    with pytest.raises(UsageError):
        probe_write(str(tmp_path / "absent"), 10)


def test_sigterm_handler_restored_after_probe(tmp_path):
    probe_write(str(tmp_path), 1000)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_plan_reference_example_is_true():
    text = (ROOT / "docs" / "commands" / "plan.md").read_text()
    block = re.search(r"```\n\$ ckptinspect (plan [^\n]*)\n(.*?)```", text, flags=re.S)
    assert block, "docs/commands/plan.md has no plan example"
    result = runner.invoke(app, block.group(1).split(), env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert result.stdout == block.group(2)


def test_identical_save_times_give_no_cadence(tmp_path):
    d = run_copy(tmp_path)
    (d / "checkpoint").unlink()
    for step in (4, 6, 8):
        os.utime(d / f"ckpt-{step}.index", (7000.0, 7000.0))  # copied together: one mtime
    doc = plan_json(str(d), "--train-time", "1d")
    cadence = doc["measured"]["cadence"]
    assert cadence["interval_seconds"] is None and cadence["time_source"] is None
    assert cadence["interval_steps"] == 2
    assert doc["every_seconds"] is None and "every_seconds" in doc["missing"]
    table = invoke(str(d), "--train-time", "1d").stdout
    assert "cadence:    every 2 steps, time unknown (no two of its 3 checkpoints have distinct save times)" in table


def sparse_safetensors(path: pathlib.Path, nbytes: int) -> None:
    """A .safetensors file of one float32 tensor of ``nbytes``, its data a hole (no disk used)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + nbytes)


@pytest.mark.slow  # writes until interrupted (up to a second or two of a 1 GiB probe)
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM),
                                      (signal.SIGHUP, 128 + signal.SIGHUP)])
def test_cli_probe_killed_mid_write_leaves_nothing(tmp_path, sig, code):
    sparse_safetensors(tmp_path / "model.safetensors", 1 << 30)
    before = listing(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "ckptinspect", "plan", str(tmp_path / "model.safetensors"), "--probe"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 30
        while not any(p.name.endswith(".write-probe") for p in tmp_path.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "the probe never started"
            time.sleep(0.01)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Ctrl-C says so; SIGTERM/SIGHUP end quietly with 128 + the signal, as every writing command does
    assert (proc.returncode, out, err) == (code, "", "Error: interrupted\n" if sig == signal.SIGINT else "")
    assert listing(tmp_path) == before
