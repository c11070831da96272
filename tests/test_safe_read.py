"""Host reads of sandbox-writable files: no symlinks, no FIFOs, bounded size."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sandbox_kernel.engine.safe_read import UnsafeFileError, read_bytes, read_json


def test_regular_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text('{"cell": 3}')
    assert read_json(tmp_path / "m.json") == {"cell": 3}


def test_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_text("secret")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UnsafeFileError, match="symlink"):
        read_bytes(tmp_path / "link", 100)


def test_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    result: list[BaseException] = []

    def read() -> None:
        with pytest.raises(UnsafeFileError) as caught:
            read_bytes(tmp_path / "fifo", 100)
        result.append(caught.value)

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "reading a FIFO blocked"
    assert "not a regular file" in str(result[0])


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 2000)
    with pytest.raises(UnsafeFileError, match="over the 1000-byte limit"):
        read_bytes(tmp_path / "big", 1000)
