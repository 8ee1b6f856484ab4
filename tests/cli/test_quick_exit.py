"""The ``ckptinspect`` process ends without tearing the interpreter down
(``ckptinspect.__main__.run``): same exit codes and output as :func:`ckptinspect.cli.main`,
exit handlers still run, and a process with another thread alive exits normally."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL_H5 = ROOT / "fixtures" / "keras" / "model.h5"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptinspect", *args], capture_output=True, text=True, env=ENV,
                          timeout=120)


def _main(*args: str) -> subprocess.CompletedProcess:
    """The same command through cli.main in a process that exits normally."""
    code = "import sys; from ckptinspect.cli import main; sys.argv = ['ckptinspect', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV, timeout=120)


@pytest.fixture(scope="module")
def changed_copy(tmp_path_factory) -> pathlib.Path:
    """model.h5 with one weight changed, written by h5py."""
    path = tmp_path_factory.mktemp("quick") / "model_b.h5"
    path.write_bytes(MODEL_H5.read_bytes())
    with h5py.File(path, "r+") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and o.dtype.kind == "f" and o.size > 1 else None)
        ds = f[names[0]]
        ds[...] = np.asarray(ds[()]) + 1
    return path


@pytest.mark.parametrize("case", ["equal", "different", "error", "json"])
def test_exit_code_and_output_as_cli_main(case, changed_copy):
    args = {
        "equal": ["diff", str(MODEL_H5), str(MODEL_H5)],
        "different": ["diff", str(MODEL_H5), str(changed_copy)],
        "error": ["ls", str(changed_copy.parent / "missing.h5")],
        "json": ["diff", str(MODEL_H5), str(changed_copy), "--format", "json"],
    }[case]
    quick, normal = _module(*args), _main(*args)
    assert quick.returncode == normal.returncode == {"equal": 0, "different": 1, "error": 2, "json": 1}[case]
    assert (quick.stdout, quick.stderr) == (normal.stdout, normal.stderr)
    if case == "json":
        assert json.loads(quick.stdout)["summary"]["changed"] == 1
    if case == "error":
        assert quick.stderr.startswith("Error: ") and quick.stderr.count("\n") == 1


def test_exit_handlers_run_and_output_is_flushed():
    code = textwrap.dedent("""
        import atexit, sys
        atexit.register(lambda: sys.stderr.write("handler ran\\n"))
        sys.stdout.write("buffered, not flushed\\n")
        sys.argv = ["ckptinspect", "ls", sys.argv[1], "--format", "json"]
        from ckptinspect.__main__ import run
        run()
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(MODEL_H5)], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "handler ran\n"
    head, _, rest = proc.stdout.partition("\n")
    assert head == "buffered, not flushed" and "not reached" not in rest
    assert json.loads(rest)["format"] == "keras-h5"


def test_exit_handlers_run_once_when_a_stream_does_not_flush():
    """stdout closed by the reader before the end, the listing still buffered: the quick exit
    falls back to a normal exit, which must not run the handlers a second time (CPython's
    ``atexit._run_exitfuncs`` clears them once run)."""
    code = textwrap.dedent("""
        import atexit, io, os, sys
        atexit.register(lambda: os.write(2, b"handler ran\\n"))
        r, w = os.pipe()
        os.close(r)  # nobody reads: the last flush fails with a broken pipe
        os.dup2(w, 1)
        raw = io.BufferedWriter(io.FileIO(1, "w", closefd=False), buffer_size=1 << 20)
        sys.stdout = io.TextIOWrapper(raw)  # the whole listing stays buffered until the end
        sys.argv = ["ckptinspect", "ls", sys.argv[1]]
        from ckptinspect.__main__ import run
        run()
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(MODEL_H5)], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.stderr.count("handler ran") == 1, proc.stderr


def test_a_thread_still_running_gets_a_normal_exit():
    """A non-daemon thread alive at the end: the process waits for it, as a normal exit does.
    The thread prints once the main thread is done (the command over, the exit begun), however
    long the command took on a loaded machine (a fixed 0.3 s sleep raced it)."""
    code = textwrap.dedent("""
        import sys, threading, time
        def late():
            deadline = time.monotonic() + 60
            while threading.main_thread().is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)
            print("thread finished", flush=True)
        threading.Thread(target=late).start()
        sys.argv = ["ckptinspect", "ls", sys.argv[1]]
        from ckptinspect.__main__ import run
        run()
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(MODEL_H5)], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("thread finished")


