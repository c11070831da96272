"""ContainerConfig, presets, environment parsing, hardening kwargs, names: no daemon needed."""

from __future__ import annotations

import os

import pytest

from sandbox_kernel.docker import ContainerConfig, SandboxManager, build_container_kwargs
from sandbox_kernel.docker.config import (
    PRESETS,
    container_prefix,
    default_workspace_root,
    session_timeout,
)
from sandbox_kernel.docker.hardening import check_read_only_mount, docker_network, resolve_user
from sandbox_kernel.docker.names import container_labels, container_name, owner_status, validate_id
from sandbox_kernel.privacy.modes import NetworkMode

ENV_VARS = [
    "SANDBOX_DOCKER_IMAGE",
    "SANDBOX_CPU_LIMIT",
    "SANDBOX_MEMORY_LIMIT",
    "SANDBOX_PIDS_LIMIT",
    "SANDBOX_TMPFS_SIZE",
    "SANDBOX_COMMAND_TIMEOUT",
    "SANDBOX_SESSION_TIMEOUT",
    "SANDBOX_CONTAINER_PREFIX",
    "SANDBOX_WORKSPACE_ROOT",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def test_defaults_and_env_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    config = ContainerConfig()
    assert config.image == "sandbox-kernel:latest"
    assert (config.cpu_limit, config.memory_limit, config.working_dir) == (1.0, "512m", "/workspace")
    assert config.network_mode is NetworkMode.FULL and config.user is None
    monkeypatch.setenv("SANDBOX_DOCKER_IMAGE", "mine:1")
    monkeypatch.setenv("SANDBOX_CPU_LIMIT", "0.25")
    monkeypatch.setenv("SANDBOX_MEMORY_LIMIT", "1g")
    monkeypatch.setenv("SANDBOX_COMMAND_TIMEOUT", "7.5")
    monkeypatch.setenv("SANDBOX_SESSION_TIMEOUT", "90")
    monkeypatch.setenv("SANDBOX_CONTAINER_PREFIX", "sk-test")
    config = ContainerConfig()
    assert (config.image, config.cpu_limit, config.memory_limit) == ("mine:1", 0.25, "1g")
    assert config.memory_bytes == 1024**3 and config.command_timeout == 7.5
    assert session_timeout() == 90 and container_prefix() == "sk-test"


@pytest.mark.parametrize(
    ("variable", "value", "reader"),
    [
        ("SANDBOX_CPU_LIMIT", "lots", ContainerConfig),
        ("SANDBOX_CPU_LIMIT", "-1", ContainerConfig),
        ("SANDBOX_MEMORY_LIMIT", "big", ContainerConfig),
        ("SANDBOX_MEMORY_LIMIT", "1m", ContainerConfig),
        ("SANDBOX_PIDS_LIMIT", "1.5", ContainerConfig),
        ("SANDBOX_TMPFS_SIZE", "x", ContainerConfig),
        ("SANDBOX_COMMAND_TIMEOUT", "0", ContainerConfig),
        ("SANDBOX_COMMAND_TIMEOUT", "nan", ContainerConfig),
        ("SANDBOX_DOCKER_IMAGE", "a b", ContainerConfig),
        ("SANDBOX_SESSION_TIMEOUT", "soon", session_timeout),
        ("SANDBOX_CONTAINER_PREFIX", "bad prefix/", container_prefix),
        ("SANDBOX_WORKSPACE_ROOT", "relative/dir", default_workspace_root),
    ],
)
def test_bad_env_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, reader: object
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        reader()  # type: ignore[operator]


def test_presets() -> None:
    assert set(PRESETS) == {"low", "medium", "high", "max"}
    expected = {
        "low": (0.5, "256m", 30),
        "medium": (1.0, "512m", 60),
        "high": (2.0, "1g", 120),
        "max": (4.0, "2g", 300),
    }
    for name, (cpu, memory, timeout) in expected.items():
        config = ContainerConfig.from_preset(name)
        assert (config.cpu_limit, config.memory_limit, config.command_timeout) == (cpu, memory, timeout)
    custom = ContainerConfig.from_preset("HIGH", memory_limit="3g", image="x:1")
    assert (custom.cpu_limit, custom.memory_limit, custom.image) == (2.0, "3g", "x:1")
    with pytest.raises(ValueError, match="preset 'huge' is unknown"):
        ContainerConfig.from_preset("huge")
    with pytest.raises(ValueError, match="unknown ContainerConfig field"):
        ContainerConfig.from_preset("low", cpus=3)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cpu_limit", 0, "cpu_limit"),
        ("memory_limit", "5m", "memory_limit"),
        ("memory_limit", "12x", "memory_limit"),
        ("pids_limit", 0, "pids_limit"),
        ("cpu_limit", 1e-12, r"cpu_limit=1e-12 is too small \(at least 0.01\)"),  # was NanoCpus=0: no limit
        ("pids_limit", 2**63, r"pids_limit=9223372036854775808 is too large"),  # was a daemon HTTP 500
        ("working_dir", "relative", "working_dir"),
        ("working_dir", "/", "working_dir"),
        ("user", "0:0", "never runs as root"),
        ("user", "1000:0", "never runs as root"),
        ("user", "nobody", "numeric"),
        ("network_mode", "host", "network_mode"),
        ("environment", {"BAD-NAME": "x"}, "environment"),
        ("command_timeout", -3, "command_timeout"),
    ],
)
def test_config_validation_names_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ContainerConfig(**{field: value})


