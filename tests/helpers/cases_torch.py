"""Bad PyTorch / safetensors / Hugging Face inputs for the hardening catalogue, each built for
real (pickles assembled opcode by opcode, zips written by zipfile, bytes of files torch wrote
changed), with what every command must say about them."""

from __future__ import annotations

import json
import pathlib
import struct
import zipfile

from catalogue import Case
from torch_builders import (
    global_,
    int_,
    tuple_,
    unicode,
    copy_fixture,
    dict_pickle,
    legacy_file,
    nested_lists,
    shared_lists,
    safetensors_file,
    system_call,
    tensor,
    torch_zip,
)

FOUR = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
MARKER = "ckptinspect-catalogue-pwned"


def _zip(name: str, data_pkl: bytes, records: dict[str, bytes], **kw):
    def make(d: pathlib.Path) -> pathlib.Path:
        return torch_zip(d / name, data_pkl, records, **kw)

    return make


def malicious_legacy(d: pathlib.Path) -> pathlib.Path:
    evil = b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(f"touch {MARKER}")) + f"touch {MARKER}".encode() + b"\x85R."
    return legacy_file(d / "evil_legacy.pt", evil, [], [], [])


def whole_model(d: pathlib.Path) -> pathlib.Path:
    return copy_fixture("whole_module.pt", d)


def missing_record(d: pathlib.Path) -> pathlib.Path:
    path = copy_fixture("state_dict.pt", d)
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(d / "tmp.pt", "w") as zout:
        for info in zin.infolist():
            if info.filename != "state_dict/data/2":
                zout.writestr(info.filename, zin.read(info))
    (d / "tmp.pt").replace(path)
    assert path.read_bytes() != raw
    return path


def truncated_zip(d: pathlib.Path) -> pathlib.Path:
    path = copy_fixture("training.pt", d)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    return path


def _record_start(path: pathlib.Path, member: str) -> int:
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as zf:
        offset = zf.getinfo(member).header_offset
    name_len, extra_len = struct.unpack_from("<2H", raw, offset + 26)
    return offset + 30 + name_len + extra_len


def flipped_storage_byte(d: pathlib.Path) -> pathlib.Path:
    path = copy_fixture("state_dict.pt", d)
    start = _record_start(path, "state_dict/data/0")  # fc1.weight, a whole storage record
    raw = bytearray(path.read_bytes())
    raw[start + 5] ^= 0x20
    path.write_bytes(bytes(raw))
    return path


def compressed_bomb(d: pathlib.Path) -> pathlib.Path:
    """A storage record deflated, its central directory entry declaring 4 GiB."""
    path = torch_zip(d / "bomb.pt", dict_pickle({"w": tensor("0", 4, 0, (4,), (1,))}), {"0": FOUR}, compress=True)
    raw = bytearray(path.read_bytes())
    pos = raw.find(b"PK\x01\x02")
    while pos != -1:
        name_len = int.from_bytes(raw[pos + 28 : pos + 30], "little")
        if raw[pos + 46 : pos + 46 + name_len] == b"archive/data/0":
            raw[pos + 24 : pos + 28] = (0xFFFFFFF0).to_bytes(4, "little")
        pos = raw.find(b"PK\x01\x02", pos + 4)
    path.write_bytes(bytes(raw))
    return path


def torchscript(d: pathlib.Path) -> pathlib.Path:
    path = torch_zip(d / "scripted.pt", dict_pickle({"w": tensor("0", 4, 0, (4,), (1,))}), {"0": FOUR})
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("archive/constants.pkl", b"\x80\x02).")
        zf.writestr("archive/code/__torch__.py", "def forward(self): ...\n")
    return path


def truncated_legacy(d: pathlib.Path) -> pathlib.Path:
    path = copy_fixture("training_legacy.pt", d)
    raw = path.read_bytes()
    path.write_bytes(raw[:-100])
    return path


def st_petabyte(d: pathlib.Path) -> pathlib.Path:
    header = {"w": {"dtype": "F32", "shape": [1 << 48], "data_offsets": [0, 1 << 50]}}
    return safetensors_file(d / "petabyte.safetensors", header, FOUR)


