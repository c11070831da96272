"""``sandbox-kernel export``: a notebook a sandbox wrote, converted on the host
as the Lab server converts it (the page itself is checked in
tests/test_lab_html_exports.py, and opened in Chromium in
tests/browser/test_notebook_exports.py).

The control is ``jupyter nbconvert`` on the same files: it imports what the
notebook names and writes the notebook's scripts into the page.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from export_attack import PLANTED_TEXT, attack_notebook, plant_templates
from nbformat import v4

VENV_BIN = Path(sys.executable).parent
ZEN = "Beautiful is better than ugly"


def _cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "sandbox-kernel"), "export", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def _nbconvert(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(cwd / "no-config")}
    return subprocess.run(
        [str(VENV_BIN / "jupyter"), "nbconvert", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def _write(path: Path, nb: object) -> Path:
    path.write_text(nbformat.writes(nb))  # type: ignore[arg-type]
    return path


def test_an_html_export_is_confined(tmp_path: Path) -> None:
    notebook = _write(tmp_path / "report.ipynb", attack_notebook())
    control = _nbconvert("--to", "html", notebook, cwd=tmp_path)
    assert control.returncode == 0, control.stderr
    control_page = (tmp_path / "report.html").read_text()
    assert "<script>window.pageScriptRan = true; fetch('http://127.0.0.1:9/markdown_script')</script>" in control_page
    (tmp_path / "report.html").unlink()
    done = _cli(notebook, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {tmp_path / 'report.html'}"
    page = (tmp_path / "report.html").read_text()
    assert '<meta http-equiv="Content-Security-Policy"' in page
    assert "127.0.0.1:9/markdown_script" not in page and "127.0.0.1:9/html_script" not in page
    assert "<h1" in page and "<th>" in page


def test_slides_and_stdout(tmp_path: Path) -> None:
    notebook = _write(tmp_path / "talk.ipynb", attack_notebook())
    done = _cli(notebook, "--to", "slides", "--output", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "reveal" in done.stdout and '<meta http-equiv="Content-Security-Policy"' in done.stdout
    assert "127.0.0.1:9/markdown_script" not in done.stdout and "127.0.0.1:9/html_script" not in done.stdout
    assert not list(tmp_path.glob("talk.*.html"))


def test_a_script_export_imports_nothing_the_notebook_names(tmp_path: Path) -> None:
    nb = v4.new_notebook(cells=[v4.new_code_cell("print('hello')")])
    nb.metadata["language_info"] = {"name": "python", "nbconvert_exporter": "this.x"}
    notebook = _write(tmp_path / "named.ipynb", nb)
    control = _nbconvert("--to", "script", notebook, cwd=tmp_path)
    assert ZEN in control.stdout + control.stderr  # the control imported `this`
    done = _cli(notebook, "--to", "script", cwd=tmp_path)
    assert done.returncode == 1 and ZEN not in done.stdout + done.stderr
    assert "nbconvert_exporter is 'this.x', not an exporter's name" in done.stderr
    nb.metadata["language_info"]["nbconvert_exporter"] = "python"
    _write(notebook, nb)
    done = _cli(notebook, "--to", "script", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "print('hello')" in (tmp_path / "named.py").read_text()


def test_a_link_at_the_output_is_replaced_not_followed(tmp_path: Path) -> None:
    # a sandbox cannot make links (seccomp), but a folder may hold one from elsewhere
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    notebook = _write(tmp_path / "report.ipynb", attack_notebook())
    (tmp_path / "report.html").symlink_to(precious)
    done = _cli(notebook, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert precious.read_text() == "keep me"
    assert (
        not (tmp_path / "report.html").is_symlink()
        and "Content-Security-Policy" in (tmp_path / "report.html").read_text()
    )


def test_a_link_renamed_to_the_notebook_or_a_folder_of_its_path_is_not_followed(tmp_path: Path) -> None:
    """A sandbox cannot make a link but can rename one its workspace holds
    (an attack review, with a real kernel): renamed to ``report.ipynb``, the
    export read the host file it names and wrote its page into the
    workspace, where the sandbox read it."""
    private = tmp_path / "private"
    private.mkdir()
    _write(private / "diary.ipynb", v4.new_notebook(cells=[v4.new_markdown_cell("DIARY-SECRET")]))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "report.ipynb").symlink_to(private / "diary.ipynb")
    (ws / "sub").symlink_to(private)
    for path, link in (("ws/report.ipynb", "ws/report.ipynb"), ("ws/sub/diary.ipynb", "ws/sub")):
        done = _cli(path, cwd=tmp_path)
        assert done.returncode == 1 and f"{link} is a link: not followed" in done.stderr, done.stderr
    assert sorted(p.name for p in ws.iterdir()) == ["report.ipynb", "sub"]
    assert sorted(p.name for p in private.iterdir()) == ["diary.ipynb"]


def test_a_folder_swapped_for_a_link_during_the_conversion_is_not_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write went by path: a sandbox that swapped the notebook's folder
    with the user's link ``proj -> ~/code-proj`` once the export had read it
    (``renameat2(RENAME_EXCHANGE)``, on inotify's word) had its code written
    over the user's ``setup.py`` outside the workspace (an attack review).
    Now the output goes through the folder the notebook was read from."""
    from sandbox_kernel import export, lab_exports

    project = tmp_path / "code-proj"
    project.mkdir()
    (project / "setup.py").write_text("the user's setup\n")
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    (ws / "proj").symlink_to(project)
    nb = v4.new_notebook(cells=[v4.new_code_cell("print('THE SANDBOX CODE')")])
    nb.metadata["language_info"] = {"name": "python", "nbconvert_exporter": "python", "file_extension": ".py"}
    _write(ws / "out" / "setup.ipynb", nb)
    checked = lab_exports.exporter_problem

    def swap_then_check(*args: object) -> str | None:  # (between the read and the write)
        os.rename(ws / "out", ws / "was-out")
        os.rename(ws / "proj", ws / "out")
        os.rename(ws / "was-out", ws / "proj")
        return checked(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(lab_exports, "exporter_problem", swap_then_check)
    monkeypatch.chdir(tmp_path)
    assert export.main(["--to", "script", "ws/out/setup.ipynb"]) == 0
    assert (project / "setup.py").read_text() == "the user's setup\n"
    assert "THE SANDBOX CODE" in (ws / "proj" / "setup.py").read_text()  # (its own folder, renamed)


def test_bad_input_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "broken.ipynb").write_text("{not json")
    (tmp_path / "folder.ipynb").mkdir()
    # JSON nbformat reads, against its schema (it only warns): a cell id a
    # sandbox wrote, with a terminal sequence in it
    invalid = v4.new_notebook(cells=[v4.new_code_cell("1")])
    invalid.cells[0].id = "bad\x1b]0;owned\x07id"
    (tmp_path / "invalid.ipynb").write_text(json.dumps(invalid))
    cases = {
        ("missing.ipynb",): "missing.ipynb: no such file",
        ("broken.ipynb",): "broken.ipynb is not a notebook nbformat can read",
        ("folder.ipynb",): "folder.ipynb is a folder, not a notebook",
        ("invalid.ipynb", "--to", "script"): "invalid.ipynb is not a valid notebook: ",
    }
    for args, message in cases.items():
        done = _cli(*args, cwd=tmp_path)
        assert done.returncode == 1 and message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert "(at ['cells'][0]['id'])" in done.stderr, done.stderr
    notebook = _write(tmp_path / "ok.ipynb", v4.new_notebook())
    done = _cli(notebook, "--to", "pdf", cwd=tmp_path)
    assert done.returncode == 2 and "invalid choice: 'pdf'" in done.stderr
    done = _cli(notebook, "--output", tmp_path / "no-such-folder" / "x.html", cwd=tmp_path)
    assert done.returncode == 1 and "cannot write" in done.stderr and "No such file or directory" in done.stderr
    done = _cli(notebook, "--output", notebook, cwd=tmp_path)
    assert done.returncode == 1 and "is the notebook itself" in done.stderr
    assert json.loads(notebook.read_text())["nbformat"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.ipynb", "folder.ipynb", "invalid.ipynb", "ok.ipynb"]


def test_the_users_nbconvert_configuration_applies(tmp_path: Path) -> None:
    config = tmp_path / "jupyter-config"
    config.mkdir()
    (config / "jupyter_nbconvert_config.py").write_text(
        "c.HTMLExporter.mathjax_url = 'https://math.example/mj/MathJax.js'\n"
    )
    notebook = _write(tmp_path / "m.ipynb", v4.new_notebook(cells=[v4.new_markdown_cell("$x$")]))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config)}
    done = subprocess.run(
        [str(VENV_BIN / "sandbox-kernel"), "export", str(notebook), "-o", "-"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (
        'src="https://math.example/mj/MathJax.js"' in done.stdout
        and "https://math.example/mj/" in done.stdout.split("</head>")[0]
    )


def test_a_script_export_is_never_written_as_a_page(tmp_path: Path) -> None:
    # nbconvert names the script after the notebook's language_info: a
    # sandbox's notebook made `--to script` write report.html beside it
    nb = v4.new_notebook(cells=[v4.new_code_cell("<script>window.ran = 1</script>")])
    nb.metadata["language_info"] = {"name": "python", "file_extension": ".html", "mimetype": "text/html"}
    notebook = _write(tmp_path / "report.ipynb", nb)
    done = _cli(notebook, "--to", "script", cwd=tmp_path)
    assert done.returncode == 1
    assert "file_extension is '.html', not a script's" in done.stderr
    assert not (tmp_path / "report.html").exists()


def test_templates_a_sandbox_wrote_beside_the_notebook_are_not_used(tmp_path: Path) -> None:
    # nbconvert looked for templates in the working directory first (and
    # imported what their conf.json names): a cell that wrote lab/index.html.j2
    # ran its command on the host when the user exported from the notebook's folder
    marker = tmp_path / "ran-on-the-host.txt"
    nb = v4.new_notebook(cells=[v4.new_code_cell("print('hello')")])
    nb.metadata["language_info"] = {"name": "python", "nbconvert_exporter": "python", "file_extension": ".py"}
    notebook = _write(tmp_path / "report.ipynb", nb)
    # the attacks, on the tool without the guard: the templates run...
    plant_templates(tmp_path, marker, conf=False)
    control = _nbconvert("--to", "html", notebook, cwd=tmp_path)
    assert marker.exists(), control.stderr
    marker.unlink()
    # ... and their conf.json's preprocessor is imported
    plant_templates(tmp_path, marker)
    control = _nbconvert("--to", "html", notebook, cwd=tmp_path)
    assert ZEN in control.stdout + control.stderr, control.stderr[-2000:]
    for fmt, written in (("html", "report.html"), ("slides", "report.slides.html"), ("script", "report.py")):
        done = _cli(notebook, "--to", fmt, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        made = (tmp_path / written).read_text()
        assert PLANTED_TEXT not in made and "hello" in made, made[-500:]
        assert ZEN not in done.stdout + done.stderr
        assert not marker.exists(), f"--to {fmt} ran a template of the notebook's folder"
