"""``sandbox-kernel mcp``: the MCP server's configuration and life cycle.

Configuration is traitlets, like the kernel's: the flags (aliases of the
traits), ``--MCPServerApp.<option>=<value>``, and ``c.MCPServerApp.<option>``
in ``sandbox_kernel_config.py`` (the kernel's config file, read from every
``jupyter --paths`` config dir); the command line wins. A bad value exits
with status 2 and a message naming the option. The options become a
:class:`~sandbox_kernel.tools.sessions.ToolsConfig` (the library API), the
way the kernel's traits become the engine's ``EngineConfig``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from jupyter_core.paths import jupyter_config_path
from mcp.server.mcpserver import MCPServer
from traitlets import Bool, Bunch, Dict, Enum, Float, Int, List, TraitError, Unicode, validate
from traitlets.config import Config
from traitlets.config.application import Application, boolean_flag
from traitlets.config.loader import ArgumentError, KVArgParseConfigLoader

from ..app import CONFIG_FILE
from ..engine.settings import EngineSettings
from ..terminal_text import TerminalSafeFormatter, make_handlers_terminal_safe
from .mcp_server import build_server, guarded_http_app, host_with_port, http_allowed_hosts, is_loopback_host
from .runtime_token import RuntimeTokenError, RuntimeTokenFile, check_private_dir, generate_token, token_file_name
from .sessions import SessionRegistry, ToolsConfig

log = logging.getLogger("sandbox_kernel.tools.mcp")

#: the HTTP bearer token when neither --token-file nor --token is given
TOKEN_ENV = "SANDBOX_KERNEL_MCP_TOKEN"
#: shortest token accepted: a guessable token is no authentication
MIN_TOKEN_LENGTH = 16
#: :attr:`HttpGuardConfig.token_source` of a token made for this run (none was configured)
GENERATED = "generated"


def _usable_token(value: str) -> bool:
    """A bearer token: long enough to guess at no rate, one printable word
    (it travels in an HTTP header)."""
    return len(value) >= MIN_TOKEN_LENGTH and value.isprintable() and " " not in value


# ---------------------------------------------------------------- configuration

#: the command-line shortcuts of the traits (the flags of the former argparse CLI)
ALIASES: dict[str, str] = {
    "transport": "MCPServerApp.transport",
    "host": "MCPServerApp.host",
    "port": "MCPServerApp.port",
    "path": "MCPServerApp.path",
    "allowed-host": "MCPServerApp.allowed_hosts",
    "token": "MCPServerApp.token",
    "token-file": "MCPServerApp.token_file",
    "user-id": "MCPServerApp.user_id",
    "session-id": "MCPServerApp.session_id",
    "backend": "MCPServerApp.backend",
    "shell-backend": "MCPServerApp.shell_backend",
    "docker-image": "MCPServerApp.docker_image",
    "idle-timeout": "MCPServerApp.idle_timeout",
    "data-dir": "MCPServerApp.data_dir",
    "log-level": "MCPServerApp.log_level",
}
_FLAG_OF = {trait.split(".", 1)[1]: f"--{flag}" for flag, trait in ALIASES.items()}
_FLAG_OF.update(
    identity_headers="--identity-headers", docker_persistent="--docker-persistent", unsafe_no_token="--unsafe-no-token"
)
_DEFAULTS = ToolsConfig()


class ConfigError(ValueError):
    """A bad configuration value; the message names the option."""


def _option(name: str) -> str:
    """How an option is named in messages: ``--port (MCPServerApp.port)``."""
    flag = _FLAG_OF.get(name)
    return f"{flag} (MCPServerApp.{name})" if flag else f"MCPServerApp.{name}"


def _bad(name: str, message: str) -> TraitError:
    return TraitError(f"{_option(name)}: {message}")


def _config_error(exc: BaseException) -> ConfigError:
    """A ConfigError naming the option for traitlets' own messages
    ("The 'port' trait of an MCPServerApp instance expected an int...")."""
    text = str(exc)
    if not text.startswith(("--", "MCPServerApp.")):
        match = re.search(r"The '(\w+)' trait", text)
        if match:
            text = f"{_option(match.group(1))}: {text}"
    return ConfigError(text)


class LogLevel(Enum):  # type: ignore[type-arg]  # traitlets' Enum of Any
    """Application's log-level Enum, also accepting WARNING and lower case (as the argparse CLI did)."""

    def validate(self, obj: Any, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().upper()
        return super().validate(obj, value)


class MCPServerApp(Application, EngineSettings):
    """``sandbox-kernel mcp``: the agent tools over MCP, configured with traitlets.

    Every option is a trait: ``--MCPServerApp.<name>=<value>`` on the command
    line, ``c.MCPServerApp.<name> = ...`` in ``sandbox_kernel_config.py`` (read
    from every directory of ``jupyter --paths``, like the kernel's), plus the
    short flags of :data:`ALIASES`. The command line wins over the file.

    >>> app = MCPServerApp()
    >>> app.initialize(["--backend", "subprocess"])
    >>> app.tools_config().backend
    'subprocess'
    """

    _log_formatter_cls = TerminalSafeFormatter  # its log can quote what a sandbox wrote

    name = "sandbox-kernel-mcp"
    description = (
        "Serve the sandbox_kernel agent tools (a sandboxed notebook and shell) over MCP. "
        f"Options also come from {CONFIG_FILE}.py / .json in the Jupyter config dirs "
        "(`jupyter --paths`); the command line wins."
    )
    examples = (
        "python -m sandbox_kernel mcp --user-id alice --session-id s1\n"
        "python -m sandbox_kernel mcp --transport streamable-http --port 8000\n"
        "python -m sandbox_kernel mcp --transport streamable-http --host 0.0.0.0 --token-file /run/secrets/mcp-token "
        "--allowed-host localhost:9000\n"
        "python -m sandbox_kernel mcp --MCPServerApp.network=host --MCPServerApp.max_cells=200"
    )
    aliases = {**Application.aliases, **ALIASES}  # noqa: RUF012 - traitlets declares them per instance
    flags = {  # noqa: RUF012 - traitlets declares them per instance
        **Application.flags,
        **boolean_flag(
            "identity-headers",
            "MCPServerApp.identity_headers",
            "HTTP only: take the session from the X-Sandbox-User-Id / X-Sandbox-Session-Id headers "
            "(only behind a trusted gateway that sets them).",
            "Use the fixed --user-id / --session-id (the default).",
        ),
        "unsafe-no-token": (
            {"MCPServerApp": {"unsafe_no_token": True}},
            "UNSAFE: serve HTTP without a bearer token, on loopback too (every local user or process that "
            "reaches the port runs code in the sandbox and reads the workspace). Only behind a gateway that "
            "authenticates every request.",
        ),
        **boolean_flag(
            "docker-persistent",
            "MCPServerApp.docker_persistent",
            "Keep one Docker shell container per session between commands.",
            "One Docker shell container per command (the default).",
        ),
    }

    # -- server -------------------------------------------------------------
    transport = Enum(
        ["stdio", "streamable-http"],
        default_value="stdio",
        help="MCP transport: 'stdio' (the client starts this process) or 'streamable-http' "
        "(serve http://<host>:<port><path>).",
    ).tag(config=True)
    host = Unicode(
        "127.0.0.1",
        help="Bind address of the streamable-http transport (the default: this machine only).",
    ).tag(config=True)
    port = Int(8000, help="TCP port of the streamable-http transport (1-65535).").tag(config=True)
    path = Unicode("/mcp", help="Endpoint path of the streamable-http transport.").tag(config=True)
    allowed_hosts = List(
        Unicode(),
        [],
        help="HTTP: more Host header values to answer to, as 'name:port' (e.g. 'localhost:9000' when a "
        "container's port 8000 is published as 9000, or 'mcp.example.org:443'); 'name:*' for any port. "
        "Always allowed: 127.0.0.1, localhost and [::1] on --port, and --host itself if it is an IP address. "
        "Requests with any other Host are refused (421) and browser pages of another origin (403): "
        "DNS-rebinding protection.",
    ).tag(config=True)
    token = Unicode(
        "",
        help="HTTP: bearer token every request must carry (Authorization: Bearer <token>, else 401). "
        "Visible to other local users in the process list: prefer --token-file or "
        f"${TOKEN_ENV}. At least {MIN_TOKEN_LENGTH} characters. With none of the three on a loopback "
        "--host, the server generates a token and writes it to a file only you can read, in the Jupyter "
        "runtime dir ($JUPYTER_RUNTIME_DIR, `jupyter --runtime-dir`); the path is printed at start.",
    ).tag(config=True)
    token_file = Unicode(
        "",
        help="HTTP: file holding the bearer token (surrounding whitespace ignored); see --token.",
    ).tag(config=True)
    unsafe_no_token = Bool(
        False,
        help="UNSAFE: serve HTTP without a bearer token. Without it a server with no configured token "
        "generates one on a loopback --host and refuses to start on any other: anyone who reaches the port "
        "(on loopback, every local user of the machine) could run commands and read the notebooks.",
    ).tag(config=True)
    log_level = LogLevel(
        (0, 10, 20, 30, 40, 50, "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL"),
        default_value=logging.WARNING,
        help="Log level, a name or a number (30: WARN, the default). Logs go to stderr.",
    ).tag(config=True)

    # -- which session ------------------------------------------------------
    identity_headers = Bool(
        False,
        help="HTTP only: take the user and session per request from the X-Sandbox-User-Id / "
        "X-Sandbox-Session-Id headers. Only behind a trusted gateway that sets them: clients could "
        "otherwise pick any session.",
    ).tag(config=True)

    # -- sandboxes ----------------------------------------------------------
    shell_backend = Enum(
        ["sandbox", "docker"],
        default_value=_DEFAULTS.shell_backend,
        help="Where sandbox_execute runs commands: 'sandbox' (the cells' sandbox backend) or 'docker' "
        "(hardened containers, see docker_persistent).",
    ).tag(config=True)
    docker_image = Unicode(
        "",
        help="Image of the Docker shell (shell_backend='docker'). Empty (the default): "
        "$SANDBOX_DOCKER_IMAGE, else sandbox-kernel:latest.",
    ).tag(config=True)
    docker_persistent = Bool(
        _DEFAULTS.docker_persistent,
        help="Docker shell: keep one container per session between commands (faster; /tmp and background "
        "processes survive) instead of a fresh container per command.",
    ).tag(config=True)
    docker_read_only_mounts = Dict(
        {},
        help="Docker shell: extra read-only mounts {host path: container path}.",
    ).tag(config=True)

    # -- sessions and outputs -----------------------------------------------
    idle_timeout = Float(
        _DEFAULTS.idle_timeout,
        help="Seconds before an idle session is checkpointed and its sandbox stopped (resumed on the next "
        "call; 0: never).",
    ).tag(config=True)
    max_cells = Int(_DEFAULTS.max_cells, help="Most cells a notebook may hold.").tag(config=True)

    # -- validation ---------------------------------------------------------
    def _trait_error(self, name: str, message: str) -> TraitError:
        return _bad(name, message)  # names the flag too: "--data-dir (MCPServerApp.data_dir)"

    @validate("port")
    def _check_port(self, proposal: Bunch) -> int:
        if not 1 <= proposal.value <= 65535:
            raise _bad("port", f"must be between 1 and 65535, got {proposal.value}")
        return int(proposal.value)

    @validate("host")
    def _check_host(self, proposal: Bunch) -> str:
        value = str(proposal.value).strip()
        if not value or any(c.isspace() for c in value):
            raise _bad("host", f"must be a host name or address, got {proposal.value!r}")
        return value

    @validate("allowed_hosts")
    def _check_allowed_hosts(self, proposal: Bunch) -> list[str]:
        hosts = [str(h).strip() for h in proposal.value]
        for host in hosts:
            if not host or any(c.isspace() for c in host) or "/" in host or "@" in host or host == "*":
                raise _bad(
                    "allowed_hosts",
                    f"{host!r} is not a Host header value: give 'name:port' (e.g. 'localhost:8000') or 'name:*', "
                    "without scheme or path",
                )
        return hosts

    @validate("token")
    def _check_token(self, proposal: Bunch) -> str:
        value = str(proposal.value).strip()
        if value and not _usable_token(value):
            raise _bad("token", f"must be at least {MIN_TOKEN_LENGTH} printable characters without spaces")
        return value

    @validate("path")
    def _check_path(self, proposal: Bunch) -> str:
        if not proposal.value.startswith("/") or any(c.isspace() for c in proposal.value):
            raise _bad("path", f"must start with '/' and contain no spaces, got {proposal.value!r}")
        return str(proposal.value)

    @validate("idle_timeout")
    def _check_idle_timeout(self, proposal: Bunch) -> float:
        if not proposal.value >= 0 or proposal.value == float("inf"):  # NaN fails too
            raise _bad("idle_timeout", f"must be a number of seconds >= 0 (0: never), got {proposal.value}")
        return float(proposal.value)

    @validate("max_cells")
    def _check_positive(self, proposal: Bunch) -> int:
        if proposal.value < 1:
            raise _bad(proposal.trait.name, f"must be >= 1, got {proposal.value}")
        return int(proposal.value)

    @validate("docker_image")
    def _check_docker_image(self, proposal: Bunch) -> str:
        if proposal.value and (not proposal.value.strip() or any(c.isspace() for c in proposal.value)):
            raise _bad("docker_image", f"{proposal.value!r} is not an image reference (no spaces allowed)")
        return str(proposal.value)

    @validate("docker_read_only_mounts")
    def _check_mounts(self, proposal: Bunch) -> dict[str, str]:
        from ..docker import check_read_only_mounts

        try:
            return check_read_only_mounts({str(k): str(v) for k, v in proposal.value.items()})
        except ValueError as exc:
            raise _bad("docker_read_only_mounts", str(exc)) from None

    # -- life cycle ---------------------------------------------------------
    def _create_loader(self, argv: Any, aliases: Any, flags: Any, classes: Any) -> KVArgParseConfigLoader:
        return KVArgParseConfigLoader(
            argv, aliases, flags, classes=classes, log=self.log, subcommands=self.subcommands, prog="sandbox-kernel mcp"
        )

    def parse_command_line(self, argv: Sequence[str] | None = None) -> None:
        """Application's, but a bad value raises (``TraitError``) instead of being
        logged as CRITICAL with exit status 1 (``catch_config_error``)."""
        parse = getattr(Application.parse_command_line, "__wrapped__", Application.parse_command_line)
        parse(self, list(argv) if argv is not None else None)

    def initialize(self, argv: Sequence[str] | None = None) -> None:
        """Parse the command line, then read the config files (the command line wins).
        Raises :class:`ConfigError` on a bad value (``SystemExit`` for ``--help``
        and argument syntax errors, as argparse does)."""
        try:
            self.parse_command_line(argv)
            if self.extra_args:
                raise ConfigError(f"unexpected argument(s): {' '.join(self.extra_args)} (see --help)")
            self.load_config_file()
        except (TraitError, ArgumentError) as exc:
            raise _config_error(exc) from None

    def load_config_file(self, suppress_errors: bool = False) -> None:  # type: ignore[override]
        """Read ``sandbox_kernel_config.py`` / ``.json`` (the kernel's file) from every
        directory of :func:`jupyter_config_path` (earlier directories win over
        later ones, the command line over every file). A broken file is an error (:class:`ConfigError`),
        not a warning: a server must not start on a half-read configuration."""
        new_config = Config()
        for directory in reversed(jupyter_config_path()):  # lowest priority first
            try:
                for config, filename in self._load_config_files(
                    CONFIG_FILE,
                    path=[directory],
                    log=self.log,
                    raise_config_file_errors=True,
                ):
                    new_config.merge(config)
                    if filename not in self._loaded_config_files:
                        self._loaded_config_files.append(filename)
            except Exception as exc:
                if suppress_errors:
                    self.log.error("cannot read %s in %s: %s", CONFIG_FILE, directory, exc)
                    continue
                raise ConfigError(
                    f"cannot read {os.path.join(directory, CONFIG_FILE)}.py/.json: {type(exc).__name__}: {exc}"
                ) from None
        new_config.merge(self.cli_config)
        self.update_config(new_config)

    def tools_config(self) -> ToolsConfig:
        """The :class:`ToolsConfig` these options ask for (``ValueError`` on a bad value)."""
        docker_config = None
        if self.docker_image:
            from ..docker import ContainerConfig

            docker_config = ContainerConfig(image=self.docker_image)
        return ToolsConfig(
            backend=self.backend,
            shell_backend=self.shell_backend,
            idle_timeout=self.idle_timeout,
            max_cells=self.max_cells,
            data_dir=self.data_root(),
            limits=self.resource_limits(),
            network="user" if self.network == "full" else self.network,
            egress_policy=self.egress_policy(),
            egress_name_overrides=dict(self.egress_name_overrides),
            trust_outputs=self.trust_outputs,
            max_output_bytes=self.max_output_bytes,
            tmp_size=self.tmp_size,
            interrupt_grace=self.interrupt_grace,
            sandbox_uid=None if self.sandbox_uid < 0 else self.sandbox_uid,
            private_datasets={name: dict(spec) for name, spec in self.private_datasets.items()},
            shared_store_url=self.shared_store_url,
            docker_read_only_mounts=dict(self.docker_read_only_mounts),
            docker_config=docker_config,
            docker_persistent=self.docker_persistent,
        )

    def http_token(self) -> tuple[str, str] | None:
        """The configured bearer token and where it came from (an option's name):
        ``--token-file``, else ``--token``, else ``$SANDBOX_KERNEL_MCP_TOKEN``;
        ``None`` if none is set. :class:`ConfigError` (naming the option) for an
        unreadable file, an empty or too short token, or both ``--token`` and
        ``--token-file``."""
        if self.token and self.token_file:
            raise ConfigError(f"{_option('token')} and {_option('token_file')}: give one of them, not both")
        if self.token_file:
            try:
                with open(self.token_file, encoding="utf-8") as f:
                    value, origin = f.read().strip(), _option("token_file")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{_option('token_file')}: cannot read {self.token_file!r}: {exc}") from None
        elif self.token:
            value, origin = self.token, _option("token")
        elif TOKEN_ENV in os.environ:
            value, origin = os.environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
        else:
            return None
        if not _usable_token(value):
            raise ConfigError(
                f"{origin}: the token must be at least {MIN_TOKEN_LENGTH} printable characters without spaces "
                "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return value, origin

    def http_guard(self) -> HttpGuardConfig:
        """The allowed Host values and the bearer token of the HTTP transport.

        Without a configured token, a loopback bind gets a generated one
        (:data:`GENERATED`; the server writes it to a private file once it
        listens): on a shared machine every local account reaches 127.0.0.1.
        Any other bind address without a token is a :class:`ConfigError` naming
        ``--token-file`` (its clients are elsewhere: they need a token provisioned
        for them, not one in this machine's runtime dir). ``--unsafe-no-token``
        serves without one on any address (e.g. an authenticating gateway in front)."""
        hosts = http_allowed_hosts(self.host, self.port, self.allowed_hosts)
        configured = self.http_token()
        if configured is not None:
            return HttpGuardConfig(hosts, *configured)
        if self.unsafe_no_token:
            return HttpGuardConfig(hosts, None, _option("unsafe_no_token"))
        if not is_loopback_host(self.host):
            raise ConfigError(
                f"{_option('host')} {self.host} is not a loopback address, so the server needs a bearer token: "
                f"set {_option('token_file')} (or {_option('token')}, or ${TOKEN_ENV}). Clients then send "
                f"'Authorization: Bearer <token>'. Only behind a gateway that authenticates every request, "
                f"{_option('unsafe_no_token')} serves without one."
            )
        try:
            check_private_dir()  # fail before serving, not once the port is bound
        except RuntimeTokenError as exc:
            raise ConfigError(_no_token_file(exc)) from None
        return HttpGuardConfig(hosts, generate_token(), GENERATED)

    def make_server(self) -> tuple[SessionRegistry, MCPServer]:
        """The session registry and the MCP server (:class:`ConfigError` on a bad
        value, e.g. an invalid ``$SANDBOX_KERNEL_SESSION_ID``)."""
        try:
            registry = SessionRegistry(self.tools_config())
            server = build_server(
                registry, self.user_id or None, self.session_id or None, identity_headers=self.identity_headers
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return registry, server

    def init_root_logging(self) -> None:
        """Log the libraries' records (the engine's, MCP's) to stderr at the
        application's level; lines can quote what a sandbox wrote, so they are
        escaped (sandbox_kernel/terminal_text.py)."""
        logging.basicConfig(level=self.log_level, stream=sys.stderr)
        make_handlers_terminal_safe(logging.getLogger())

    def start(self) -> None:
        """Build the registry and the server, serve the chosen transport until the
        client goes away (stdio) or the process is interrupted (HTTP: SIGINT or
        SIGTERM; stdio: SIGTERM too), then close the registry (sessions checkpointed) and remove a
        generated token's file. :class:`ConfigError` before serving."""
        self.init_root_logging()
        guard = self.http_guard() if self.transport == "streamable-http" else None
        registry, server = self.make_server()
        if self.transport == "stdio":
            for name in ("identity_headers", "allowed_hosts", "token", "token_file", "unsafe_no_token"):
                if getattr(self, name):
                    log.warning("%s has no effect with the stdio transport", _FLAG_OF[name])
        import anyio

        async def transport() -> None:
            if guard is None:
                await server.run_stdio_async()
            else:
                await self._serve_http(server, guard)

        async def serve() -> None:
            await _serve_then_close(transport, registry.aclose)

        try:
            anyio.run(serve)
        except KeyboardInterrupt:
            pass

    async def _serve_http(self, server: MCPServer, guard: HttpGuardConfig) -> None:
        """Serve :func:`guarded_http_app` with uvicorn (what the SDK's
        ``run_streamable_http_async`` does, with the guard in front). Once the
        port is bound, a generated token is written to its file (so a second
        server on a taken port never replaces the first one's) and
        :func:`http_notice` is printed; the file goes when serving ends."""
        import uvicorn

        app = guarded_http_app(server, path=self.path, allowed_hosts=guard.allowed_hosts, token=guard.token)
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level=server.settings.log_level.lower())
        url = f"http://{host_with_port(self.host, self.port)}{self.path}"
        written: list[RuntimeTokenFile] = []

        def listening() -> None:
            path = None
            if guard.token is not None and guard.token_source == GENERATED:
                try:
                    written.append(RuntimeTokenFile.write(guard.token, token_file_name(self.host, self.port)))
                except RuntimeTokenError as exc:
                    raise ConfigError(_no_token_file(exc)) from None
                path = written[0].path
            print(http_notice(url, guard.token_source, path, host_with_port(self.host, self.port)), file=sys.stderr)

        try:
            await _notifying_server(config, listening).serve()
        finally:
            for token_file in written:
                token_file.remove()


class HttpGuardConfig(NamedTuple):
    """What :class:`~sandbox_kernel.tools.mcp_server.HttpGuard` enforces, from the options."""

    allowed_hosts: list[str]
    #: the bearer token every request must carry; ``None`` with ``--unsafe-no-token``
    token: str | None
    #: where the token comes from: an option's name, :data:`GENERATED`, or ``--unsafe-no-token``
    token_source: str


def _no_token_file(exc: RuntimeTokenError) -> str:
    """A :class:`RuntimeTokenError` as a ConfigError message naming the ways out."""
    return (
        f"no token was configured and the generated one cannot be stored safely: {exc}. "
        f"Set {_option('token_file')} (or ${TOKEN_ENV}), or point $JUPYTER_RUNTIME_DIR at a private directory."
    )


def http_notice(url: str, token_source: str, token_path: str | None, address: str) -> str:
    """What the HTTP server prints on stderr once it listens: where it serves and
    how a client authenticates.

    A generated token is not printed, only the path of its file: a server's
    stderr often ends up in logs others read (a systemd journal, a JupyterHub,
    container or CI log), while the file is readable by its user alone. Jupyter
    prints its URL with the token because a person clicks it in a browser; an
    MCP client is configured once, and the header value is as easily copied
    from the file."""
    head = f"sandbox-kernel mcp: serving MCP (streamable HTTP) at {url}"
    if token_path is not None:
        client = {
            "mcpServers": {
                "sandbox-kernel": {
                    "type": "http",
                    "url": url,
                    "headers": {"Authorization": "Bearer <the token in that file>"},
                }
            }
        }
        return (
            f"{head}\n"
            "  Every request must carry the header 'Authorization: Bearer <token>'. No token was configured "
            f"(--token-file, --token, ${TOKEN_ENV}), so one was generated for this run; it is in\n"
            f"    {token_path}\n"
            "  (readable by you only, removed when the server stops). An MCP client's configuration, e.g.:\n"
            f"    {json.dumps(client)}\n"
            f'  In a shell the header is: "Authorization: Bearer $(cat {shlex.quote(token_path)})"'
        )
    if token_source == _option("unsafe_no_token"):
        return (
            f"{head}\n"
            f"  UNSAFE ({token_source}): no bearer token is required. Whoever reaches {address} (on loopback: "
            "every local user and process of this machine) can run code in this session's sandbox and read its "
            "workspace."
        )
    return f"{head}\n  Every request must carry 'Authorization: Bearer <token>', the token of {token_source}."


#: how long a SIGTERM waits for the transport to stop before the sessions are closed anyway
STOP_WAIT = 1.0


async def _serve_then_close(serve: Callable[[], Awaitable[None]], close: Callable[[], Awaitable[None]]) -> None:
    """Run ``serve`` until it ends or SIGTERM comes, then ``close`` (the
    sessions: checkpointed, their sandboxes and temporary folders removed),
    shielded.

    SIGTERM stops serving as end of input (stdio) or Ctrl-C (HTTP) does. With
    the default action the process died at once and left the sessions' folders
    behind; an MCP client sends it two seconds after closing a stdio server's
    input, a supervisor or ``docker stop`` at any time, and uvicorn raises it
    again after its own graceful shutdown. The signal is taken through the
    event loop (anyio's signal receiver), so it cancels the serving cleanly.
    A stdio transport whose input is still open cannot stop: its reader thread
    sits in a read no cancellation reaches, and the interpreter would wait for
    it at exit. Then the sessions are closed all the same and the process ends
    with ``os._exit(0)``. A SIGTERM while the sessions close is said in the log
    and otherwise ignored: it would cut the closing short."""
    import anyio

    closing = False
    stopped = anyio.Event()

    async def close_once() -> None:
        nonlocal closing
        if closing:
            return
        closing = True
        with anyio.CancelScope(shield=True):
            await close()

    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        async with anyio.create_task_group() as group:
            serving = anyio.CancelScope()

            async def watch() -> None:
                async for _ in signals:
                    if closing:
                        log.warning("SIGTERM while the sessions are being closed: finishing that first")
                        continue
                    log.warning("SIGTERM: closing the sessions, then exiting")
                    serving.cancel()
                    with anyio.move_on_after(STOP_WAIT):
                        await stopped.wait()
                    if not stopped.is_set():
                        await close_once()
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(0)

            group.start_soon(watch)
            try:
                with serving:
                    await serve()
            finally:
                stopped.set()
                await close_once()
                group.cancel_scope.cancel()


def _notifying_server(config: Any, listening: Callable[[], None]) -> Any:
    """A ``uvicorn.Server`` that calls ``listening()`` once its socket is bound
    (uvicorn has no such hook; its lifespan start-up runs before the bind)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[Any] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                listening()

    return Server(config)


def main(argv: Sequence[str] | None = None) -> int:
    """``sandbox-kernel mcp``: 0 after serving, 2 on a bad option (message on stderr)."""
    app = MCPServerApp()
    try:
        app.initialize(list(sys.argv[1:] if argv is None else argv))
        app.start()
    except ConfigError as exc:
        print(f"sandbox-kernel mcp: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help, --version, argument syntax errors (argparse prints them)
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    return 0
