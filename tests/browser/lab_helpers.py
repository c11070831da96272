"""A real JupyterLab server for the browser tests, driven over its REST API.

Kept free of pytest so it can be used from a script while debugging
(``python -c 'from lab_helpers import LabServer; ...'``).
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
JUPYTER = VENV_BIN / "jupyter"
KERNEL_NAME = "sandbox-python"
# The configuration of the README's Lab command (scripts/lab.sh passes it with --config).
LAB_CONFIG = REPO / "scripts" / "lab_config.py"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def code_cell(
    cell_id: str, source: str, outputs: Sequence[dict[str, Any]] = (), execution_count: int | None = None
) -> dict[str, Any]:
    """An nbformat 4 code cell, with outputs as a file a sandbox wrote may hold them."""
    return {
        "cell_type": "code",
        "id": cell_id,
        "metadata": {},
        "source": source,
        "outputs": list(outputs),
        "execution_count": execution_count,
    }


def notebook_json(cells: list[str] | None = None) -> dict[str, Any]:
    """An nbformat 4 notebook on the sandboxed kernel."""
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3 (sandboxed)", "language": "python"},
            "language_info": {"name": "python"},
        },
        "cells": [code_cell(f"cell-{i}", src) for i, src in enumerate(cells or [""])],
    }


def with_inline_scripts(policy: str) -> str:
    """``policy`` with its script-src as the Lab's was before page scripts were
    allowed by hash only (any inline script runs): a control's policy."""
    directives = policy.split("; ")
    return "; ".join(
        "script-src 'self' 'unsafe-inline' 'unsafe-eval' blob:" if d.startswith("script-src ") else d
        for d in directives
    )


