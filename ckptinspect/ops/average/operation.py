"""``average``: the mean (or exponential moving average) of several checkpoints of one run.

Which inputs: the checkpoints given, or the newest ``last`` ones a CheckpointManager / Saver
directory retains. They are put in step order (their step variable, else the number in their
name; inputs whose step is unknown keep the order given), the last one being the *newest*.

What is written (for TF checkpoints a TF bundle, through our own writer, without TensorFlow):

* every float variable (float16, bfloat16, float32, float64, float8) that is not metadata is
  averaged over the inputs, element by element, in float64, and rounded once to its stored
  dtype (numpy's ``astype``: round to nearest, ties to even);
* everything else (integers such as the step and the optimizer's iteration counter, strings,
  bools, complex values, metadata such as ``save_counter`` or Keras metric accumulators) is
  the newest's, copied byte for byte;
* the newest's object graph, byte for byte, so the output restores into the same model; with
  ``role="model"`` only the model's variables, under a pruned object graph re-keyed by their
  path through the model (as ``extract`` writes them).

The arithmetic, exactly (``x_1 .. x_N`` the inputs in step order, as float64):

* mean: ``s = 0.0; s = s + x_k`` for ``k = 1..N`` in that order, then ``s / N``: this is what
  ``np.mean(np.stack([x_1, ..., x_N]).astype(np.float64), axis=0)`` computes for a variable of
  two or more elements (numpy adds the stacked rows in order). For a variable of one element
  numpy reduces the N values with its pairwise summation, so those are computed by numpy's own
  ``np.mean`` over the N values. Either way the result equals
  ``np.mean(np.stack(inputs).astype(np.float64), axis=0).astype(dtype)`` bit for bit.
* ema (``decay`` d): ``e_1 = x_1``, ``e_k = d * e_{k-1} + (1 - d) * x_k`` (``1 - d`` computed once in
  float64, every operation in float64), the result ``e_N.astype(dtype)``: the newest weighs
  ``1 - d``, the oldest ``d ** (N - 1)``.

Values are streamed. From local TF bundles (the usual case) each averaged tensor is a
``TensorData.from_combined`` run: the writer cuts it into blocks of about 1 MiB per input that
worker threads read (checked against each input's recorded crc32c), combine and checksum, and
writes them in order (``formats.bundle_combine``; the same bits with any number of workers),
around the page cache on an I/O thread (``formats._direct_io``). Otherwise (a remote input) the
inputs' blocks are read in lock-step in the writer's thread. Memory is a few blocks per worker
plus the writer's staging buffers. Sliced (TF1 partitioned) variables
are averaged slice by slice and written with the newest's slices. Inputs that disagree on keys,
shapes, dtypes or slicing are refused with one error listing the disagreements.

The output is written under a temporary name, read back (keys, shapes, dtypes and the object
graph compared with the plan, every averaged tensor's recorded checksum compared with the
checksum of the values computed, its first 4 KiB read from the data file right after they were
written (by the writer's I/O thread; by this module for streamed ones) and compared with the
computed ones, every copied tensor's recorded checksum with the newest's) and only then renamed
into place. ``ckptinspect verify OUT`` re-reads every byte.

Keras ``.weights.h5`` files of one run average into a ``.weights.h5``, legacy ``.h5`` files (full
models or weights, ``tf_keras`` or Keras 3's legacy writer) into a ``.h5`` (:mod:`.keras_h5`).

Inputs of any other format the tool reads whose values are not TF bundle runs (the steps of a Keras
3 Orbax run, read through tensorstore; safetensors, torch, npz files) average into a name-based TF
bundle keyed by the variables' names, as ``extract`` writes one from such a source: every value
streamed through the source's ``iter_blocks`` (the same arithmetic), copied ones (integers, the
optimizer's iteration count) read from the newest and checked against its values' checksum.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ... import _atomic
from ..._parallel import ordered_map
from ... import model as m
from ...errors import CkptError, CorruptCheckpointError, UsageError, VerificationError
from ..extract.to_tf import name_keys
from ..sources import files_size
from ...formats import (
    TO_H5,
    TO_WEIGHTS_H5,
    capabilities,
    output_kind,
    OutputTensor,
    StoredBytes,
    TensorData,
    copy_tensor,
    list_directory,
    object_graph_bytes,
    open_checkpoint,
    save_bundle_native,
    spec_of,
    stored_slice_blocks,
)
from .arithmetic import BLOCK_ELEMENTS, Combiner, Computed, averaged_dtype, lockstep
from .keras_h5 import average_weights_h5
from .report import (
    ACTION_AVERAGED,
    ACTION_COPIED,
    ACTION_DROPPED,
    METHOD_EMA,
    METHOD_MEAN,
    AverageInput,
    AveragedVariable,
    AverageReport,
)

__all__ = ["average", "AverageReport", "AverageInput", "AveragedVariable", "averaged_dtype"]

MAX_LISTED = 5  # disagreements named in the error
SPOT_READERS = 4  # threads reading the first values back (waiting on the device, not the CPU)
TF_NEEDS = ("tf-restorable", "stored-bytes")  # a TF bundle: values streamed from its data files (not a V1 table)
TF_RESTORABLE = "tf-restorable"  # keys and object graph a TF model restores: kept as they are
WRITABLE_DTYPES = frozenset(m.NUMERIC_DTYPES) | {"string"}  # what a TF bundle holds
KIND_TF2 = "tf2-object"
ROLE_CHOICES = (m.ROLE_MODEL,)
WRITES = ("average writes a TF prefix (no suffix, .ckpt or .ckpt-N), a .weights.h5 from .weights.h5 inputs or a"
          " .h5 from legacy .h5 inputs")
# Keras HDF5 inputs: the output kind each format averages into (the newest file's layout, copied).
KERAS_OUTPUTS = {m.FORMAT_KERAS_WEIGHTS_H5: TO_WEIGHTS_H5, m.FORMAT_KERAS_H5: TO_H5}

Progress = Callable[[int, int, m.Variable], None]


# -- inputs ----------------------------------------------------------------------------------
def _retained(directory: str, last: int) -> list[m.RetainedCheckpoint]:
    """The newest ``last`` checkpoints ``directory`` retains, oldest first."""
    listing = list_directory(directory)
    if listing.v1 is not None:
        raise UsageError(f"{directory}: holds TF V1 checkpoint files; average reads TF bundles (.index + .data)")
    present = [c for c in listing.checkpoints if c.exists]
    retained = [c for c in present if c.in_state_file] or present
    positions, axis = m.run_positions([c.step for c in retained], [c.number for c in retained])
    if axis is not None:
        retained = [c for _, _, c in sorted(zip(positions, range(len(retained)), retained))]
    if len(retained) < last:
        raise UsageError(
            f"{directory}: retains {len(retained)} checkpoint{'s' if len(retained) != 1 else ''}; --last asks for {last}"
        )
    return retained[-last:]


def _check_arguments(out: str, ema: float | None, role: str | None, last: int | None, sources: Sequence[str]) -> None:
    if ema is not None and not (isinstance(ema, (int, float)) and math.isfinite(ema) and 0.0 <= ema <= 1.0):
        raise UsageError(f"the EMA decay is a number from 0 to 1. Received: {ema!r}")
    if role is not None and role not in ROLE_CHOICES:
        raise UsageError(f"average --role takes 'model' (the model's variables only). Received: {role!r}")
    if last is not None:
        if isinstance(last, bool) or not isinstance(last, int) or last < 1:
            raise UsageError(f"--last takes a number of checkpoints, at least 1. Received: {last!r}")
        if len(sources) != 1:
            raise UsageError(f"--last N takes one checkpoint directory. Received: {len(sources)} paths")
    elif not sources:
        raise UsageError("average needs at least one checkpoint (or --last N DIR)")
    if output_kind(out) not in KERAS_OUTPUTS.values():
        error = _atomic.prefix_suffix_error(out, WRITES, "")
        if error is not None:
            raise error


def _refuse_series(sources: Sequence[str]) -> None:
    """A directory of checkpoints given as one source would be its newest checkpoint alone: say
    how to average what it holds instead (a path that cannot be told apart is left to opening)."""
    for source in sources:
        try:
            series = spec_of(source).can("series")
        except CkptError:
            continue
        if series:
            held = [c for c in list_directory(source, steps=False).checkpoints if c.exists]
            raise UsageError(
                f"{source}: a directory of {len(held)} checkpoint{'s' if len(held) != 1 else ''}, not one; "
                f"average --last {max(len(held), 1)} {source} averages them (or name the checkpoints)"
            )


def _refuse_repeats(paths: Sequence[str], ckpts: Sequence[m.Checkpoint]) -> None:
    """One checkpoint named twice (``ckpt-6`` and ``ckpt-6.index``) would weigh double in the mean."""
    seen: dict[str, str] = {}
    for path, ckpt in zip(paths, ckpts):
        key = os.path.realpath(ckpt.path)
        if key in seen:
            raise UsageError(f"{path}: the same checkpoint as {seen[key]} ({ckpt.path}); each checkpoint counts once")
        seen[key] = path


def _describe(ckpt: m.Checkpoint) -> str:
    place = m.place_in_run(ckpt.step, ckpt.number, ckpt.number_source)
    return f"{ckpt.path} ({place})" if place else ckpt.path


def _check_readable(ckpt: m.Checkpoint) -> None:
    can = capabilities(ckpt.format)
    if TF_RESTORABLE in can and not can.issuperset(TF_NEEDS):
        raise UsageError(f"{ckpt.path}: is {ckpt.format}; average reads TF bundle checkpoints (.index + .data), not"
                         " V1 tables")
    if TF_RESTORABLE not in can and ckpt.format not in KERAS_OUTPUTS:  # name-based output: values encoded
        for v in ckpt.variables:
            if v.dtype not in WRITABLE_DTYPES:
                raise UsageError(f"{ckpt.path}: '{m.display_name(v.name)}' has dtype {v.dtype}, which a TF bundle"
                                 " cannot hold")
    unreadable = ckpt.info.get("unreadable") or {}
    if unreadable:
        key = next(iter(unreadable))
        raise CorruptCheckpointError(
            f"{ckpt.path}: cannot read '{m.display_name(key)}': {unreadable[key]} (`ckptinspect verify` reports it)"
        )
    graph = ckpt.info.get("object_graph") or {}
    if graph.get("error"):
        raise CorruptCheckpointError(
            f"{ckpt.path}: the object graph cannot be read ({graph['error']}); average keeps it and needs it whole"
        )


def _disagreements(ckpts: Sequence[m.Checkpoint]) -> list[str]:
    """Every way the inputs disagree with the newest: kind, keys, shapes, dtypes, slicing."""
    newest = ckpts[-1]
    ref = {v.key: v for v in newest.variables}
    problems: list[str] = []
    for ckpt in ckpts[:-1]:
        here = {v.key: v for v in ckpt.variables}
        who = _describe(ckpt)
        if ckpt.format != newest.format:
            problems.append(f"{who} is {ckpt.format}, the newest is {newest.format}")
        elif ckpt.info.get("kind") != newest.info.get("kind"):
            problems.append(f"{who} is {ckpt.info.get('kind')}, the newest is {newest.info.get('kind')}")
        for key in ref.keys() - here.keys():
            problems.append(f"'{m.display_name(key)}' is missing in {who}")
        for key in here.keys() - ref.keys():
            problems.append(f"'{m.display_name(key)}' is only in {who}")
        for key in ref.keys() & here.keys():
            a, b = here[key], ref[key]
            if a.shape != b.shape:
                problems.append(f"'{m.display_name(key)}': shape {m.format_shape(a.shape)} in {who}, "
                                f"{m.format_shape(b.shape)} in the newest")
            elif a.dtype != b.dtype:
                problems.append(f"'{m.display_name(key)}': {a.dtype} in {who}, {b.dtype} in the newest")
            elif [(s.starts, s.lengths) for s in a.slices] != [(s.starts, s.lengths) for s in b.slices]:
                problems.append(f"'{m.display_name(key)}': sliced differently in {who} and the newest")
    return sorted(problems, key=lambda p: p.lower()) if len(ckpts) > 2 else problems


def _refuse_disagreements(ckpts: Sequence[m.Checkpoint]) -> None:
    problems = _disagreements(ckpts)
    if problems:
        shown = "; ".join(problems[:MAX_LISTED])
        more = f" (+{len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
        raise UsageError(
            f"the checkpoints do not agree ({len(problems)} difference{'s' if len(problems) != 1 else ''}): {shown}{more}"
        )


# -- the operation -----------------------------------------------------------------------------
class _Plan:
    """The output of one average: its tensors (streamed), what each one should read back as."""

    def __init__(self, ckpts: Sequence[m.Checkpoint], decay: float | None, role: str | None,
                 progress: Progress | None):
        self.ckpts = ckpts
        self.newest = ckpts[-1]
        self.decay = decay
        self.role = role
        self.progress = progress
        self.combiner = Combiner(len(ckpts), decay)
        self.computed: dict[str, list[Computed]] = {}  # output key -> per stored run
        self.copied: dict[str, OutputTensor] = {}  # output key -> the newest's stored runs
        self.variables: list[AveragedVariable] = []
        self.blob: bytes | None = None
        self.object_graph: dict[str, Any] | None = None
        self.notes: list[str] = []
        self.done = 0
        self.total = 0

    def _key_map(self) -> dict[str, str]:
        newest = self.newest
        kept = [v for v in newest.variables if self.role is None or v.role == self.role]
        if not kept:
            raise UsageError(f"{newest.path}: no {self.role} variables to write")
        if TF_RESTORABLE not in capabilities(newest.format):
            return self._name_keys(kept)
        blob = object_graph_bytes(newest) if newest.info.get("kind") == KIND_TF2 else None
        if blob is None:
            if self.role is not None:
                self.notes.append("name-based (TF1) checkpoint: the model's keys kept as they are")
            self.notes.append("name-based (TF1) checkpoint: restore with tf.compat.v1.train.Saver over the model's variables")
            return {v.key: v.key for v in kept}
        if self.role is None:
            self.blob = blob
            nodes = (newest.info.get("object_graph") or {}).get("nodes")
            self.object_graph = {"pruned": False, "nodes": nodes, "source_nodes": nodes}
            self.notes.append("the newest's object graph kept byte for byte: restore into the same objects as the inputs")
            return {v.key: v.key for v in kept}
        from ...formats import prune_object_graph  # noqa: PLC0415 - imports TensorFlow (for now)

        pruned = prune_object_graph(blob, {v.key for v in kept})
        self.blob = pruned.blob
        self.object_graph = {"pruned": True, "nodes": pruned.num_nodes, "source_nodes": pruned.source_nodes,
                             "root_children": list(pruned.root_children)}
        if len(pruned.root_children) == 1:
            self.notes.append(f"restore with tf.train.Checkpoint({pruned.root_children[0]}=model).read(OUT)")
        return pruned.key_map

    def _name_keys(self, kept: list[m.Variable]) -> dict[str, str]:
        """A source TF cannot restore (an Orbax step, safetensors, torch): keys are the variables'
        names, as ``extract`` writes such a source (:func:`~ckptinspect.ops.extract.to_tf.name_keys`)."""
        keys, note = name_keys(self.newest, kept)
        self.notes.append(note)
        return keys

    def tensors(self) -> list[OutputTensor]:
        key_map = self._key_map()
        newest = self.newest
        out: list[OutputTensor] = []
        for v in newest.variables:
            key = key_map.get(v.key)
            action = ACTION_DROPPED if key is None else ACTION_AVERAGED if averaged_dtype(v) else ACTION_COPIED
            self.variables.append(AveragedVariable(v.name, v.key, key, v.role, v.shape, v.dtype, v.nbytes, action))
        self.total = sum(1 for p in self.variables if p.action == ACTION_AVERAGED)
        by_key = {v.key: v for v in newest.variables}
        for p in sorted(self.variables, key=lambda p: newest.storage_order(by_key[p.key])):
            v = by_key[p.key]
            if p.action == ACTION_COPIED:
                tensor = copy_tensor(newest, v, p.output_key)
                self.copied[p.output_key] = tensor
                out.append(tensor)
            elif p.action == ACTION_AVERAGED:
                out.append(self._averaged(v, p.output_key))
        return out

    def _averaged(self, v: m.Variable, key: str) -> OutputTensor:
        dtype = m.numpy_dtype(v.dtype)
        if dtype is None:  # pragma: no cover - every float dtype has one (ml_dtypes comes with TF)
            raise UsageError(f"'{m.display_name(v.key)}': cannot average {v.dtype} values here")
        combined = self._combined(v, key)
        if combined is not None:
            return combined
        if not v.slices:
            record = Computed()
            self.computed[key] = [record]
            streams = lambda: [c.iter_blocks(c[v.key], BLOCK_ELEMENTS) for c in self.ckpts]  # noqa: E731
            return OutputTensor.whole(key, TensorData.from_blocks(
                v.dtype, v.shape, lambda: self._blocks(v, streams, dtype, record, last=True)))
        per_input = []
        for c in self.ckpts:
            parts = stored_slice_blocks(c, c[v.key], BLOCK_ELEMENTS)
            if parts is None:
                raise UsageError(f"{c.path}: '{m.display_name(v.key)}' is sliced and cannot be streamed from its files"
                                 " (a remote checkpoint?)")
            if [(p.starts, p.lengths) for p in parts] != [(s.starts, s.lengths) for s in v.slices]:
                raise UsageError(f"{c.path}: '{m.display_name(v.key)}' is stored in other slices than the newest's")
            per_input.append(parts)
        slices = []
        records = []
        for i, part in enumerate(per_input[-1]):
            record = Computed()
            records.append(record)
            streams = lambda i=i: [parts[i].blocks() for parts in per_input]  # noqa: E731
            data = TensorData.from_blocks(
                v.dtype, part.shape,
                lambda streams=streams, record=record, i=i: self._blocks(
                    v, streams, dtype, record, last=i == len(per_input[-1]) - 1),
            )
            slices.append((part.starts, part.lengths, data))
        self.computed[key] = records
        return OutputTensor(key, v.dtype, v.shape, slices=tuple(slices))

    def _combined(self, v: m.Variable, key: str) -> OutputTensor | None:
        """The averaged tensor computed from the inputs' stored bytes on worker threads (every
        input a local TF bundle); None when an input cannot be read that way."""
        copies = [copy_tensor(c, c[v.key]) for c in self.ckpts]
        runs = [[t.data] if t.data is not None else [s[2] for s in t.slices] for t in copies]
        extents = [[s[:2] for s in t.slices] for t in copies]
        if any(d.stored is None for r in runs for d in r) or any(e != extents[-1] for e in extents):
            return None
        newest = copies[-1]
        records = []
        datas = []
        label = m.display_name(v.key)
        for i, data in enumerate(runs[-1]):
            record = Computed()
            records.append(record)
            datas.append(TensorData.from_combined(
                v.dtype, data.shape, [r[i] for r in runs], self._block_fn(v),
                labels=[label] * len(runs), written=self._written_fn(v, record, last=i == len(runs[-1]) - 1),
                read_back=lambda record=record: setattr(record, "read_back", True)))
        self.computed[key] = records
        if newest.data is not None:
            return OutputTensor.whole(key, datas[0])
        return OutputTensor(key, v.dtype, v.shape, slices=tuple((s[0], s[1], d) for s, d in zip(newest.slices, datas)))

    def _block_fn(self, v: m.Variable) -> Callable[[int, Sequence[np.ndarray], np.ndarray], None]:
        """One block of the mean (or EMA), on a worker thread (the writer reads the first bytes
        written back and compares them with the ones computed)."""
        combiner, size = self.combiner, v.size

        def fn(start: int, blocks: Sequence[np.ndarray], out: np.ndarray) -> None:
            combiner.combine(blocks, out.dtype, size, out=out)

        return fn

    def _written_fn(self, v: m.Variable, record: Computed, last: bool) -> Callable[[int], None]:
        def written(crc32c: int) -> None:
            record.written_crc32c = crc32c
            record.done = True
            if last:
                self.done += 1
                if self.progress is not None:
                    self.progress(self.done, self.total, v)

        return written

    def _blocks(self, v: m.Variable, streams: Callable[[], list[Iterator[np.ndarray]]], dtype: np.dtype,
                record: Computed, last: bool) -> Iterator[np.ndarray]:
        label = f"'{m.display_name(v.key)}'"
        for blocks in lockstep(streams(), label):
            result = self.combiner.combine(blocks, dtype, v.size)
            record.add(result)
            yield result
        record.done = True
        if last:
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, self.total, v)

    # -- read-back ---------------------------------------------------------------------------
    def check(self, tmp: str, out: str) -> int:
        """Read the written bundle back; returns the tensors checked. Raises VerificationError."""

        def fail(what: str) -> VerificationError:
            return VerificationError(f"{out}: read-back check failed: {what}")

        kept = [p for p in self.variables if p.output_key is not None]
        checked = 0
        spots: list[tuple[str, StoredBytes, bytes]] = []
        with open_checkpoint(tmp) as written:
            by_key = {v.key: v for v in written.variables}
            if set(by_key) != {p.output_key for p in kept}:
                raise fail(f"the keys written are not the {len(kept)} planned")
            if object_graph_bytes(written) != self.blob:
                raise fail("the object graph was not written as planned")
            for p in kept:
                w = by_key[p.output_key]
                if (w.shape, w.dtype) != (p.shape, p.dtype):
                    raise fail(f"'{m.display_name(p.output_key)}' is {w.dtype} {m.format_shape(w.shape)}, "
                               f"planned {p.dtype} {m.format_shape(p.shape)}")
                runs = _stored_runs(copy_tensor(written, w))
                stored = [r.crc32c if r is not None else None for r in runs]
                if p.action == ACTION_COPIED:
                    source = [r.crc32c if r is not None else None for r in _stored_runs(self.copied[p.output_key])]
                    if None in source:  # streamed from the newest: the checksum of its values (strings: the values)
                        crc = _values_crc32c(self.newest, self.newest[p.key])
                        same = (stored == [crc] if crc is not None else
                                np.array_equal(written.read(w), self.newest.read(self.newest[p.key])))
                    else:
                        same = stored == source
                    if not same:
                        raise fail(f"'{m.display_name(p.output_key)}' is not the newest's bytes")
                else:
                    records = self.computed[p.output_key]
                    if not all(r.done for r in records) or stored != [r.crc32c for r in records]:
                        raise fail(f"'{m.display_name(p.output_key)}' does not hold the values computed")
                    if any(r is None for r in runs):  # pragma: no cover - our own bundle: stored runs
                        raise fail(f"'{m.display_name(p.output_key)}' cannot be read back")
                    for run, record in zip(runs, records):
                        if record.written_crc32c is None:  # streamed in this thread: read its first values here
                            spots.append((p.output_key, run, record.spot))
                        elif not record.read_back:  # computed on workers: the writer read them back
                            raise fail(f"'{m.display_name(p.output_key)}': its first values were not read back")
                checked += 1
        # the first values of the averaged runs streamed in this thread, read from the data file
        heads = ordered_map(lambda s: s[1].read(0, len(s[2])), spots, SPOT_READERS)
        for (key, _, spot), head in zip(spots, heads):
            if head != spot:
                raise fail(f"'{m.display_name(key)}': its first values are not the ones computed")
        return checked


def _values_crc32c(ckpt: m.Checkpoint, var: m.Variable) -> int | None:
    """The masked crc32c of a variable's values as a bundle records it (numeric values)."""
    if var.dtype not in m.NUMERIC_DTYPES:
        return None
    record = Computed()
    for block in ckpt.iter_blocks(var, BLOCK_ELEMENTS):
        record.add(np.ascontiguousarray(block))
    return record.crc32c


