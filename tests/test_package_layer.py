"""The ``%pip`` layer of a session no later kernel can name goes with it.

A notebook's layer outlives its kernels (a restart, or the next kernel on the
notebook, keeps what ``%pip install`` put there). A kernel with no notebook
and no ``session_id`` (nbclient, papermill, a bare KernelManager) has a session
named after its connection file, which no later run uses again: each run left
its layer, with whatever a cell wrote there (no size cap), in a folder of its
own for good (an attack review, helper 38: 101 MB per run).
"""

from __future__ import annotations

from pathlib import Path

from kernel_helpers import SandboxKernelHandle, require_bwrap

WRITE = (
    "import os\n"
    "layer = os.environ['SANDBOX_KERNEL_PACKAGES']\n"
    "open(os.path.join(layer, 'left.bin'), 'wb').write(b'x' * (1 << 20))\n"
    "print('written')"
)


def _layers(data_dir: Path) -> list[Path]:
    return [p.parent for p in (data_dir / "packages").glob("*/*/left.bin")]


def _kernel(tmp_path: Path, name: str, env: dict[str, str] | None = None) -> SandboxKernelHandle:
    require_bwrap()
    (tmp_path / name / "ws").mkdir(parents=True)
    (tmp_path / name / "tmp").mkdir()
    return SandboxKernelHandle(
        tmp_path / name / "ws", tmp_path / name / "tmp", extra_args=["--SandboxKernel.backend=bwrap"], env=env
    )


def test_a_throwaway_sessions_layer_goes_with_its_clean_shutdown(tmp_path: Path) -> None:
    kernel = _kernel(tmp_path, "papermill")
    try:
        assert kernel.stdout_of(WRITE) == "written\n"
        assert len(_layers(kernel.data_dir)) == 1
        kernel.km.restart_kernel()  # a restart keeps the session, and its layer
        kernel.kc.wait_for_ready(timeout=60)
        assert len(_layers(kernel.data_dir)) == 1
    finally:
        kernel.shutdown()
    assert _layers(kernel.data_dir) == []


def test_a_notebooks_layer_outlives_its_kernel(tmp_path: Path) -> None:
    kernel = _kernel(tmp_path, "notebook", env={"JPY_SESSION_NAME": str(tmp_path / "notebook" / "ws" / "a.ipynb")})
    try:
        assert kernel.stdout_of(WRITE) == "written\n"
    finally:
        kernel.shutdown()
    assert len(_layers(kernel.data_dir)) == 1
