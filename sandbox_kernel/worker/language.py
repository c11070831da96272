"""The language the kernel and exported notebooks declare: the host
interpreter, which is also what runs inside the sandbox.

In the worker's package (stdlib only) so that both sides say the same: the
host's kernel_info and notebooks, and the kernel face cells see
(``%notebook``, comms.py)."""

from __future__ import annotations

import platform
from typing import Any


def language_info() -> dict[str, Any]:
    return {
        "name": "python",
        "version": platform.python_version(),
        "mimetype": "text/x-python",
        "file_extension": ".py",
        "pygments_lexer": "ipython3",
        "codemirror_mode": {"name": "ipython", "version": 3},
        "nbconvert_exporter": "python",
    }
