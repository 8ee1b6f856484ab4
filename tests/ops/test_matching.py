"""The one matcher (ops/matching.py): every stage, --map semantics, ambiguity, on synthetic lists.

Pure functions over records: no checkpoint file, no TensorFlow. The name spellings are the ones
the readers really produce for the committed fixtures (``ls`` of fixtures/run/ckpt-8,
fixtures/keras/model.weights.h5, fixtures/keras/keras2_tf/ckpt).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptinspect.errors import UsageError
from ckptinspect.model import ROLE_OPTIMIZER, Variable
from ckptinspect.ops.match import matcher as mt
from ckptinspect.ops.match.mapping import apply_rules, parse_mapping

ATTR = "/.ATTRIBUTES/VARIABLE_VALUE"


def var(key, name=None, shape=(2,), dtype="float32", role="model", graph_path=None) -> Variable:
    return Variable(key=key, name=name or key, shape=tuple(shape), dtype=dtype, nbytes=4, role=role, graph_path=graph_path)


def pairs_of(result: mt.Match) -> set[tuple[str, str, str]]:
    return {(p.a.key, p.b.key, p.how) for p in result.pairs}


# -- names -----------------------------------------------------------------------------------------
def test_normalize_name_drops_format_wrappers_only():
    assert mt.normalize_name("enc/w" + ATTR) == "enc/w"
    assert mt.normalize_name("dense/kernel:0") == "dense/kernel"
    assert mt.normalize_name("a/.ATTRIBUTES/b") == "a/b"
    assert mt.normalize_name("/top/") == "top"
    assert mt.normalize_name("dense_1/kernel") == "dense_1/kernel"  # Keras numbering is a name


def test_name_stage_pairs_equal_normalised_names_across_formats():
    a = mt.items([var("dense/kernel" + ATTR), var("dense/bias:0")])
    b = mt.items([var("dense/bias"), var("dense/kernel")])
    result = mt.match(a, b, mt.NAME_STAGES)
    assert pairs_of(result) == {("dense/kernel" + ATTR, "dense/kernel", "name"), ("dense/bias:0", "dense/bias", "name")}
    assert result.only_a == result.only_b == () and result.notes == ()


def test_prefix_stage_drops_an_outer_prefix_one_side_has():
    a = mt.items([var("k2", "enc_dense/kernel"), var("b2", "enc_dense/bias"), var("h", "head/kernel")])
    b = mt.items([var("k3", "encoder/enc_dense/kernel"), var("b3", "encoder/enc_dense/bias"), var("h3", "head/kernel")])
    result = mt.match(a, b, mt.NAME_STAGES)
    assert pairs_of(result) == {("h", "h3", "name"), ("k2", "k3", "prefix"), ("b2", "b3", "prefix")}
    assert result.notes == ("dropped the prefix 'encoder/' from 2 variable name(s) of B to align them",)
    assert {p.name for p in result.pairs if p.how == "prefix"} == {"enc_dense/kernel", "enc_dense/bias"}


def test_positional_stage_follows_keras_creation_order_and_checks_shapes():
    a = mt.items([var("g", "bn/gamma", (16,)), var("b", "bn/beta", (16,)), var("k", "head/kernel", (16, 4)),
                  var("c", "head/bias", (4,))])
    b = mt.items([var("p1", "bn/vars/1", (16,)), var("p0", "bn/vars/0", (16,)), var("q1", "head/vars/1", (4,)),
                  var("q0", "head/vars/0", (16, 4))])
    result = mt.match(a, b, mt.NAME_STAGES)
    assert pairs_of(result) == {("g", "p0", "positional"), ("b", "p1", "positional"), ("k", "q0", "positional"),
                                ("c", "q1", "positional")}
    assert result.notes[0].startswith("matched 4 positional Keras 3 name(s) of B")


def test_positional_stage_refuses_a_layer_it_cannot_order():
    # Two variables of the same shape whose names say nothing about Keras creation order.
    a = mt.items([var("x", "layer/alpha", (3,)), var("y", "layer/beta2", (3,))])
    b = mt.items([var("p0", "layer/vars/0", (3,)), var("p1", "layer/vars/1", (4,))])
    result = mt.match(a, b, mt.NAME_STAGES)
    assert result.pairs == () and len(result.only_a) == 2
    assert "could not match the positional variables of 1 layer(s) of B" in result.notes[-1]


def test_optimizer_positions_pair_with_a_tf_checkpoints_optimizer_slots():
    a = mt.items([
        var("optimizer/_iterations" + ATTR, "adam/iteration", (), "int64", ROLE_OPTIMIZER),
        var("optimizer/_variables/2" + ATTR, "adam/k_momentum", (8, 16), role=ROLE_OPTIMIZER),
        var("optimizer/_variables/3" + ATTR, "adam/k_velocity", (8, 16), role=ROLE_OPTIMIZER),
    ])
    b = mt.items([var(f"optimizer/vars/{i}", shape=s, dtype=d, role=ROLE_OPTIMIZER)
                  for i, (s, d) in enumerate([((), "int64"), ((), "float32"), ((8, 16), "float32"), ((8, 16), "float32")])])
    result = mt.match(a, b, mt.NAME_STAGES)
    assert {(p.a.name, p.b.name) for p in result.pairs} == {
        ("adam/iteration", "optimizer/vars/0"), ("adam/k_momentum", "optimizer/vars/2"), ("adam/k_velocity", "optimizer/vars/3")}
    assert {p.how for p in result.pairs} == {"optimizer-positional"}
    assert [y.key for y in result.only_b] == ["optimizer/vars/1"]


# -- identity stages ---------------------------------------------------------------------------------
def test_key_stage_first_then_names_for_what_is_left():
    a = [var("w", "w"), var("layers/dense/vars/0", "head/vars/0", (4,))]
    b = [var("w", "w"), var("layers/dense_1/vars/0", "head/vars/0", (4,))]
    result = mt.align(a, b, same_format=True)
    assert result.method == "key"
    assert pairs_of(result) == {("w", "w", "key"), ("layers/dense/vars/0", "layers/dense_1/vars/0", "name")}
    assert result.notes == ("1 pair(s) whose keys differ aligned by readable name",)


def test_keys_that_mean_other_variables_lose_to_names():
    # Two TF checkpoints of one model through different object graphs: key 0 is `a` in one
    # and `b` in the other, and only names pair everything.
    a = [var("opt/0", "a", (2,)), var("opt/1", "b", (3,)), var("x", "c", (4,))]
    b = [var("opt/0", "b", (3,)), var("y", "a", (2,)), var("z", "c", (4,))]
    result = mt.align(a, b, same_format=True)
    assert result.method == "name" and result.notes[0] == "keys differ (1 shared); aligned by readable name instead (3 pairs)"
    assert {(p.a.name, p.b.name) for p in result.pairs} == {("a", "a"), ("b", "b"), ("c", "c")}


def test_unaligned_names_get_one_note_pointing_at_map():
    result = mt.align([var("enc/w" + ATTR)], [var("encoder/w" + ATTR)], same_format=True)
    assert result.pairs == () and result.method == "key"
    assert result.notes == ("could not align 1 name(s) of A with 1 name(s) of B (e.g. A 'enc/w" + ATTR + "', B 'encoder/w"
                            + ATTR + "'); they are listed as removed/added: rename A's names with --map 'REGEX=REPLACEMENT'",)


def test_graph_path_stage_finds_the_node_the_model_was_saved_under():
    a = mt.items([var("k", "x", graph_path="model/layer/kernel"), var("b", "y", graph_path="model/layer/bias"),
                  var("s", "step", graph_path="step")])
    b = mt.items([var("t0", "layer/kernel", graph_path="layer/kernel"), var("t1", "layer/bias", graph_path="layer/bias")])
    result = mt.match(a, b, (mt.GRAPH_PATH,))
    assert pairs_of(result) == {("k", "t0", "graph-path"), ("b", "t1", "graph-path")}
    assert [x.key for x in result.only_a] == ["s"]


def test_graph_path_stage_is_all_or_nothing_unless_asked():
    a = mt.items([var("k", graph_path="model/layer/kernel"), var("b", graph_path="model/other/bias")])
    b = mt.items([var("t0", graph_path="layer/kernel"), var("t1", graph_path="layer/bias")])
    assert mt.match(a, b, (mt.GRAPH_PATH,)).pairs == ()
    partial = mt.match(a, b, (mt.graph_path_stage(complete=False),))
    assert pairs_of(partial) == {("k", "t0", "graph-path")} and [y.key for y in partial.only_b] == ["t1"]


def test_a_structure_found_twice_is_an_ambiguity_not_a_guess():
    a = mt.items([var("k1", graph_path="gen/layer/kernel"), var("k2", graph_path="disc/layer/kernel")])
    b = mt.items([var("t", graph_path="layer/kernel")])
    result = mt.match(a, b, (mt.graph_path_stage(complete=False),))
    assert result.pairs == () and len(result.ambiguous) == 1 and result.ambiguous[0].stage == "graph-path"
    assert "appears more than once in A (under 'gen' and 'disc')" in result.notes[0]


# -- ambiguity -----------------------------------------------------------------------------------------
def test_a_name_two_variables_share_is_reported_never_guessed():
    a = mt.items([var("x1", "dense/kernel"), var("x2", "dense/kernel:0"), var("y", "head/bias")])
    b = mt.items([var("k", "dense/kernel"), var("h", "head/bias")])
    result = mt.match(a, b, mt.NAME_STAGES)
    assert pairs_of(result) == {("y", "h", "name")}
    assert [x.key for x in result.only_a] == ["x1", "x2"] and [y.key for y in result.only_b] == ["k"]
    (amb,) = result.ambiguous
    assert {x.key for x in amb.a} == {"x1", "x2"} and [y.key for y in amb.b] == ["k"] and amb.stage == "name"
    assert any("not unique (e.g. 'dense/kernel')" in n for n in result.notes)
    assert any("left unpaired rather than guessed" in n for n in result.notes)


def test_an_alias_two_model_variables_answer_to_is_ambiguous():
    a = mt.items([var("src", "kernel")])
    b = [mt.Item("enc/kernel", "enc/kernel", (2,), "float32", index=0, aliases=("kernel",)),
         mt.Item("dec/kernel", "dec/kernel", (2,), "float32", index=1, aliases=("kernel",))]
    result = mt.match(a, b, (mt.NAME,))
    assert result.pairs == () and {y.key for y in result.ambiguous[0].b} == {"enc/kernel", "dec/kernel"}


# -- --map -----------------------------------------------------------------------------------------------
def test_every_rule_applies_in_order_to_every_name():
    rules = parse_mapping(["^enc/=encoder/", "encoder/w$=encoder/kernel", "zz=yy"])
    assert apply_rules("enc/w", rules) == ("encoder/kernel", frozenset({0, 1}))
    a = mt.items([var("a1", "enc/w" + ATTR), var("a2", "enc/b"), var("a3", "head/bias")])
    b = mt.items([var("b1", "encoder/kernel"), var("b2", "encoder/b"), var("b3", "head/bias")])
    result = mt.match(a, b, mt.NAME_STAGES, rules=rules)
    assert pairs_of(result) == {("a1", "b1", "mapping"), ("a2", "b2", "mapping"), ("a3", "b3", "name")}
    assert {p.name for p in result.pairs} == {"encoder/kernel", "encoder/b", "head/bias"}
    assert result.notes == ("--map rule 'zz' -> 'yy' matched no name of A",)


def test_rules_mean_names_decide_even_where_keys_agree():
    # Compare layer 1 of A with layer 2 of B in two checkpoints of the same format: the equal
    # key dense_1/kernel must not win over the rule.
    a = [var("dense_1/kernel", shape=(3,))]
    b = [var("dense_1/kernel", shape=(3,)), var("dense_2/kernel", shape=(3,))]
    result = mt.align(a, b, same_format=True, mapping=["^dense_1/=dense_2/"])
    assert result.method == "name"
    assert pairs_of(result) == {("dense_1/kernel", "dense_2/kernel", "mapping")}
    assert [y.key for y in result.only_b] == ["dense_1/kernel"]
    assert mt.stages_for(key=True, graph_path=True, rules=True, order=True) == (*mt.NAME_STAGES, mt.ORDER)


def test_rules_run_in_order_so_a_swap_goes_through_a_temporary_name():
    a = [var("dense_1/kernel"), var("dense_2/kernel")]
    b = [var("dense_1/kernel"), var("dense_2/kernel")]
    swap = ["^dense_1/=tmp/", "^dense_2/=dense_1/", "^tmp/=dense_2/"]
    result = mt.align(a, b, same_format=True, mapping=swap)
    assert pairs_of(result) == {("dense_1/kernel", "dense_2/kernel", "mapping"), ("dense_2/kernel", "dense_1/kernel", "mapping")}


def test_a_rule_that_merges_two_names_is_an_ambiguity():
    a = mt.items([var("x", "dense/kernel"), var("y", "dense_1/kernel")])
    b = mt.items([var("k", "dense_1/kernel")])
    result = mt.match(a, b, mt.NAME_STAGES, rules=["^dense/=dense_1/"])
    assert result.pairs == () and len(result.ambiguous) == 1


@pytest.mark.parametrize("rule, message", [
    ("(=x", "bad --map regex '('"),
    ("noequals", "bad --map rule 'noequals'"),
    (r"^a/=\1/", r"bad --map replacement '\\1/' for '^a/'"),
    (r"^(?P<x>a)/=\g<y>", "bad --map replacement"),
])
def test_bad_rules_fail_before_any_matching(rule, message):
    with pytest.raises(UsageError) as info:
        parse_mapping([rule])
    assert str(info.value).startswith(message)


# -- order -----------------------------------------------------------------------------------------------
def test_order_stage_pairs_by_shape_in_order_preferring_the_leaf_name():
    a = mt.items([var("k", "encoder/kernel", (8, 16)), var("m", "bn/moving_mean", (16,)), var("g", "bn/gamma", (16,))])
    b = [mt.Item("layer0/kernel", "layer0/kernel", (8, 16), "float32", index=0),
         mt.Item("layer3/gamma", "layer3/gamma", (16,), "float32", index=1),
         mt.Item("layer3/moving_mean", "layer3/moving_mean", (16,), "float32", index=2),
         mt.Item("layer4/kernel", "layer4/kernel", (16, 4), "float32", index=3)]
    result = mt.match(a, b, (mt.ORDER,))
    assert pairs_of(result) == {("k", "layer0/kernel", "order"), ("g", "layer3/gamma", "order"),
                                ("m", "layer3/moving_mean", "order")}
    assert [y.key for y in result.only_b] == ["layer4/kernel"]  # no variable of that shape: never forced


def test_a_later_stage_sees_only_what_earlier_ones_left():
    a = mt.items([var("x", "head/kernel", (16, 4)), var("y", "anon_7", (16, 4))])
    b = mt.items([var("p", "head/kernel", (16, 4)), var("q", "dense/kernel", (16, 4))])
    result = mt.match(a, b, mt.stages_for(order=True))
    assert pairs_of(result) == {("x", "p", "name"), ("y", "q", "order")}


def test_a_new_stage_plugs_in_with_the_same_signature():
    """What a scoring stage (issue 13) will be: it sees the unpaired items and the names."""

    def same_shape_unique(a, b, ctx):
        pairs = []
        for x in a:
            fits = [y for y in b if y.shape == x.shape]
            if len(fits) == 1 and sum(1 for z in a if z.shape == x.shape) == 1:
                pairs.append(mt.Pair(x, fits[0], "shape", ctx.name_a(x)))
        return mt.StageResult(pairs=tuple(pairs), notes=(f"{len(pairs)} by shape",))

    a = mt.items([var("x", "a/w", (3, 3)), var("y", "renamed/kernel", (5,))])
    b = mt.items([var("p", "a/w", (3, 3)), var("q", "other/kernel", (5,))])
    result = mt.match(a, b, (mt.NAME, mt.Stage("shape", same_shape_unique)))
    assert pairs_of(result) == {("x", "p", "name"), ("y", "q", "shape")} and result.notes == ("1 by shape",)


def test_items_need_distinct_indices():
    x = mt.Item("k", "k", (1,), "float32", index=0)
    with pytest.raises(ValueError, match="distinct indices"):
        mt.match([x, x], [], mt.NAME_STAGES)


def test_the_matcher_imports_neither_tensorflow_nor_numpy():
    code = ("import sys, ckptinspect.ops.match.matcher, ckptinspect.ops.match.mapping; "
            "print(sorted(m for m in ('tensorflow', 'numpy', 'h5py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
