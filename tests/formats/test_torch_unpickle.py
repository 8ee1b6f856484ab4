"""The restricted unpickler: only torch.load(weights_only=True)'s allow-list, to inert stand-ins;
everything else refused naming the global; pickle-level bombs refused in bounded time."""

from __future__ import annotations

import struct
import sys
import time

import numpy as np
import pytest

import ckptinspect
from ckptinspect.errors import CorruptCheckpointError, NotACheckpointError, UnsafeFileError
from ckptinspect.formats.torch import unpickle as tu
from torch_builders import (
    dict_pickle,
    global_,
    int_,
    legacy_file,
    nested_lists,
    shared_lists,
    tensor,
    torch_zip,
    tuple_,
    unicode,
)

FOUR = np.arange(4, dtype="<f4")


def no_storage(pid):
    raise AssertionError(f"unexpected persistent id {pid!r}")


def load(body: bytes):
    return tu.unpickle(b"\x80\x02" + body + b".", no_storage, "t.pkl")[0]


@pytest.mark.parametrize("module,name", [
    ("os", "system"), ("posix", "system"), ("nt", "system"), ("builtins", "eval"), ("builtins", "exec"),
    ("builtins", "getattr"), ("builtins", "__import__"), ("__builtin__", "eval"), ("builtins", "open"),
    ("builtins", "type"), ("subprocess", "Popen"), ("subprocess", "check_output"), ("importlib", "import_module"),
    ("pickle", "loads"), ("_pickle", "loads"), ("marshal", "loads"), ("types", "CodeType"), ("types", "FunctionType"),
    ("code", "InteractiveInterpreter"), ("operator", "attrgetter"), ("_operator", "methodcaller"), ("torch", "load"),
    ("numpy", "load"), ("dill", "loads"), ("torch.nn.modules.linear", "Linear"), ("torch._utils", "_rebuild_tensor_v4"),
    ("copyreg", "__newobj__"), ("runpy", "run_path"), ("sys", "modules"),
])
def test_globals_that_run_code_are_refused_by_name(module, name):
    fixed = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)
    with pytest.raises(UnsafeFileError, match=rf"^t\.pkl: refusing to unpickle: it would call {fixed}\.{name}, "):
        load(global_(module, name) + b")R")
    # protocol 4 spells globals with STACK_GLOBAL
    with pytest.raises(UnsafeFileError, match=rf"it would call {fixed}\.{name}, "):
        tu.unpickle(b"\x80\x04" + unicode(module) + unicode(name) + b"\x93)R.", no_storage, "t.pkl")


@pytest.mark.parametrize("module,name", [
    ("copyreg", "_reconstructor"), ("copy_reg", "_reconstructor"), ("numpy.core.multiarray", "_reconstruct"),
    ("__main__", "Net"), ("collections", "defaultdict"), ("functools", "partial"), ("argparse", "Namespace"),
    ("numpy.core.multiarray", "scalar"), ("numpy", "dtype"), ("builtins", "slice"),
])
def test_other_globals_become_inert_stand_ins(module, name):
    """Issue 25 item 5: a global outside the allow-list that runs no code is never imported or
    called; what calling it would make is recorded, and its name is listed as needed."""
    fixed = {"copy_reg": "copyreg"}.get(module, module)
    before = set(sys.modules)
    obj, found = tu.unpickle(b"\x80\x02" + global_(module, name) + tuple_(int_(1), unicode("a")) + b"R.", no_storage, "t.pkl")
    assert isinstance(obj, tu.StandIn) and obj.name == f"{fixed}.{name}" and obj.args == (1, "a")
    assert found.needs == (f"{fixed}.{name}",)
    assert set(sys.modules) == before  # nothing imported


def test_stand_ins_record_newobj_build_and_items():
    body = (global_("argparse", "Namespace") + b")\x81" + b"}" + unicode("lr") + b"G" + struct.pack(">d", 0.5) + b"sb"
            + global_("mylib", "AttrDict") + b")\x81(" + unicode("k") + int_(3) + b"u"
            + global_("mylib", "MyList") + b")\x81(" + int_(1) + int_(2) + b"e" + b"\x87")
    ns, attrs, items = load(body)
    assert (ns.name, ns.new, ns.args, ns.state) == ("argparse.Namespace", True, (), {"lr": 0.5})
    assert attrs.items == {"k": 3} and items.elements == [1, 2]


