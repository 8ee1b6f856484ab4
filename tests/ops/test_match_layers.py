"""The global ``layers`` stage (ops/match_layers.py) and the layout rules, on synthetic lists.

Pure functions over records: no checkpoint file, no TensorFlow. Side A is a checkpoint's
variables, side B a model's (Keras 3 names, each also answering to its ``layer/vars/N``
position, as ``ops/targets.py`` builds them).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptinspect.errors import UsageError
from ckptinspect.model import Variable
from ckptinspect.ops.match import layouts as lo
from ckptinspect.ops.match import matcher as mt
from ckptinspect.ops.match.layers import leaf_class, split_name, split_number


def src(*entries) -> list[mt.Item]:
    """Items of a checkpoint: ``(name, shape)`` in the file's order."""
    return mt.items([Variable(key=n, name=n, shape=tuple(s), dtype="float32", nbytes=4) for n, s in entries])


def model(*entries) -> list[mt.Item]:
    """Items of a model: ``(path, shape)`` in the model's order; a layer's variables also answer
    to their Keras 3 positions."""
    out, seen = [], {}
    for i, (path, shape) in enumerate(entries):
        layer = path.rpartition("/")[0]
        n = seen[layer] = seen.get(layer, -1) + 1
        out.append(mt.Item(path, path, tuple(shape), "float32", index=i, aliases=(f"{layer}/vars/{n}",)))
    return out


def dense(name, n_in, n_out):
    return [(f"{name}/kernel", (n_in, n_out)), (f"{name}/bias", (n_out,))]


def run(a, b, *, order=False, order_known=True, layout=lo.PLAIN, rules=None):
    return mt.match(a, b, (mt.layer_stage(layout, order=order, order_known=order_known),), rules=rules)


def pairs(result) -> dict[str, tuple[str, str]]:
    return {p.b.name: (p.a.name, p.how) for p in result.pairs}


# -- names -----------------------------------------------------------------------------------------
def test_names_split_into_layer_and_leaf():
    assert split_name("sequential/dense_1/kernel") == (("sequential", "dense_1"), "kernel")
    assert split_name("dense_1/dense_1/kernel") == (("dense_1",), "kernel")  # doubled layer/layer/
    assert split_name("bn/vars/3") == (("bn",), "vars/3")
    assert split_number("dense_12") == ("dense", 12) and split_number("dense") == ("dense", 0)
    assert split_number("conv2d") == ("conv2d", 0) and split_number("layer_with_weights-0") == ("layer_with_weights-0", 0)
    assert leaf_class("weights") == leaf_class("kernel") and "bias" in leaf_class("biases")
    assert leaf_class("scale") == leaf_class("gamma") and leaf_class("offset") == leaf_class("beta")


# -- Keras auto-numbering --------------------------------------------------------------------------
def test_keras2_numbering_offset_beats_equal_names_whose_shapes_also_fit():
    # Keras 2 numbers from 1, Keras 3 from 0. conv2d_1/conv2d_2 of the model have the same shapes
    # as conv2d_1/conv2d_2 of the file, so equal names fit too, but only the offset pairs all.
    a = src(*dense("conv2d_1", 1, 8), *dense("conv2d_2", 8, 8), *dense("conv2d_3", 8, 8), *dense("dense_1", 8, 4))
    b = model(*dense("conv2d", 1, 8), *dense("conv2d_1", 8, 8), *dense("conv2d_2", 8, 8), *dense("dense", 8, 4))
    result = run(a, b)
    got = pairs(result)
    assert {k: v[0] for k, v in got.items()} == {
        "conv2d/kernel": "conv2d_1/kernel", "conv2d/bias": "conv2d_1/bias",
        "conv2d_1/kernel": "conv2d_2/kernel", "conv2d_1/bias": "conv2d_2/bias",
        "conv2d_2/kernel": "conv2d_3/kernel", "conv2d_2/bias": "conv2d_3/bias",
        "dense/kernel": "dense_1/kernel", "dense/bias": "dense_1/bias",
    }
    assert {how for _, how in got.values()} == {"normalized-name"}
    assert result.only_a == result.only_b == () and result.ambiguous == ()
    assert any("4 layer(s) paired across Keras auto-numbering (conv2d_1 -> conv2d" in n for n in result.notes)


def test_offsets_with_a_model_prefix_and_a_session_that_numbered_from_5():
    a = src(*dense("dense_5", 3, 4), *dense("dense_6", 4, 2))
    b = model(*dense("sequential/dense", 3, 4), *dense("sequential/dense_1", 4, 2))
    got = pairs(run(a, b))
    assert got["sequential/dense/kernel"] == ("dense_5/kernel", "normalized-name")
    assert got["sequential/dense_1/bias"] == ("dense_6/bias", "normalized-name")


