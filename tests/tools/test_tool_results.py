"""What one tool result may carry to an agent: bounded text, a bounded number
of images whose headers parse and declare a sane size, and no terminal
sequence or bidirectional override. Found by an attack review (findings 5-7:
one result of 10 MB of text or 20,000 images; a 30000x30000 px PNG and a PNG
signature followed by junk passed on as images; escapes through an image's
alt text, an error without traceback, the notebook's error summary and the
Docker shell; U+202E kept)."""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from sandbox_kernel.terminal_text import terminal_safe_output
from sandbox_kernel.tools import (
    SessionRegistry,
    ToolFatalError,
    ToolRetryError,
    ToolsConfig,
    repl_execute_cell,
    repl_show_cell,
    repl_show_notebook,
    sandbox_execute,
)
from sandbox_kernel.tools.mcp_server import _content
from sandbox_kernel.tools.render import ToolResult

# render.py's MAX_RESULT_CHARS, FULL_RESULT_CHARS, MAX_IMAGES, FULL_MAX_IMAGES
MAX_RESULT_CHARS, FULL_RESULT_CHARS, MAX_IMAGES, FULL_MAX_IMAGES = 20_000, 500_000, 10, 50


def ids(reg: SessionRegistry, session: str) -> dict[str, Any]:
    return {"user_id": "alice", "session_id": session, "registry": reg}


def png(width: int, height: int) -> bytes:
    """A PNG header (signature and IHDR) declaring ``width`` x ``height``: all the tools read."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + ihdr + chunk(b"IDAT", zlib.compress(b"\0" * (width + 1))) + chunk(b"IEND", b"")


TINY = base64.b64encode(png(1, 1)).decode()
BOMB = base64.b64encode(png(30000, 30000)).decode()
JUNK = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"<svg onload=alert(1)> not an image " * 20).decode()
OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x1b]0;title\x07"
SEQUENCES = ("\x1b", "\x07", "\u202e")


# --- pure functions ----------------------------------------------------------


def test_image_headers_are_read_without_an_image_library() -> None:
    from sandbox_kernel.outputs.images import image_problem, image_size

    assert image_size("image/png", png(640, 480)) == (640, 480)
    assert image_size("image/gif", b"GIF89a" + struct.pack("<HH", 320, 200) + b"\0" * 8) == (320, 200)
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 600, 800, 1) + b"\x01\x11\x00"
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0" + b"\0" * 9
    assert image_size("image/jpeg", b"\xff\xd8" + app0 + sof + b"\xff\xd9") == (800, 600)
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\0" * 4 + (1023).to_bytes(3, "little") + (767).to_bytes(3, "little")
    assert image_size("image/webp", b"RIFF" + struct.pack("<I", 30) + b"WEBP" + vp8x) == (1024, 768)
    assert image_problem("image/png", TINY) is None
    assert "30000x30000" in (image_problem("image/png", BOMB) or "")
    assert "does not parse" in (image_problem("image/png", JUNK) or "")
    assert image_problem("image/png", base64.b64encode(png(9000, 10)).decode())  # over 8000 px a side


def test_agent_text_loses_bidirectional_controls_and_keeps_scripts() -> None:
    overrides = "invoice_\u202efdp.exe \u202a\u202b\u202c\u202d \u2066\u2067\u2068\u2069 \u200e\u200f\u061c"
    assert terminal_safe_output(overrides, keep_colours=False) == "invoice_fdp.exe   "
    scripts = "naïve 表 שלום مرحبا नमस्ते می‌خواهم 👩\u200d💻 \x1b[1mbold\x1b[0m\n"
    assert terminal_safe_output(scripts, keep_colours=False) == scripts.replace("\x1b[1m", "").replace("\x1b[0m", "")
    assert terminal_safe_output(overrides) is overrides  # a notebook's terminal frontend: as before


def test_adapters_hand_on_only_sane_images() -> None:
    """``mcp_server._content`` and the PydanticAI adapter's ``_out``, whoever made the result."""
    result = ToolResult("text", [("image/png", BOMB), ("image/png", JUNK)] + [("image/png", TINY)] * 60)
    blocks = _content(result).content
    assert len(blocks) == 1 + FULL_MAX_IMAGES
    assert "12 image(s) not returned" in blocks[0].text
    pytest.importorskip("pydantic_ai")
    from sandbox_kernel.tools.pydantic_ai import _out

    out = _out(result)
    assert len(out.content) == FULL_MAX_IMAGES and "12 image(s) not returned" in out.return_value
    assert _out(ToolResult("plain")) == "plain"


# --- the tools, in a real sandbox ----------------------------------------------


@pytest.mark.asyncio
async def test_one_result_shares_a_text_budget(registry: SessionRegistry) -> None:
    kw = ids(registry, "size")
    code = "import sys\nfor i in range(300):\n    print(f'{i:04d}' + 'x' * 3995, file=(sys.stdout, sys.stderr)[i % 2], flush=True)"
    r = await repl_execute_cell(code, timeout=120, **kw)
    assert len(r.text) < MAX_RESULT_CHARS + 2000, len(r.text)
    assert "outputs (" in r.text and "left out" in r.text and "repl_show_cell(0, full=True)" in r.text, r.text[-3000:]
    assert "0000xxx" in r.text and "0299xxx" in r.text  # the first and the last outputs are shown
    full = await repl_show_cell(0, full=True, **kw)
    assert len(full.text) < FULL_RESULT_CHARS + 20_000, len(full.text)
    assert "0000xxx" in full.text and "0299xxx" in full.text and "write it to a file" in full.text
    small = await repl_execute_cell("print('a' * 3000)\nprint('b', flush=True)\n1", **kw)
    assert small.text.endswith("--- stdout ---\n" + "a" * 3000 + "\nb\n--- result ---\n1"), small.text[-200:]


