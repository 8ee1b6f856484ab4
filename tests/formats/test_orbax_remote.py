"""Keras 3 Orbax steps and runs on a real S3-compatible server (moto's, on 127.0.0.1; see
``object_store.py``; the committed fixtures are uploaded under ``s3://fixtures/``): ``ls`` of a
step and of a run (the interrupted save named), ``ls --stats``, ``verify`` and ``diff`` against
the local copy give what they give locally; the requests ``ls`` of a step makes, through the
delaying proxy. ``model_parallel`` holds arrays split on their second axis (read through
tensorstore's own ``s3`` kvstore) beside arrays streamed from their zstd frames; ``multiprocess``
has two process databases."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from conftest import FIXTURES
from object_store import run_counted

from ckptinspect.cli import app

pytest.importorskip("tensorstore")
pytest.importorskip("zstandard")

runner = CliRunner()
STEP = "orbax/model_parallel/run/3"
RUN = "orbax/model_parallel/run"
MULTI = "orbax/multiprocess/2"
MULTI_RUN = "orbax/multiprocess"


def same(text: str, *roots: str) -> str:
    for root in roots:
        text = text.replace(root, "ROOT")
    return text


def flat(table: str) -> str:
    return " ".join(re.sub(r"-{2,}", "--", table).split())


def both(s3, *args: str, rel: str) -> tuple[str, str]:
    """A command's output on the remote copy and on the local files, paths made equal."""
    far = runner.invoke(app, [args[0], s3.url(rel), *args[1:]])
    near = runner.invoke(app, [args[0], str(FIXTURES / rel), *args[1:]])
    assert far.exit_code == near.exit_code, (far.stdout, far.stderr, near.stderr)
    return same(far.stdout, "s3://fixtures/"), same(near.stdout, str(FIXTURES) + "/")


@pytest.mark.parametrize("rel", [STEP, RUN, pytest.param(MULTI, marks=pytest.mark.slow),
                                 pytest.param(MULTI_RUN, marks=pytest.mark.slow)])
def test_ls_of_a_remote_step_and_run_is_the_local_one(s3, rel):
    far, near = both(s3, "ls", "--format", "json", rel=rel)
    report = json.loads(far)
    assert report["format"] == "orbax" and report["variables"], far
    assert far == near
    far, near = both(s3, "ls", rel=rel)  # the table too (a run's path column is as wide as its paths)
    assert flat(far) == flat(near)


def test_ls_of_a_remote_run_names_the_interrupted_save(s3):
    far = runner.invoke(app, ["ls", s3.url(RUN)])
    assert far.exit_code == 0, far.stderr
    assert "s3://fixtures/orbax/model_parallel/run/9.orbax-checkpoint-tmp: an interrupted Orbax save" in far.output


@pytest.mark.parametrize("rel", [STEP, pytest.param(MULTI, marks=pytest.mark.slow)])
def test_stats_and_verify_of_a_remote_step_are_the_local_ones(s3, rel):
    far, near = both(s3, "ls", "--stats", "--format", "json", rel=rel)
    assert json.loads(far)["variables"][0].get("stats") or "mean" in far, far
    assert far == near
    far, near = both(s3, "verify", "--format", "json", rel=rel)
    assert '"intact"' in far, far
    assert far == near


@pytest.mark.parametrize("rel", [STEP, pytest.param(MULTI, marks=pytest.mark.slow)])
def test_diff_of_a_remote_step_against_its_local_copy_is_equal(s3, rel):
    local = str(FIXTURES / rel)
    far = runner.invoke(app, ["diff", s3.url(rel), local, "--format", "json"])
    near = runner.invoke(app, ["diff", local, local, "--format", "json"])
    assert far.exit_code == near.exit_code == 0, (far.stdout, far.stderr)
    assert same(far.stdout, s3.url(rel), local) == same(near.stdout, local)


@pytest.mark.slow
def test_diff_of_two_remote_steps_finds_the_changes(s3):
    far = runner.invoke(app, ["diff", s3.url(RUN + "/3"), s3.url(RUN + "/6"), "--format", "json"])
    near = runner.invoke(app, ["diff", str(FIXTURES / RUN / "3"), str(FIXTURES / RUN / "6"), "--format", "json"])
    assert far.exit_code == near.exit_code == 1, far.stderr
    assert same(far.stdout, "s3://fixtures/") == same(near.stdout, str(FIXTURES) + "/")


