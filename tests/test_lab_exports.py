"""Which notebooks sandbox_kernel.lab_exports refuses to convert (the server
test, with the attack, is tests/browser/test_notebook_exports.py)."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_kernel.lab_exports import exporter_problem, installed_exporter, makes_a_script


def _notebook(exporter: Any) -> dict[str, Any]:
    return {"metadata": {"language_info": {"name": "python", "nbconvert_exporter": exporter}}, "cells": []}


@pytest.mark.parametrize("name", ["python", "script", "r", "julia-script", None, ""])
def test_exporter_names_pass(name: Any) -> None:
    assert exporter_problem(_notebook(name)) == ""


@pytest.mark.parametrize(
    "name",
    ["this.x", "os.system", "nbconvert.exporters.PythonExporter", "python ", "a/b", 3, ["python"], "x" * 65],
)
def test_anything_else_is_refused_by_name(name: Any) -> None:
    problem = exporter_problem(_notebook(name))
    assert problem.startswith(f"the notebook's metadata.language_info.nbconvert_exporter is {name!r}")


@pytest.mark.parametrize("notebook", [None, [], {}, {"metadata": []}, {"metadata": {"language_info": "python"}}])
def test_notebooks_without_the_field_pass(notebook: Any) -> None:
    assert exporter_problem(notebook) == ""


@pytest.mark.parametrize("name", ["html", "HTML", "slides", "webpdf", "pdf", "latex", "markdown", "notebook"])
def test_an_installed_exporter_that_makes_no_script_is_refused(name: str) -> None:
    # the script export delegates to the exporter the field names: "html" made
    # the "Executable Script" download an unconfined HTML page
    problem = exporter_problem(_notebook(name))
    assert problem.startswith(f"the notebook's metadata.language_info.nbconvert_exporter is {name!r}, the exporter of")
    assert "which makes no script" in problem


def test_a_script_exporter_is_known_and_an_unknown_name_passes() -> None:
    from nbconvert.exporters import HTMLExporter, PythonExporter

    assert installed_exporter("python") is PythonExporter and makes_a_script(PythonExporter)
    assert installed_exporter("Html") is HTMLExporter and not makes_a_script(HTMLExporter)
    # (nbconvert fails on a name nothing installed answers to: nothing is made)
    assert installed_exporter("julia-script") is None


def test_the_converted_notebook_itself_is_checked() -> None:
    # (the server's handler reads the file twice: tests/browser/test_notebook_exports.py races them)
    import nbformat
    from nbconvert.exporters import ScriptExporter

    from sandbox_kernel.lab_exports import ExportRefused, checked_class

    kind = checked_class(ScriptExporter)
    assert kind.__name__ == "ScriptExporter" and issubclass(kind, ScriptExporter)
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    notebook.metadata["language_info"] = {"name": "python", "nbconvert_exporter": "python"}
    script, _ = kind().from_notebook_node(notebook)
    assert "print(1)" in script
    notebook.metadata["language_info"]["nbconvert_exporter"] = "os.system"
    with pytest.raises(ExportRefused, match=r"nbconvert_exporter is 'os\.system', not an exporter's name"):
        kind().from_notebook_node(notebook)


def _script_notebook(**info: Any) -> dict[str, Any]:
    return {"metadata": {"language_info": {"name": "x", **info}}, "cells": []}


@pytest.mark.parametrize(
    ("extension", "mimetype"),
    [
        (".py", "text/x-python"),  # ipykernel
        (".r", "text/x-r-source"),  # IRkernel
        (".jl", "application/julia"),  # IJulia
        (".sh", "text/x-sh"),  # bash_kernel
        (".js", "application/javascript"),  # IJavascript (its type is served as text/plain)
        (".scala", "text/x-scala"),
        (None, None),
    ],
)
def test_the_script_types_kernels_write_pass(extension: Any, mimetype: Any) -> None:
    info = {k: v for k, v in (("file_extension", extension), ("mimetype", mimetype)) if v is not None}
    assert exporter_problem(_script_notebook(**info)) == ""
    assert exporter_problem(_script_notebook(nbconvert_exporter="script", **info)) == ""


@pytest.mark.parametrize("extension", [".html", ".HTM", ".svg", ".xhtml", ".hta", ".desktop", ".pdf", "py", ".a/b", 3])
def test_a_script_export_named_as_a_page_is_refused(extension: Any) -> None:
    # nbconvert names the script export's download after these fields: a
    # sandbox's notebook made "Executable Script" download an HTML page
    problem = exporter_problem(_script_notebook(file_extension=extension, mimetype="text/x-python"))
    assert problem.startswith(
        f"the notebook's metadata.language_info.file_extension is {str(extension)!r}, not a script's"
    )


@pytest.mark.parametrize(
    "mimetype", ["text/html", "application/xhtml+xml", "image/svg+xml", "text/xml", "text/html; x", 1]
)
def test_a_script_export_typed_as_a_page_is_refused(mimetype: Any) -> None:
    problem = exporter_problem(_script_notebook(file_extension=".py", mimetype=mimetype))
    assert problem.startswith(f"the notebook's metadata.language_info.mimetype is {str(mimetype)!r}, not a script's")


def test_only_the_script_export_is_named_after_these_fields() -> None:
    # nbconvert reads them for the script export alone: a notebook saying
    # .html still exports to HTML (and gophernotes or lgo write them empty)
    page = _script_notebook(file_extension=".html", mimetype="text/html")
    assert exporter_problem(page, "html") == "" and exporter_problem(page, "slides") == ""
    assert exporter_problem(page, "script").startswith("the notebook's metadata.language_info.file_extension")
    empty = _script_notebook(file_extension="", mimetype="", nbconvert_exporter="")
    assert exporter_problem(empty, "script") == "" and exporter_problem(empty) == ""


def test_the_converting_exporter_checks_the_script_fields_only_for_a_script() -> None:
    import nbformat
    from nbconvert.exporters import HTMLExporter, ScriptExporter

    from sandbox_kernel.lab_exports import ExportRefused, checked_class

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    notebook.metadata["language_info"] = {"name": "python", "file_extension": ".html", "mimetype": "text/html"}
    with pytest.raises(ExportRefused, match=r"file_extension is '\.html', not a script's"):
        checked_class(ScriptExporter)().from_notebook_node(notebook)
    page, _ = checked_class(HTMLExporter)().from_notebook_node(notebook)
    assert "print" in page
