"""``%matplotlib`` behaves as in ipykernel: inline and no argument work, non-GUI
backends work, GUI backends say the sandbox has no display, and
``%config InlineBackend.*`` keeps working."""

from __future__ import annotations

import pytest
from kernel_helpers import SandboxKernelHandle

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()"


@pytest.mark.parametrize("magic", ["%matplotlib inline", "%matplotlib"])
def test_inline_forms_draw_figures_in_the_notebook(fresh_kernel: SandboxKernelHandle, magic: str) -> None:
    run = fresh_kernel.run(f"{magic}\n{PLOT}")
    assert run.status == "ok", (run.stderr, run.errors)
    assert "NotImplementedError" not in run.stderr
    assert any("image/png" in d["data"] for d in run.of("display_data")), run.messages


def test_config_inline_backend_still_applies(fresh_kernel: SandboxKernelHandle) -> None:
    run = fresh_kernel.run(f"%matplotlib inline\n%config InlineBackend.figure_format = 'svg'\n{PLOT}")
    assert run.status == "ok", (run.stderr, run.errors)
    assert any("image/svg+xml" in d["data"] for d in run.of("display_data")), run.messages


def test_non_gui_backend_works(fresh_kernel: SandboxKernelHandle) -> None:
    run = fresh_kernel.run("%matplotlib agg\nimport matplotlib\nprint(matplotlib.get_backend().lower())")
    assert run.status == "ok", (run.stderr, run.errors)
    assert run.stdout.strip() == "agg"


@pytest.mark.parametrize("backend", ["qt", "tk", "osx", "gtk3", "wx", "qt5"])
def test_gui_backends_say_there_is_no_display(fresh_kernel: SandboxKernelHandle, backend: str) -> None:
    run = fresh_kernel.run(f"%matplotlib {backend}")
    assert run.status == "error"
    assert "no display" in run.stderr and "%matplotlib inline" in run.stderr, run.stderr
    assert "import" not in run.stderr.lower(), run.stderr  # not a toolkit import error
    assert fresh_kernel.run("1 + 1").result["text/plain"] == "2"  # and the kernel serves
