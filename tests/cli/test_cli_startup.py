"""The CLI's start-up and values: the commands are click's (no typer, no pydantic), whose
plain types coerce every value as typer 0.29's pydantic route did (the table below, taken
from it), and ``ls`` imports only what the format it reads needs."""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys

import click
import pytest

from ckptinspect import cli
from ckptinspect._cli_app import EnumChoice

ROOT = pathlib.Path(__file__).resolve().parents[2]

# What typer 0.29 (pydantic) gave for each kind of value our commands take: str -> value.
# ERR: a usage error (exit 2).
ERR = object()
TYPER_029 = {
    "int": {"0": 0, "7": 7, "-3": -3, "+4": 4, "007": 7, "1_000": 1000, " 5": 5, "5 ": 5,
            **dict.fromkeys(["", "x", "1.5", ".5", "1e-3", "-2E+2", "inf", "nan", "0x10", "1.", "json"], ERR)},
    "float": {"0": 0.0, "7": 7.0, "-3": -3.0, "+4": 4.0, "007": 7.0, "1.5": 1.5, ".5": 0.5, "1e-3": 0.001,
              "-2E+2": -200.0, "inf": math.inf, "-inf": -math.inf, "Infinity": math.inf, "nan": math.nan,
              "1_000": 1000.0, " 5": 5.0, "5 ": 5.0, "1.": 1.0, **dict.fromkeys(["", "x", "0x10", "json"], ERR)},
    "OutputFormat": {"json": "json", "JSON": "json", "table": "table", "Table": "table", "csv": "csv",
                     **dict.fromkeys(["", "x", "xml", "map", "0"], ERR)},
    "Emit": {"map": "map", "assignment-map": "assignment-map", "ASSIGNMENT-MAP": "assignment-map",
             "Weights": "weights", **dict.fromkeys(["", "x", "json", "assignment_map"], ERR)},
    "str": {"": "", "x": "x", "007": "007", " 5": " 5", "a=b": "a=b", "JSON": "JSON"},
    "tuple[int, str]": {("3", "d"): (3, "d"), ("+3", "d"): (3, "d"), ("x", "d"): ERR, ("1.5", "d"): ERR},
}


def _kind(param: click.Parameter) -> str:
    """Which row of TYPER_029 a parameter's values follow (every parameter has one)."""
    t = param.type
    if isinstance(t, EnumChoice):
        return t.enum_type.__name__
    if isinstance(t, click.Tuple):
        return f"tuple[{', '.join(x.name for x in t.types)}]".replace("integer", "int").replace("text", "str")
    return {"integer": "int", "float": "float", "text": "str", "boolean": "bool"}[t.name]


def _params():
    ctx = click.Context(cli.app)
    for name, command in [("ckptinspect", cli.app), *cli.app.commands.items()]:
        for param in command.get_params(ctx):
            if not set(getattr(param, "opts", ())) & {"-h", "--help"}:  # click's own --help (named per version)
                yield name, param


PARAMS = list(_params())


@pytest.mark.parametrize("name,param", PARAMS, ids=[f"{n}:{p.name}" for n, p in PARAMS])
def test_values_are_coerced_as_typer_did(name, param):
    kind = _kind(param)
    if kind == "bool":
        assert param.is_flag, (name, param.name)  # flags take no value
        return
    ctx = click.Context(cli.app)
    for raw, expected in TYPER_029[kind].items():  # each value as given once (a repeatable option's too)
        if expected is ERR:
            with pytest.raises(click.BadParameter):
                param.type.convert(raw, param, ctx)
            continue
        got = param.type.convert(raw, param, ctx)
        got = got.value if hasattr(got, "value") else got
        if isinstance(expected, float) and math.isnan(expected):
            assert math.isnan(got), (raw, got)
        else:
            assert got == expected and type(got) is type(expected), (raw, got, expected)


def test_repeatable_options_and_variadic_arguments_give_lists():
    ctx = cli.app.commands["diff"].make_context("diff", ["a", "b", "--map", "x=y", "--map", "z=w"], parent=click.Context(cli.app))
    assert ctx.params["maps"] == ["x=y", "z=w"] and ctx.params["format"] is cli.OutputFormat.table
    ctx = cli.app.commands["scan"].make_context("scan", ["d1", "d2"], parent=click.Context(cli.app))
    assert ctx.params["paths"] == ["d1", "d2"]


