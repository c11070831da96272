"""A sandbox renaming names while the user moves or copies must not get an unchecked move.

The Lab server's guard (``sandbox_kernel.lab_folder_moves``) decides by the
ratchet's levels, kept per path, and the move runs a moment later. A real
sandboxed kernel's cell starts a thread that renames entries of its
workspace in a loop (a folder away and back, the user's link and a real
folder swapped), while the file browser's own requests (PATCH and POST of
``/api/contents``) are sent to a real ``jupyter lab`` server. An attack
review moved a networked sandbox's folder, with the descriptor it held, into
a private folder on the 3rd request, and a private folder into the sandbox's
own workspace through the user's link on the 3rd.

Now the guard judges the entry it finds through no link, by its real place,
and the move or copy acts only on that entry there (409 otherwise).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser.lab_helpers import LabServer, contents_status, serving
from kernel_helpers import SandboxKernelHandle, require_bwrap, shared_data_kernel

from sandbox_kernel.privacy import PrivacyStore, Sensitivity
from sandbox_kernel.privacy.workspace_levels import WorkspaceLevels

pytestmark = pytest.mark.timeout(300)

TRIES = 150
#: the answers a request may get while names change under it: jupyter_server's
#: own (400: the name looked hidden or gone at its look, 404: gone), the
#: guard's (403) and a changed entry (409)
REFUSED = {400, 403, 404, 409}
ROWS = "ada,42\n"

#: a thread of the cell renames in a loop until ``stop`` is set
FLIPPER = """
import ctypes, os, threading
os.chdir('/workspace')
stop = threading.Event()
libc = ctypes.CDLL(None, use_errno=True)
def flip():
    while not stop.is_set():
        {step}
threading.Thread(target=flip, daemon=True).start()
print('flipping')
"""
AWAY_AND_BACK = "os.rename({name!r}, '.away'); os.rename('.away', {name!r})"
EXCHANGE = "libc.renameat2(-100, b'data', -100, b'.d', 2)  # RENAME_EXCHANGE"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    require_bwrap()
    root = tmp_path_factory.mktemp("move-races")
    with serving(root / "lab", root / "lab.log") as server:
        yield server


def _kernel(server: LabServer, folder: str) -> SandboxKernelHandle:
    return shared_data_kernel(server.notebooks / folder, server.root / "kernels" / folder, server.data_dir)


def _flipping(kernel: SandboxKernelHandle, step: str, setup: str = "") -> None:
    run = kernel.run(setup + FLIPPER.format(step=step))
    assert run.status == "ok" and run.stdout.strip().endswith("flipping"), (run.stderr, run.errors)


def _stop(kernel: SandboxKernelHandle) -> None:
    assert kernel.run("stop.set()").status == "ok"


def _tries(server: LabServer, method: str, path: str, body: dict[str, str]) -> dict[int, int]:
    """The statuses of ``TRIES`` requests; stops at the first that succeeded."""
    counts: dict[int, int] = {}
    for _ in range(TRIES):
        status, _ = contents_status(server, method, path, body)
        counts[status] = counts.get(status, 0) + 1
        if status == 200:
            break
    return counts


def _private(server: LabServer, folder: str) -> None:
    (server.notebooks / folder).mkdir(parents=True, exist_ok=True)
    WorkspaceLevels.beside(PrivacyStore(server.data_dir / "privacy")).record(
        server.notebooks / folder, Sensitivity.CONFIDENTIAL, "a private session's folder"
    )


def test_a_folder_its_networked_sandbox_flips_never_moves_into_a_private_folder(server: LabServer) -> None:
    """Refused while the sandbox works there (a cell may hold it open); the
    flips made the name absent at the guard's look, which then checked nothing."""
    _private(server, "vault")
    public = _kernel(server, "play")
    try:
        _flipping(public, AWAY_AND_BACK.format(name="sub"), "import os\nos.mkdir('/workspace/sub')\n")
        counts = _tries(server, "PATCH", "play/sub", {"path": "vault/sub"})
        _stop(public)
    finally:
        public.shutdown()
    assert 200 not in counts and set(counts) <= REFUSED, counts
    assert not (server.notebooks / "vault" / "sub").exists()


def test_the_users_link_swapped_with_a_folder_takes_no_private_folder_into_the_sandbox(server: LabServer) -> None:
    """The user's link ``public/data -> ../archive``; the networked sandbox
    in ``public`` exchanges it with a folder of its own while the user moves
    a private folder into ``public/data``: the guard judged ``archive`` (no
    sandbox there) and the move landed in the sandbox's folder."""
    _private(server, "secret")
    (server.notebooks / "secret" / "results").mkdir()
    (server.notebooks / "secret" / "results" / "rows.csv").write_text(ROWS)
    (server.notebooks / "archive").mkdir()
    (server.notebooks / "public").mkdir()
    (server.notebooks / "public" / "data").symlink_to("../archive")
    public = _kernel(server, "public")
    try:
        _flipping(public, EXCHANGE, "import os\nos.mkdir('/workspace/.d')\n")
        counts = _tries(server, "PATCH", "secret/results", {"path": "public/data/results"})
        _stop(public)
    finally:
        public.shutdown()
    assert 200 not in counts and set(counts) <= REFUSED, counts
    assert (server.notebooks / "secret" / "results" / "rows.csv").read_text() == ROWS
    for folder in ("public/data", "public/.d", "archive"):
        assert not (server.notebooks / folder / "results").exists(), folder
    levels = WorkspaceLevels.beside(PrivacyStore(server.data_dir / "privacy"))
    assert levels.exact(server.notebooks / "archive" / "results").sensitivity == Sensitivity.PUBLIC


def test_a_file_a_private_sandbox_flips_is_never_copied_out(server: LabServer) -> None:
    """A private session's own cells are untrusted too: its file flipped
    away and back was copied, unchecked, into a public folder."""
    kernel = _kernel(server, "clinic")
    try:
        kernel.run("%private patients CONFIDENTIAL")  # (that cell is stopped: its sandbox had network)
        assert kernel.run("import socket\nprint([n for _, n in socket.if_nameindex()])").stdout.strip() == "['lo']"
        setup = f"open('/workspace/rows.csv', 'w').write({ROWS!r})\n"
        _flipping(kernel, AWAY_AND_BACK.format(name="rows.csv"), setup)
        (server.notebooks / "open").mkdir()
        copies = _tries(server, "POST", "open", {"copy_from": "clinic/rows.csv"})
        moves = _tries(server, "PATCH", "clinic/rows.csv", {"path": "open/rows.csv"})
        _stop(kernel)
    finally:
        kernel.shutdown()
    assert 200 not in copies and set(copies) <= REFUSED, copies
    assert 200 not in moves and set(moves) <= REFUSED, moves
    assert os.listdir(server.notebooks / "open") == []


def test_a_move_of_a_link_is_judged_as_a_file(server: LabServer) -> None:
    """A link carries no data, but a sandbox can put a file or a folder at
    its name: it gets a file's rules (here: out of a private folder)."""
    _private(server, "locked")
    (server.notebooks / "locked" / "shortcut").symlink_to("/etc")
    (server.notebooks / "elsewhere").mkdir()
    status, message = contents_status(server, "PATCH", "locked/shortcut", {"path": "elsewhere/shortcut"})
    assert status == 403 and "holds data of a CONFIDENTIAL session" in message, message
    assert Path(server.notebooks / "locked" / "shortcut").is_symlink()