def test_equal_names_stay_exact():
    a = src(*dense("encoder/enc_dense", 8, 16), *dense("head", 16, 4))
    b = model(*dense("encoder/enc_dense", 8, 16), *dense("head", 16, 4))
    assert {how for _, how in pairs(run(a, b)).values()} == {"name"}


def test_a_tie_between_equal_names_and_an_offset_is_ambiguous():
    # One Dense(4,4) in the file, two in the model: is the file's dense_1 the model's dense
    # (Keras 2 numbering) or its dense_1 (equal names)? Nothing says.
    a = src(*dense("dense_1", 4, 4))
    b = model(*dense("dense", 4, 4), *dense("dense_1", 4, 4))
    result = run(a, b, order=True)
    assert result.pairs == () and len(result.ambiguous) == 1
    amb = result.ambiguous[0]
    assert {x.name for x in amb.a} == {"dense_1/kernel", "dense_1/bias"} and len(amb.b) == 4
    assert "pair equally well in more than one way" in amb.reason and "left unpaired rather than guessed" in amb.reason


def test_the_offset_of_the_rest_of_the_model_settles_a_tie():
    a = src(*dense("conv2d_1", 1, 8), *dense("conv2d_2", 8, 16), *dense("dense_1", 4, 4))
    b = model(*dense("conv2d", 1, 8), *dense("conv2d_1", 8, 16), *dense("dense", 4, 4), *dense("dense_1", 4, 4))
    result = run(a, b)
    got = pairs(result)
    assert got["dense/kernel"] == ("dense_1/kernel", "normalized-name") and "dense_1/kernel" not in got
    assert result.ambiguous == () and any("numbering offset of the rest of the model decided it" in n for n in result.notes)


# -- shapes are a hard constraint ----------------------------------------------------------------
def test_a_resized_layer_is_paired_for_the_report_and_nothing_is_guessed():
    a = src(*dense("conv2d_1", 1, 8), *dense("dense_1", 8, 32), *dense("dense_2", 32, 10))
    b = model(*dense("conv2d", 1, 8), *dense("dense", 8, 16), *dense("dense_1", 16, 10))  # dense resized
    result = run(a, b, order=True)
    fitting = [p for p in result.pairs if p.a.shape == p.b.shape]
    misfits = {(p.a.name, p.b.name) for p in result.pairs if p.a.shape != p.b.shape}
    assert {(p.a.name, p.b.name) for p in fitting} == {
        ("conv2d_1/kernel", "conv2d/kernel"), ("conv2d_1/bias", "conv2d/bias"), ("dense_2/bias", "dense_1/bias")}
    assert misfits == {("dense_1/kernel", "dense/kernel"), ("dense_1/bias", "dense/bias"), ("dense_2/kernel", "dense_1/kernel")}
    assert any("3 variable(s) paired by name have shapes that do not fit" in n for n in result.notes)


def test_a_name_pair_whose_shapes_differ_never_blocks_an_order_and_shape_pair():
    # The model's `frozen` was resized; its old shape now lives in `extra`, which the file
    # names nothing: layer order and shape pair them, and the model's `frozen` is missing.
    a = src(*dense("frozen", 16, 16), *dense("head", 16, 4))
    b = model(*dense("frozen", 16, 8), *dense("extra", 16, 16), *dense("head", 16, 4))
    result = run(a, b, order=True)
    got = pairs(result)
    assert got["extra/kernel"] == ("frozen/kernel", "layer-order") and got["extra/bias"] == ("frozen/bias", "layer-order")
    assert got["head/kernel"] == ("head/kernel", "name")
    assert [y.name for y in result.only_b] == ["frozen/kernel", "frozen/bias"]
    # Without layer order, the name pair stays, reported as a shape mismatch.
    plain = pairs(run(a, b))
    assert plain["frozen/kernel"] == ("frozen/kernel", "name") and "extra/kernel" not in plain


