"""Issue 27 item 14: a ``--builder`` that exits (``sys.exit``, ``absl.app.run``) is an error
naming the builder, in every command that takes one; it never becomes the command's exit."""

from __future__ import annotations

import pathlib
import sys
import textwrap

import pytest
from click.testing import CliRunner

from ckptinspect.cli import app

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "run"
runner = CliRunner()

BUILDERS = textwrap.dedent("""
    import sys

    def exits_zero():
        sys.exit(0)

    def exits_three():
        raise SystemExit(3)
""")


@pytest.fixture
def builders(tmp_path, monkeypatch):
    (tmp_path / "exiting_builders.py").write_text(BUILDERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("exiting_builders", None)


@pytest.mark.parametrize("fn,code", [("exits_zero", 0), ("exits_three", 3)])
@pytest.mark.parametrize("command", ["doctor", "transplant", "extract"])
def test_a_builder_that_exits_is_an_error_naming_it(command, fn, code, builders):
    spec = f"exiting_builders:{fn}"
    out = builders / "out.weights.h5"
    args = {"doctor": ["doctor", str(RUN), "--builder", spec],
            "transplant": ["transplant", str(RUN), str(out), "--builder", spec],
            "extract": ["extract", str(RUN), "-o", str(out), "--builder", spec]}[command]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stderr == (f"Error: --builder {spec}: exited (SystemExit({code!r}): sys.exit, absl.app.run...)"
                             " instead of returning a model; a builder must return the model\n"), result.stderr
    assert not out.exists()
