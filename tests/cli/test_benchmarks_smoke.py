"""Smoke test of ``benchmarks/run.py``: it still runs end to end on a tiny checkpoint.

One subprocess run (about 2 MB, 20 variables, one round, no warm-up) of a few pairs chosen to
cover every kind of tool (ckptinspect without TensorFlow, TensorFlow scripts, HDF5 command-line
tools, cached generation) plus a two-point scale series without baselines; checks the report
has a timed row for every available tool and a clear "skipped" for a missing one. hdf5-tools
and matplotlib are optional: their rows or the plot are checked only as present or absent.
The generated checkpoints' contents are checked against h5py and the bundle's own files.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs the whole benchmark suite at a tiny size (~25 s)

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "run.py"
PAIRS = ("ls", "diff-h5", "verify", "scan")
TOOLS = {
    "ls": ("ckptinspect ls", "tf.train.list_variables", "inspect_checkpoint"),
    "diff-h5": ("ckptinspect diff", "h5diff -d 0.01", "h5py script (max abs diff per dataset)"),
    "verify": ("ckptinspect verify", "TF: get_tensor of every key"),
    "scan": ("ckptinspect scan", "read each checkpoint once: TF get_tensor of every key",
             "read each checkpoint once: ckptinspect verify DIR"),
}
HDF5_TOOLS = {"h5diff -d 0.01": "h5diff"}  # row label -> the executable it needs
ROW = re.compile(r"^\| (?P<tool>[^|]+?) \| (?P<median>[^|]*?) \| (?P<spread>[^|]*?) \| (?P<peak>[^|]*?) \| (?P<ratio>[^|]*?) \|$")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Run the benchmark once on a tiny size; return (process, results text, work folder, plot path)."""
    tmp = tmp_path_factory.mktemp("bench")
    work, results, plot = tmp / "work", tmp / "RESULTS.md", tmp / "scale.png"
    cmd = [sys.executable, str(RUN), "--size-mb", "2", "--variables", "20", "--rounds", "1", "--warmup", "0",
           "--only", ",".join(PAIRS), "--scale", "1,2", "--no-scale-baselines",
           "--work", str(work), "--results", str(results), "--plot", str(plot), "--ratio-plot", str(tmp / "ratios.png")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, results.read_text(), work, plot


def _section(text: str, pair: str) -> list[dict[str, str]]:
    """The tool rows of one pair's table in RESULTS.md."""
    start = text.index(f"### `{pair}`:")
    end = text.find("\n### ", start + 1)
    end = text.find("\n## ", start) if end < 0 else min(end, text.find("\n## ", start))
    rows = [ROW.match(line) for line in text[start:end].splitlines()]
    return [m.groupdict() for m in rows if m and m["tool"] not in ("tool", "---")]


def test_report_has_a_timed_row_per_available_tool(run):
    _, text, _, _ = run
    for pair in PAIRS:
        rows = {r["tool"]: r for r in _section(text, pair)}
        assert set(rows) == set(TOOLS[pair]), (pair, rows)
        for tool, row in rows.items():
            if tool in HDF5_TOOLS and shutil.which(HDF5_TOOLS[tool]) is None:
                assert row["median"] == "skipped" and "hdf5-tools" in row["ratio"]
                continue
            assert float(row["median"]) > 0, row
            assert float(row["peak"]) > 1, row
            expected = "1.00x (reference)" if tool.startswith("ckptinspect") else None
            assert row["ratio"] == expected if expected else re.fullmatch(r"\d+\.\d\dx", row["ratio"]), row
    # Pairs not asked for are not timed.
    assert "### `transplant`" not in text and "### `extract`" not in text


def test_report_has_machine_targets_and_scale(run):
    _, text, _, plot = run
    assert re.search(r"^- \d+ cores, [\d.]+ GiB memory, ", text, re.M)
    assert re.search(r"tensorflow \d+\.\d+", text) and re.search(r"h5py \d+\.\d+", text)
    assert re.search(r"load average: \d+\.\d\d when timing started", text)
    checks = re.findall(r"^\| (ls A|diff model.h5 model_b.h5|verify A) --format json: (\w+) \| (\S+) \| (\S+) \| (\S+) \|$", text, re.M)
    assert checks == [("ls A", "variables", "20", "20", "ok"), ("diff model.h5 model_b.h5", "changed", "5", "5", "ok"),
                      ("verify A", "intact", "True", "True", "ok")]
    targets = text[text.index("## Targets"):text.index("## Pairs")]
    assert re.search(r"\| ls >= 10x faster than tf.train.list_variables \(20 variables\) \| [\d.]+x .* \| (met|\*\*missed\*\*) \|", targets)
    assert re.search(r"\| verify at least as fast as .* \(verify\) \| [\d.]+x", targets)
    scale = text[text.index("## Scale series"):text.index("## Notes")]
    for size in ("1 MB", "2 MB"):
        for series, tool in (("ls", "ckptinspect ls"), ("diff", "ckptinspect diff"), ("verify", "ckptinspect verify"),
                             ("scan", "ckptinspect scan"), ("average", "ckptinspect average"), ("extract", "ckptinspect extract")):
            assert re.search(rf"^\| {size} \([\d.]+ MiB\) \| `{series}` \| {tool} \| [\d.]+ \|", scale, re.M), (size, series)
    if importlib.util.find_spec("matplotlib") is None:
        assert "matplotlib is not installed" in scale and not plot.exists()
    else:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "](scale.png)" in scale


def test_generated_checkpoints_are_what_the_report_says(run):
    h5py = pytest.importorskip("h5py")
    _, text, work, _ = run
    folder = work / "2mb_20v"
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["entries"] == 20 and f"{meta['entries']} variables" in text
    # The legacy .h5 holds the same tensors as the bundle; B differs from A in the perturbed ones.
    with h5py.File(folder / "model.h5", "r") as a, h5py.File(folder / "model_b.h5", "r") as b:
        names: list[str] = []
        a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        assert len(names) == meta["entries"]
        changed = sum(not (a[n][()] == b[n][()]).all() for n in names)
    assert changed == meta["perturbed"] > 0
    sizes = {f.name: f.stat().st_size for f in (folder / "a").iterdir()}
    assert sum(sizes.values()) == meta["files"]["a"]
    assert abs(meta["files"]["a"] - 2 * 2**20) < 0.1 * 2**20


def test_generation_is_cached(run, tmp_path):
    """A second run reuses the checkpoints (no generator process) and --only rejects unknown names."""
    proc, _, work, _ = run
    assert "generating" in proc.stderr
    bad = subprocess.run([sys.executable, str(RUN), "--only", "ls,nonsense", "--work", str(work), "--results", str(tmp_path / "R.md")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--only: unknown nonsense" in bad.stderr
    assert not (tmp_path / "R.md").exists()
    again = subprocess.run([sys.executable, str(RUN), "--size-mb", "2", "--variables", "20", "--rounds", "1", "--warmup", "0",
                            "--only", "ls-h5", "--scale", "", "--work", str(work), "--results", str(tmp_path / "R.md"),
                            "--plot", str(tmp_path / "p.png"), "--ratio-plot", str(tmp_path / "r.png")],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "generating" not in again.stderr
    rows = {r["tool"]: r for r in _section((tmp_path / "R.md").read_text(), "ls-h5")}
    assert float(rows["ckptinspect ls"]["median"]) > 0
    assert not (tmp_path / "p.png").exists()