def _stored_runs(tensor: OutputTensor) -> list[StoredBytes | None]:
    """Where each stored run of a tensor copied from a bundle lies (with its recorded checksum)."""
    datas = [tensor.data] if tensor.data is not None else [s[2] for s in tensor.slices]
    return [d.stored for d in datas]


def _file_bytes(ckpts: Iterable[m.Checkpoint]) -> int:
    return files_size(f for c in ckpts for f in c.files())


def average(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    last: int | None = None,
    ema: float | None = None,
    role: str | None = None,
    force: bool = False,
    max_shard_bytes: int | None = None,
    progress: Progress | None = None,
) -> AverageReport:
    """Average several checkpoints of one run into one TF checkpoint at ``out``.

    Args:
        sources: The checkpoints (TF prefixes, ``.index`` files, directories resolving to
            one), or with ``last`` one checkpoint directory.
        out: The output prefix (no suffix, ``.ckpt`` or ``.ckpt-N``); a ``.weights.h5`` for Keras 3
            ``.weights.h5`` inputs, a ``.h5`` for legacy ``.h5`` inputs.
        last: Average the newest ``last`` checkpoints the directory ``sources`` retains.
        ema: An exponential moving average with this decay (0 to 1) in step order instead of
            the arithmetic mean (see the module's documentation for the exact formulas).
        role: ``"model"``: write only the model's variables (the object graph pruned to them).
        force: Replace an earlier output of the same kind.
        max_shard_bytes: Data bytes per output shard (None: one shard).
        progress: Called as ``progress(done, total, variable)`` after each averaged tensor.

    Returns:
        The :class:`AverageReport`.

    Raises:
        UsageError: Bad arguments, inputs that are neither TF bundles nor Keras HDF5 files, or
            inputs that disagree on keys, shapes, dtypes or slicing (one error listing them).
        OutputExistsError: ``out`` exists and ``force`` is not set.
        CheckpointNotFoundError, NotACheckpointError, CorruptCheckpointError: Bad inputs.
        VerificationError: The output did not read back as computed (nothing is left behind).
    """
    start = time.perf_counter()
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    sources = [os.fspath(s) for s in sources]
    out = os.fspath(out)
    _check_arguments(out, ema, role, last, sources)
    if last is None:
        _refuse_series(sources)
    listed = _retained(sources[0], last) if last is not None else []
    paths = [c.path for c in listed] if last is not None else sources
    numbers = {c.path: c.number for c in listed}  # a series' numbers, from the names (the listing's)
    ckpts: list[m.Checkpoint] = []
    try:
        _open_inputs(paths, numbers, ckpts)
        _refuse_repeats(paths, ckpts)
        ckpts, notes = _in_run_order(ckpts)
        _refuse_disagreements(ckpts)
        protected = [*sources, *(c.path for c in ckpts), *(f for c in ckpts for f in c.files())]
        common = dict(
            method=METHOD_MEAN if ema is None else METHOD_EMA, decay=None if ema is None else float(ema), role=role,
            inputs=tuple(AverageInput(c.path, c.step, newest=i == len(ckpts) - 1, number=c.number,
                                      number_source=c.number_source) for i, c in enumerate(ckpts)),
            input_file_bytes=_file_bytes(ckpts),
        )
        if _output_kind(out, ckpts) in KERAS_OUTPUTS.values():
            variables, verified, size = average_weights_h5(ckpts, out, ema, role, force, protected, progress)
            return AverageReport(
                output=out, files=(out,), **common, variables=tuple(variables), output_file_bytes=size, num_shards=1,
                verified=verified, seconds=time.perf_counter() - start, object_graph=None,
                notes=(*notes, "the newest file with its averaged datasets rewritten: load with model.load_weights(OUT)"),
            )
        plan = _Plan(ckpts, ema, role, progress)
        checked: list[int] = []
        summary = save_bundle_native(
            out, plan.tensors(), force=force, protected=protected, object_graph=plan.blob,
            max_shard_bytes=max_shard_bytes, check=lambda tmp: checked.append(plan.check(tmp, out)),
        )
        return AverageReport(
            output=out, files=tuple(sorted(_atomic.prefix_files(out))), **common, variables=tuple(plan.variables),
            output_file_bytes=summary.data_bytes + summary.index_bytes, num_shards=summary.num_shards,
            verified=checked[0] if checked else 0, seconds=time.perf_counter() - start,
            object_graph=plan.object_graph, notes=tuple(notes + plan.notes),
        )
    finally:
        for c in ckpts:
            c.close()


