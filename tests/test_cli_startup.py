"""The CLI's start-up: typer's pydantic coercion is bypassed for the plain values our commands
take (``cli.fast_value``), with results identical to typer's own route, which still handles
everything else (other spellings, errors)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import click
import pytest
import typer

from ckptinspect import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
RAW_VALUES = [None, "", "x", "0", "7", "-3", "+4", "007", "1.5", ".5", "1e-3", "-2E+2", "inf", "nan", "1_000",
              " 5", "0x10", "json", "JSON", "table", "csv", "map", "assignment-map", "Weights", "a=b", True, False,
              0, 3, 2.5, ("a", "b"), [], ["x=y"], cli.OutputFormat.json, cli.Emit.map]


def _params():
    group = typer.main.get_command(cli.app)
    ctx = click.Context(group)
    for name, command in group.commands.items():
        for param in command.get_params(ctx):  # the CLI's own classes (_Argument/_Option)
            if param.name != "help":
                yield name, param


PARAMS = list(_params())


def test_parameters_use_the_fast_route():
    assert PARAMS and all(type(p).get_runtime_param is cli._fast_get_runtime_param for _, p in PARAMS)


@pytest.mark.parametrize("name,param", PARAMS, ids=[f"{n}:{p.name}" for n, p in PARAMS])
def test_fast_values_equal_typers_own(name, param):
    pytest.importorskip("typer._coercion")
    from typer._coercion import build_runtime_param

    slow = build_runtime_param(param.type_descriptor)
    ctx = click.Context(typer.main.get_command(cli.app))
    handled = 0
    for raw in RAW_VALUES:
        fast = cli.fast_value(param, raw)
        if fast is cli._NOT_FAST:
            continue
        handled += 1
        expected = slow.coerce(raw, param=param, ctx=ctx)  # typer's route must accept what we accept
        assert fast == expected and type(fast) is type(expected), (raw, fast, expected)
    assert handled >= 1  # at least None or the default's type


def test_ls_does_not_import_pydantic():
    code = ("import sys; from ckptinspect.cli import app\n"
            "try:\n    app(['ls', 'fixtures/run', '--format', 'json'])\nexcept SystemExit as e:\n    code = e.code\n"
            "print(code, 'pydantic' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip().splitlines()[-1] == "0 False", done.stderr
