"""A kernelspec manager for the Jupyter server that offers no unsandboxed Python kernel.

Why: ipykernel installs its stock ``python3`` spec into every environment it is
installed in, so a JupyterLab started from the project's venv lists "Python 3
(ipykernel)" beside "Python 3 (sandboxed)", and a notebook saved with the stock
kernel runs untrusted code on the host without anyone noticing.

Hiding a spec from the list is not enough: jupyter_client's
``KernelSpecManager.allowed_kernelspecs`` filters ``find_kernel_specs`` (the
launcher, ``GET /api/kernelspecs``) but ``get_kernel_spec`` still resolves any
installed name, so ``POST /api/kernels {"name": "python3"}`` (a notebook's
metadata, a script, another tab) would still start it. This manager refuses such
names in both places, case-insensitively (jupyter_client lower-cases the name
when it looks the directory up).

Only the Jupyter server started by ``scripts/lab.sh`` (``scripts/lab_config.py``)
uses it: nbclient, papermill and ``jupyter console`` build their own plain
``KernelSpecManager`` and still get the ``python3`` they name.
"""

from __future__ import annotations

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from traitlets import Bool, Unicode

SANDBOX_KERNEL_NAME = "sandbox-python"


def is_sandbox_kernel_name(name: str) -> bool:
    """``sandbox-python`` or a variant ``sandbox-python-<suffix>`` (as the lab extension decides)."""
    name = name.lower()
    return name == SANDBOX_KERNEL_NAME or name.startswith(f"{SANDBOX_KERNEL_NAME}-")


class SandboxKernelSpecManager(KernelSpecManager):
    """Lists and starts every kernelspec except Python kernels that are not sandboxed."""

    allow_unsandboxed_python = Bool(
        False,
        config=True,
        help="""Offer Python kernelspecs that do not run in the sandbox (ipykernel's
        ``python3`` and any other spec whose language is Python). Off so that a
        newcomer cannot pick, or be handed by a notebook's metadata, a kernel that
        runs untrusted code on the host; ``scripts/lab.sh --with-stock-kernel`` turns it on.""",
    )

    hidden_message = Unicode(
        "hidden by SandboxKernelSpecManager: it would run cells on the host, outside the sandbox "
        "(start Lab with `scripts/lab.sh --with-stock-kernel` to offer it)",
        help="Logged when a hidden kernel is asked for, so the server log says why it was refused.",
    )

    def is_hidden(self, name: str, spec: KernelSpec) -> bool:
        """Whether ``name`` (with its loaded ``spec``) must be neither listed nor started."""
        if self.allow_unsandboxed_python or is_sandbox_kernel_name(name):
            return False
        return (spec.language or "").strip().lower() == "python"

    def find_kernel_specs(self) -> dict[str, str]:
        found = super().find_kernel_specs()
        visible: dict[str, str] = {}
        for name, resource_dir in found.items():
            try:
                spec = self._get_kernel_spec_by_name(name, resource_dir)
            except NoSuchKernel:
                continue
            except Exception:  # an unreadable spec is left for the base class to report
                visible[name] = resource_dir
                continue
            if not self.is_hidden(name, spec):
                visible[name] = resource_dir
        return visible

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        spec = super().get_kernel_spec(kernel_name)
        if self.is_hidden(kernel_name, spec):
            self.log.warning("Kernel %r %s", kernel_name, self.hidden_message)
            raise NoSuchKernel(kernel_name)
        return spec