def st_header_length(d: pathlib.Path) -> pathlib.Path:
    header = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    return safetensors_file(d / "hugeheader.safetensors", header, FOUR, length=1 << 50)


def st_overlap(d: pathlib.Path) -> pathlib.Path:
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    return safetensors_file(d / "overlap.safetensors", header, FOUR * 3)


def st_bad_span(d: pathlib.Path) -> pathlib.Path:
    header = {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}
    return safetensors_file(d / "span.safetensors", header, FOUR)


def st_bad_json(d: pathlib.Path) -> pathlib.Path:
    path = d / "badjson.safetensors"
    d.mkdir(parents=True, exist_ok=True)
    raw = b'{"a": {"dtype": "F32", '
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + FOUR)
    return path


def st_truncated(d: pathlib.Path) -> pathlib.Path:
    path = copy_fixture("model.safetensors", d)
    raw = path.read_bytes()
    path.write_bytes(raw[:-30])
    return path


def hf_traversal(d: pathlib.Path) -> pathlib.Path:
    folder = copy_fixture("hf_sharded", d)
    index = folder / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["lm_head.weight"] = "../../../etc/passwd"
    index.write_text(json.dumps(doc))
    return folder


def hf_missing_shard(d: pathlib.Path) -> pathlib.Path:
    folder = copy_fixture("hf_sharded", d)
    (folder / "model-00003-of-00003.safetensors").unlink()
    return folder


def hf_wrong_map(d: pathlib.Path) -> pathlib.Path:
    folder = copy_fixture("hf_bin_sharded", d)
    index = folder / "pytorch_model.bin.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["not.in.any.shard"] = "pytorch_model-00001-of-00002.bin"
    index.write_text(json.dumps(doc))
    return folder / "pytorch_model.bin.index.json"


REFUSE = "refusing to unpickle: it would call os.system, which is not a tensor, storage or container"
ALL = ("ls", "ls-stats", "verify", "diff", "extract")


def _all(code: int, message: str, commands=ALL) -> dict[str, tuple[int, str]]:
    return {cmd: (code, message) for cmd in commands}


