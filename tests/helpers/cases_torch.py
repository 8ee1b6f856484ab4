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
    Case("torch-pickle-inst-opcode", _zip("inst.pt", b"(cos\nsystem\nS'x'\no.", {}),
         _all(2, "Error: {p}: pickle opcode OBJ at byte 17, which torch.save never writes; refusing")),
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
