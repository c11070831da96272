"""PROXIED mode (the default) through real kernels: HTTP(S) only through the egress
proxy, its rules and log, and a ratchet that cuts in place without losing state.

Every origin is a server this test starts on 127.0.0.1, reached by names the
proxy maps there (``egress_name_overrides``); refused names and addresses are
refused before any connection, so nothing leaves loopback.
"""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import sys
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from kernel_helpers import SandboxKernelHandle, configured_kernel, status_of

sys.path.insert(0, str(Path(__file__).parent / "network"))
from proxy_helpers import OriginServer

from sandbox_kernel.privacy import PrivacyStore, PrivateData, Sensitivity

IFACES = "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))"


@pytest.fixture
def origin() -> Iterator[OriginServer]:
    server = OriginServer()
    yield server
    server.close()


def proxied_kernel(tmp_path: Path, extra_config: str = "", *args: str) -> SandboxKernelHandle:
    return configured_kernel(
        tmp_path,
        "c.SandboxKernel.egress_allow = ['files.example', '*.test']\n"
        "c.SandboxKernel.egress_deny = ['blocked.test']\n"
        "c.SandboxKernel.egress_allow_addresses = ['127.0.0.1']\n"
        "c.SandboxKernel.egress_name_overrides = {'files.example': ['127.0.0.1'], 'pkgs.test': ['127.0.0.1'],"
        " 'blocked.test': ['127.0.0.1'], 'rebind.test': ['127.0.0.1', '10.9.8.7']}\n" + extra_config,
        "--SandboxKernel.privacy_poll_interval=0.2",
        *args,
    )


def test_web_through_the_proxy_and_nothing_else(tmp_path: Path, origin: OriginServer) -> None:
    k = proxied_kernel(tmp_path)
    try:
        assert k.run(IFACES).stdout.strip() == "['lo']"
        run = k.run(
            "import urllib.request, os\n"
            f"print(urllib.request.urlopen('http://files.example:{origin.port}/small', timeout=10).read())\n"
            "print(os.environ['HTTPS_PROXY'])"
        )
        assert run.status == "ok", run.reply
        assert "b'hello from the origin'" in run.stdout and "http://127.0.0.1:" in run.stdout
        run = k.run(
            "import requests\n"
            f"r = requests.get('http://pkgs.test:{origin.port}/small', timeout=10)\n"
            "print(r.status_code, r.text)\n"
            f"r = requests.get('http://blocked.test:{origin.port}/small', timeout=10)\n"
            "print(r.status_code, r.headers['X-Sandbox-Egress-Rule'])\n"
            f"r = requests.get('http://rebind.test:{origin.port}/small', timeout=10)\n"
            "print(r.status_code, r.headers['X-Sandbox-Egress-Rule'])"
        )
        lines = run.stdout.strip().splitlines()
        assert lines[0] == "200 hello from the origin"
        assert lines[1] == "403 deny list: blocked.test"
        assert lines[2].startswith("403 rebind.test resolves to a refused address") and "10.9.8.7" in lines[2]
        # No way around it: no DNS, no raw socket to the host, no metadata address.
        run = k.run(
            "import socket\n"
            "out = []\n"
            f"for target in [('files.example', 80), ('127.0.0.1', {origin.port}), ('169.254.169.254', 80), ('10.0.0.1', 80)]:\n"
            "    try:\n"
            "        socket.create_connection(target, timeout=3).close(); out.append('connected')\n"
            "    except OSError as e:\n"
            "        out.append(type(e).__name__)\n"
            "print(out)"
        )
        result = eval(run.stdout.strip())
        assert "connected" not in result and result[0] == "gaierror", result
        # the proxy's socket folder is the host's: a cell reaches the socket and writes nothing there
        run = k.run(
            "import os\n"
            "try:\n"
            "    open('/.sandbox_kernel/egress/planted', 'w'); print('written')\n"
            "except OSError as e:\n"
            "    print(e.errno == 30)"
        )
        assert run.stdout.strip() == "True", (run.stdout, run.stderr)
        # the socket serves only a connection opening with this session's
        # secret: another sandbox that can see it (a workspace that was /tmp,
        # an attack review) gets nothing through it
        run = k.run(
            "import os, socket\n"
            "def ask(opening):\n"
            "    s = socket.socket(socket.AF_UNIX); s.settimeout(10)\n"
            "    s.connect(os.environ['SANDBOX_KERNEL_EGRESS_SOCKET'])\n"
            f"    s.sendall(opening + b'GET http://files.example:{origin.port}/small HTTP/1.1\\r\\n\\r\\n')\n"
            "    got = b''\n"
            "    while chunk := s.recv(65536): got += chunk\n"
            "    return got.split(b'\\r\\n')[0].decode(), got.endswith(b'hello from the origin')\n"
            "token = os.environ['SANDBOX_KERNEL_EGRESS_TOKEN'].encode()\n"
            "print(ask(b''))\n"
            "print(ask(b'SK-EGRESS ' + os.urandom(16).hex().encode() + b'\\r\\n'))\n"
            "print(ask(b'SK-EGRESS ' + token + b'\\r\\n'))"
        )
        lines = run.stdout.strip().splitlines()
        assert lines[:2] == ["('HTTP/1.1 403 Forbidden', False)"] * 2, (run.stdout, run.stderr)
        assert lines[2].endswith(" 200 OK', True)"), (run.stdout, run.stderr)
    finally:
        k.shutdown()