CASES = [
    Case("torch-malicious-os-system", _zip("evil.pt", system_call(f"touch {MARKER}"), {}),
         _all(2, "Error: {p}: " + REFUSE)),
    Case("torch-malicious-stack-global", _zip("evil4.pt", system_call(f"touch {MARKER}", protocol4=True), {}),
         _all(2, "Error: {p}: " + REFUSE)),
    Case("torch-malicious-legacy", malicious_legacy, _all(2, "Error: {p}: " + REFUSE)),
    Case("torch-whole-model", whole_model, _all(
        2, "Error: {p}: refusing to unpickle: it would call torch.nn.modules.container.Sequential, … "
           "save model.state_dict() instead")),
    Case("torch-missing-storage-record", missing_record, {
        "ls": (2, "Error: {p}: 'bn.weight': storage record '2' named by the pickle is missing"),
        "ls-stats": (2, "Error: {p}: 'bn.weight': storage record '2' named by the pickle is missing"),
        "verify": (1, "DAMAGED … bn.weight … storage record '2' named by the pickle is missing"),
        "diff": (2, "Error: {p}: 'bn.weight': storage record '2' named by the pickle is missing"),
        "extract": (2, "Error: {p}: 'bn.weight': storage record '2' named by the pickle is missing"),
    }),
    Case("torch-view-past-storage", _zip("past.pt", dict_pickle({"w": tensor("0", 4, 2, (2, 2), (2, 1))}), {"0": FOUR}), {
        "ls": (2, "Error: {p}: 'w': view (offset 2, shape [2, 2], stride [2, 1]) ends at byte 24 of storage '0', which holds 16 bytes"),
        "verify": (1, "DAMAGED … view (offset 2, shape [2, 2], stride [2, 1]) ends at byte 24 of storage '0'"),
        "diff": (2, "Error: {p}: 'w': view (offset 2"),
        "extract": (2, "Error: {p}: 'w': view (offset 2"),
    }),
    Case("torch-truncated-zip", truncated_zip, {
        "ls": (2, "Error: {p}: not a readable zip archive (4569 bytes), truncated or damaged"),
        "verify": (1, "DAMAGED … not a readable zip archive (4569 bytes), truncated or damaged"),
        "diff": (2, "Error: {p}: not a readable zip archive"),
        "extract": (2, "Error: {p}: not a readable zip archive"),
    }),
    Case("torch-flipped-storage-byte", flipped_storage_byte, {
        "ls": (0, ""),
        "ls-stats": (2, "Error: {p}: 'fc1.weight': storage record 'state_dict/data/0' has CRC-32 0x"),
        "verify": (1, "fc1.weight … storage record 'state_dict/data/0' has CRC-32 0x … the archive records 0x"),
        "extract": (2, "Error: {p}: 'fc1.weight': storage record 'state_dict/data/0' has CRC-32 0x"),
    }),
    Case("torch-compressed-record-bomb", compressed_bomb, _all(
        2, "Error: {p}: archive member 'archive/data/0' is compressed and declares 4294967280 bytes")),
    Case("torch-torchscript-archive", torchscript, _all(
        2, "Error: {p}: is a TorchScript archive (torch.jit.save), not a torch.save file")),
    Case("torch-pickle-deep-nesting", _zip("deep.pt", nested_lists(200_000), {}),
         _all(2, "Error: {p}: the pickle nests more than 200 levels deep; refusing")),
    Case("torch-pickle-billion-laughs", _zip("laughs.pt", shared_lists(64), {}),
         _all(2, "Error: {p}: the pickle expands to more than … entries (shared containers); refusing a possible pickle bomb")),
    Case("torch-pickle-huge-memo", _zip("memo.pt", b"\x80\x02]r\xf0\xff\xff\x7f.", {}),
         _all(2, "Error: {p}: pickle memo index 2147483632 at byte 3 is out of sequence (0 entries so far); refusing")),
    # the global comes before the OBJ opcode: the pickle machine refuses it first, naming it
    Case("torch-pickle-inst-opcode", _zip("inst.pt", b"(cos\nsystem\nS'x'\no.", {}),
         _all(2, "Error: {p}: " + REFUSE)),
    Case("torch-pickle-obj-opcode", _zip("obj.pt", b"\x80\x02(" + global_("collections", "OrderedDict") + b"o.", {}),
         _all(2, "Error: {p}: pickle opcode OBJ at byte 28, which torch.save never writes; refusing")),
    Case("torch-absurd-storage-size", _zip("huge.pt", dict_pickle({"w": tensor("0", 1 << 60, 0, (4,), (1,))}), {"0": FOUR}), {
        "ls": (2, "Error: {p}: storage record 'archive/data/0' holds 16 bytes, the pickle declares 1152921504606846976 float32"),
        "verify": (1, "DAMAGED … storage record 'archive/data/0' holds 16 bytes"),
        "diff": (2, "Error: {p}: storage record 'archive/data/0' holds 16 bytes"),
        "extract": (2, "Error: {p}: storage record 'archive/data/0' holds 16 bytes"),
    }),
    Case("torch-broadcast-size-bomb", _zip("bcast.pt", dict_pickle({"w": tensor("0", 1, 0, (1 << 40,), (0,))}), {"0": FOUR[:4]}), {
        "ls": (2, "Error: {p}: 'w': shape [1099511627776] declares 4398046511104 bytes over a storage of 4; refusing a possible size bomb"),
        "verify": (1, "DAMAGED … refusing a possible size bomb"),
        "diff": (2, "refusing a possible size bomb"),
        "extract": (2, "refusing a possible size bomb"),
    }),
    Case("torch-truncated-legacy", truncated_legacy, {
        "ls": (2, "Error: {p}: truncated: storage"),
        "verify": (1, "DAMAGED … is missing or truncated (the legacy storages end at byte"),
        "diff": (2, "Error: {p}: truncated: storage"),
        "extract": (2, "Error: {p}: truncated: storage"),
    }),
    Case("safetensors-petabyte-claim", st_petabyte, {
        "ls": (2, "Error: {p}: safetensors entry 'w' declares data up to byte 1125899906842624 of the buffer, which holds 16 bytes"),
        "verify": (1, "DAMAGED … safetensors entry 'w' declares data up to byte 1125899906842624"),
        "diff": (2, "Error: {p}: safetensors entry 'w' declares data up to byte 1125899906842624"),
        "extract": (2, "Error: {p}: safetensors entry 'w' declares data up to byte 1125899906842624"),
    }),
    Case("safetensors-header-length-bomb", st_header_length, _all(
        2, "Error: {p}: safetensors header declares 1125899906842624 bytes (limit 100000000); refusing")),
    Case("safetensors-overlapping-offsets", st_overlap, {
        "ls": (2, "Error: {p}: safetensors entries 'a' and 'b' overlap (bytes 4..8 of the buffer)"),
        "verify": (1, "DAMAGED … safetensors entries 'a' and 'b' overlap"),
        "diff": (2, "Error: {p}: safetensors entries 'a' and 'b' overlap"),
        "extract": (2, "Error: {p}: safetensors entries 'a' and 'b' overlap"),
    }),
    Case("safetensors-span-mismatch", st_bad_span, {
        "ls": (2, "Error: {p}: safetensors entry 'a': data_offsets [0, 16] span 16 bytes, its F32 shape [3] needs 12"),
        "verify": (1, "DAMAGED … data_offsets [0, 16] span 16 bytes"),
        "extract": (2, "Error: {p}: safetensors entry 'a': data_offsets"),
    }),
    Case("safetensors-bad-json", st_bad_json, {
        "ls": (2, "Error: {p}: safetensors header is not valid JSON"),
        "verify": (1, "DAMAGED … safetensors header is not valid JSON"),
        "extract": (2, "Error: {p}: safetensors header is not valid JSON"),
    }),
    Case("safetensors-truncated-data", st_truncated, {
        "ls": (2, "Error: {p}: safetensors entry … (truncated, or a header claiming more than the file holds)"),
        "verify": (1, "DAMAGED … (truncated, or a header claiming more than the file holds)"),
        "extract": (2, "(truncated, or a header claiming more than the file holds)"),
    }),
    Case("hf-index-path-traversal", hf_traversal, _all(
        2, "Error: {p}/model.safetensors.index.json: shard file name '../../../etc/passwd' is not a plain file name")),
    Case("hf-index-missing-shard", hf_missing_shard, {
        "ls": (0, "lm_head.weight … unknown", "warning: {p}/model-00003-of-00003.safetensors: shard 3 of 3 named by {p}/model.safetensors.index.json is missing"),
        "verify": (1, "DAMAGED … shard 3 of 3 named by"),
        "diff": (1, "note: A: … is missing"),
        "extract": (2, "is missing"),
    }),
    Case("hf-index-names-absent-tensor", hf_wrong_map, {
        "ls": (2, "Error: {p}: the index maps 'not.in.any.shard' to pytorch_model-00001-of-00002.bin, which does not hold it"),
        "verify": (1, "DAMAGED … not.in.any.shard"),
        "extract": (2, "which does not hold it"),
    }),
]


