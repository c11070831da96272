"""Development fallback: a plain subprocess. It isolates NOTHING.

Every session on it says so loudly (first cell output and kernel log).
Bind mounts cannot be honoured, so their host paths are used directly.
"""

from __future__ import annotations

from .base import BindMount, Sandbox, SandboxProcess, SandboxSpec, spawn

WARNING = (
    "sandbox_kernel is using the 'subprocess' backend: cells run as plain processes "
    "with YOUR user's rights, files and network. Nothing is isolated. Install "
    "bubblewrap (package 'bubblewrap') or use --SandboxKernel.backend=docker."
)


class SubprocessSandbox(Sandbox):
    """No isolation at all; for development on machines without bwrap or Docker."""

    name = "subprocess"
    isolates = False
    enforces_network = False
    warning = WARNING

    @staticmethod
    def visible_path(mount: BindMount) -> str:
        return str(mount.source)

    async def start(self, spec: SandboxSpec) -> SandboxProcess:
        process = await spawn(list(spec.command), spec.limits, env=spec.env, cwd=spec.cwd)
        return SandboxProcess(process, self.name)
