"""``bit_equal`` and ``same_bytes`` (ops/bit_equality.py): the one bit-for-bit equality behind diff, scan, extract and transplant."""

from __future__ import annotations

import numpy as np
import pytest

from ckptinspect.model import numpy_dtype
from ckptinspect.ops import bit_equality
from ckptinspect.ops.bit_equality import COMPARE_CHUNK_BYTES, bit_equal


def test_nan_payloads_and_signed_zeros_count():
    quiet = np.array([np.nan], np.float32)
    payload = np.array([0x7FC00001], np.uint32).view(np.float32)
    assert bit_equal(quiet, quiet.copy())
    assert not bit_equal(quiet, payload)  # both NaN, different bits
    assert not bit_equal(np.array([0.0]), np.array([-0.0]))  # equal as numbers, not as bits
    assert bit_equal(np.array([1 + 2j], np.complex128), np.array([1 + 2j], np.complex128))


def test_shape_and_dtype_are_part_of_identity():
    assert not bit_equal(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    assert not bit_equal(np.zeros(4, np.float32), np.zeros(4, np.int32))  # same bytes, other dtype
    assert not bit_equal(np.array([True]), np.array([1], np.uint8))


def test_strings_compare_as_bytes_whatever_the_array_type():
    assert bit_equal(np.array([b"a", b"bc"], object), np.array([b"a", b"bc"]))
    assert bit_equal(np.array(["caf\u00e9"], object), np.array(["caf\u00e9".encode()], object))
    assert not bit_equal(np.array([b"a"]), np.array([1]))
    assert not bit_equal(np.array([b"a", b"b"], object), np.array([b"a", b"c"], object))


def test_buffers_read_as_bytes_compare_whole_and_others_in_chunks():
    data = np.arange(1000, dtype=np.float64).tobytes()
    x, y = np.frombuffer(data, np.float64), np.frombuffer(bytes(data), np.float64)
    assert bit_equal(x, y)
    flipped = bytearray(data)
    flipped[-1] ^= 1
    assert not bit_equal(x, np.frombuffer(bytes(flipped), np.float64))
    n = COMPARE_CHUNK_BYTES // 4 * 2 + 3  # more than two chunks, not a multiple of one
    big = np.arange(n, dtype=np.float32)
    late = big.copy()
    late[-1] = np.nextafter(late[-1], np.float32(np.inf))
    assert bit_equal(big, big.copy()) and not bit_equal(big, late)
    assert bit_equal(big[::2], big.copy()[::2])  # non-contiguous views


@pytest.mark.parametrize("dtype", ["int8", "uint16", "float16", "int64", "complex64"])
def test_every_element_size(dtype):
    x = np.arange(7).astype(dtype)
    y = x.copy()
    assert bit_equal(x, y)
    y[3] = y[3] + 1
    assert not bit_equal(x, y)


@pytest.mark.parametrize("route", ["memcmp", "numpy"])
def test_both_routes_of_same_bytes_agree(monkeypatch, route):
    """Contiguous arrays go through libc's memcmp (GIL released) or, where it cannot be
    called, numpy in chunks: the same answers either way, for bit_equal too."""
    if route == "numpy":
        monkeypatch.setattr(bit_equality, "_MEMCMP", None)
    elif bit_equality._memcmp() is None:  # pragma: no cover - libc's memcmp is there on Linux and macOS
        pytest.skip("no libc memcmp here")
    n = COMPARE_CHUNK_BYTES // 4 * 2 + 3
    big = np.arange(n, dtype=np.float32)
    for i in (0, 255, 256, n // 2, n - 1):  # in the peeked bytes, past them, in the last chunk, the tail
        late = big.copy()
        late[i] = np.nextafter(late[i], np.float32(np.inf))
        assert not bit_equality.same_bytes(big, late) and not bit_equal(big, late), i
    assert bit_equality.same_bytes(big, big.copy()) and bit_equal(big, big.copy())
    quiet = np.array([np.nan], np.float32)
    assert not bit_equal(quiet, np.array([0x7FC00001], np.uint32).view(np.float32))  # NaN payloads differ
    frozen = big.copy()
    frozen.flags.writeable = False  # read-only arrays are compared at their own address too
    assert bit_equality.same_bytes(frozen, big) and bit_equality.same_bytes(big[7:], frozen[7:])
    assert not bit_equality.same_bytes(big[7:-1], frozen[8:])


@pytest.mark.parametrize("route", ["memcmp", "numpy"])
def test_dtypes_without_a_buffer_format_compare_too(monkeypatch, route):
    """bfloat16 (ml_dtypes) has no buffer-protocol format: its address is taken through a byte
    view (a ctypes view of the array itself raised ValueError in diff, extract and rewrite)."""
    if route == "numpy":
        monkeypatch.setattr(bit_equality, "_MEMCMP", None)
    bf16 = numpy_dtype("bfloat16")
    if bf16 is None:  # pragma: no cover - ml_dtypes comes with TensorFlow
        pytest.skip("no bfloat16 dtype here")
    x = np.arange(1000, dtype=np.float32).astype(bf16)
    y = x.copy()
    assert bit_equal(x, y) and bit_equality.same_bytes(x, y)
    y[999] = bf16.type(-1.0)
    assert not bit_equal(x, y) and not bit_equality.same_bytes(x, y)
    scalar = np.asarray(x[3])  # 0-d
    assert bit_equal(scalar, scalar.copy()) and not bit_equal(scalar, np.asarray(x[4]))


def test_importing_compare_loads_no_native_library():
    """libc is opened at the first comparison, not at import: a command that refuses a file
    (the malicious-pickle audit forbids ctypes.dlopen) never loads it."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = ("import sys, ctypes, numpy\n"  # numpy's own import opens the interpreter through ctypes
            "def hook(event, args):\n"
            "    if event == 'ctypes.dlopen': raise RuntimeError('dlopen at import')\n"
            "sys.addaudithook(hook)\n"
            "import ckptinspect.ops.bit_equality, ckptinspect.ops.diff.compare, ckptinspect.ops.diff.operation, ckptinspect.ops.scan.stats\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "ok\n", proc.stderr
