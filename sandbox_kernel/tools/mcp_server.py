"""The agent tools as an MCP server (official ``mcp`` SDK, ``MCPServer``).

    python -I -m sandbox_kernel mcp [--transport stdio|streamable-http] ...

Configuration and start-up: :mod:`sandbox_kernel.tools.mcp_app`
(``MCPServerApp``, traitlets like the kernel's).

Errors: bad arguments (unknown cell, bad path, invalid id...) come back as a
tool error (``isError``) with a plain message the model can act on;
infrastructure failures (no sandbox, Docker down, corrupt notebook file) come
back as a tool error whose text starts with ``[FATAL]`` (the seeds'
convention: a strict client aborts the run instead of retrying). Figures are
MCP ``ImageContent``.

The session the tools act on is fixed per server: ``--user-id`` /
``--session-id`` (or $SANDBOX_KERNEL_USER_ID / $SANDBOX_KERNEL_SESSION_ID).
The model cannot pick another session (that would let it escape the
private-data ratchet by starting a fresh one). Over HTTP, with
``--identity-headers``, a trusted gateway may set ``X-Sandbox-User-Id`` and
``X-Sandbox-Session-Id`` per request instead.

Over HTTP every request passes :class:`HttpGuard` first: its ``Host`` must be
one this server answers to and a browser's ``Origin`` must be this server's
(a web page that rebinds its own name to this address sends its own name:
refused), and it must carry ``Authorization: Bearer <token>``: the token of
``--token-file`` / ``--token`` / ``$SANDBOX_KERNEL_MCP_TOKEN``, else one the
server generated and wrote to a file only its user can read (see
:mod:`sandbox_kernel.tools.runtime_token`); only ``--unsafe-no-token`` serves
without one. The SDK's own Host/Origin check is switched on too, whatever the
bind address (it switches itself on only for the literal loopback hosts).
"""

from __future__ import annotations

import hmac
import inspect
import ipaddress
import logging
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp_types import CallToolResult, ImageContent, TextContent
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..privacy import default_user_id, validate_id
from .catalog import CATALOG, ToolSpec, call_tool
from .errors import ToolFatalError, ToolRetryError, classify
from .render import ToolResult, deliverable
from .sessions import SESSION_ENV, USER_ENV, SessionRegistry

log = logging.getLogger("sandbox_kernel.tools.mcp")

INSTRUCTIONS = (
    "A stateful Python notebook and a shell, both sandboxed. repl_execute_cell runs Python; "
    "variables, imports and functions persist across cells. sandbox_execute runs shell commands. "
    "Both share /workspace. Once private data enters the session, network access is cut for good."
)


def _content(result: ToolResult) -> CallToolResult:
    result = deliverable(result)  # a bounded number of images, each with a sane header
    blocks: list[Any] = [TextContent(type="text", text=result.text)]
    for mime, data in result.images:
        blocks.append(ImageContent(type="image", data=data, mime_type=mime))
    return CallToolResult(content=blocks)


def _error(exc: BaseException) -> CallToolResult:
    mapped = classify(exc)
    if isinstance(mapped, ToolRetryError):
        text = f"Error: {mapped}"
    else:
        text = str(mapped if isinstance(mapped, ToolFatalError) else ToolFatalError(str(mapped)))
        log.error("fatal tool error: %s", text)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


#: the request headers a trusted gateway names the session with (``--identity-headers``)
USER_HEADER = "X-Sandbox-User-Id"
SESSION_HEADER = "X-Sandbox-Session-Id"


def identity_header(headers: Mapping[str, str], name: str) -> str | None:
    """The one value of the identity header ``name`` (any case), or None.

    More than one is refused: a dict of the headers kept the last silently,
    so behind a gateway that adds its header in front of the client's, the
    client chose the session (a fresh, public one: out of the ratchet).
    ``items()`` of the transport's headers (Starlette's) lists each header
    as sent, repeats included."""
    values = [value for key, value in headers.items() if key.lower() == name.lower()]
    if len(values) > 1:
        raise ToolFatalError(
            f"the request carries {len(values)} {name} headers: exactly one is allowed with --identity-headers "
            "(the gateway must replace the header a client sent, not add its own beside it)"
        )
    return values[0] if values else None


def build_server(
    registry: SessionRegistry | None = None,
    user_id: str | None = None,
    session_id: str | None = None,
    identity_headers: bool = False,
    name: str = "sandbox-kernel",
) -> MCPServer:
    """An MCPServer exposing the REPL tools and sandbox_execute for one session
    (or, with ``identity_headers``, the session named by trusted request headers)."""
    reg = registry or SessionRegistry()
    user = validate_id(user_id or os.environ.get(USER_ENV) or default_user_id(), "user_id")
    session = validate_id(session_id or os.environ.get(SESSION_ENV) or f"mcp-{uuid.uuid4().hex[:12]}", "session_id")
    server = MCPServer(name=name, instructions=INSTRUCTIONS)

    def ids(ctx: Context | None) -> dict[str, Any]:
        u, s = user, session
        if identity_headers and ctx is not None:
            try:
                headers = ctx.headers or {}
            except Exception:
                headers = {}
            named_user, named_session = identity_header(headers, USER_HEADER), identity_header(headers, SESSION_HEADER)
            u = validate_id(u if named_user is None else named_user, "user_id")
            s = validate_id(s if named_session is None else named_session, "session_id")
        return {"user_id": u, "session_id": s, "registry": reg}

    async def call(spec: ToolSpec, arguments: dict[str, Any]) -> CallToolResult:
        ctx = arguments.pop("ctx", None)
        try:
            return _content(await call_tool(spec, arguments, ids(ctx)))
        except Exception as exc:
            return _error(exc)

    # the SDK injects the request context into a parameter annotated with Context
    ctx_param = inspect.Parameter(
        "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=Context | None
    )
    for spec in CATALOG:
        server.add_tool(spec.bind(call, [ctx_param]))
    server.registry = reg  # type: ignore[attr-defined]
    return server


