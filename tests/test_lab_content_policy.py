"""The Lab server's policy as ``lab_content_policy.apply`` configures it.

The browser tests (tests/browser/test_page_scripts.py and the others, all
under this policy) attack it; these check what it is made of: which inline
scripts it allows and why, and that it keeps what the user configured.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from traitlets.config import Config

from sandbox_kernel import lab_content_policy
from sandbox_kernel.lab_content_policy import (
    OUTPUT_SCRIPTS_OPTION,
    content_security_policy,
    page_script_hashes,
    page_templates,
    without_output_scripts,
)
from sandbox_kernel.page_scripts import read_page, script_hash


def _script_src(policy: str) -> list[str]:
    return next(d.split()[1:] for d in policy.split("; ") if d.startswith("script-src "))


def test_inline_scripts_run_only_by_the_hash_of_a_page_the_server_ships() -> None:
    script_src = _script_src(content_security_policy("/"))
    assert "'unsafe-inline'" not in script_src
    assert [s for s in script_src if s.startswith("'sha256-")] == list(page_script_hashes())
    names = {(p.parent.parent.name, p.parent.name, p.name) for p in page_templates()}
    # Lab's page, Notebook 7's, the server's own (login)
    assert ("jupyterlab", "static", "index.html") in names
    assert ("notebook", "templates", "notebooks.html") in names
    assert ("jupyter_server", "templates", "page.html") in names
    lab_page = next(p for p in page_templates() if p.parent.parent.name == "jupyterlab" and p.name == "index.html")
    (token_removal,) = read_page(lab_page.read_text()).inline_scripts
    assert script_hash(token_removal) in script_src


def test_a_script_the_template_fills_in_per_request_is_not_allowed(tmp_path: Path) -> None:
    # the text a browser receives differs from the template's: its hash would allow nothing
    error_page = next(
        p for p in page_templates() if p.parent.parent.name == "jupyterlab_server" and p.name == "error.html"
    )
    (scroll,) = read_page(error_page.read_text()).inline_scripts
    assert "{" in scroll and script_hash(scroll) not in page_script_hashes()


def test_the_text_of_a_script_with_an_address_is_not_an_inline_script() -> None:
    found = read_page(
        '<script src="/a.js">alert(1)</script><script>ok()</script><script type="application/json">{}</script>'
    )
    assert found.inline_scripts == ["ok()"] and found.script_urls == ["/a.js"]


def test_the_page_config_hook_says_output_scripts_are_off_after_the_users_hook() -> None:
    calls: list[str] = []

    def users_hook(handler: object, page_config: dict[str, object]) -> dict[str, object]:
        calls.append("user")
        return {**page_config, "theirs": 1, OUTPUT_SCRIPTS_OPTION: "on"}

    config = without_output_scripts(users_hook)(None, {"appName": "JupyterLab"})
    assert calls == ["user"]
    assert config == {"appName": "JupyterLab", "theirs": 1, OUTPUT_SCRIPTS_OPTION: "off"}
    assert without_output_scripts()(None, {})[OUTPUT_SCRIPTS_OPTION] == "off"


def test_apply_keeps_the_users_headers_and_hook() -> None:
    def users_hook(handler: object, page_config: dict[str, object]) -> dict[str, object]:
        return {**page_config, "theirs": 1}

    c = Config()
    c.ServerApp.tornado_settings = {"headers": {"X-Theirs": "1"}, "page_config_hook": users_hook, "other": 2}
    lab_content_policy.apply(c)
    settings = c.ServerApp.tornado_settings
    assert settings["other"] == 2 and settings["headers"]["X-Theirs"] == "1"
    assert settings["headers"]["Content-Security-Policy"] == content_security_policy("/")
    assert settings["page_config_hook"](None, {}) == {"theirs": 1, OUTPUT_SCRIPTS_OPTION: "off"}


def test_remote_content_leaves_scripts_and_the_page_config_as_they_were() -> None:
    code = (
        "from traitlets.config import Config\n"
        "from sandbox_kernel import lab_content_policy\n"
        "c = Config(); lab_content_policy.apply(c)\n"
        "s = c.ServerApp.tornado_settings if 'tornado_settings' in c.ServerApp else {}\n"
        "print(sorted(s))\n"
    )
    env = {"SANDBOX_KERNEL_REMOTE_CONTENT": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
