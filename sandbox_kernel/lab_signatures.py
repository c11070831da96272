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
a notebook with saved widget state; ``sandbox-kernel trust NOTEBOOK`` on the
host does (the user named that file), and so does a save when
``SandboxContents.sign_saved_widget_state`` is on. The file is not changed.

The signature itself was ambiguous: nbformat's digest runs over every key
and value of the notebook one after the other, with nothing between them, so
``{"a": "bc"}`` and ``{"ab": "c"}`` sign alike. A sandbox had the user save
a notebook whose stream output spelled the bytes of widget state, then cut
the same bytes into a notebook whose metadata *was* that state: it opened
trusted, and the state's script ran (a review of the change above, in Lab).
The server's notary therefore signs a canonical form instead
(:class:`CanonicalNotary`: sorted JSON, lines joined as nbformat reads
them). Notebooks signed before, or by ``jupyter trust``, open untrusted once:
"Trust Notebook" and a save sign them again.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable, Mapping
from hmac import HMAC
from typing import Any

from nbformat.sign import NotebookNotary

#: what the canonical digest starts with: no nbformat digest is one of its
_DOMAIN = b"sandbox_kernel canonical notebook v1\0"
#: what the canonical signatures' key is derived from (see CanonicalNotary)
_KEY_LABEL = b"sandbox_kernel canonical signature key v1"


def canonical_bytes(notebook: Any) -> bytes:
    """The notebook (its JSON content, nbformat 4 or older) as the signature
    sees it: without its signature and what nbformat strips when it writes a
    file (cells' ``trusted``), multi-line strings joined as nbformat reads
    them (a list of lines and the joined string are the same notebook), as
    sorted, separated JSON: two different notebooks never give the same
    bytes."""
    from nbformat import from_dict
    from nbformat.v4.rwbase import rejoin_lines, strip_transient

    shown = from_dict(copy.deepcopy(dict(notebook)))  # type: ignore[no-untyped-call]
    metadata = shown.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("signature", None)
    if shown.get("nbformat", 0) >= 4 and isinstance(shown.get("cells"), list):
        rejoin_lines(shown)  # type: ignore[no-untyped-call]
        strip_transient(shown)  # type: ignore[no-untyped-call]
    return _DOMAIN + json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8",
        "surrogatepass",  # (a lone surrogate in a notebook made every open of it fail)
    )


class CanonicalNotary(NotebookNotary):
    """nbformat's notary (same secret file, same store of signatures), whose
    digest runs over :func:`canonical_bytes`, keyed by a key derived from the
    secret. Config of ``NotebookNotary`` (its ``data_dir``, ``secret_file``)
    applies to it.

    Why a key of its own: with the secret itself, nbformat's digest of one
    notebook could be made equal to this digest of another. nbformat's bytes
    are the keys and values one after the other, so a sandbox wrote a
    notebook whose extra top-level keys (hidden in Lab) spelled the domain
    and the canonical bytes of a second notebook around one of its strings;
    the user ran ``jupyter trust`` on the first, and the second, never
    signed, opened trusted in the guarded Lab and ran its widget state's
    script (an attack review). Under a derived key, no signature of one
    scheme is one of the other."""

    def compute_signature(self, nb: Any) -> str:
        digest = HMAC(self._canonical_key(), digestmod=self.digestmod)
        digest.update(canonical_bytes(nb))
        return digest.hexdigest()

    def _canonical_key(self) -> bytes:
        return HMAC(self.secret, _KEY_LABEL, digestmod=self.digestmod).digest()

    def _check_cell(self, cell: Any, nbformat_version: int) -> bool:
        """Whether a save may sign ``cell``: one the frontend marked trusted
        (it ran it), or one whose outputs are all text (``stream``, ``error``)
        or results without data. nbformat lists the kinds that are not safe
        instead, and a sandbox's ``update_display_data`` output holding HTML
        (Lab renders its data as a display's) was signed by a plain save and
        shown trusted when opened again: a ``<meta http-equiv=refresh>`` took
        the page to an address of the cell's choosing (an attack review).
        ``trusted`` is taken out of the metadata as nbformat does (it is not
        saved)."""
        metadata = cell.get("metadata") if isinstance(cell, dict) else None
        explicitly = metadata.pop("trusted", False) if isinstance(metadata, dict) else False
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            return True
        if explicitly is True:
            return True
        outputs = cell.get("outputs", [])
        return isinstance(outputs, list) and all(_text_only(output, nbformat_version) for output in outputs)


