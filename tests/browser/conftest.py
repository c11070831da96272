"""Fixtures of the browser tests: a real JupyterLab server and Debian's chromium.

The browser is Debian's ``/usr/bin/chromium`` driven by Playwright through
``executable_path`` (Playwright's own browser download is never used). The
tests are skipped only when that binary is missing, and fail instead under
``CI=true``. Screenshots, the server log and the browser console go to
``test-artifacts/browser/`` at the repository root (git-ignored). With
``SK_LAB_DEBUG=1`` the server logs at DEBUG and every kernel message through the
page's websockets is traced in the console log.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "network"))

from kernel_helpers import RecordingHTTPServer
from lab_helpers import REPO, LabServer, Shots, serving
from proxy_helpers import OriginServer

CHROMIUM = Path("/usr/bin/chromium")
IN_CI = os.environ.get("CI", "").lower() == "true"
ARTIFACTS = REPO / "test-artifacts" / "browser"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Belt and braces for "loopback only": no name but 127.0.0.1 resolves.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]


def _require(condition: bool, why: str) -> None:
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{why} (required under CI=true)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """test-artifacts/browser, emptied of the previous run's files."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.iterdir():
        if old.is_file() and old.suffix in {".png", ".log", ".txt", ".html"}:
            old.unlink(missing_ok=True)  # the other test worker may have removed it
    return ARTIFACTS


@pytest.fixture
def shot(artifacts: Path) -> Shots:
    """Numbered screenshots in test-artifacts/browser (NN-name.png)."""
    return Shots(artifacts)


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    _require(CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is not installed")
    return CHROMIUM


@pytest.fixture(scope="module")
def lab(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path) -> Iterator[LabServer]:
    """One JupyterLab server for the module; every kernel it started is shut down after."""
    root = tmp_path_factory.mktemp("lab")
    # The sandboxes' "internet": an origin on 127.0.0.1 that the egress proxy
    # reaches as files.example (a test-only name override; nothing leaves loopback).
    origin = OriginServer()
    config = (
        "c.SandboxKernel.egress_name_overrides = {'files.example': ['127.0.0.1']}\n"
        "c.SandboxKernel.egress_allow_addresses = ['127.0.0.1']\n"
    )
    try:
        with serving(root, artifacts / "jupyter-lab.log", kernel_config=config) as server:
            server.origin_port = origin.port  # type: ignore[attr-defined]
            yield server
    finally:
        origin.close()


@pytest.fixture
def recorder() -> Iterator[RecordingHTTPServer]:
    """A server on 127.0.0.1 that records what a page fetched from it."""
    server = RecordingHTTPServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def own_browser(chromium_path: Path) -> Iterator[Any]:
    """Chromium with the tests' arguments and no Lab server, for pages a test
    opens itself (an export opened from disk): the test routes and accounts
    for every request its pages make."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(chromium_path), headless=True, args=CHROMIUM_ARGS, timeout=60_000
        )
        try:
            yield browser
        finally:
            browser.close()


class BrowserLog:
    """What the page did: every request that was not to the test server, console lines, page errors."""

    def __init__(self) -> None:
        self.foreign: list[str] = []
        self.console: list[str] = []
        self.page_errors: list[str] = []

    def on_request(self, request: Any) -> None:
        url = request.url
        parts = urlsplit(url)
        # the browser's own pages and resources (its PDF viewer's included): no network
        if parts.scheme in {"data", "blob", "about", "chrome", "chrome-extension", "devtools"}:
            return
        if parts.hostname not in {"127.0.0.1"}:
            self.foreign.append(url)

    def on_websocket(self, ws: Any) -> None:
        host = urlsplit(ws.url).hostname
        if host != "127.0.0.1":
            self.foreign.append(ws.url)

    def trace_frames(self, ws: Any) -> None:
        """With SK_LAB_DEBUG=1: a console line per kernel message either way (types,
        msg_ids, sessions of the message and its parent), for races between the
        page, jupyter_server and the kernel that only a trace explains."""

        def frame(direction: str, payload: bytes | str) -> None:
            text = payload.decode("latin-1") if isinstance(payload, bytes) else payload
            fields = {key: re.findall(rf'"{key}": ?"([^"]{{0,12}})', text) for key in ("msg_type", "msg_id", "session")}
            self.console.append(f"{time.time():.3f} ws {direction} {fields}")

        ws.on("framesent", lambda p: frame("sent", p))
        ws.on("framereceived", lambda p: frame("recv", p))


@pytest.fixture(scope="module")
def browser_context(
    lab: LabServer, chromium_path: Path, tmp_path_factory: pytest.TempPathFactory, artifacts: Path
) -> Iterator[tuple[Any, BrowserLog]]:
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    log = BrowserLog()
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(chromium_path),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900},
            timeout=60_000,
        )
        context.set_default_timeout(30_000)
        context.on("request", log.on_request)
        try:
            yield context, log
        finally:
            context.close()
            (artifacts / "browser-console.log").write_text(
                "\n".join([*log.console, "--- page errors ---", *log.page_errors])
            )


@pytest.fixture
def page(browser_context: tuple[Any, BrowserLog], request: pytest.FixtureRequest, artifacts: Path) -> Iterator[Any]:
    """A fresh tab; on failure a screenshot named after the test is kept."""
    context, log = browser_context
    log.console.append(f"=== {time.strftime('%H:%M:%S')} start {request.node.name}")
    page = context.new_page()
    page.on("websocket", log.on_websocket)
    page.on("console", lambda msg: log.console.append(f"[{request.node.name}] {msg.type}: {msg.text}"))
    if os.environ.get("SK_LAB_DEBUG"):
        page.on("websocket", log.trace_frames)
    page.on("pageerror", lambda exc: log.page_errors.append(f"[{request.node.name}] {exc.message}\n{exc.stack}"))
    errors_before = len(log.page_errors)
    try:
        yield page
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
            try:
                page.screenshot(path=str(artifacts / f"FAILED-{name}.png"))
                (artifacts / f"FAILED-{name}.html").write_text(page.content())
            except Exception:  # the page may be gone
                pass
        page.close()
        log.console.append(f"=== {time.strftime('%H:%M:%S')} end {request.node.name}")
    ours = [e for e in log.page_errors[errors_before:] if "sandbox-kernel-status" in e]
    assert not ours, f"uncaught errors in the extension: {ours}"
    assert not log.foreign, f"the browser talked to something other than the loopback test server: {log.foreign[:10]}"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
