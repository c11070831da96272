"""A private dataset source inside the notebook's folder is warned about.

Every sandbox hides such a source by a mount over it, and that mount does not
survive a host program replacing the file (a rename over it, or a delete and
re-create): Linux detaches a mount whose file is unlinked in another
namespace, so every running sandbox then reads the new file, with network
too (docs/security.md, "Private dataset sources"). So such a folder holds
private data and its sandboxes run without network (tests/test_dataset_sources.py);
the kernel says why once (its log, and the user once the session shows it)
for a source in its workspace, and not for one outside.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_helpers import SandboxKernelHandle, require_bwrap

from sandbox_kernel.engine.ratchet import exposed_sources, exposed_sources_warning

WARNING = "private dataset source(s) inside a folder this notebook's sandboxes mount"


def _kernel_log(tmp_path: Path, source: str) -> tuple[str, str]:
    """The log of a kernel on ``tmp_path/project`` configured with the dataset
    ``source``, after two cells, and what those cells showed on stderr."""
    require_bwrap()
    ws = tmp_path / "project"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "hr.csv").write_text("name,salary\nada,1\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "hr.csv").write_text("name,salary\nada,1\n")
    config = tmp_path / "config"
    config.mkdir()
    (config / "sandbox_kernel_config.py").write_text(
        f"c.SandboxKernel.private_datasets = {{'hr': {{'source': {source!r}, 'sensitivity': 'SECRET'}}}}\n"
    )
    (tmp_path / "tmp").mkdir()
    log_file = tmp_path / "kernel-stderr.log"
    with log_file.open("wb") as log:
        kernel = SandboxKernelHandle(
            ws,
            tmp_path / "tmp",
            extra_args=["--SandboxKernel.backend=bwrap", "--SandboxKernel.network=full"],
            env={"SANDBOX_KERNEL_DATA_DIR": str(tmp_path / "host-data"), "JUPYTER_CONFIG_DIR": str(config)},
            stderr=log,
        )
        try:
            shown = kernel.run("print(1)").stderr + kernel.run("print(2)").stderr
        finally:
            kernel.shutdown()
    return log_file.read_text(errors="replace"), shown


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_a_source_in_the_workspace_is_warned_about_once(tmp_path: Path, where: str) -> None:
    source = "data/hr.csv" if where == "inside" else str(tmp_path / "elsewhere" / "hr.csv")
    log, shown = _kernel_log(tmp_path, source)
    if where == "inside":
        assert log.count(WARNING) == 1, log
        assert str((tmp_path / "project" / "data" / "hr.csv").resolve()) in log
        assert "every sandbox on it runs without network" in log
        assert "Keep private data outside notebook folders" in log
        # and the user is told once, in the first cell's output
        assert shown.count("Keep private data outside notebook folders") == 1, shown
    else:
        assert WARNING not in log and WARNING not in shown, (log, shown)


def test_the_warning_names_each_source_in_a_mounted_folder(tmp_path: Path) -> None:
    ws, reads, far = tmp_path / "ws", tmp_path / "ro", tmp_path / "far"
    for folder in (ws / "d", reads, far):
        folder.mkdir(parents=True)
    inside, read, outside = ws / "d" / "a.csv", reads / "b.csv", far / "c.csv"
    for f in (inside, read, outside):
        f.write_text("x\n")
    assert exposed_sources([inside, read, outside], [ws, reads]) == [(inside, ws), (read, reads)]
    assert exposed_sources([tmp_path], [ws]) == [(tmp_path, ws)]  # a source folder holding the workspace
    assert exposed_sources_warning([outside], [ws, reads]) is None
    text = exposed_sources_warning([inside], [ws])
    assert text is not None and str(inside) in text and "rename" in text.replace("renaming", "rename")
