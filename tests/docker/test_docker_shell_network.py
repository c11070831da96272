"""The Docker shell's network follows ``ToolsConfig.network``, and
``sandbox_network`` reports what the shell really gets (found by an audit: the
shell got Docker's bridge whatever the setting, because only the ratchet was
asked, and the tool reported the setting).

Interfaces are read inside the container (/proc/net/dev); nothing is sent
anywhere, and no bridge address is ever contacted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kernel_helpers import shell_output

from sandbox_kernel.docker import offline_config
from sandbox_kernel.privacy import PrivateData
from sandbox_kernel.tools import SessionRegistry, ToolsConfig, sandbox_execute
from sandbox_kernel.tools.network import sandbox_network

pytestmark = pytest.mark.asyncio

#: the interface names of /proc/net/dev (its first two lines are headers)
INTERFACES = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort"


def _config(data_dir: Path, image: str, limits: dict[str, Any], network: str) -> ToolsConfig:
    # cells are never run here: "bwrap" only names an isolating backend for the reports
    return ToolsConfig(
        backend="bwrap",
        shell_backend="docker",
        network=network,
        idle_timeout=600,
        data_dir=data_dir,
        docker_config=offline_config(image=image, **limits),
        docker_persistent=True,  # the container stays, so its HostConfig can be read
    )


@pytest_asyncio.fixture
async def make_registry(
    tmp_path: Path, test_image: str, test_limits: dict[str, Any]
) -> AsyncIterator[Callable[[str], SessionRegistry]]:
    made: list[SessionRegistry] = []

    def make(network: str) -> SessionRegistry:
        reg = SessionRegistry(_config(tmp_path / f"data-{network}", test_image, test_limits, network))
        made.append(reg)
        return reg

    try:
        yield make
    finally:
        for reg in made:
            await reg.aclose()


async def _interfaces(reg: SessionRegistry, ids: tuple[str, str]) -> list[str]:
    r = await sandbox_execute(INTERFACES, user_id=ids[0], session_id=ids[1], registry=reg)
    assert r.text.startswith("Exit code: 0\n"), r.text
    return shell_output(r.text).split()


async def test_network_none_gives_the_docker_shell_no_network(
    make_registry: Callable[[str], SessionRegistry], ids: tuple[str, str], list_managed: Any
) -> None:
    reg = make_registry("none")
    assert await _interfaces(reg, ids) == ["lo"]
    [container] = list_managed(user=ids[0], session=ids[1])
    assert container["HostConfig"]["NetworkMode"] == "none"
    report = (await sandbox_network(user_id=ids[0], session_id=ids[1], registry=reg)).text
    assert report.splitlines()[0] == "Network: none", report


async def test_network_user_gives_a_bridge_until_private_and_says_so(
    make_registry: Callable[[str], SessionRegistry], ids: tuple[str, str]
) -> None:
    reg = make_registry("user")
    kw = {"user_id": ids[0], "session_id": ids[1], "registry": reg}
    public = await _interfaces(reg, ids)
    assert "lo" in public and len(public) >= 2, public
    report = (await sandbox_network(**kw)).text
    assert "Network (shell commands, Docker): full (Docker's bridge network" in report, report
    PrivateData(ids[0], ids[1], store=reg.config.privacy_store()).mark_private("SECRET", reason="test")
    assert await _interfaces(reg, ids) == ["lo"]
    report = (await sandbox_network(**kw)).text
    assert report.splitlines()[0] == "Network: none (the session holds private data)", report


async def test_proxied_is_refused_with_the_docker_shell() -> None:
    with pytest.raises(ValueError, match=r"shell_backend='docker' cannot honour network='proxied'"):
        ToolsConfig(shell_backend="docker")  # the default network is "proxied"
    config = ToolsConfig(shell_backend="docker", network="none")
    config.network = "proxied"  # changed after it was made: refused before any container starts
    reg = SessionRegistry(config)
    try:
        with pytest.raises(ValueError, match="network='proxied'"):
            reg.docker_manager()
    finally:
        await reg.aclose()
