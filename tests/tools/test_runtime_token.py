"""The generated token's file (no server started): private, written through no
link, removed only while it is still the server's own."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandbox_kernel.tools.runtime_token import RuntimeTokenError, RuntimeTokenFile, token_file_name

TOKEN = "t" * 43


def test_the_file_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        written = RuntimeTokenFile.write(TOKEN, "a.token", str(tmp_path / "new" / "runtime"))
    finally:
        os.umask(old)
    path = Path(written.path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == TOKEN + "\n"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["a.token"]  # no temporary left behind
    written.remove()
    written.remove()  # idempotent
    assert not path.exists()


def test_a_replaced_file_is_left_alone(tmp_path: Path) -> None:
    """Another server that took over the name keeps its file when this one stops."""
    runtime = tmp_path / "runtime"
    first = RuntimeTokenFile.write(TOKEN, "a.token", str(runtime))
    second = RuntimeTokenFile.write("u" * 43, "a.token", str(runtime))
    first.remove()
    assert (runtime / "a.token").read_text() == "u" * 43 + "\n"
    second.remove()
    assert not (runtime / "a.token").exists()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_directory_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    runtime.chmod(mode)
    with pytest.raises(RuntimeTokenError, match="is not private: other users may write to it"):
        RuntimeTokenFile.write(TOKEN, "a.token", str(runtime))
    assert list(runtime.iterdir()) == []


def test_a_directory_in_place_of_the_file_is_a_clear_error(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    (runtime / "a.token").mkdir(parents=True, mode=0o700)
    runtime.chmod(0o700)
    with pytest.raises(RuntimeTokenError, match=r"cannot write the token file .*a\.token"):
        RuntimeTokenFile.write(TOKEN, "a.token", str(runtime))
    assert [p.name for p in runtime.iterdir()] == ["a.token"]


def test_file_names_stay_in_the_directory() -> None:
    assert token_file_name("127.0.0.1", 8000) == "sandbox-kernel-mcp-127.0.0.1-8000.token"
    assert token_file_name("::1", 1) == "sandbox-kernel-mcp-::1-1.token"
    assert token_file_name("../x/y", 2) == "sandbox-kernel-mcp-.._x_y-2.token"