# -- layer order and shape -------------------------------------------------------------------------
def test_permuted_layers_with_distinct_shapes_pair_by_shape_whatever_their_order():
    # TF1 names sorted alphabetically (order unknown) against a model of other names.
    a = src(*dense("b_out", 8, 3), *dense("a_in", 4, 8), *dense("c_mid", 8, 6))
    b = model(*dense("hidden1", 4, 8), *dense("hidden2", 8, 6), *dense("logits", 8, 3))
    result = run(a, b, order=True, order_known=False)
    got = pairs(result)
    assert {k: v[0] for k, v in got.items()} == {
        "hidden1/kernel": "a_in/kernel", "hidden1/bias": "a_in/bias", "hidden2/kernel": "c_mid/kernel",
        "hidden2/bias": "c_mid/bias", "logits/kernel": "b_out/kernel", "logits/bias": "b_out/bias"}
    assert {how for _, how in got.values()} == {"layer-order"} and result.ambiguous == ()
    assert run(a, b).pairs == ()  # layer order is opt-in


def test_identical_shapes_stay_ambiguous_when_nothing_tells_them_apart():
    # Three Dense(8,8) in the file, two in the model: which one is left over is unknowable.
    a = src(*dense("x", 8, 8), *dense("y", 8, 8), *dense("z", 8, 8))
    b = model(*dense("p", 8, 8), *dense("q", 8, 8))
    result = run(a, b, order=True)
    assert result.pairs == () and len(result.ambiguous) == 1
    assert "3 layer(s) of A (x, y, z) and 2 of B (p, q) have the same shapes" in result.ambiguous[0].reason


def test_identical_shapes_pair_in_order_only_where_the_order_is_known():
    a = src(*dense("b_first", 8, 8), *dense("a_second", 8, 8))
    b = model(*dense("p", 8, 8), *dense("q", 8, 8))
    unknown = run(a, b, order=True, order_known=False)  # a TF1 checkpoint: names sorted, not created
    assert unknown.pairs == () and "the order of A's layers is not known" in unknown.ambiguous[0].reason
    known = pairs(run(a, b, order=True, order_known=True))  # a legacy .h5: layer_names order
    assert known["p/kernel"] == ("b_first/kernel", "layer-order") and known["q/kernel"] == ("a_second/kernel", "layer-order")
    # Keras numbering is creation order even where the file's order is not known.
    numbered = pairs(run(src(*dense("dense_2", 8, 8), *dense("dense_1", 8, 8)), b, order=True, order_known=False))
    assert numbered["p/kernel"][0] == "dense_1/kernel" and numbered["q/kernel"][0] == "dense_2/kernel"


def test_same_shapes_within_a_layer_follow_the_leaf_names():
    a = src(("bn/moving_variance", (16,)), ("bn/beta", (16,)), ("bn/gamma", (16,)), ("bn/moving_mean", (16,)))
    b = model(("norm/gamma", (16,)), ("norm/beta", (16,)), ("norm/moving_mean", (16,)), ("norm/moving_variance", (16,)))
    got = pairs(run(a, b, order=True, order_known=False))
    assert {k: v[0].split("/")[1] for k, v in got.items()} == {
        "norm/gamma": "gamma", "norm/beta": "beta", "norm/moving_mean": "moving_mean", "norm/moving_variance": "moving_variance"}


# -- spellings -------------------------------------------------------------------------------------
def test_tf1_and_pytorch_leaf_spellings():
    a = src(("fc1/weights", (4, 8)), ("fc1/biases", (8,)), ("ln/scale", (8,)), ("ln/offset", (8,)),
            ("bn/running_mean", (8,)), ("bn/running_var", (8,)))
    b = model(*dense("fc1", 4, 8), ("ln/gamma", (8,)), ("ln/beta", (8,)), ("bn/moving_mean", (8,)), ("bn/moving_variance", (8,)))
    got = pairs(run(a, b))
    assert got == {
        "fc1/kernel": ("fc1/weights", "normalized-name"), "fc1/bias": ("fc1/biases", "normalized-name"),
        "ln/gamma": ("ln/scale", "normalized-name"), "ln/beta": ("ln/offset", "normalized-name"),
        "bn/moving_mean": ("bn/running_mean", "normalized-name"),
        "bn/moving_variance": ("bn/running_var", "normalized-name"),
    }


def test_keras3_positions_and_output_suffixes():
    a = src(("dense_1/vars/0:0", (3, 2)), ("dense_1/vars/1", (2,)))
    b = model(*dense("dense", 3, 2))
    got = pairs(run(a, b))
    assert got == {"dense/kernel": ("dense_1/vars/0:0", "normalized-name"), "dense/bias": ("dense_1/vars/1", "normalized-name")}
    same = pairs(run(src(("dense/vars/0", (3, 2)), ("dense/vars/1", (2,))), b))
    assert {how for _, how in same.values()} == {"name"}  # the model's variables answer to their positions


