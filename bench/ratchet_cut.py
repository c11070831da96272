"""Time from a ratchet rise to the last byte a sandbox can send, per network mode.

    .venv/bin/python bench/ratchet_cut.py

A cell holds 100 MB of state and a thread that streams an upload to an
origin on 127.0.0.1 as fast as it can (PROXIED: through the egress proxy,
reached as files.example by a name override; FULL: the user-mode network
cannot reach the host's loopback, so FULL is measured to the end of the
replacement, the time the cell's state is unavailable). Then the cell raises
the ratchet itself. Reported:

* PROXIED: rise (the cell's clock just before ``add_dataset``) to the last
  upload byte the origin received (same machine, same monotonic clock), and
  whether the cell went on with its state;
* FULL: rise to the end of the cell that raised it plus the next cell (the
  replacement and the state carried over: the cell is stopped and re-run).

Nothing is asserted; the figures go into the notes (goal for PROXIED <= 50 ms).
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from pathlib import Path

from jupyter_client.manager import KernelManager

STATE = "import numpy as np\nbig = np.ones(100_000_000 // 8)\n"


class UploadSink:
    """Accepts uploads on 127.0.0.1 and remembers when the last byte came."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.last_byte = 0.0
        self.received = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(1 << 20)
                except OSError:
                    return
                if not data:
                    return
                self.received += len(data)
                self.last_byte = time.monotonic()


def run(kc, code: str, timeout: float = 120) -> tuple[dict, str]:
    msg_id = kc.execute(code, stop_on_error=False)
    out = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)
    return reply["content"], "".join(out)


def kernel(workdir: Path, config: str, *args: str) -> tuple[KernelManager, object]:
    cfg = workdir / "config"
    cfg.mkdir(exist_ok=True)
    (cfg / "sandbox_kernel_config.py").write_text(config)
    km = KernelManager(kernel_name="sandbox-python")
    km.start_kernel(
        cwd=str(workdir / "ws"), extra_arguments=list(args), env={**os.environ, "JUPYTER_CONFIG_DIR": str(cfg)}
    )
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    return km, kc


def proxied(sink: UploadSink, workdir: Path) -> None:
    km, kc = kernel(
        workdir,
        "c.SandboxKernel.egress_name_overrides = {'files.example': ['127.0.0.1']}\n"
        "c.SandboxKernel.egress_allow_addresses = ['127.0.0.1']\n",
    )
    try:
        run(kc, STATE)
        code = (
            "import socket, threading, time\n"
            "s = socket.create_connection(('127.0.0.1', 3128))\n"
            f"s.sendall(b'CONNECT files.example:{sink.port} HTTP/1.1\\r\\n\\r\\n')\n"
            "assert s.recv(1024).startswith(b'HTTP/1.1 200')\n"
            "sent = {'n': 0, 'error': None}\n"
            "def upload():\n"
            "    chunk = b'u' * 65536\n"
            "    try:\n"
            "        while True:\n"
            "            s.sendall(chunk); sent['n'] += len(chunk)\n"
            "    except OSError as e:\n"
            "        sent['error'] = type(e).__name__\n"
            "t = threading.Thread(target=upload); t.start()\n"
            "time.sleep(0.5)\n"
            "import sandbox_kernel.private as p\n"
            "rise = time.monotonic()\n"
            "p.add_dataset('patients', 'CONFIDENTIAL')\n"
            "t.join(5)\n"
            "print('RISE', rise, 'STATE', big.nbytes, 'ERR', sent['error'])\n"
        )
        reply, out = run(kc, code)
        fields = out.split()
        rise = float(fields[fields.index("RISE") + 1])
        time.sleep(0.5)
        print(
            f"PROXIED: rise -> last byte at the origin {1000 * (sink.last_byte - rise):.1f} ms "
            f"({sink.received / 1e6:.0f} MB uploaded before); the cell {reply['status']}, "
            f"state kept: {fields[fields.index('STATE') + 1]} bytes; uploader saw {fields[fields.index('ERR') + 1]}"
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def full(workdir: Path) -> None:
    km, kc = kernel(workdir, "", "--SandboxKernel.network=full")
    try:
        run(kc, STATE)
        started = time.monotonic()
        reply, _ = run(kc, "import sandbox_kernel.private as p\np.add_dataset('patients', 'CONFIDENTIAL')")
        _, out = run(kc, "print(big.nbytes)")
        elapsed = time.monotonic() - started
        print(
            f"FULL: rise -> state usable again in a network-less sandbox {1000 * elapsed:.0f} ms "
            f"(the raising cell: {reply['status']}, re-run needed; state after: {out.strip()} bytes)"
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main() -> None:
    sink = UploadSink()
    for mode in (proxied, full):
        with tempfile.TemporaryDirectory(prefix="sk-cut-") as tmp:
            workdir = Path(tmp)
            (workdir / "ws").mkdir()
            if mode is proxied:
                proxied(sink, workdir)
            else:
                full(workdir)


if __name__ == "__main__":
    main()