def test_rise_cuts_in_place_mid_download_and_keeps_every_object(tmp_path: Path, origin: OriginServer) -> None:
    """A rise during a streaming download: the transfer stops, the cell that
    raised goes on, and threads, open files and generators are all still there."""
    k = proxied_kernel(tmp_path)
    try:
        run = k.run(
            "import threading, urllib.request, time\n"
            "log = open('/tmp/kept.txt', 'w')\n"
            "gen = (i * i for i in range(10))\n"
            "first = next(gen)\n"
            "got = {'bytes': 0, 'error': None, 'done': False}\n"
            "def download():\n"
            "    try:\n"
            f"        with urllib.request.urlopen('http://files.example:{origin.port}/slow', timeout=20) as r:\n"
            "            while True:\n"
            "                chunk = r.read(65536)\n"
            "                if not chunk: break\n"
            "                got['bytes'] += len(chunk)\n"
            "    except Exception as e:\n"
            "        got['error'] = type(e).__name__\n"
            "    got['done'] = True\n"
            "t = threading.Thread(target=download); t.start()\n"
            "while got['bytes'] < 5 * 65536: time.sleep(0.01)\n"
            "import sandbox_kernel.private as p\n"
            "p.add_dataset('patients', 'CONFIDENTIAL')\n"
            "t.join(10)\n"
            "log.write('still open'); log.flush()\n"
            "print('continued', got['done'], got['bytes'] < 100 * 65536, next(gen), t.is_alive())"
        )
        assert run.status == "ok", run.reply
        assert run.stdout.strip().splitlines()[-1] == "continued True True 1 False"
        assert "The sandbox was replaced" not in run.stderr
        assert "[SYSTEM] Network access has been restricted" in run.stderr
        # the cut is for good: new requests are refused, the state is intact
        run = k.run(
            "try:\n"
            f"    urllib.request.urlopen('http://files.example:{origin.port}/small', timeout=10)\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code, e.headers['X-Sandbox-Egress-Rule'])\n"
            "print(first, next(gen), log.closed, open('/tmp/kept.txt').read())"
        )
        lines = run.stdout.strip().splitlines()
        assert lines[0] == "403 no network: the session holds private data"
        assert lines[1] == "0 4 False still open"
    finally:
        k.shutdown()


def test_host_side_rise_cuts_a_running_cell_in_place(tmp_path: Path, origin: OriginServer) -> None:
    """Another process raises the store while a cell downloads: the proxy is cut
    within the poll interval and the cell finishes normally."""
    session = f"s-{uuid.uuid4().hex[:8]}"
    k = proxied_kernel(tmp_path, "", "--SandboxKernel.user_id=tester", f"--SandboxKernel.session_id={session}")
    try:
        marker = tmp_path / "ws" / "started"
        k.kc.execute(
            "import urllib.request, time, pathlib\n"
            "n = 0\n"
            "try:\n"
            f"    with urllib.request.urlopen('http://files.example:{origin.port}/slow', timeout=20) as r:\n"
            "        while True:\n"
            "            chunk = r.read(65536)\n"
            "            if not chunk: break\n"
            "            n += len(chunk)\n"
            "            pathlib.Path('/workspace/started').write_text(str(n))\n"
            "except Exception as e:\n"
            "    print('cut:', type(e).__name__)\n"
            "print('finished', n < 100 * 65536)"
        )
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists()
        # another process (a connector, the host API) raises the same store
        PrivateData("tester", session, PrivacyStore(k.data_dir / "privacy")).mark_private(
            Sensitivity.SECRET, source="api"
        )
        run = k.run("print('next cell', n > 0)")
        assert "next cell True" in run.stdout
        assert "The sandbox was replaced" not in run.stderr
        out = k.run("print(n < 100 * 65536)")
        assert out.stdout.strip() == "True", "the download was not cut"
    finally:
        k.shutdown()


