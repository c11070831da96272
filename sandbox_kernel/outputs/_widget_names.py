"""What a widget may call itself: the standard models and the views each is shown by.

The frontend builds a model from ``_model_module``/``_model_name`` and a view from
``_view_module``/``_view_name``, and what a view renders as HTML depends on the
view, not on the model: a Label model shown by ``HTMLView`` puts its ``value``
into ``innerHTML``. So for the standard packages the pair is fixed here (the
pairs ipywidgets 7 and 8 use): a view can only be one its model's package pairs
with it, and the HTML views show only the HTML models, whose ``value`` the
policy cleans.

Names and versions also reach the page as text of an error widget (ipywidgets
builds "Failed to load model class 'X' from module 'Y'" and shows it with
``innerHTML``): they must be plain identifiers and version ranges.
"""

from __future__ import annotations

import re
from typing import Any

from .sizing import text_of

BASE = "@jupyter-widgets/base"
CONTROLS = "@jupyter-widgets/controls"
OUTPUT = "@jupyter-widgets/output"
#: the widget packages every JupyterLab / Notebook 7 with ipywidgets has
STANDARD_MODULES: frozenset[str] = frozenset({BASE, CONTROLS, OUTPUT})

View = tuple[str | None, str | None]

# controls models shown by the view of the same stem (FooModel -> FooView)
_SAME_STEM = [
    "Accordion",
    "Audio",
    "Box",
    "Button",
    "Checkbox",
    "ColorPicker",
    "ColorsInput",
    "Combobox",
    "ControllerAxis",
    "ControllerButton",
    "Controller",
    "DatePicker",
    "Datetime",
    "Dropdown",
    "FileUpload",
    "FloatLogSlider",
    "FloatRangeSlider",
    "FloatSlider",
    "FloatText",
    "FloatsInput",
    "GridBox",
    "HBox",
    "HTMLMath",
    "HTML",
    "Image",
    "IntRangeSlider",
    "IntSlider",
    "IntText",
    "IntsInput",
    "Label",
    "Password",
    "Play",
    "RadioButtons",
    "Select",
    "SelectMultiple",
    "SelectionRangeSlider",
    "SelectionSlider",
    "Stack",
    "Tab",
    "TagsInput",
    "Text",
    "Textarea",
    "Time",
    "ToggleButton",
    "ToggleButtons",
    "VBox",
    "Valid",
    "Video",
]
# controls models shown by another stem's view
_OTHER_STEM = {
    "BoundedFloatText": "FloatText",
    "BoundedIntText": "IntText",
    "FloatProgress": "Progress",
    "IntProgress": "Progress",
    "NaiveDatetime": "Datetime",
    "NumbersInputBase": "TagsInput",
}
# controls models with no view of their own (links, abstract bases)
_NO_VIEW = ["Bool", "DOMWidget", "Description", "DirectionalLink", "Link", "String", "TagsInputBase", "Widget"]
# controls style models, shown by the base package's StyleView
_STYLES = [
    "Button",
    "Checkbox",
    "Description",
    "HTMLMath",
    "HTML",
    "Label",
    "Progress",
    "Slider",
    "String",
    "Text",
    "ToggleButton",
    "ToggleButtons",
]


def _standard_views() -> dict[tuple[str, str], frozenset[View]]:
    """(model module, model name) -> the (view module, view name) it may be shown by."""
    table: dict[tuple[str, str], frozenset[View]] = {
        (BASE, "WidgetModel"): frozenset(),
        (BASE, "DOMWidgetModel"): frozenset(),
        (BASE, "LayoutModel"): frozenset({(BASE, "LayoutView")}),
        (BASE, "StyleModel"): frozenset({(BASE, "StyleView")}),
        (OUTPUT, "OutputModel"): frozenset({(OUTPUT, "OutputView")}),
    }
    for stem in _SAME_STEM:
        table[(CONTROLS, f"{stem}Model")] = frozenset({(CONTROLS, f"{stem}View")})
    for stem, view in _OTHER_STEM.items():
        table[(CONTROLS, f"{stem}Model")] = frozenset({(CONTROLS, f"{view}View")})
    for stem in _NO_VIEW:
        table[(CONTROLS, f"{stem}Model")] = frozenset()
    for stem in _STYLES:
        table[(CONTROLS, f"{stem}StyleModel")] = frozenset({(BASE, "StyleView")})
    return table