def test_allowed_globals_are_local_stand_ins():
    for full in ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter", "collections.OrderedDict",
                 "torch.Size", "torch.device", "_codecs.encode", "builtins.bytearray"):
        assert getattr(tu.resolve_global(full), "__module__", "") == tu.__name__, full
    assert tu.resolve_global("torch.FloatStorage") == "float32"
    assert tu.resolve_global("torch.cuda.HalfStorage") == "float16"
    assert tu.resolve_global("torch.storage.UntypedStorage") == "uint8"
    assert tu.resolve_global("torch.bfloat16") == "bfloat16"
    assert "torch" not in sys.modules


def test_containers_and_helpers():
    assert load(global_("torch", "Size") + tuple_(int_(2), int_(3)) + b"\x85R") == (2, 3)
    assert load(global_("torch", "device") + unicode("cuda") + int_(0) + b"\x86R") == "cuda:0"
    assert load(global_("_codecs", "encode") + unicode("\xff") + unicode("latin1") + b"\x86R") == b"\xff"
    assert load(global_("__builtin__", "set") + b"](K\x01K\x02e\x85R") == {1, 2}
    od = load(global_("collections", "OrderedDict") + b")R" + b"}" + unicode("_metadata") + b"}sb")
    assert od == {} and od.pickled_state == {"_metadata": {}}


@pytest.mark.parametrize("body,message", [
    (global_("builtins", "bytearray") + int_(1 << 40) + b"\x85R", "bytearray with arguments"),
    (global_("_codecs", "encode") + unicode("x") + unicode("zlib_codec") + b"\x86R", "_codecs.encode with encoding"),
    (global_("torch", "Size") + int_(3) + b"\x85R", "torch.Size with arguments"),
    (global_("torch._utils", "_rebuild_tensor_v2") + tuple_(int_(1), int_(0), b")", b")", b"\x89", b"N") + b"R",
     "a tensor's storage is int"),
    (global_("torch._utils", "_rebuild_sparse_tensor") + b")R", "holds a sparse tensor"),
    (global_("torch", "QInt8Storage"), "quantized storages"),
])
def test_stand_ins_refuse_what_torch_save_does_not_write(body, message):
    with pytest.raises((CorruptCheckpointError, NotACheckpointError), match=message):
        load(body)


@pytest.mark.parametrize("data,message", [
    (b"\x80\x02]r\xff\xff\xff\xff.", "memo index 4294967295 at byte 3 is out of sequence"),
    (b"\x80\x02(S'x'\nios\nsystem\n.", "pickle opcode INST"),
    (b"\x80\x02X\xff\xff\xff\x7fabc.", "not a complete pickle"),
    (b"\x80\x02K\x01", "not a complete pickle"),
    (b"\x80\x05\x97.", "pickle opcode NEXT_BUFFER"),
], ids=["memo", "inst", "short-string", "no-stop", "buffer"])
def test_scan_refuses_before_unpickling(data, message):
    with pytest.raises((UnsafeFileError, CorruptCheckpointError), match=message):
        tu.unpickle(data, no_storage, "t.pkl")


@pytest.mark.parametrize("data,message", [
    (nested_lists(300_000), "nests more than 200 levels deep"),
    (shared_lists(80), "expands to more than"),
], ids=["deep-nesting", "billion-laughs"])
def test_bombs_refused_quickly(data, message, tmp_path):
    path = torch_zip(tmp_path / "bomb.pt", data, {})
    start = time.process_time()  # CPU time: the bound is the work done, whatever the machine's load
    with pytest.raises(UnsafeFileError, match=message):
        ckptinspect.open(path)
    assert time.process_time() - start < 5