# -- issue 27 (round 3) and issue 25 item 5 ------------------------------------------------------
def _write(path: pathlib.Path, data: bytes) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def deep_tuple_key(d: pathlib.Path) -> pathlib.Path:
    return torch_zip(d / "deepkey.pt", b"\x80\x02}" + b")" + b"\x85" * 300_000 + b"Ns.", {})


def build_after_validation(d: pathlib.Path) -> pathlib.Path:
    build = b"}" + unicode("offset") + int_(-20) + b"sb"
    return torch_zip(d / "build.pt", dict_pickle({"w": tensor("0", 4, 0, (4,), (1,)) + build}), {"0": FOUR})


def amplifying_calls(d: pathlib.Path) -> pathlib.Path:
    """A 1.1 MB file whose 10,000 _codecs.encode calls on one memoised 1 MiB string ask for ~10 GiB."""
    call = global_("_codecs", "encode") + b"h\x00" + unicode("latin1") + b"\x86R"
    data = b"\x80\x02](" + unicode("x" * (1 << 20)) + b"q\x000" + call * 10_000 + b"e."
    return torch_zip(d / "amplify.pt", data, {})


def duplicate_data_pkl(d: pathlib.Path) -> pathlib.Path:
    import warnings

    evil = b"\x80\x02" + global_("os", "system") + unicode(f"touch {MARKER}") + b"\x85R."
    path = d / "dup.pt"
    d.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as zf:
        warnings.simplefilter("ignore")
        zf.writestr("archive/data.pkl", evil)
        zf.writestr("archive/data.pkl", dict_pickle({"w": tensor("0", 4, 0, (4,), (1,))}))
        zf.writestr("archive/data/0", FOUR)
        zf.writestr("archive/version", "3\n")
    return path


