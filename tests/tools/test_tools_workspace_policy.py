"""The agent tools follow the workspace policy: a repository the host checked out
into an agent's workspace keeps its hooks and config out of the sandbox's reach,
through the REPL cells and through ``sandbox_execute`` (bwrap)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_kernel.tools import SessionRegistry, repl_execute_cell, sandbox_execute

pytestmark = pytest.mark.asyncio


def _kw(reg: SessionRegistry) -> dict:
    return {"user_id": "alice", "session_id": "repo", "registry": reg}


async def _workspace_with_repo(reg: SessionRegistry) -> Path:
    session = await reg.get("alice", "repo")
    repo = session.workspace / "checkout"
    (repo / ".git" / "hooks").mkdir(parents=True)
    (repo / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (repo / "main.py").write_text("print('hi')\n")
    return repo


async def test_shell_cannot_plant_git_hooks_or_config(registry: SessionRegistry) -> None:
    repo = await _workspace_with_repo(registry)
    r = await sandbox_execute(
        "cd checkout; printf '#!/bin/sh\\nevil\\n' > .git/hooks/pre-commit; echo rc=$?; "
        "printf '[core]\\n\\tfsmonitor = evil\\n' >> .git/config; echo rc=$?; "
        "echo '# edited' >> main.py; echo rc=$?",
        **_kw(registry),
    )
    assert r.text.count("rc=1") == 2 and r.text.count("rc=0") == 1, r.text
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert "fsmonitor" not in (repo / ".git" / "config").read_text()
    assert (repo / "main.py").read_text() == "print('hi')\n# edited\n"


async def test_cell_cannot_plant_git_hooks(registry: SessionRegistry) -> None:
    repo = await _workspace_with_repo(registry)
    r = await repl_execute_cell(
        "try:\n    open('/workspace/checkout/.git/hooks/post-checkout', 'w').write('evil'); print('WROTE')\n"
        "except OSError as e:\n    print('DENIED', type(e).__name__)\n",
        **_kw(registry),
    )
    assert "DENIED" in r.text and "WROTE" not in r.text, r.text
    assert not (repo / ".git" / "hooks" / "post-checkout").exists()
