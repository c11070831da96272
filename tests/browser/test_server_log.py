"""The Jupyter server's log shows what a sandbox named as text, not as terminal commands.

The server logs paths at INFO level: "Saving file at <path>" on every save
(and autosave) of an open file, "Creating new notebook in <folder>",
"delete <path>". A cell can name a file or folder with any bytes but ``/``
and NUL, an OSC 52 sequence included; the user opens the file in Lab, Lab
saves it, and the line reaches the terminal that runs ``jupyter lab``, which
sets the clipboard to what the cell chose (the user's next paste into a host
shell runs it). ``lab_content_policy.apply`` gives the server's console log a
formatter that escapes control characters in each record
(``terminal_text.TerminalSafeServerFormatter``).

The control is a server configured without it (an explicit ``--config`` is
read instead of the config dir's file, so that server has jupyter_server's own
formatter): the sequence reaches its log as it was. No browser is needed: the
requests are the ones Lab sends.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_helpers import LabServer, notebook_json, serving

pytestmark = pytest.mark.timeout(300)

OSC52 = "\x1b]52;c;ZWNobyBwd25lZAo=\x07"
FOLDER = "data\x1b]0;title\x07\x9b2J"


@pytest.fixture(scope="module")
def protected_server(tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    with serving(tmp_path_factory.mktemp("log-protected"), artifacts / "jupyter-lab-log.log") as server:
        yield server


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    with serving(
        tmp_path_factory.mktemp("log-plain"), artifacts / "jupyter-lab-log-plain.log", protected=False
    ) as server:
        yield server


def _open_and_save(server: LabServer) -> bytes:
    """What the sandbox writes (a notebook named with escape sequences, in a folder
    named with more) and what Lab sends when the user opens it, saves it and makes
    a new notebook beside it; the server's log after."""
    folder = server.notebooks / FOLDER
    folder.mkdir()
    name = f"report{OSC52}.ipynb"
    (folder / name).write_text(json.dumps(notebook_json(["1 + 1"])))
    path = urllib.parse.quote(f"{FOLDER}/{name}")
    model = server.request("GET", f"/api/contents/{path}")
    server.request("PUT", f"/api/contents/{path}", {"type": "notebook", "format": "json", "content": model["content"]})
    server.request("POST", f"/api/contents/{urllib.parse.quote(FOLDER)}", {"type": "notebook"})
    return server.log_bytes()


def test_without_the_formatter_the_log_carries_the_sequences(plain_server: LabServer) -> None:
    log = _open_and_save(plain_server)
    assert b"Saving file at" in log
    assert OSC52.encode() in log and b"\x1b]0;title\x07" in log


def test_the_servers_log_escapes_what_a_sandbox_named(protected_server: LabServer) -> None:
    log = _open_and_save(protected_server)
    assert b"\x1b" not in log and b"\x07" not in log and "\x9b".encode() not in log
    text = log.decode()
    assert r"Saving file at /data\x1b]0;title\x07\x9b2J/report\x1b]52;c;ZWNobyBwd25lZAo=\x07.ipynb" in text
    assert r"Creating new notebook in /data\x1b]0;title\x07\x9b2J" in log.decode()
