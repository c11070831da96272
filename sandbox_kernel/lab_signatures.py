"""A save signs no notebook that carries saved widget state.

Why: Jupyter signs a notebook on every save whose code cells are trusted or
show no rich output (nbformat's ``NotebookNotary.check_cells``), and never
looks at its metadata. A notebook's saved widget state is in its metadata,
and the Lab extension's ``savedWidgetState`` plugin gives it to the widget
manager only when the notebook is trusted, because building its models runs
code (anywidget's ``_esm``) and renders HTML (an ipywidgets HTML widget's
value, set as ``innerHTML``) outside the kernel's output policy. A sandbox
wrote a notebook with code cells that show only a stream and anywidget state
carrying a script; the plugin withheld it when the user opened the file, the
user pressed Ctrl+S, the server signed it, and when the notebook was opened
again the script ran in the Lab's page, where the server's API opens a
terminal on the host (an attack review, in JupyterLab with anywidget).

"Trust Notebook" in Lab marks the cells trusted and signs at the next save,
like running every cell: neither shows the user the state. So no save signs
a notebook with saved widget state; ``jupyter trust NOTEBOOK`` on the host
still does (the user named that file), and so does a save when
``SandboxContents.sign_saved_widget_state`` is on. The file is not changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the notebook metadata key where widget managers keep their state
WIDGETS_KEY = "widgets"


def holds_widget_state(notebook: Any) -> bool:
    """Whether ``notebook`` (its JSON content) carries saved widget state: any
    non-empty value under ``metadata.widgets`` (a shape nobody writes counts,
    since a widget manager might read it)."""
    metadata = notebook.get("metadata") if isinstance(notebook, Mapping) else None
    widgets = metadata.get(WIDGETS_KEY) if isinstance(metadata, Mapping) else None
    if not widgets:
        return False
    if not isinstance(widgets, Mapping):
        return True
    for value in widgets.values():
        if isinstance(value, Mapping) and set(value) <= {"version_major", "version_minor", "state"}:
            if value.get("state"):
                return True
        elif value:
            return True
    return False


def sign_no_widget_state(cm: Any, log: Any) -> None:
    """Make ``cm``'s ``check_and_sign`` (called by every notebook save) leave a
    notebook that :func:`holds_widget_state` unsigned, saying so in ``log``."""
    check_and_sign = cm.check_and_sign

    def checked_and_signed(nb: Any, path: str = "", **kwargs: Any) -> Any:
        if holds_widget_state(nb):
            log.warning(
                "Notebook %s is not signed: it carries saved widget state, which opening it would build "
                "outside the kernel's output policy (sign it on the host with `jupyter trust` if you wrote it)",
                path,
            )
            return None
        return check_and_sign(nb, path, **kwargs)

    cm.check_and_sign = checked_and_signed
