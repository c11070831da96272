"""The engine's options as traitlets, declared once for every front end.

The kernel (``SandboxKernel``) and the MCP server (``MCPServerApp``) both
inherit :class:`EngineSettings`, so one ``sandbox_kernel_config.py`` (or
``--SandboxKernel.x=`` / ``--MCPServerApp.x=``) means the same thing to both,
with the same defaults, help and validation, and both produce their
:class:`~sandbox_kernel.engine.config.EngineConfig` with
:meth:`EngineSettings.engine_config`. Options that only one front end has
(the kernel's ``cell_timeout``, the server's ``port``) stay in that front end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode, observe, validate
from traitlets.utils.bunch import Bunch

from ..network import EgressPolicy
from ..network.egress_rules import parse_address
from ..privacy import PrivacyStore, default_store, validate_id
from ..sandbox.limit_traits import GiB, LimitTraits
from ..sandbox.registry import backend_names, load_backend
from .config import EngineConfig


class EngineSettings(LimitTraits):
    """Sandbox, network, privacy and output options shared by the kernel and the MCP server."""

    backend = Unicode(
        "auto",
        help="Sandbox backend: 'bwrap' (the default on Linux when installed), 'docker', 'subprocess' "
        "(development only: isolates nothing), or one a package registers under the "
        "'sandbox_kernel.backends' entry point. 'auto' picks bwrap, else subprocess.",
    ).tag(config=True)
    network = Enum(
        ["proxied", "full", "user", "host", "none"],
        default_value="proxied",
        help="Network of public sessions' sandboxes. 'proxied' (the default): no interface; HTTP(S) goes "
        "through an egress proxy on the host that applies egress_allow/egress_deny, never reaches loopback, "
        "private or metadata addresses, logs every connection, and is cut in place (no sandbox replacement) "
        "when the session turns private. 'full' (or 'user'): a user-mode network with raw sockets, but not "
        "the host's loopback; replaced by a network-less sandbox when private. 'host': the HOST's network "
        "namespace (exposes every service on the host's loopback, the Jupyter server included, and its "
        "abstract unix sockets). 'none': never any network. Private sessions never get network.",
    ).tag(config=True)
    egress_allow = List(
        Unicode(),
        ["*"],
        help="PROXIED mode: domains the sandbox may reach ('pypi.org', '*.pythonhosted.org' for any name "
        "below it, '*' for all). Default: the whole public internet.",
    ).tag(config=True)
    egress_deny = List(
        Unicode(), [], help="PROXIED mode: domains never reached (deny wins over allow), same patterns."
    ).tag(config=True)
    egress_allow_addresses = List(
        Unicode(),
        [],
        help="PROXIED mode: addresses or networks reached although loopback/private/link-local "
        "(e.g. a package mirror on 10.0.0.5). Default: none.",
    ).tag(config=True)
    egress_connect_ports = List(
        Int(),
        [443],
        help="PROXIED mode: the ports an HTTPS (CONNECT) tunnel may go to. What passes inside a tunnel is "
        "not read, so to a port serving plain HTTP it carries any request to any site sharing the address, "
        "logged as one connection. Plain http:// requests go to any port, one checked request each.",
    ).tag(config=True)
    egress_name_overrides = Dict(
        {},
        help="PROXIED mode: fixed addresses for names {name: [address, ...]}, still checked by the rules "
        "(pin a mirror; the tests point names at 127.0.0.1 servers).",
    ).tag(config=True)
    share_host_network = Bool(
        False,
        help="Deprecated spelling of network='host' (kept so existing configurations keep working).",
    ).tag(config=True)
    data_dir = Unicode(
        "",
        help="Where sandbox_kernel keeps its state on the host: the ratchet's store (<data_dir>/privacy) and "
        "the agent tools' notebooks and workspaces (a relative path is taken from the current directory). "
        "Empty (the default): $SANDBOX_KERNEL_DATA_DIR, else <jupyter data dir>/sandbox_kernel.",
    ).tag(config=True)
    shared_store_url = Unicode(
        "",
        help="A postgresql:// URL: the ratchet's levels are also kept there, so kernels and agent tools on "
        "other hosts serving the same session share them (the file store under data_dir stays in use on "
        "each host). An unreachable database makes sessions SECRET (no network), never public. Needs "
        "'sandbox_kernel[postgresql]'.",
    ).tag(config=True)
    user_id = Unicode(
        "",
        help="User id of the private-data ratchet. Empty (the default): the OS user name (the MCP server "
        "reads $SANDBOX_KERNEL_USER_ID first).",
    ).tag(config=True)
    session_id = Unicode(
        "",
        help="Session id of the private-data ratchet. Empty (the default): the kernel derives it from the "
        "notebook's path (restarts and new kernels on one notebook share the ratchet); the MCP server from "
        "$SANDBOX_KERNEL_SESSION_ID, else a new random id.",
    ).tag(config=True)
    private_datasets = Dict(
        {},
        help="Private datasets mounted read-only at /private/<name>, only into sandboxes without network: "
        "{name: {'source': host path, 'sensitivity': 'INTERNAL'|'CONFIDENTIAL'|'SECRET'}} (sensitivity "
        "defaults to CONFIDENTIAL; on the command line: name=<JSON object> or name=<path>). Using one "
        "raises the session's ratchet.",
    ).tag(config=True)
    trust_outputs = Bool(
        False,
        help="Pass HTML, SVG and JavaScript outputs to the frontend unsanitised. Outputs come from untrusted "
        "code: only enable this for code you trust.",
    ).tag(config=True)
    max_output_bytes = Int(
        10 * 1024 * 1024, help="Output a single cell may send before it is truncated, in bytes."
    ).tag(config=True)
    tmp_size = Int(1 * GiB, help="Size cap of the sandbox's private /tmp, in bytes.").tag(config=True)
    interrupt_grace = Float(5.0, help="Seconds an interrupted cell gets before it is killed.").tag(config=True)
    sandbox_uid = Int(
        -1,
        help="Host uid the sandbox runs as when the host process runs as root: -1 picks 65534 (nobody), so "
        "cells get no more file access than any other unprivileged user; the workspace is shared with it "
        "by POSIX ACLs. 0 keeps host root's file access inside the sandbox (unsafe). Ignored when not root "
        "(the sandbox then has the host user's access).",
    ).tag(config=True)

    # ---- messages ----------------------------------------------------------------
    def _trait_error(self, name: str, message: str) -> TraitError:
        """An error naming the option; front ends with flags override the naming."""
        return TraitError(f"{type(self).__name__}.{name}: {message}")

    # ---- validation ----------------------------------------------------------------
    @validate("backend")
    def _check_backend(self, proposal: Bunch) -> str:
        value = str(proposal.value).strip()
        if value == "auto":
            return value
        if value not in backend_names():
            raise self._trait_error(
                "backend", f"unknown sandbox backend {value!r}: choose one of auto, {', '.join(backend_names())}"
            )
        try:
            load_backend(value)
        except ValueError as exc:
            raise self._trait_error("backend", str(exc)) from None
        return value

    @observe("share_host_network")
    def _share_host_network_changed(self, change: Bunch) -> None:
        if change.new:
            self.network = "host"

    @validate("user_id", "session_id")
    def _check_id(self, proposal: Bunch) -> str:
        name = proposal.trait.name
        if proposal.value == "":
            return ""  # the default: each front end's own
        try:
            return validate_id(proposal.value, name)
        except ValueError as exc:
            raise self._trait_error(name, str(exc)) from None

    @validate("memory_limit", "max_processes", "max_file_size", "max_open_files")
    def _check_limit(self, proposal: Bunch) -> int:
        if proposal.value < 0:
            raise self._trait_error(proposal.trait.name, f"must be >= 0 (0: no limit), got {proposal.value}")
        return int(proposal.value)

    @validate("max_output_bytes", "tmp_size")
    def _check_positive(self, proposal: Bunch) -> int:
        if proposal.value < 1:
            raise self._trait_error(proposal.trait.name, f"must be >= 1, got {proposal.value}")
        return int(proposal.value)

    @validate("interrupt_grace")
    def _check_grace(self, proposal: Bunch) -> float:
        if not 0 <= proposal.value < float("inf"):  # NaN fails too
            raise self._trait_error("interrupt_grace", f"must be a number of seconds >= 0, got {proposal.value}")
        return float(proposal.value)

    @validate("data_dir")
    def _check_data_dir(self, proposal: Bunch) -> str:
        if not proposal.value:
            return ""
        if "\0" in proposal.value:
            raise self._trait_error("data_dir", "must be a path")
        return str(Path(proposal.value).expanduser().absolute())

    @validate("private_datasets")
    def _check_private_datasets(self, proposal: Bunch) -> dict[str, dict[str, str]]:
        from .ratchet import PrivateMount

        result: dict[str, dict[str, str]] = {}
        for name, raw in proposal.value.items():
            spec: Any = raw
            if isinstance(spec, str):  # from the command line: name=<JSON object> or name=<path>
                if spec.lstrip().startswith("{"):
                    try:
                        spec = json.loads(spec)
                    except json.JSONDecodeError as exc:
                        raise self._trait_error(
                            "private_datasets", f"private dataset {name!r}: invalid JSON ({exc})"
                        ) from None
                else:
                    spec = {"source": spec}
            try:
                mount = PrivateMount.parse(str(name), spec)
            except ValueError as exc:
                raise self._trait_error("private_datasets", str(exc)) from None
            # the checked, absolute form: sessions resolve nothing relative later
            result[mount.name] = {"source": str(mount.source), "sensitivity": mount.sensitivity.name}
        return result

    # ---- what the settings make ----------------------------------------------------
    def data_root(self) -> Path | None:
        """``data_dir`` as a path; None: the default, read from the environment when used."""
        return Path(self.data_dir) if self.data_dir else None

    def privacy_store(self, root: Path | None = None) -> PrivacyStore:
        """The ratchet's store: under the data dir (or ``root``), and shared
        through PostgreSQL when ``shared_store_url`` is set."""
        if root is None:
            data = self.data_root()
            root = data / "privacy" if data is not None else default_store().root
        if not self.shared_store_url:
            return PrivacyStore(root)
        from ..privacy.postgres import open_store

        return open_store(root, self.shared_store_url)

    def egress_policy(self) -> EgressPolicy:
        """The PROXIED mode's rules (a bad pattern raises ValueError naming it)."""
        return EgressPolicy(
            allow=list(self.egress_allow),
            deny=list(self.egress_deny),
            allow_addresses=list(self.egress_allow_addresses),
            connect_ports=list(self.egress_connect_ports),
        )

    @validate("egress_allow", "egress_deny", "egress_allow_addresses")
    def _check_egress(self, proposal: Bunch) -> list[str]:
        values = [str(v) for v in proposal.value]
        key = {"egress_allow": "allow", "egress_deny": "deny", "egress_allow_addresses": "allow_addresses"}
        rules: dict[str, Any] = {key[proposal.trait.name]: values}
        try:
            EgressPolicy(**rules)
        except ValueError as exc:
            raise self._trait_error(proposal.trait.name, str(exc)) from None
        return values

    @validate("egress_connect_ports")
    def _check_connect_ports(self, proposal: Bunch) -> list[int]:
        try:
            return list(EgressPolicy(connect_ports=list(proposal.value)).connect_ports)
        except ValueError as exc:
            raise self._trait_error(proposal.trait.name, str(exc)) from None

    @validate("egress_name_overrides")
    def _check_overrides(self, proposal: Bunch) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, addresses in proposal.value.items():
            values = [addresses] if isinstance(addresses, str) else list(addresses)
            if not values or any(parse_address(str(a)) is None for a in values):
                raise self._trait_error(
                    "egress_name_overrides", f"{name!r}: {addresses!r} is not a list of IP addresses"
                )
            out[str(name).lower().rstrip(".")] = [str(a) for a in values]
        return out

    def engine_config(self, workspace: Path, **overrides: Any) -> EngineConfig:
        """The plain engine settings these options describe, for one session's workspace."""
        values: dict[str, Any] = {
            "backend": self.backend,
            "workspace": workspace,
            "limits": self.resource_limits(),
            "tmp_size": self.tmp_size,
            "trust_outputs": self.trust_outputs,
            "max_output_bytes": self.max_output_bytes,
            "interrupt_grace": self.interrupt_grace,
            "network": "user" if self.network == "full" else self.network,
            "egress_policy": self.egress_policy(),
            "egress_name_overrides": {str(k): [str(a) for a in v] for k, v in self.egress_name_overrides.items()},
            "sandbox_uid": None if self.sandbox_uid < 0 else self.sandbox_uid,
        }
        values.update(overrides)
        return EngineConfig(**values)


__all__ = ["EngineSettings"]