class LabServer:
    """``jupyter lab`` on 127.0.0.1 with a random port and token, isolated under ``root``.

    ``root/notebooks`` is the server's root dir; the ratchet store lives in
    ``root/data`` (``SANDBOX_KERNEL_DATA_DIR``), Jupyter's config, runtime,
    settings and workspaces under ``root/jupyter`` so nothing of the user's
    setup leaks in and nothing of the test is left behind.

    ``extra_args`` go to ``jupyter lab`` (e.g. ``--config=scripts/lab_config.py``,
    as ``scripts/lab.sh`` passes it), ``extra_env`` into its environment.
    """

    def __init__(
        self,
        root: Path,
        log_path: Path | None = None,
        startup_timeout: float = 90.0,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        kernel_config: str = "",
    ) -> None:
        self.root = root
        self.notebooks = root / "notebooks"
        self.data_dir = root / "data"
        jupyter_dir = root / "jupyter"
        for path in (
            self.notebooks,
            self.data_dir,
            jupyter_dir / "config",
            jupyter_dir / "runtime",
            jupyter_dir / "settings",
            jupyter_dir / "workspaces",
            root / "tmp",
        ):
            path.mkdir(parents=True, exist_ok=True)
        # The README's Lab fetches nothing from another origin (scripts/lab_config.py
        # applies the same policy): every browser test runs Lab under it.
        (jupyter_dir / "config" / "jupyter_server_config.py").write_text(
            "from sandbox_kernel import lab_content_policy\nlab_content_policy.apply(c)\n"
        )
        if kernel_config:  # read by every sandbox kernel this server starts
            (jupyter_dir / "config" / "sandbox_kernel_config.py").write_text(kernel_config)
        # No "get Jupyter news?" toast (it would cover our notification and
        # offer a request to the internet): news fetching set to Never.
        news = jupyter_dir / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        news.parent.mkdir(parents=True, exist_ok=True)
        news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        self.port = free_port()
        self.token = secrets.token_hex(24)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or (root / "jupyter-lab.log")
        env = {
            **os.environ,
            # kernel.json runs "python -m sandbox_kernel": make that the venv's python.
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "SANDBOX_KERNEL_DATA_DIR": str(self.data_dir),
            "JUPYTER_CONFIG_DIR": str(jupyter_dir / "config"),
            "JUPYTER_RUNTIME_DIR": str(jupyter_dir / "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(jupyter_dir / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(jupyter_dir / "workspaces"),
            "TMPDIR": str(root / "tmp"),
            # the trash of the server's deletes (send2trash): not the user's
            "XDG_DATA_HOME": str(root / "xdg-data"),
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        env.pop("JUPYTER_TOKEN", None)
        args = [
            str(JUPYTER),
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.notebooks}",
            "--ServerApp.open_browser=False",
            # No calls to PyPI / jupyter.org from the server side either.
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
            *(["--ServerApp.log_level=DEBUG"] if os.environ.get("SK_LAB_DEBUG") else []),
        ]
        if os.geteuid() == 0:
            args.append("--allow-root")
        args.extend(extra_args)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - kept open for the server's life, closed in stop()
        self.proc = subprocess.Popen(
            args,
            cwd=str(self.notebooks),
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self._wait_ready(startup_timeout)

    # ---- REST -----------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.base_url}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                status = self.request("GET", "/api/status", timeout=5)
                if isinstance(status, dict) and "started" in status:
                    return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = exc
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(
            f"jupyter lab did not answer /api/status within {timeout}s ({last}); log:\n{self.log_tail()}"
        )

    def put_notebook(self, name: str, cells: list[str] | None = None) -> None:
        """Save a notebook through the contents API, creating its folder first.
        Tests that must stay independent use a folder each: a private notebook
        raises every notebook sharing its folder (docs/privacy.md, rule 1)."""
        folder = name.rpartition("/")[0]
        if folder:
            self.request("PUT", f"/api/contents/{folder}", {"type": "directory"})
        self.request(
            "PUT", f"/api/contents/{name}", {"type": "notebook", "format": "json", "content": notebook_json(cells)}
        )

    def sessions(self) -> list[dict[str, Any]]:
        return self.request("GET", "/api/sessions")

    def kernels(self) -> list[dict[str, Any]]:
        return self.request("GET", "/api/kernels")

    def session_for(self, path: str) -> dict[str, Any] | None:
        for sess in self.sessions():
            if sess.get("path") == path or sess.get("notebook", {}).get("path") == path:
                return sess
        return None

    def wait_kernel_idle(self, path: str, timeout: float = 60.0) -> dict[str, Any]:
        """The session of ``path`` once its kernel reports idle; raises on timeout."""
        deadline = time.monotonic() + timeout
        sess = None
        while time.monotonic() < deadline:
            sess = self.session_for(path)
            if sess and sess["kernel"].get("execution_state") == "idle":
                return sess
            time.sleep(0.3)
        raise TimeoutError(f"kernel of {path} not idle within {timeout}s: {sess}")

    def status_comms(self, path: str, timeout: float = 10.0) -> int:
        """How many status comms the kernel of ``path`` has open, by its own
        ``comm_info_reply`` on a connection of our own (0 when it does not
        answer within ``timeout``) (the widget's comm is
        re-opened with each new kernel process; a restart keeps the page's
        last state shown meanwhile, so the page alone cannot tell)."""
        from jupyter_client import BlockingKernelClient

        from sandbox_kernel.status_comm import TARGET

        sess = self.session_for(path)
        if sess is None:
            raise LookupError(f"no session for {path}")
        client = BlockingKernelClient()
        client.load_connection_file(str(self.root / "jupyter" / "runtime" / f"kernel-{sess['kernel']['id']}.json"))
        client.start_channels()
        try:
            msg_id = client.comm_info(target_name=TARGET)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    reply = client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    break  # (a kernel still restarting answers nothing yet: the caller asks again)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return len(reply["content"].get("comms", {}))
            return 0
        finally:
            client.stop_channels()

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}{path}{sep}token={self.token}"

    # ---- processes ------------------------------------------------------------------
    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def pasta_helpers(self) -> list[psutil.Process]:
        """The user-mode network helpers (pasta) of this server's sandboxes.

        pasta daemonises (its parent is init), so it is never a descendant; it
        is ours when its pid file lives in the TMPDIR given to this server."""
        marker = f"{self.root / 'tmp'}/"
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                args = proc.info["cmdline"] or []
                if args and os.path.basename(args[0]).startswith(("pasta", "passt")) and any(marker in a for a in args):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def log_bytes(self, settle: float = 1.0) -> bytes:
        """The whole log as the server wrote it (control bytes included), after
        ``settle`` seconds: the server's process writes it in its own time."""
        time.sleep(settle)
        return self.log_path.read_bytes()

    def log_tail(self, chars: int = 6000) -> str:
        try:
            self._log.flush()
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "<no log>"

    def stop(self) -> list[str]:
        """Shut every kernel and terminal down through the API, then the server (by PID only).

        Returns a description of processes that were still alive afterwards
        (and had to be killed): empty when everything went away by itself.
        """
        leftovers: list[str] = []
        # Everything the server started, taken before anything is shut down (a
        # sandbox orphaned by its kernel would no longer be a descendant), plus
        # the pasta helpers of our sandboxes (pasta daemonises: not a descendant).
        children = self.descendants() + self.pasta_helpers()
        if self.proc.poll() is None:
            for listing, key in (("/api/kernels", "id"), ("/api/terminals", "name")):
                try:
                    for item in self.request("GET", listing):
                        try:
                            self.request("DELETE", f"{listing}/{item[key]}", timeout=30)
                        except (OSError, urllib.error.URLError):
                            pass
                except (OSError, urllib.error.URLError, ValueError):
                    pass  # (terminals may be off: a 404)
        children += [p for p in self.descendants() + self.pasta_helpers() if p not in children]
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        # Anything the server started (kernels, bwrap sandboxes) must be gone now.
        gone, alive = psutil.wait_procs(children, timeout=10)
        for proc in alive:
            try:
                started = time.strftime("%H:%M:%S", time.localtime(proc.create_time()))
                leftovers.append(f"{proc.pid} {proc.name()} (started {started}) {' '.join(proc.cmdline())[:300]}")
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        self._log.close()
        return leftovers


class Shots:
    """Numbered screenshots in test-artifacts/browser, in the order taken."""

    counter = 0

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, page: Any, name: str) -> Path:
        Shots.counter += 1
        path = self.directory / f"{Shots.counter:02d}-{name}.png"
        page.screenshot(path=str(path))
        return path


