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

ROOT = pathlib.Path(__file__).resolve().parents[2]
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


# What `ls` may not import, per format: detection reads a file's first bytes and imports only
# the module of the format it found (formats/__init__.py, _LAZY_NAMES and _FORMATS).
TF_READERS = ("ckptinspect.formats.tf.bundle", "ckptinspect.formats.tf.index", "ckptinspect.formats.tf.variables",
              "ckptinspect.formats.tf.data", "ckptinspect.formats.tf.directory",
              "ckptinspect.formats.tf.v1", "ckptinspect.formats.tf.object_graph", "ckptinspect.formats.tf.protos")
OTHER_READERS = ("ckptinspect.formats.keras.h5", "ckptinspect.formats.keras.zip", "ckptinspect.formats.npz",
                 "ckptinspect.formats.torch.reader", "ckptinspect.formats.hf.sharded")
NEVER_FOR_LS = ("tensorflow", "keras", "torch", "pydantic", "google.protobuf", "ckptinspect.ops.stats",
                "ckptinspect.ops.diff.operation", "ckptinspect.trainer", "concurrent.futures", "csv")


def _ls_modules(path: str, *args: str) -> tuple[int, set[str]]:
    """Exit code and every module imported by `ckptinspect ls PATH ARGS...` in a fresh interpreter."""
    code = ("import sys; from ckptinspect.cli import app\n"
            f"try:\n    app(['ls', {path!r}, *{list(args)!r}])\nexcept SystemExit as e:\n    code = e.code\n"
            "print(code); print(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = done.stdout.strip().splitlines()
    assert len(lines) >= 2, done.stderr
    return int(lines[-2]), set(lines[-1].split())


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules for n in names if m == n or m.startswith(n + "."))


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_ls_safetensors_imports_only_what_it_needs(fmt):
    code, modules = _ls_modules("fixtures/torch/model.safetensors", "--format", fmt)
    assert code == 0
    assert "ckptinspect.formats.safetensors.file" in modules  # the reader did run
    # the header is JSON, read without numpy: no values, no TF reader, no other format's module
    assert _loaded(modules, ("numpy", "h5py", "safetensors") + TF_READERS + OTHER_READERS
                   + NEVER_FOR_LS[:-1]) == []
    assert ("csv" in modules) == (fmt == "csv")


def test_ls_keras_h5_imports_no_tf_reader():
    code, modules = _ls_modules("fixtures/keras/model.h5")
    assert code == 0
    assert "ckptinspect.formats.keras.h5" in modules and "h5py" in modules
    assert _loaded(modules, TF_READERS + NEVER_FOR_LS + ("ckptinspect.formats.torch.reader",
                                                         "ckptinspect.formats.safetensors.file")) == []


def test_ls_tf_bundle_still_finds_its_reader():
    """The lazy registry hands a TF directory to the TF readers (and imports nothing else)."""
    code, modules = _ls_modules("fixtures/run")
    assert code == 0
    assert {"ckptinspect.formats.tf.bundle", "ckptinspect.formats.tf.directory"} <= modules
    assert _loaded(modules, OTHER_READERS + ("h5py", "tensorflow", "pydantic", "csv")) == []