def _open_inputs(paths: Sequence[str], numbers: dict[str, int | None], ckpts: list[m.Checkpoint]) -> None:
    """Open every input into ``ckpts`` (the caller closes them, also on error), a series'
    number from its name where the checkpoint has none, each checked readable."""
    for path in paths:
        ckpt = open_checkpoint(path)
        if ckpt.number is None and numbers.get(path) is not None:
            ckpt = dataclasses.replace(ckpt, number=numbers[path], number_source="name")
        ckpts.append(ckpt)
        _check_readable(ckpt)


def _in_run_order(ckpts: list[m.Checkpoint]) -> tuple[list[m.Checkpoint], list[str]]:
    """The inputs in run order (by step, else by the numbers in their names, else as given),
    and a note when a step is unknown."""
    positions, axis = m.run_positions([c.step for c in ckpts], [c.number for c in ckpts])
    if axis is not None:
        ckpts = [c for _, _, c in sorted(zip(positions, range(len(ckpts)), ckpts))]
    notes = []
    if axis != "step":
        notes.append("a step is unknown: inputs taken "
                     + ("in the order of the numbers in their names" if axis else "in the order given")
                     + ", the last one as the newest")
    return ckpts, notes


def _output_kind(out: str, ckpts: Sequence[m.Checkpoint]) -> str:
    """The output's kind (:func:`output_kind`), refused unless it is the inputs' own kind."""
    kind = output_kind(out)
    h5_out = kind in KERAS_OUTPUTS.values()
    if kind != KERAS_OUTPUTS.get(ckpts[-1].format, None if h5_out else kind):
        raise UsageError(f"{out}: .weights.h5 inputs average into a .weights.h5 output, legacy .h5 inputs into a"
                         f" .h5, TF checkpoints and other sources into a TF prefix (the inputs are {ckpts[-1].format})")
    return kind