STANDARD_VIEWS = _standard_views()
#: views that put a model's ``value`` into ``innerHTML``
HTML_VIEWS: frozenset[View] = frozenset({(CONTROLS, "HTMLView"), (CONTROLS, "HTMLMathView")})
#: models whose ``value`` the frontend renders as HTML
HTML_VALUE_MODELS: frozenset[str] = frozenset({"HTMLModel", "HTMLMathModel"})
#: views and models that load ``value`` as a URL when ``format == "url"``
MEDIA_VIEWS: frozenset[View] = frozenset({(CONTROLS, "ImageView"), (CONTROLS, "VideoView"), (CONTROLS, "AudioView")})
MEDIA_MODELS: frozenset[str] = frozenset({"ImageModel", "VideoModel", "AudioModel"})
#: views that set every value of their model as a CSS property
STYLE_VIEWS: frozenset[View] = frozenset({(BASE, "StyleView"), (BASE, "LayoutView")})
#: models that copy one model's attribute into another's in the page
#: (``jslink``/``jsdlink``): what they copy never passes the host
LINK_MODELS: frozenset[str] = frozenset({"LinkModel", "DirectionalLinkModel"})
#: the keys that say what a model is (checked by name, version and pairing)
IDENTITY_KEYS: frozenset[str] = frozenset(
    {"_model_module", "_model_module_version", "_model_name", "_view_module", "_view_module_version", "_view_name"}
)
#: keys whose value decides what, and how, a standard view renders (HTML
#: switches, formats, child views, outputs, link ends): a binary buffer never
#: goes there, nor does a link copy into or out of them
RENDERING_KEYS: frozenset[str] = frozenset(
    {
        "description",
        "description_allow_html",
        "format",
        "layout",
        "style",
        "children",
        "outputs",
        "msg_id",
        "source",
        "target",
        "titles",
        "_titles",
    }
)

_NAME = re.compile(r"[A-Za-z0-9_]{1,100}\Z")
# one semver or npm range term: 2.0.0, ^1.5, ~0.1.0-beta.1, >=1.0, *, 1.x; a "<"
# is only ever followed by "=" or a digit, so it never opens a tag
_TERM = r"(?:\*|(?:[\^~]|[<>]=?|=)?\d+(?:\.(?:\d+|[xX*])){0,2}(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?)"
_VERSION = re.compile(rf"(?:{_TERM}(?:(?: \|\| | - | ){_TERM})*)?\Z")


def name_problem(key: str, value: Any, *, optional: bool) -> str | None:
    """Why ``value`` cannot be a widget class name (``_model_name``/``_view_name``)."""
    if value is None and optional:
        return None
    if isinstance(value, str) and _NAME.match(value):
        return None
    return f"widget {key} must be 1-100 letters, digits or '_', not {text_of(value, 40)!r}"


def version_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be a module version (range): it never holds markup."""
    if value is None or (isinstance(value, str) and len(value) <= 100 and _VERSION.match(value)):
        return None
    return f"widget {key} must be a version such as '2.0.0' or '^1.5', not {text_of(value, 40)!r}"


def view_problem(model: tuple[str | None, str | None], view: View) -> str | None:
    """Why a model cannot be shown by a view. By a standard view, a standard
    model only if its package pairs them, any other model never by the HTML
    ones (they would render its value as HTML uncleaned). By an installed
    package's own view, any model: that package's code is trusted with its
    own models already, and custom widgets often keep ipywidgets'
    ``DOMWidgetModel`` and bring only a view."""
    if view[1] is None:
        return None  # no view can be made, so nothing is rendered
    if view[0] not in STANDARD_MODULES:
        return None  # an installed package's view (the module itself is checked as installed)
    module, name = model
    if module in STANDARD_MODULES:
        allowed = STANDARD_VIEWS.get((str(module), str(name)))
        if allowed is None:
            return f"{name} is not a widget model of {module}"
        if view not in allowed:
            shown_by = ", ".join(sorted(f"{v[1]}" for v in allowed)) or "no view"
            return f"a {name} is shown by {shown_by}, not by {view[1]} of {view[0]}"
        return None
    if view in HTML_VIEWS:
        return f"{view[1]} shows only HTML widgets, not a {name} of {module}"
    return None


def js_truthy(value: Any) -> bool:
    """Whether JavaScript takes ``value`` (from JSON) as true: a frontend tests
    ``description_allow_html`` so, where Python's ``[]`` and ``{}`` are false."""
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)):
        return value == value and value != 0
    if isinstance(value, str):
        return value != ""
    return True
