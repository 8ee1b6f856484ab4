"""errors.one_line: an exception's message as our messages quote it."""

from ckptinspect import errors


def test_one_line_collapses_whitespace():
    e = ValueError("bad header\n  at offset 12\tin\r\nshard 3  ")
    assert errors.one_line(e) == "bad header at offset 12 in shard 3"


def test_one_line_falls_back_to_the_type_name():
    assert errors.one_line(KeyError()) == "KeyError"
    assert errors.one_line(OSError(" \n ")) == "OSError"


def test_one_line_keeps_a_one_line_message():
    assert errors.one_line(errors.CorruptCheckpointError("x.h5: damaged")) == "x.h5: damaged"