def test_importing_the_module_runs_nothing():
    proc = subprocess.run([sys.executable, "-c", "import ckptinspect.__main__ as m; print(callable(m.run))"],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "True\n", "")


def test_cyclic_garbage_is_still_collected_in_the_process():
    """The process's higher collector threshold (GC_THRESHOLD): no collection for the objects
    start-up leaves, but cycles made while a command runs are collected, with no explicit call."""
    code = textwrap.dedent("""
        import gc, sys, weakref
        import ckptinspect.cli as cli
        from ckptinspect import __main__ as entry

        class Node:
            pass

        def command():
            assert gc.get_threshold()[0] == entry.GC_THRESHOLD > 700
            refs = []
            for i in range(20 * entry.GC_THRESHOLD // 3):  # 3 container objects per pair
                a, b = Node(), Node()
                a.other, b.other = b, a
                if i % 1000 == 0:
                    refs.append(weakref.ref(a))
            print(sum(r() is not None for r in refs), len(refs))
            sys.exit(0)

        cli.main = command
        entry.run()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    alive, made = map(int, proc.stdout.split())
    assert made > 600 and alive < made // 4, (alive, made)  # most pairs were collected as the loop ran


# A module-level object whose finalizer writes a marker: it runs when the interpreter is torn
# down (a normal exit), never after os._exit (the quick one).
TEARDOWN_MARKER = textwrap.dedent("""
    import os, sys
    class Marker:
        def __del__(self, write=os.write):  # module globals are gone by then
            write(2, b"torn down\\n")
    marker = Marker()
""")


def _run_with_marker(prelude: str) -> subprocess.CompletedProcess:
    code = TEARDOWN_MARKER + prelude + textwrap.dedent("""
        sys.argv = ["ckptinspect", "ls", sys.argv[1]]
        from ckptinspect.__main__ import run
        run()
    """)
    return subprocess.run([sys.executable, "-c", code, str(MODEL_H5)], capture_output=True, text=True, env=ENV,
                          timeout=300)


def test_the_process_skips_interpreter_teardown():
    proc = _run_with_marker("")
    assert proc.returncode == 0, proc.stderr
    assert "torn down" not in proc.stderr and proc.stdout.startswith("path:")


@pytest.mark.slow
def test_with_tensorflow_loaded_the_process_exits_normally():
    proc = _run_with_marker("import tensorflow\n")
    assert proc.returncode == 0, proc.stderr
    assert "torn down\n" in proc.stderr and proc.stdout.startswith("path:")


def test_no_private_cpython_calls():
    """The quick exit stands on public APIs (``gc.callbacks``, ``sys.is_finalizing``,
    ``os._exit``): no ``atexit._run_exitfuncs`` or other private name of ``atexit``/``sys``."""
    import ast  # noqa: PLC0415

    tree = ast.parse((ROOT / "ckptinspect" / "__main__.py").read_text())
    private = [f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
               and node.value.id in ("atexit", "sys", "gc", "threading") and node.attr.startswith("_")]
    assert private == []


def test_exit_handlers_registered_during_the_command_run_once_and_before_the_exit():
    """A handler the command registers (as logging or a library does) runs once, after the
    command's output, and the process still skips the teardown."""
    code = TEARDOWN_MARKER + textwrap.dedent("""
        import atexit
        import ckptinspect.cli as cli
        from ckptinspect.__main__ import run
        real_main = cli.main

        def command():
            atexit.register(lambda: os.write(2, b"late handler ran\\n"))
            real_main()

        cli.main = command
        sys.argv = ["ckptinspect", "ls", sys.argv[1]]
        run()
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(MODEL_H5)], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "late handler ran\n" and proc.stdout.startswith("path:")