def test_a_renamed_name_pair_reports_mapping_but_layer_order_does_not():
    a = src(*dense("old_head", 16, 4), *dense("anon", 4, 2))
    b = model(*dense("head", 16, 4), *dense("tail", 4, 2))
    result = run(a, b, order=True, rules=["^old_head/=head/"])
    got = pairs(result)
    assert got["head/kernel"] == ("old_head/kernel", "mapping") and got["tail/kernel"] == ("anon/kernel", "layer-order")


# -- layout rules ----------------------------------------------------------------------------------
def test_layout_fits():
    assert lo.fit((4, 3), (4, 3), "kernel") == lo.Fit("equal", (), (4, 3))
    assert lo.fit((3, 4), (4, 3), "kernel") is None
    dense_t = lo.Layout(transpose_dense=True)
    assert lo.fit((3, 4), (4, 3), "kernel", dense_t).kind == "transpose"
    assert lo.fit((3, 4), (4, 3), "embeddings", dense_t) is None  # an embedding table keeps its layout
    assert lo.fit((8,), (8,), "bias", dense_t).kind == "equal"
    oihw = lo.Layout(conv_layout="oihw")
    f = lo.fit((32, 3, 5, 7), (5, 7, 3, 32), "kernel", oihw)
    assert f.kind == "permute" and f.axes == (2, 3, 1, 0)
    assert lo.target_shape_of((32, 3, 5, 7), f) == (5, 7, 3, 32)
    assert lo.fit((16, 4, 3), (3, 4, 16), "kernel", oihw).axes == (2, 1, 0)  # Conv1D
    assert lo.fit((1, 1, 8), (8,), "bias") is None
    assert lo.fit((1, 1, 8), (8,), "bias", lo.Layout(allow_reshape=True)).kind == "reshape"
    assert lo.Layout(transpose_dense=True, allow_reshape=True).describe() == ("--transpose-dense", "--allow-reshape")
    with pytest.raises(UsageError, match="conv layout must be one of hwio, oihw. Received: 'nchw'"):
        lo.Layout(conv_layout="nchw")


def test_the_stage_compares_shapes_through_the_layout_rules():
    a = src(("fc/weight", (10, 64)), ("fc/bias", (10,)), ("conv/weight", (16, 3, 3, 3)), ("conv/bias", (16,)))
    b = model(("conv/kernel", (3, 3, 3, 16)), ("conv/bias", (16,)), *dense("fc", 64, 10))
    plain = run(a, b)  # only the biases fit; the kernels are paired by name for the report, as misfits
    assert {p.b.name for p in plain.pairs if p.a.shape == p.b.shape} == {"fc/bias", "conv/bias"}
    assert {p.b.name for p in plain.pairs if p.a.shape != p.b.shape} == {"fc/kernel", "conv/kernel"}
    rules = lo.Layout(transpose_dense=True, conv_layout="oihw")
    got = pairs(run(a, b, layout=rules))
    assert got == {"fc/kernel": ("fc/weight", "normalized-name"), "fc/bias": ("fc/bias", "name"),
                   "conv/kernel": ("conv/weight", "normalized-name"), "conv/bias": ("conv/bias", "name")}


def test_the_stage_imports_neither_tensorflow_nor_numpy():
    code = ("import sys, ckptinspect.ops.match.layers, ckptinspect.ops.match.layouts; "
            "print(sorted(m for m in ('tensorflow', 'numpy', 'h5py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- layer order: what is left on both sides is a shape mismatch, not missing and unused (issue 25) --
def test_by_order_pairs_the_one_layer_left_on_each_side_without_the_shape_check():
    a = src(*dense("encoder/enc_dense", 8, 16), *dense("frozen", 16, 16), *dense("head", 16, 4))
    b = model(*dense("fc1", 8, 16), *dense("fixed", 16, 16), *dense("classifier", 16, 5))
    result = run(a, b, order=True, order_known=False)
    got = pairs(result)
    assert got["fc1/kernel"] == ("encoder/enc_dense/kernel", "layer-order")
    assert got["classifier/kernel"] == ("head/kernel", "layer-order")  # [16,4] vs [16,5]: the caller reports it
    assert got["classifier/bias"] == ("head/bias", "layer-order")
    assert not result.only_a and not result.only_b
    assert "2 variable(s) paired by layer order have shapes that do not fit" in result.notes
    # Without layer order nothing pairs; two layers left on each side in an unknown order stay apart.
    assert not run(a, b).pairs
    two = run(src(*dense("x", 3, 4), *dense("y", 5, 6)), model(*dense("p", 3, 7), *dense("q", 5, 8)),
              order=True, order_known=False)
    assert not two.pairs and len(two.only_a) == len(two.only_b) == 4