def contents_status(server: LabServer, method: str, path: str, body: Any = None) -> tuple[int, str]:
    """The status and message of a contents request, as Lab's file browser
    sends it (200 and an empty message when it succeeded)."""
    try:
        server.request(method, "/api/contents/" + urllib.parse.quote(path), body)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}").get("message", "")
    return 200, ""


@contextmanager
def serving(
    root: Path, log_copy: Path, kernel_config: str = "", extra_args: Sequence[str] = (), protected: bool = True
) -> Iterator[LabServer]:
    """A :class:`LabServer` for a test module. On exit every kernel is shut
    down and the server stopped, its log is copied to ``log_copy``, and a
    process it started that outlived it (a kernel, a sandbox, a pasta helper)
    is killed and fails the module.

    ``protected=False`` is the control of a test that attacks what
    ``lab_content_policy.apply`` guards: an explicit, empty ``--config`` is
    read instead of the config dir's file, so the server has jupyter_server's
    and Lab's own behaviour."""
    if not protected:
        root.mkdir(parents=True, exist_ok=True)
        plain = root / "unprotected_config.py"
        plain.write_text("# jupyter_server's and Lab's own behaviour: a test's control\n")
        extra_args = [*extra_args, f"--config={plain}"]
    server = LabServer(root, kernel_config=kernel_config, extra_args=extra_args)
    try:
        yield server
    finally:
        leftovers = server.stop()
        shutil.copyfile(server.log_path, log_copy)
        assert not leftovers, (
            "processes started by the server (kernels, bwrap sandboxes, pasta network helpers) were still "
            f"alive after every kernel was shut down and the server stopped; killed now: {leftovers}"
        )


@contextmanager
def guarded_and_control(root: Path) -> Iterator[dict[str, LabServer]]:
    """Two servers for an attack on what ``lab_content_policy.apply`` guards:
    ``guarded`` with it, ``control`` with jupyter_server's and Lab's own
    behaviour (:func:`serving`'s ``protected=False``)."""
    with (
        serving(root / "guarded", root / "guarded.log") as guarded,
        serving(root / "control", root / "control.log", protected=False) as control,
    ):
        yield {"guarded": guarded, "control": control}