def test_the_cli_stands_on_public_apis():
    """No typer, no private names of click (``click._...``, a ``_``-attribute of click), no
    parameter whose class is swapped after the fact."""
    import ast  # noqa: PLC0415

    for module in ("cli.py", "_cli_app.py", "__main__.py"):
        tree = ast.parse((ROOT / "ckptinspect" / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                assert not any(n and (n.split(".")[0] == "typer" or "._" in f".{n}" and n.startswith("click"))
                               for n in names), (module, ast.dump(node))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "click":
                assert not node.attr.startswith("_"), (module, node.attr)
            if isinstance(node, ast.Attribute) and node.attr == "__class__" and isinstance(node.ctx, ast.Store):
                pytest.fail(f"{module}: assigns __class__")


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
WRITERS = ("ckptinspect.formats.keras.write", "ckptinspect.formats.keras.h5_write", "ckptinspect.formats.tf.write")
NEVER_FOR_LS = ("tensorflow", "keras", "torch", "pydantic", "typer", "rich", "google.protobuf", "ckptinspect.ops.stats",
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
    assert "ckptinspect.formats.keras.h5" in modules
    assert "h5py" not in modules  # listed by our own HDF5 reader (issue 28)
    assert _loaded(modules, TF_READERS + NEVER_FOR_LS + WRITERS + ("ckptinspect.formats.torch.reader",
                                                                   "ckptinspect.formats.safetensors.file")) == []


@pytest.mark.parametrize("path", ["fixtures/keras/model.weights.h5", "fixtures/keras/model.h5",
                                  "fixtures/series/keras3_weights/weights.01.weights.h5"])
def test_ls_keras_h5_imports_no_numpy(path):
    """Our own HDF5 reader lists without numpy (dtypes described, string attributes and the
    optimizer's scalar counter decoded without it): ls pays no numpy import (issue 28)."""
    code, modules = _ls_modules(path)
    assert code == 0
    assert "ckptinspect.formats.keras.hdf5" in modules  # our reader did run
    assert _loaded(modules, ("numpy", "h5py")) == []


def test_ls_tf_bundle_still_finds_its_reader():
    """The lazy registry hands a TF directory to the TF readers (and imports nothing else)."""
    code, modules = _ls_modules("fixtures/run")
    assert code == 0
    assert {"ckptinspect.formats.tf.bundle", "ckptinspect.formats.tf.directory"} <= modules
    assert _loaded(modules, OTHER_READERS + WRITERS + ("h5py", "tensorflow", "pydantic", "csv")) == []


# What `ls` of one file never loads, in an interpreter started without site (-S: an editable
# install's .pth finder and other .pth files import pathlib, zipfile, tempfile... themselves, which
# would hide a regression). Each was loaded by every start once: the standard library's for the
# paths that need it (zip detection's fallback, a terminal, a sharded index, --debug, a mistyped
# command, a pool of threads), and the package's modules only some inputs need (remote paths,
# giant safetensors headers, directory listings).
NEVER_FOR_ONE_FILE = ("numpy", "h5py", "zipfile", "pathlib", "tempfile", "shutil", "urllib", "difflib", "traceback",
                      "textwrap", "concurrent.futures", "logging", "csv",
                      "ckptinspect.formats.remote", "ckptinspect.formats.safetensors.compact",
                      "ckptinspect.formats._listing", "ckptinspect._atomic")


def _ls_modules_without_site(path: str) -> tuple[int, set[str]]:
    """Exit code and the modules `ckptinspect ls PATH` executed, in ``python -S`` (site-packages on
    PYTHONPATH instead). A module registered to load on first use (``formats._lazymod``) and never
    used does not count: its type is still the lazy loader's module subclass."""
    import site  # noqa: PLC0415

    code = ("import sys, types; from ckptinspect.cli import app\n"
            f"try:\n    app(['ls', {path!r}])\nexcept SystemExit as e:\n    code = e.code\n"
            "print(code); print(' '.join(sorted(n for n, m in sys.modules.items()"
            " if not (isinstance(m, types.ModuleType) and type(m) is not types.ModuleType))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *site.getsitepackages()])}
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=env)
    lines = done.stdout.strip().splitlines()
    assert len(lines) >= 2, done.stderr
    return int(lines[-2]), set(lines[-1].split())


@pytest.mark.parametrize("path,reader,also_never", [
    ("fixtures/torch/model.safetensors", "ckptinspect.formats.safetensors.file", ("google.protobuf",)),
    ("fixtures/keras/model.weights.h5", "ckptinspect.formats.keras.hdf5", ("google.protobuf", "json")),
    ("fixtures/sharded/ckpt-4", "ckptinspect.formats.tf.index", ("json",)),
])
def test_ls_of_one_file_loads_nothing_other_paths_need(path, reader, also_never):
    code, modules = _ls_modules_without_site(path)
    assert code == 0
    assert reader in modules and "click" in modules  # the listing did run
    assert _loaded(modules, NEVER_FOR_ONE_FILE + also_never) == []


@pytest.mark.parametrize("preset, expected", [(None, "1"), ("3", "3")])
def test_the_process_runs_openblas_on_one_thread_unless_told(preset, expected):
    """The command line sets ``OPENBLAS_NUM_THREADS`` before numpy loads (a setting in the
    environment wins): the process's environment, read at its exit."""
    code = ("import atexit, os, sys\n"
            "sys.argv = ['ckptinspect', '--version']\n"
            "atexit.register(lambda: print('BLAS', os.environ.get('OPENBLAS_NUM_THREADS'), flush=True))\n"
            "from ckptinspect.__main__ import run\n"
            "run()\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"BLAS {expected}" in proc.stdout.splitlines()