# ---------------------------------------------------------------- HTTP guard

#: the names of this machine's loopback interface a local client puts in ``Host``
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def is_loopback_host(host: str) -> bool:
    """Whether a bind address keeps the server on this machine's loopback
    (``localhost``, 127.0.0.0/8, ``::1``). Any other name or address (``0.0.0.0``,
    a host name that might resolve elsewhere) counts as reachable from outside."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_with_port(name: str, port: int) -> str:
    """``Host`` header spelling of ``name`` on ``port`` (IPv6 literals in brackets)."""
    try:
        if ipaddress.ip_address(name.strip("[]")).version == 6:
            name = f"[{name.strip('[]')}]"
    except ValueError:
        pass
    return f"{name}:{port}"


def http_allowed_hosts(bind_host: str, port: int, extra: Iterable[str] = ()) -> list[str]:
    """The ``Host`` values the server answers to: the loopback names on ``port``,
    the bind address itself when it is a concrete IP address (a rebinding page
    sends its own *name*, never an address literal), and ``extra`` (the user's
    ``--allowed-host``: e.g. the name and port a container is published on)."""
    hosts = [host_with_port(name, port) for name in LOOPBACK_NAMES]
    if port == 80:  # clients leave out the default port
        hosts += list(LOOPBACK_NAMES)
    try:
        address = ipaddress.ip_address(bind_host.strip("[]"))
    except ValueError:
        address = None
    if address is not None and not address.is_unspecified:
        hosts.append(host_with_port(str(address), port))
    for host in extra:
        if host not in hosts:
            hosts.append(host)
    return hosts


def transport_security(allowed_hosts: Sequence[str]) -> TransportSecuritySettings:
    """DNS-rebinding protection on, for these ``Host`` values and the matching
    ``http(s)://`` origins (a browser page of any other origin is refused)."""
    origins = [f"{scheme}://{host}" for host in allowed_hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=list(allowed_hosts), allowed_origins=origins
    )


class HttpGuard:
    """ASGI middleware in front of the whole HTTP app (every path and method).

    1. ``Host`` / ``Origin`` (the SDK's checker, with :func:`transport_security`):
       an unknown Host gets 421, a foreign browser Origin 403. The SDK checks
       these too, but only on the MCP endpoint and after a session may have been
       set up; here nothing behind the guard sees such a request.
    2. With a ``token``: exactly one ``Authorization: Bearer <token>`` header,
       compared in constant time (:func:`hmac.compare_digest`), else 401.
    """

    def __init__(self, app: ASGIApp, security: TransportSecuritySettings, token: str | None = None) -> None:
        self.app = app
        self.security = TransportSecurityMiddleware(security)
        self.token = token.encode() if token else None

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        values = [v for k, v in scope.get("headers", []) if k.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, credential = values[0].strip().partition(b" ")
        # compare every time, even for a wrong scheme, so timing tells nothing
        matches = hmac.compare_digest(credential.strip(), self.token)
        return scheme.lower() == b"bearer" and matches

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        response: PlainTextResponse | None = None
        refused = await self.security.validate_request(Request(scope), is_post=False)
        if refused is not None:
            what = "Host" if refused.status_code == 421 else "Origin"
            log.warning("refused an HTTP request: %s %r not allowed", what, Request(scope).headers.get(what))
            response = PlainTextResponse(
                f"{what} header not allowed: this MCP server answers only to the Host names set with "
                "--allowed-host (MCPServerApp.allowed_hosts) and the loopback names on its port "
                "(DNS-rebinding protection); browser pages of other origins are refused.",
                status_code=refused.status_code,
            )
        elif self.token is not None and not self._authorized(scope):
            log.warning("refused an HTTP request without the right bearer token")
            response = PlainTextResponse(
                "missing or wrong bearer token: send 'Authorization: Bearer <token>' with the token set by "
                "--token-file / --token / $SANDBOX_KERNEL_MCP_TOKEN, or, if none was set, the one the server "
                "generated (the file it is in was printed on the server's stderr at start)",
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        if response is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await response(scope, receive, send)
        else:  # a websocket: close before accepting
            await send({"type": "websocket.close", "code": 1008})


def guarded_http_app(
    server: MCPServer,
    *,
    path: str,
    allowed_hosts: Sequence[str],
    token: str | None,
) -> ASGIApp:
    """The streamable-HTTP ASGI app of ``server``, with the SDK's DNS-rebinding
    protection on (whatever the bind address) and :class:`HttpGuard` in front."""
    security = transport_security(allowed_hosts)
    app = server.streamable_http_app(streamable_http_path=path, transport_security=security)
    return HttpGuard(app, security, token)
