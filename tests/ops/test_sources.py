"""ops.sources: a checkpoint's files as the writing operations protect and size them."""

from ckptinspect.ops.sources import files_size, source_files


class _Ckpt:
    def __init__(self, files):
        self._files = files

    def files(self):
        return self._files


def test_source_files_keeps_the_regular_files_in_order(tmp_path):
    a, b = tmp_path / "a.data", tmp_path / "b.index"
    a.write_bytes(b"12345")
    b.write_bytes(b"12")
    (tmp_path / "dir").mkdir()
    files = [str(b), str(tmp_path / "gone"), str(tmp_path / "dir"), str(a)]
    assert source_files(_Ckpt(files)) == [str(b), str(a)]
    assert files_size(files) == 7
