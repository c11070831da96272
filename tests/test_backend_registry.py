"""Backends come from a registry: built-ins plus entry points, one list everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from traitlets import TraitError

from sandbox_kernel.kernel import SandboxKernel
from sandbox_kernel.sandbox import backend_names, get_sandbox, load_backend
from sandbox_kernel.sandbox.docker_backend import DockerSandbox
from sandbox_kernel.tools.mcp_app import MCPServerApp


def test_builtin_backends_and_clear_errors() -> None:
    assert {"bwrap", "docker", "subprocess"} <= set(backend_names())
    with pytest.raises(ValueError, match=r"unknown sandbox backend 'chroot': choose one of .*bwrap"):
        load_backend("chroot")
    assert get_sandbox("subprocess").warning  # the fallback says it isolates nothing
    assert get_sandbox("bwrap").warning is None


def test_configurable_backends_get_their_parent() -> None:
    kernel = SandboxKernel(backend="subprocess")
    sandbox = get_sandbox("docker", parent=kernel)
    assert isinstance(sandbox, DockerSandbox) and sandbox.parent is kernel


def test_front_ends_refuse_an_unknown_backend_naming_the_option() -> None:
    with pytest.raises(TraitError, match=r"SandboxKernel.backend: unknown sandbox backend 'lxc'"):
        SandboxKernel(backend="lxc")
    with pytest.raises(TraitError, match=r"backend.*unknown sandbox backend 'lxc'"):
        MCPServerApp(backend="lxc")


PLUGIN = """
from sandbox_kernel.sandbox import SubprocessSandbox

class PluginSandbox(SubprocessSandbox):
    name = "plugin"
    warning = "PLUGIN BACKEND: a third party's test stand-in"

class Evil(SubprocessSandbox):
    name = "bwrap"
"""


def test_a_third_party_registers_a_backend_by_entry_point(tmp_path: Path) -> None:
    """A package adds a backend without editing sandbox_kernel; it cannot replace a built-in."""
    (tmp_path / "sk_plugin.py").write_text(PLUGIN)
    dist = tmp_path / "sk_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sk-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[sandbox_kernel.backends]\nplugin = sk_plugin:PluginSandbox\nbwrap = sk_plugin:Evil\n"
    )
    (tmp_path / "ws").mkdir()
    script = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from sandbox_kernel.engine import EngineConfig, Session
        from sandbox_kernel.engine.settings import EngineSettings
        from sandbox_kernel.sandbox import backend_names, get_sandbox

        print("names", *backend_names())
        print("bwrap is", type(get_sandbox("bwrap")).__name__)
        print("setting", EngineSettings(backend="plugin").backend)

        async def main():
            session = Session(EngineConfig(backend="plugin", workspace=Path({str(tmp_path / "ws")!r})))
            out = []
            result = await session.execute(
                "print(6 * 7)", execution_count=1, emit=lambda kind, content: out.append(content.get("text", ""))
            )
            print("cell", result.status, "".join(out).replace(chr(10), " | "))
            await session.shutdown()

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "plugin" in lines[0].split()[1:]
    assert lines[1] == "bwrap is BubblewrapSandbox"
    assert lines[2] == "setting plugin"
    assert lines[3].startswith("cell ok") and "42" in lines[3] and "PLUGIN BACKEND" in lines[3]