def test_persistent_ids_are_checked(tmp_path):
    module_pid = b"\x80\x02" + tuple_(unicode("module"), b"N", b"N", b"N") + b"Q."
    with pytest.raises(UnsafeFileError, match="it would call a pickled nn.Module class, .* this is a whole model"):
        ckptinspect.open(torch_zip(tmp_path / "m.pt", module_pid, {}))
    twice = dict_pickle({"a": tensor("0", 4, 0, (4,), (1,)), "b": tensor("0", 2, 0, (2,), (1,), storage="DoubleStorage")})
    with pytest.raises(CorruptCheckpointError, match="storage '0' is declared as 4 float32 and as 2 float64"):
        ckptinspect.open(torch_zip(tmp_path / "twice.pt", twice, {"0": FOUR.tobytes()}))
    not_callable = b"\x80\x02" + unicode("x") + b")R."
    with pytest.raises(CorruptCheckpointError, match="damaged pickle"):
        ckptinspect.open(torch_zip(tmp_path / "nc.pt", not_callable, {}))


def test_big_endian_zip(tmp_path):
    path = torch_zip(tmp_path / "be.pt", dict_pickle({"w": tensor("0", 4, 0, (2, 2), (2, 1)),
                                                      "h": tensor("1", 2, 0, (2,), (1,), storage="HalfStorage")}),
                     {"0": FOUR.astype(">f4").tobytes(), "1": np.array([1.5, -2], ">f2").tobytes()})
    with zipfile_replace(path, "archive/byteorder", b"big"):
        pass
    with ckptinspect.open(path) as ckpt:
        assert ckpt.info["byteorder"] == "big"
        assert np.array_equal(ckpt.read("w"), FOUR.reshape(2, 2))
        assert np.array_equal(np.concatenate([np.array(b) for b in ckpt.iter_blocks("w", 3)]), FOUR)
        assert np.array_equal(ckpt.read("h"), np.array([1.5, -2], np.float16))


class zipfile_replace:
    """Rewrite one member of a zip (stored) in place."""

    def __init__(self, path, member, data):
        import zipfile

        with zipfile.ZipFile(path) as zin:
            items = [(i.filename, data if i.filename == member else zin.read(i)) for i in zin.infolist()]
        with zipfile.ZipFile(path, "w") as zout:
            for name, raw in items:
                zout.writestr(name, raw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_legacy_storage_views_and_key_order(tmp_path):
    """Legacy storages in key-list order (not first-use order), one of them used through a
    storage view (the 6th persistent-id field: view key, offset, size)."""
    def pid(key, numel, view=None):
        fields = [unicode("storage"), global_("torch", "FloatStorage"), unicode(key), unicode("cpu"), int_(numel)]
        fields.append(b"N" if view is None else tuple_(unicode(view[0]), int_(view[1]), int_(view[2])))
        return tuple_(*fields) + b"Q"

    def t(p, offset, shape):
        return (global_("torch._utils", "_rebuild_tensor") + tuple_(p, int_(offset), tuple_(*map(int_, shape)),
                                                                   tuple_(*map(int_, [1] * len(shape)))) + b"R")

    main = dict_pickle({"b": t(pid("2", 3), 0, (3,)), "a": t(pid("10", 6, ("v", 2, 3)), 1, (2,))})
    big = np.arange(6, dtype="<f4")
    small = np.array([7, 8, 9], "<f4")
    path = legacy_file(tmp_path / "views.pt", main, ["10", "2"], [big.tobytes(), small.tobytes()], [6, 3])
    with ckptinspect.open(path) as ckpt:
        assert ckpt.format == "torch-legacy"
        assert np.array_equal(ckpt.read("b"), small)
        assert np.array_equal(ckpt.read("a"), big[3:5])  # view starts at element 2, tensor offset 1


def test_reading_never_uses_the_default_find_class(tmp_path):
    events = []
    sys.addaudithook(lambda event, args: events.append(args) if event == "pickle.find_class" else None)
    path = torch_zip(tmp_path / "ok.pt", dict_pickle({"w": tensor("0", 4, 0, (4,), (1,))}), {"0": FOUR.tobytes()})
    with ckptinspect.open(path) as ckpt:
        assert np.array_equal(ckpt.read("w"), FOUR)
    assert events == []

