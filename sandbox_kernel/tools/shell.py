"""``sandbox_execute``: a shell command in the session's sandbox.

Default: a fresh sandbox of the session's engine (``Session.run_command``:
the same launch as the cells', see engine/launch.py), with the workspace at
/workspace and the network decided by the session's ratchet (no network once
private; private dataset mounts only then). With ``ToolsConfig.shell_backend = "docker"`` the
command runs in a Docker container through ``SandboxManager``.

What the command prints is the sandbox's: the host keeps a bounded head and
tail of each stream (``Sandbox.run_spec``'s ``max_output``) and says how much
it dropped, and once the session is private its URLs are defanged as cell
output is (an MCP client may render a tool's result as markdown and fetch
an image link, carrying data out).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..engine.session import SandboxUnavailable
from ..outputs.links import defang_text
from ..sandbox import SandboxResult
from ..terminal_text import terminal_safe_output
from .calls import session_for, tool_errors, with_notices
from .errors import ToolFatalError
from .notebook import unicode_problem
from .render import ToolResult, inert, truncate
from .sessions import SessionRegistry, ToolSession

log = logging.getLogger("sandbox_kernel.tools")
MAX_SHELL_OUTPUT = 8000
#: bytes of each stream the host keeps of a command (its head and tail halves)
HOST_KEEPS = 64 * 1024
MAX_COMMAND_CHARS = 100_000


def _shell() -> str:
    return "/bin/bash" if Path("/bin/bash").exists() or shutil.which("bash") else "/bin/sh"


def _stream_text(data: bytes, dropped: int, at: int, name: str) -> str:
    """One stream's kept bytes as text, with a note where ``run_spec`` dropped its middle."""
    if not dropped:
        return data.decode("utf-8", "replace")
    note = f"\n[... {dropped} bytes of {name} dropped ...]\n"
    return data[:at].decode("utf-8", "replace") + note + data[at:].decode("utf-8", "replace")


def _output_text(result: SandboxResult) -> str:
    """stdout then stderr, as the tool shows them."""
    out = _stream_text(result.stdout, result.stdout_dropped, result.stdout_dropped_at, "stdout")
    err = _stream_text(result.stderr, result.stderr_dropped, result.stderr_dropped_at, "stderr")
    text = out + (("\n" if out and not out.endswith("\n") else "") + err if err else "")
    return terminal_safe_output(text, keep_colours=False)  # an agent's terminal may show it


async def _run_local(session: ToolSession, command: str, timeout: float) -> tuple[int, str, int]:
    """One command in a fresh sandbox of the session's engine (``Session.run_command``):
    the cells' launch (workspace policy, environment, limits), network decided by
    the ratchet now, private mounts only without network. Returns the exit code,
    the text, and how many bytes of output never reached the host (``run_spec``
    keeps a bounded head and tail of each stream)."""
    engine = session.engine
    transient = engine is None
    if engine is None:
        engine = session.new_engine()
        session.command_engines.add(engine)  # the registry's watcher cuts it on a rise
    try:
        for attempt in range(2):
            try:
                # the host keeps a head and a tail of each stream, a few times what is shown
                result = await engine.run_command([_shell(), "-c", command], timeout=timeout, max_output=HOST_KEEPS)
                break
            except SandboxUnavailable as exc:  # a refused workspace, a missing backend
                raise ToolFatalError(str(exc)) from exc
            except BrokenPipeError as exc:
                # bwrap died while its user-mode network was being set up, before the
                # command ran (seen under load): starting again is safe
                if attempt:
                    raise ToolFatalError(f"could not start the {engine.backend} sandbox: {exc}") from exc
                log.warning("the %s sandbox died while starting (%s): retrying once", engine.backend, exc)
            except (OSError, RuntimeError) as exc:
                raise ToolFatalError(f"could not start the {engine.backend} sandbox: {exc}") from exc
    finally:
        if transient:
            session.command_engines.discard(engine)
            await engine.shutdown()
    text = _output_text(result)
    dropped = result.stdout_dropped + result.stderr_dropped
    if result.timed_out:
        return 124, text + f"\n[the command timed out after {timeout:g} s and was killed]", dropped
    return result.exit_code, text, dropped


@tool_errors
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
    problem = unicode_problem(command)
    if problem:
        raise ValueError(f"command {problem}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise ValueError(f"timeout must be between 0 and 3600 seconds, got {timeout!r}")
    dropped = 0
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
                said = f"{type(exc).__name__}: {exc}"
                if session.ratchet.private:  # (it may quote what the container printed)
                    raise ToolFatalError(f"Docker failed:\n{inert(defang_text(said))}") from exc
                raise ToolFatalError(f"Docker failed: {said}") from exc
            text = terminal_safe_output(text, keep_colours=False)  # as the local shell's: the container wrote it
        else:
            code, text, dropped = await _run_local(session, command, float(timeout))
        # read after the command: a rise during it (or made elsewhere meanwhile) counts
        private = session.ratchet.private or not session.ratchet.network_allowed
    hint = "redirect the output to a file in /workspace and read parts of it"
    body = truncate(text.rstrip("\n"), MAX_SHELL_OUTPUT, hint)
    if dropped:
        body += f"\n[{dropped} bytes of output were dropped before reaching the host (its middle); {hint}]"
    if private:
        body = inert(defang_text(body))  # (in code: a client may render the result as markdown)
    return with_notices(ToolResult(f"Exit code: {code}\n{body}" if body else f"Exit code: {code}"), notices)