@pytest.mark.asyncio
async def test_images_are_capped_and_checked(registry: SessionRegistry) -> None:
    kw = ids(registry, "images")
    loop = f"from IPython.display import display\nfor i in range(60):\n    display({{'image/png': '{TINY}'}}, raw=True)"
    r = await repl_execute_cell(loop, **kw)
    assert len(r.images) == MAX_IMAGES and len(_content(r).content) == MAX_IMAGES + 1
    assert f"50 of 60 images left out (at most {MAX_IMAGES} a result)" in r.text, r.text[-500:]
    assert "[image #11: image/png, left out" in r.text
    full = await repl_show_cell(0, full=True, **kw)
    assert len(full.images) == FULL_MAX_IMAGES and "10 of 60 images left out" in full.text
    bad = (
        "from IPython.display import display\n"
        f"display({{'image/png': '{BOMB}', 'text/plain': 'bomb'}}, raw=True)\n"
        f"display({{'image/png': '{JUNK}', 'text/plain': 'junk'}}, raw=True)"
    )
    r = await repl_execute_cell(bad, **kw)
    assert r.images == [] and len(_content(r).content) == 1, r.text
    assert "[image #1: image/png, not returned: it declares 30000x30000 px" in r.text
    assert "[image #2: image/png, not returned: its header does not parse" in r.text
    assert "2 image(s) not returned" in r.text


@pytest.mark.asyncio
async def test_no_terminal_sequence_reaches_the_tool_text(registry: SessionRegistry) -> None:
    kw = ids(registry, "escapes")
    osc = OSC52.encode("unicode_escape").decode()
    cells = [
        f"display({{'image/png': '{TINY}', 'text/plain': '{osc}'}}, raw=True)",
        f"class Quiet(Exception):\n    def _render_traceback_(self):\n        return []\nraise Quiet('{osc}')",
        f"raise ValueError('{osc}')",
        "print('invoice_\\u202efdp.exe')",
    ]
    texts = [(await repl_execute_cell(code, **kw)).text for code in cells]
    texts += [(await repl_show_cell(n, full=True, **kw)).text for n in (0, 1)]
    texts.append((await repl_show_notebook(**kw)).text)
    for text in texts:
        shown = text.replace(osc, "").replace("\\u202e", "")  # the code is the agent's own
        assert not [s for s in SEQUENCES if s in shown], repr(shown)
    assert "invoice_fdp.exe" in texts[3]


@pytest.mark.asyncio
async def test_docker_shell_output_is_made_terminal_safe(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Docker branch of ``sandbox_execute`` gets the same treatment as the
    local one (a stand-in manager: what it returns is what a container printed)."""
    reg = SessionRegistry(ToolsConfig(backend="bwrap", shell_backend="docker", network="none"))

    class Manager:
        def prepare_workspace(self, user_id: str, session_id: str) -> None:
            pass

        def read_only_sources(self) -> list[Path]:
            return []

        async def aexecute_command(self, *args: Any, **kwargs: Any) -> tuple[int, str]:
            return 0, f"before{OSC52}after \u202eexe.pdf\n"

    monkeypatch.setattr(reg, "docker_manager", lambda: Manager())
    try:
        r = await sandbox_execute("true", **ids(reg, "dsh"))
    finally:
        await reg.aclose()
    assert r.text == "Exit code: 0\nbeforeafter exe.pdf", repr(r.text)


@pytest.mark.asyncio
async def test_tool_errors_are_made_terminal_safe_and_bounded(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Docker error quotes what the daemon said, which may quote what a
    container printed: its ``[FATAL] Docker failed: ...`` text went to the
    agent with OSC 52 and screen clears (an attack review). Every tool error
    is made terminal safe and bounded."""
    reg = SessionRegistry(ToolsConfig(backend="bwrap", shell_backend="docker", network="none"))

    class Manager:
        def prepare_workspace(self, user_id: str, session_id: str) -> None:
            pass

        def read_only_sources(self) -> list[Path]:
            return []

        async def aexecute_command(self, *args: Any, **kwargs: Any) -> tuple[int, str]:
            raise RuntimeError(f"exec failed: {OSC52} \u202eexe.pdf " + "x" * 100_000)

    monkeypatch.setattr(reg, "docker_manager", lambda: Manager())
    try:
        with pytest.raises(ToolFatalError) as failed:
            await sandbox_execute("true", **ids(reg, "derr"))
    finally:
        await reg.aclose()
    text = str(failed.value)
    assert text.startswith("[FATAL] Docker failed: RuntimeError: exec failed:"), text[:200]
    assert not [s for s in SEQUENCES if s in text] and "characters cut]" in text and len(text) < 5000, repr(text[:300])
    assert str(ToolRetryError(f"bad {OSC52}")) == "bad " and str(ToolFatalError("[FATAL] x\x1b[2J")) == "[FATAL] x"