LEGACY_MAGIC_PICKLE = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little") + b"."


def legacy_sparse_bad_opcode(d: pathlib.Path) -> pathlib.Path:
    """A 1.5 GiB sparse legacy file whose second pickle has an unknown opcode at its byte 2."""
    path = _write(d / "sparse_legacy.pt", LEGACY_MAGIC_PICKLE + b"\x80\x02\xff")
    with open(path, "r+b") as f:
        f.truncate(3 << 29)
    return path


def deflated_noops(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / "noops.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02" + b"N0" * (120 << 20) + b"N.", compress_type=zipfile.ZIP_DEFLATED,
                    compresslevel=9)
        zf.writestr("archive/version", "3\n")
    return path


def broadcast_total(d: pathlib.Path) -> pathlib.Path:
    views = {f"b{i}": tensor("0", 1, 0, ((256 << 20) // 4,), (0,)) for i in range(8)}
    return torch_zip(d / "bcast8.pt", dict_pickle(views), {"0": FOUR[:4]})


def big_int_offset(d: pathlib.Path) -> pathlib.Path:
    raw = (10**5000).to_bytes(((10**5000).bit_length() + 8) // 8, "little", signed=True)
    long4 = b"\x8b" + struct.pack("<i", len(raw)) + raw
    body = tensor("0", 4, 0, (4,), (1,)).replace(int_(0) + b"(K\x04t", long4 + b"(K\x04t", 1)
    return torch_zip(d / "bigint.pt", dict_pickle({"w": body}), {"0": FOUR})


def lightning_like(d: pathlib.Path) -> pathlib.Path:
    """hyper_parameters as an argparse.Namespace (NEWOBJ + BUILD), a numpy float64 scalar."""
    ns = global_("argparse", "Namespace") + b")\x81}" + unicode("lr") + b"G" + struct.pack(">d", 0.01) + b"sb"
    dtype = global_("numpy", "dtype") + unicode("f8") + b"\x89\x88\x87R" + tuple_(
        int_(3), unicode("<"), b"N", b"N", b"N", int_(0), int_(0), int_(0)) + b"b"
    scalar = (global_("numpy.core.multiarray", "scalar") + dtype + global_("_codecs", "encode")
              + unicode(struct.pack("<d", 0.25).decode("latin1")) + unicode("latin1") + b"\x86R\x86R")
    data = dict_pickle({"state_dict": b"}(" + unicode("w") + tensor("0", 4, 0, (4,), (1,)) + b"u",
                        "hparams": ns, "best_mae_error": scalar})
    return torch_zip(d / "lightning.ckpt", data, {"0": FOUR})


def st_deep_json(d: pathlib.Path) -> pathlib.Path:
    header = b'{"w": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    return _write(d / "deep.safetensors", struct.pack("<Q", len(header)) + header)


def st_huge_dim(d: pathlib.Path) -> pathlib.Path:
    return safetensors_file(d / "dims.safetensors", {"w": {"dtype": "F32", "shape": [0, 10**30], "data_offsets": [0, 0]}},
                            b"")


def hf_deep_index(d: pathlib.Path) -> pathlib.Path:
    folder = copy_fixture("hf_sharded", d)
    (folder / "model.safetensors.index.json").write_bytes(
        b'{"metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b', "weight_map": {}}')
    return folder


NESTS = "the pickle nests more than 200 levels deep; refusing"
BUILD = "pickle BUILD of a tensor, which torch.load(weights_only=True) would not build; refusing"
BUDGET = "the objects it builds need more memory than its size allows; refusing a possible memory bomb"
DUPLICATE = "archive member 'archive/data.pkl' appears 2 times (readers disagree on which copy counts"
BROADCAST = "over the limit of 268435456 for a file (set CKPTINSPECT_MAX_BROADCAST_BYTES to allow more)"
NEEDS = "warning: needs: argparse.Namespace, numpy.core.multiarray.scalar, numpy.dtype: globals torch.load"

CASES += [
    Case("torch-deep-tuple-key", deep_tuple_key, _all(2, "Error: {p}: " + NESTS)),
    Case("torch-build-after-validation", build_after_validation, _all(2, "Error: {p}: " + BUILD)),
    Case("torch-amplifying-calls", amplifying_calls, _all(2, "Error: {p}: " + BUDGET)),
    Case("torch-duplicate-data-pkl", duplicate_data_pkl, {
        "ls": (2, "Error: {p}: " + DUPLICATE),
        "verify": (1, "DAMAGED … " + DUPLICATE),
        "diff": (2, "Error: {p}: " + DUPLICATE),
        "extract": (2, "Error: {p}: " + DUPLICATE),
    }),
    Case("torch-legacy-sparse-bad-opcode", legacy_sparse_bad_opcode, {
        "ls": (2, "Error: {p}: the legacy protocol pickle is damaged: damaged pickle: unknown opcode 0xff at byte 17"),
        "verify": (1, "DAMAGED … unknown opcode 0xff at byte 17"),
        "extract": (2, "Error: {p}: the legacy protocol pickle is damaged"),
    }),
    Case("torch-deflated-noop-pickle", deflated_noops, _all(
        2, "Error: {p}: archive/data.pkl is compressed and declares 251658244 bytes from … (more than 100:1; torch"
           " stores it uncompressed); refusing a possible zip bomb")),
    Case("torch-broadcast-total", broadcast_total, {
        "ls": (2, "Error: {p}: 'b1': views that repeat their storage's bytes (stride 0) declare … " + BROADCAST),
        "verify": (1, "DAMAGED … " + BROADCAST),
        "diff": (2, BROADCAST),
        "extract": (2, BROADCAST),
    }),
    Case("torch-big-int-offset", big_int_offset, {
        "ls": (2, "Error: {p}: damaged pickle: an int of 2077 bytes (more than 14000 bits)"),
        "verify": (1, "DAMAGED … an int of 2077 bytes"),
        "extract": (2, "Error: {p}: damaged pickle: an int of 2077 bytes"),
    }),
    Case("torch-lightning-stand-ins", lightning_like, {
        "ls": (0, "hparams/lr … best_mae_error … state_dict/w", NEEDS),
        "verify": (0, "INTACT"),
    }),
    Case("safetensors-deep-json", st_deep_json, {
        "ls": (2, "Error: {p}: safetensors header nests 65 levels deep (limit 64); not a valid header"),
        "verify": (1, "DAMAGED … safetensors header nests 65 levels deep"),
        "extract": (2, "Error: {p}: safetensors header nests 65 levels deep"),
    }),
    Case("safetensors-dim-out-of-int64", st_huge_dim, {
        "ls": (2, "Error: {p}: safetensors entry 'w' has a bad shape [0, 1000000000000000000000000000000] (at most 64"),
        "verify": (1, "DAMAGED … has a bad shape"),
        "extract": (2, "Error: {p}: safetensors entry 'w' has a bad shape"),
    }),
    Case("hf-index-deep-json", hf_deep_index, {
        "ls": (2, "Error: {p}/model.safetensors.index.json: sharded weights index nests 65 levels deep"),
        "verify": (1, "DAMAGED … sharded weights index nests 65 levels deep"),
        "diff": (2, "sharded weights index nests 65 levels deep"),
    }),
]
