"""``sandbox_execute``: a shell command in the session's sandbox.

Default: the engine's sandbox backend (bubblewrap when installed) through
``Sandbox.run``, with the session's workspace mounted at /workspace and the
network decided by the session's ratchet (no network once private; private
dataset mounts only then). With ``ToolsConfig.shell_backend = "docker"`` the
command runs in a Docker container through ``SandboxManager``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
from pathlib import Path

from ..engine.workspace_policy import WorkspaceRefused, apply_policy
from ..sandbox import BindMount, get_sandbox
from .errors import ToolFatalError
from .render import ToolResult, truncate
from .repl import _tool, _with_notices, session_for
from .sessions import SessionRegistry, ToolSession
from .workspace import IN_WORKSPACE

log = logging.getLogger("sandbox_kernel.tools")
MAX_SHELL_OUTPUT = 8000
MAX_COMMAND_CHARS = 100_000


def _shell() -> str:
    return "/bin/bash" if Path("/bin/bash").exists() or shutil.which("bash") else "/bin/sh"


async def _run_local(session: ToolSession, command: str, timeout: float) -> tuple[int, str, bool]:
    sandbox = get_sandbox(session.config.backend)
    isolated = not session.ratchet.network_allowed
    mounts: list[BindMount] = []
    if sandbox.isolates:
        # the same workspace policy as the cells' sandboxes (engine/workspace_policy.py)
        try:
            mounts, _ = await asyncio.to_thread(
                apply_policy,
                session.workspace,
                IN_WORKSPACE,
                [session.store.root],
                [session.config.root() / "workspaces"],
            )
        except WorkspaceRefused as exc:
            raise ToolFatalError(f"workspace refused: {exc}") from exc
        if isolated:
            mounts += session.ratchet.bind_mounts()
        cwd = IN_WORKSPACE
        home = "/tmp"
    else:
        mounts = []
        cwd = str(session.workspace)
        home = str(session.workspace)
    bindir = str(Path(sys.executable).parent)
    env = {
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "USER": "sandbox",
    }
    for attempt in range(2):
        try:
            result = await sandbox.run(
                [_shell(), "-c", command],
                bind_mounts=mounts,
                timeout=timeout,
                isolate_network=isolated,
                network=session.config.network,
                cwd=cwd,
                env=env,
                limits=session.config.limits,
            )
            break
        except BrokenPipeError as exc:
            # bwrap died while its user-mode network was being set up, before the
            # command ran (seen under load): starting again is safe
            if attempt:
                raise ToolFatalError(f"could not start the {sandbox.name} sandbox: {exc}") from exc
            log.warning("the %s sandbox died while starting (%s): retrying once", sandbox.name, exc)
        except (OSError, RuntimeError) as exc:
            raise ToolFatalError(f"could not start the {sandbox.name} sandbox: {exc}") from exc
    out = result.stdout.decode("utf-8", "replace")
    err = result.stderr.decode("utf-8", "replace")
    text = out + (("\n" if out and not out.endswith("\n") else "") + err if err else "")
    if result.timed_out:
        return 124, text + f"\n[the command timed out after {timeout:g} s and was killed]", True
    return result.exit_code, text, False


@_tool
async def sandbox_execute(
    command: str,
    timeout: float = 60,
    *,
    user_id: str | None = None,
    session_id: str | None = None,
    registry: SessionRegistry | None = None,
) -> ToolResult:
    """Run a shell command (bash) in the session's sandbox, in /workspace.

    The workspace is shared with the REPL cells. Returns the exit code and the
    output (stdout then stderr; long output truncated).
    """
    if not isinstance(command, str) or not command.strip():
        raise ValueError("command must be a non-empty string")
    if len(command) > MAX_COMMAND_CHARS:
        raise ValueError(f"command is too long ({len(command)} characters, at most {MAX_COMMAND_CHARS})")
    if "\x00" in command:
        raise ValueError("command contains a NUL byte")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise ValueError(f"timeout must be between 0 and 3600 seconds, got {timeout!r}")
    async with session_for(user_id, session_id, registry, engine=False) as (session, notices):
        if session.engine is not None:
            await session.engine.refresh_privacy()
        if session.config.shell_backend == "docker":
            manager = session.registry.docker_manager()
            try:
                code, text = await manager.aexecute_command(
                    session.user_id, session.session_id, command, timeout, persistent=session.config.docker_persistent
                )
            except (ValueError, TypeError):
                raise
            except Exception as exc:  # the daemon went away mid-session (requests' errors are OSErrors)
                raise ToolFatalError(f"Docker failed: {type(exc).__name__}: {exc}") from exc
        else:
            code, text, _ = await _run_local(session, command, float(timeout))
    body = truncate(
        text.rstrip("\n"), MAX_SHELL_OUTPUT, "redirect the output to a file in /workspace and read parts of it"
    )
    return _with_notices(ToolResult(f"Exit code: {code}\n{body}" if body else f"Exit code: {code}"), notices)