def test_private_mount_needs_a_new_sandbox_then_works(tmp_path: Path, origin: OriginServer) -> None:
    data = tmp_path / "hr.csv"
    data.write_text("name,salary\nada,100\n")
    k = proxied_kernel(
        tmp_path,
        f"c.SandboxKernel.private_datasets = {{'hr': {{'source': {str(data)!r}, 'sensitivity': 'SECRET'}}}}\n",
    )
    try:
        k.run("kept = [1, 2, 3]")
        run = k.run("import sandbox_kernel.private as p\nprint(p.open_dataset('hr').read())", stop_on_error=False)
        assert run.status == "error" and "never had network" in run.reply["evalue"]
        assert "with the private datasets mounted" in run.stderr
        run = k.run("import sandbox_kernel.private as p\nprint(p.open_dataset('hr').read(), kept)")
        assert run.status == "ok" and "ada,100" in run.stdout and "[1, 2, 3]" in run.stdout
        assert k.run(IFACES).stdout.strip() == "['lo']"
        run = k.run(
            "import os, urllib.request\nprint(os.environ.get('HTTP_PROXY'))\n"
            "try:\n"
            f"    urllib.request.urlopen('http://files.example:{origin.port}/small', timeout=5)\n"
            "except Exception as e:\n"
            "    print('no way out:', type(e).__name__)"
        )
        assert "None" in run.stdout and "no way out" in run.stdout
    finally:
        k.shutdown()