#: output kinds that carry text only (nbformat 4, and 3's names)
_TEXT_OUTPUTS = {"stream", "error", "pyerr"}
#: result kinds, signable without their data
_RESULT_OUTPUTS = {"execute_result", "display_data", "pyout"}


def _text_only(output: Any, nbformat_version: int) -> bool:
    if not isinstance(output, dict):
        return False
    kind = output.get("output_type")
    if kind in _TEXT_OUTPUTS:
        return True
    count_key = "execution_count" if nbformat_version >= 4 else "prompt_number"
    return kind in _RESULT_OUTPUTS and set(output) <= {"output_type", count_key, "metadata"}


def use_canonical_signatures(cm: Any) -> None:
    """Give ``cm`` (a contents manager) a :class:`CanonicalNotary` with the
    config and parent its notary had."""
    cm.notary = CanonicalNotary(parent=cm)  # type: ignore[no-untyped-call]


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
                "outside the kernel's output policy (sign it on the host with `sandbox-kernel trust` if you wrote it)",
                path,
            )
            return None
        return check_and_sign(nb, path, **kwargs)

    cm.check_and_sign = checked_and_signed


#: where a served notebook keeps the widget state it withholds
WITHHELD_KEY = "sandbox_kernel_withheld_widgets"


def withhold_untrusted_widget_state(cm: Any) -> None:
    """Serve an untrusted notebook's saved widget state under
    :data:`WITHHELD_KEY`, where no widget manager looks, and put it back
    under ``widgets`` when the notebook is saved: the file keeps it.

    Why on the server: the Lab extension's guard judges trust from the live
    notebook model, and Lab inserts a *trusted* empty code cell into a
    notebook opened with no cells, before the widget manager reads the
    state. A sandbox's notebook with ``cells: []`` and anywidget state ran
    its script as soon as it was opened (an attack review, in the guarded
    Lab). What the server checked (the signature) is the verdict here."""
    get, save = cm.get, cm.save

    def withheld(model: Any) -> Any:
        notebook = model.get("content") if isinstance(model, dict) and model.get("type") == "notebook" else None
        metadata = notebook.get("metadata") if isinstance(notebook, dict) else None
        if isinstance(metadata, dict) and holds_widget_state(notebook) and not cm.notary.check_signature(notebook):
            metadata[WITHHELD_KEY] = metadata.pop(WIDGETS_KEY)
        return model

    def restored(model: Any) -> None:
        notebook = model.get("content") if isinstance(model, dict) and model.get("type") == "notebook" else None
        metadata = notebook.get("metadata") if isinstance(notebook, dict) else None
        if isinstance(metadata, dict) and WITHHELD_KEY in metadata:
            # a live widget manager's state, saved meanwhile, wins
            metadata.setdefault(WIDGETS_KEY, metadata.pop(WITHHELD_KEY))

    cm.get = _around(get, after=withheld)
    cm.save = _around(save, before=restored)


def _around(
    function: Callable[..., Any],
    before: Callable[[Any], None] | None = None,
    after: Callable[[Any], Any] | None = None,
) -> Callable[..., Any]:
    """``function`` (a contents manager's method, sync or async), with
    ``before`` called on its first argument and ``after`` on its result."""
    if inspect.iscoroutinefunction(function):

        async def asynchronous(*args: Any, **kwargs: Any) -> Any:
            if before is not None and args:
                before(args[0])
            result = await function(*args, **kwargs)
            return after(result) if after is not None else result

        return asynchronous

    def synchronous(*args: Any, **kwargs: Any) -> Any:
        if before is not None and args:
            before(args[0])
        result = function(*args, **kwargs)
        return after(result) if after is not None else result

    return synchronous
