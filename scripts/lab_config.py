"""Jupyter server configuration of ``scripts/lab.sh`` (the README's Lab command).

Loaded with ``jupyter lab --config=scripts/lab_config.py``, so nothing is
written into the user's ``~/.jupyter``; the browser tests
(``tests/browser/test_newcomer_defaults.py``) start their server with this same
file. Why: a person who never read the README must land in the sandbox.

* ``sandbox-python`` is the default kernel: new notebooks, the launcher's first
  tile, the kernel offered for notebooks without kernel metadata.
* No unsandboxed Python kernel is offered or started (ipykernel's ``python3``
  included; see ``sandbox_kernel.lab_kernelspecs``). A notebook whose metadata
  names ``python3`` gets the only Python kernel left, the sandboxed one.
* The way back, for someone who asks for it: ``scripts/lab.sh --with-stock-kernel``
  (or ``SANDBOX_KERNEL_STOCK_KERNEL=1``) offers the stock kernel again; the
  lab extension then marks its notebooks "Not sandboxed".

nbclient and papermill do not read this file: naming ``python3`` there still
gives the stock kernel.
"""

import os

c = get_config()  # type: ignore[name-defined]  # noqa: F821  (provided by traitlets when loading)

STOCK_KERNEL_ENV = "SANDBOX_KERNEL_STOCK_KERNEL"

c.MappingKernelManager.default_kernel_name = "sandbox-python"
c.ServerApp.kernel_spec_manager_class = "sandbox_kernel.lab_kernelspecs.SandboxKernelSpecManager"
c.SandboxKernelSpecManager.allow_unsandboxed_python = os.environ.get(STOCK_KERNEL_ENV, "").strip().lower() in {
    "1",
    "true",
    "yes",
    "on",
}

# The browser renders what sandboxes write (a private session's report.md with
# a remote image, a notebook's markdown): it fetches nothing from another origin
# (sandbox_kernel/lab_content_policy.py; SANDBOX_KERNEL_REMOTE_CONTENT=1 turns it off).
from sandbox_kernel import lab_content_policy  # noqa: E402

lab_content_policy.apply(c)