def test_config_coerces() -> None:
    config = ContainerConfig(network_mode="none", user="1000", cpu_limit="1.5")
    assert config.network_mode is NetworkMode.NONE and config.user == "1000:1000"
    assert config.cpu_limit == 1.5 and config.nano_cpus == 1_500_000_000


@pytest.mark.parametrize("bad", ["", ".", "..", ".hidden", "-rf", "a/b", "a b", "x" * 65, "é", 5, None])
def test_bad_ids_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="session_id"):
        validate_id(bad, "session_id")
    with pytest.raises(ValueError, match="user_id"):
        container_name("sandbox-kernel", bad, "ok")  # type: ignore[arg-type]


def test_names_and_labels() -> None:
    assert container_name("p", "alice", "s1") == "p-alice-s1"
    eph = container_name("p", "alice", "s1", ephemeral=True)
    assert eph.startswith("p-alice-s1-") and len(eph) == len("p-alice-s1-") + 8
    labels = container_labels("alice", "s1", kind="persistent", network="none")
    assert labels["sandbox_kernel.managed"] == "1"
    assert labels["sandbox_kernel.user"] == "alice" and labels["sandbox_kernel.session"] == "s1"
    assert labels["sandbox_kernel.owner_pid"] == str(os.getpid())
    assert "sandbox_kernel.created" in labels
    assert owner_status(labels)[0] is True


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("/var/run/docker.sock", "/docker.sock"),
        ("/run/docker.sock", "/x"),
        ("/var/run", "/x"),
        ("/run", "/x"),
        ("/var", "/x"),
        ("/", "/host"),
        ("/srv/data", "/var/run/docker.sock"),
        ("/srv/data", "/run/x"),
        ("/srv/data", "/"),
        ("/srv/data", "/proc/x"),
        ("relative", "/x"),
        ("/srv/data", "relative"),
        ("/srv/../run", "/x"),
    ],
)
def test_dangerous_mounts_refused(source: str, target: str) -> None:
    with pytest.raises(ValueError):
        check_read_only_mount(source, target)
    with pytest.raises(ValueError):
        SandboxManager(read_only_mounts={source: target}, client=object(), workspace_root="/tmp/x")
    with pytest.raises(ValueError):
        build_container_kwargs(ContainerConfig(image="x", read_only_mounts={source: target}))


def test_mount_inside_workspace_refused() -> None:
    with pytest.raises(ValueError, match="inside the workspace"):
        build_container_kwargs(ContainerConfig(image="x", read_only_mounts={"/srv/s": "/workspace/s"}))


def test_hardening_kwargs(tmp_path: os.PathLike[str]) -> None:
    config = ContainerConfig(
        image="img:1",
        cpu_limit=8,
        memory_limit="256m",
        pids_limit=50,
        read_only_mounts={"/usr": "/usr"},
        environment={"A": "1"},
    )
    kwargs = build_container_kwargs(
        config, network_mode=NetworkMode.PROXIED, workspace=tmp_path, user="1000:1000", labels={"l": "v"}, max_cpus=2
    )
    assert kwargs["cap_drop"] == ["ALL"] and kwargs["security_opt"][0] == "no-new-privileges"
    assert kwargs["security_opt"][1].startswith("seccomp={") and len(kwargs["security_opt"]) == 2
    assert kwargs["read_only"] is True and kwargs["privileged"] is False
    assert kwargs["mem_limit"] == kwargs["memswap_limit"] == 256 * 1024**2
    assert kwargs["pids_limit"] == 50 and kwargs["nano_cpus"] == 2_000_000_000  # clamped
    assert kwargs["init"] is True and kwargs["ipc_mode"] == "private"
    assert kwargs["network_mode"] == "none" and kwargs["user"] == "1000:1000"
    assert kwargs["environment"] == {"HOME": "/tmp", "A": "1"}
    assert "size=" in kwargs["tmpfs"]["/tmp"] and kwargs["labels"] == {"l": "v"}
    mounts = {m["Target"]: m for m in kwargs["mounts"]}
    assert mounts["/workspace"]["ReadOnly"] is False and mounts["/usr"]["ReadOnly"] is True
    assert not any("docker.sock" in m["Source"] for m in kwargs["mounts"])
    # The config's mode wins when it is stricter than the one passed in.
    strict = build_container_kwargs(config.replace(network_mode=NetworkMode.NONE), network_mode=NetworkMode.FULL)
    assert strict["network_mode"] == "none"
    assert docker_network(NetworkMode.FULL) == "bridge" and docker_network("none") == "none"


def test_resolve_user(tmp_path: os.PathLike[str]) -> None:
    assert resolve_user("1234:99", tmp_path) == "1234:99"
    st = os.stat(tmp_path)
    expected = "65534:65534" if st.st_uid == 0 else f"{st.st_uid}:{st.st_gid or st.st_uid}"
    assert resolve_user(None, tmp_path) == expected
    with pytest.raises(ValueError):
        resolve_user("0", tmp_path)
