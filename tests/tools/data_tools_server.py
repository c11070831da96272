"""A tiny real "data tools" MCP server for the private-data routing tests.

    python tests/tools/data_tools_server.py [--label NAME]                       (stdio)
    python tests/tools/data_tools_server.py --port 8123 [--host 127.0.0.1]       (streamable HTTP)
    python tests/tools/data_tools_server.py --uds /path/to/socket                (streamable HTTP on a unix socket)

The same code runs as the normal instance and as the network-isolated one; the
tools report where they run and what network they can reach:

- ``whoami()``: the instance label ($DATA_TOOLS_LABEL, else ``--label``), the
  hostname and the pid, as JSON.
- ``interfaces()``: the network interfaces of the server's network namespace.
- ``fetch(port)``: an HTTP GET to 127.0.0.1:<port>; the body, or the error.
- ``read_data(name)``: a file of $DATA_TOOLS_DIR (a mounted data directory).
- ``fatal()`` / ``fail()``: a ``[FATAL]`` tool error and an ordinary one.

Standard library + the official ``mcp`` SDK only (it runs inside bubblewrap).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent


def build(label: str) -> MCPServer:
    server = MCPServer(name="data-tools")

    @server.tool()
    def whoami() -> str:
        """Which instance answers: its label, hostname and pid."""
        return json.dumps(
            {
                "label": os.environ.get("DATA_TOOLS_LABEL") or label,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
            }
        )

    @server.tool()
    def interfaces() -> str:
        """The network interfaces this server can use (comma-separated)."""
        return ",".join(sorted(name for _, name in socket.if_nameindex()))

    @server.tool()
    def fetch(port: int) -> str:
        """HTTP GET http://127.0.0.1:<port>/ and return the body, or the connection error."""
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(f"GET /exfiltrate HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
        except OSError as exc:
            return f"connection failed: {exc!r}"
        head, _, body = data.partition(b"\r\n\r\n")
        return body.decode("utf-8", "replace")

    @server.tool()
    def read_data(name: str) -> str:
        """Read a file of the data directory ($DATA_TOOLS_DIR)."""
        root = Path(os.environ.get("DATA_TOOLS_DIR", "/nonexistent"))
        return (root / Path(name).name).read_text()

    @server.tool()
    def fatal() -> CallToolResult:
        """Fail in a way the client must not retry."""
        return CallToolResult(content=[TextContent(type="text", text="[FATAL] data store unavailable")], is_error=True)

    @server.tool()
    def fail(message: str = "bad argument") -> str:
        """Fail in a way the model can correct (an ordinary tool error)."""
        raise ToolError(message)

    return server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--label", default="data-tools")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="serve streamable HTTP on host:port instead of stdio")
    p.add_argument("--uds", default=None, help="serve streamable HTTP on this unix socket instead of stdio")
    args = p.parse_args(argv)
    server = build(args.label)
    if args.port is None and args.uds is None:
        server.run()
        return 0
    import anyio
    import uvicorn

    app = server.streamable_http_app(streamable_http_path="/mcp", host=args.host)
    if args.uds:
        config = uvicorn.Config(app, uds=args.uds, log_level="warning")
    else:
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    anyio.run(uvicorn.Server(config).serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