def test_ls_of_a_remote_step_request_count(s3):
    proc, requests = run_counted(s3, "ls", s3.url(STEP), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # tensorstore is not even imported; nothing else speaks
    assert json.loads(proc.stdout)["variables"]
    # the step's name (a LIST of it as a prefix), its folder listed (the sniff), every key under it
    # in one recursive LIST, the 4 small JSON files (checkpoint metadata, tree metadata,
    # sharding, model config), the joined database's manifest and one window of B+tree nodes,
    # process 0's manifest and one window of its nodes (the shards column)
    assert 1 <= requests <= 11, (requests, s3.proxy.lines)


@pytest.mark.parametrize("whole", [0, 1 << 20])
def test_remote_chunks_stream_from_their_zstd_frames_as_locally(s3, monkeypatch, whole):
    # nan_run's chunks lie in data files (not inline): a small one is fetched whole (its index
    # and frame in one read); with the threshold at 0 every frame streams through a FileWindow
    # over the remote file, 1 MiB a read, as a large chunk does. Bit for bit what the local copy streams.
    import numpy as np  # noqa: PLC0415

    from ckptinspect.formats import open_checkpoint  # noqa: PLC0415
    from ckptinspect.formats.orbax import step as orbax_step  # noqa: PLC0415

    monkeypatch.setattr(orbax_step, "REMOTE_WHOLE_CHUNK_BYTES", whole)
    rel = "orbax/nan_run/2"
    streamed = 0
    with open_checkpoint(s3.url(rel)) as far, open_checkpoint(str(FIXTURES / rel)) as near:
        assert [v.key for v in far.variables] == [v.key for v in near.variables]
        for v in far.variables:
            rows = far.source._arrays[v.key].rows  # noqa: SLF001
            streamed += rows is not None and any(r is not None and r.inline is None for r in rows)
            for elements in (5, 1 << 18):
                got = np.concatenate([np.array(b) for b in far.iter_blocks(v, elements)])
                want = np.concatenate([np.array(b) for b in near.iter_blocks(near[v.name], elements)])
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (v.key, elements)
    assert streamed >= 1


def test_tensorstores_remote_errors_name_neither_endpoint_nor_secrets(s3):
    # tensorstore's s3 kvstore (the arrays streaming does not cover, verify) configured from the
    # environment; what it says when a read fails reaches the user without the endpoint or keys
    import os  # noqa: PLC0415

    import tensorstore as ts  # noqa: PLC0415

    from ckptinspect.formats import _fs  # noqa: PLC0415
    from ckptinspect.formats.orbax import step as orbax_step  # noqa: PLC0415

    base = orbax_step._kvstore_base("s3://no-such-bucket-here/run/3/pytree")  # noqa: SLF001
    assert base["endpoint"] == os.environ["AWS_ENDPOINT_URL"] and base["bucket"] == "no-such-bucket-here"
    with pytest.raises(Exception) as info:  # noqa: PT011 - tensorstore raises ValueError for everything
        spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": base, "path": "params.w/"}}
        ts.open(spec, open=True, read=True).result()
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    text = orbax_step._message(info.value)  # noqa: SLF001
    assert endpoint.split("//")[1] not in text and os.environ["AWS_SECRET_ACCESS_KEY"] not in text, text
    assert "\n" not in text and "does not exist" in text and "tensorstore_spec" not in text, text
    assert endpoint.split("//")[1] not in _fs.remote_message(str(info.value))  # the spec's copy too, were it kept


@pytest.mark.parametrize("damage", ["tree-name-leaving", "garbage-manifest"])
def test_hostile_remote_steps_are_refused_as_locally(s3, tmp_path, damage):
    import shutil  # noqa: PLC0415

    from object_store import upload_tree  # noqa: PLC0415

    step = tmp_path / "3"
    shutil.copytree(FIXTURES / STEP, step)
    if damage == "tree-name-leaving":
        meta_path = step / "pytree" / "_METADATA"
        meta = json.loads(meta_path.read_text())
        tree = meta["tree_metadata"]
        tree["('trainable_variables', '..', 'etc', 'passwd')"] = tree.pop(next(iter(tree)))
        meta_path.write_text(json.dumps(meta))
    else:
        (step / "pytree" / "manifest.ocdbt").write_bytes(b"\x00" * 200)
    remote = f"fixtures/tmp/{tmp_path.name}/3"
    upload_tree(s3.endpoint, step, remote)
    far = runner.invoke(app, ["ls", f"s3://{remote}"])
    near = runner.invoke(app, ["ls", str(step)])
    assert far.exit_code == near.exit_code == 2, far.output
    assert far.stdout == "" and same(far.stderr, f"s3://{remote}") == same(near.stderr, str(step))
    assert far.stderr.count("\n") == 1 and far.stderr.startswith("Error: "), far.stderr