def _wheel(name: str, version: str) -> bytes:
    """A minimal pure-Python wheel, built here (nothing is downloaded)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return buf.getvalue()


def test_pip_installs_from_an_allowed_index_then_fails_clearly_once_private(tmp_path: Path) -> None:
    root = tmp_path / "index"
    (root / "simple" / "tinypkg").mkdir(parents=True)
    wheel = "tinypkg-1.0-py3-none-any.whl"
    (root / "simple" / "tinypkg" / wheel).write_bytes(_wheel("tinypkg", "1.0"))
    (root / "simple" / "tinypkg" / "index.html").write_text(f'<a href="{wheel}">{wheel}</a>')
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    k = proxied_kernel(tmp_path)
    try:
        install = f"%pip install --index-url http://pkgs.test:{port}/simple/ --trusted-host pkgs.test tinypkg"
        run = k.run(install, timeout=120)
        assert "Successfully installed tinypkg-1.0" in run.stdout, run.stdout + run.stderr
        run = k.run("import tinypkg\nprint(tinypkg.VALUE, tinypkg.__file__.startswith('/.sandbox_kernel/packages/'))")
        assert run.stdout.strip() == "42 True"
        run = k.run(install.replace("pkgs.test", "blocked.test"), timeout=120)
        assert (
            "%pip cannot download: blocked.test is refused by the egress proxy: deny list: blocked.test" in run.stderr
        )
        k.run("import sandbox_kernel.private as p\np.add_dataset('ledger', 'SECRET')")
        run = k.run(install, timeout=120)
        assert (
            "%pip cannot download: pkgs.test is refused by the egress proxy: no network: the session holds private data"
            in run.stderr
        ), run.stderr
        assert k.run("print(tinypkg.VALUE)").stdout.strip() == "42"  # what was installed stays
    finally:
        k.shutdown()
        httpd.shutdown()
        httpd.server_close()


def test_status_reports_proxied_and_the_egress_log(tmp_path: Path, origin: OriginServer) -> None:
    """What the widget is sent: the mode and a summary of the log (read through a real comm)."""
    k = proxied_kernel(tmp_path)
    try:
        k.run(
            "import urllib.request\n"
            f"urllib.request.urlopen('http://files.example:{origin.port}/small', timeout=10).read()\n"
            "try:\n"
            f"    urllib.request.urlopen('http://blocked.test:{origin.port}/small', timeout=10)\n"
            "except Exception:\n"
            "    pass"
        )
        state = status_of(k)
        assert state["network"] == "proxied"
        egress = state["egress"]
        assert egress["allowed"] == 1 and egress["refused"] == 1 and egress["domains"] == ["files.example"]
        assert [e["allowed"] for e in egress["recent"]] == [True, False]
        assert egress["recent"][1]["rule"] == "deny list: blocked.test"
        json.dumps(state)
        # kept with the session's records on the host, out of every sandbox's reach
        (log,) = (k.data_dir / "egress").glob("*/*.jsonl")
        hosts = [json.loads(line)["host"] for line in log.read_text().splitlines()]
        assert hosts == ["files.example", "blocked.test"] and log.stat().st_mode & 0o777 == 0o600
    finally:
        k.shutdown()


def test_a_killed_kernels_folders_are_collected_by_the_next(tmp_path: Path) -> None:
    """SIGKILL leaves the runtime folder and the egress socket's folder behind;
    the next kernel removes them (and nothing of a live kernel)."""
    k = proxied_kernel(tmp_path)
    try:
        assert k.run("1").status == "ok"
        pid = k.pid
        runtime = list((tmp_path / "tmp").glob(f"sandbox-kernel-{pid}-*"))
        egress = list(Path("/tmp").glob(f"sk-egress-{pid}-*"))
        assert len(runtime) == 1 and len(egress) == 1
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        k.km.restart_kernel(now=True)
        k.kc.wait_for_ready(timeout=60)
        assert k.run("1").status == "ok"
        assert not runtime[0].exists() and not egress[0].exists()
        assert list((tmp_path / "tmp").glob(f"sandbox-kernel-{k.pid}-*"))  # the live one stays
    finally:
        k.shutdown()


def test_pip_layer_from_a_local_wheel_survives_restarts(tmp_path: Path) -> None:
    """%pip installs into the session's layer (site-packages are read-only), with
    no network needed for a local wheel; the layer outlives kernel restarts."""
    k = proxied_kernel(tmp_path)
    (tmp_path / "ws" / "tinypkg-1.0-py3-none-any.whl").write_bytes(_wheel("tinypkg", "1.0"))
    try:
        k.run("import sandbox_kernel.private as p\np.add_dataset('ledger', 'SECRET')")  # no network at all
        run = k.run("%pip install /workspace/tinypkg-1.0-py3-none-any.whl", timeout=120)
        assert "Successfully installed tinypkg-1.0" in run.stdout, run.stdout + run.stderr
        run = k.run("import tinypkg\nprint(tinypkg.VALUE, tinypkg.__file__)")
        assert run.stdout.split()[0] == "42" and run.stdout.split()[1].startswith("/.sandbox_kernel/packages/")
        assert "tinypkg" in k.run("%pip list", timeout=120).stdout
        k.km.restart_kernel(now=False)
        k.kc.wait_for_ready(timeout=60)
        assert k.run("import tinypkg\nprint(tinypkg.VALUE)").stdout.strip() == "42"
        run = k.run("%pip uninstall -y tinypkg", timeout=120)
        assert "Successfully uninstalled tinypkg-1.0" in run.stdout, run.stdout + run.stderr
        k.km.restart_kernel(now=False)
        k.kc.wait_for_ready(timeout=60)
        run = k.run("import tinypkg", stop_on_error=False)
        assert run.status == "error" and run.reply["ename"] == "ModuleNotFoundError"
        # the layer is the host's data dir, never the workspace nor a host import path
        assert not list((tmp_path / "ws").glob("tinypkg*/"))
        assert list((k.data_dir / "packages").glob("*/*"))
    finally:
        k.shutdown()


def test_shell_pip_installs_into_the_layer_too(tmp_path: Path) -> None:
    k = proxied_kernel(tmp_path)
    (tmp_path / "ws" / "tinypkg-1.0-py3-none-any.whl").write_bytes(_wheel("tinypkg", "1.0"))
    try:
        run = k.run("!pip install --no-index /workspace/tinypkg-1.0-py3-none-any.whl", timeout=120)
        assert "Successfully installed tinypkg-1.0" in run.stdout, run.stdout + run.stderr
        assert k.run("import tinypkg\nprint(tinypkg.VALUE)").stdout.strip() == "42"
    finally:
        k.shutdown()
