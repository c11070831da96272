"""Putting a checking subclass in place of a Jupyter server's request handler.

Why: the server extensions that guard what Lab does with files a sandbox wrote
(:mod:`sandbox_kernel.lab_workspaces`, :mod:`sandbox_kernel.lab_exports`)
must check a request before jupyter_server's or jupyterlab_server's handler
acts on it, and neither offers a hook for that. Tornado's routing table does:
each route names its handler class, so pointing the route at a subclass that
checks first and then calls the original keeps every URL, argument and
decorator of the original.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tornado.ioloop import IOLoop
from tornado.routing import Rule


def _rules(router: Any) -> Iterator[Rule]:
    for rule in getattr(router, "rules", ()):
        yield rule
        yield from _rules(rule.target)


def replace(web_app: Any, replacements: Mapping[type, type]) -> int:
    """Point every route of each handler class in ``replacements`` at its
    subclass; the number of routes changed (0 when done already or absent)."""
    changed = 0
    for rule in [*_rules(web_app.default_router), *_rules(web_app.wildcard_router)]:
        if isinstance(rule.target, type) and rule.target in replacements:
            rule.target = replacements[rule.target]
            changed += 1
    return changed


def install(serverapp: Any, replacements: Mapping[type, type], what: str) -> None:
    """:func:`replace` now (extensions load in name order, so jupyter_server's
    and jupyterlab's routes are there) and again once the loop runs, before
    any request, for an application whose routes came later; the log says so
    when the server has none of them."""
    web_app = serverapp.web_app
    replace(web_app, replacements)

    def again() -> None:
        replace(web_app, replacements)
        guarded = set(replacements.values())
        if not any(rule.target in guarded for rule in _rules(web_app.default_router)):
            serverapp.log.warning("sandbox_kernel: this server has no %s to guard", what)

    IOLoop.current().add_callback(again)


__all__ = ["install", "replace"]
