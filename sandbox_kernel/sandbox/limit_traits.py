"""The resource limits as configurable traits, shared by everything that starts
sandboxes for a user (the kernel, the MCP server), so both read the same
options with the same defaults from one ``sandbox_kernel_config.py``."""

from __future__ import annotations

from traitlets import HasTraits, Int

from .base import ResourceLimits

GiB = 1 << 30

#: the limits a sandbox gets unless configured otherwise
DEFAULT_LIMITS = ResourceLimits(address_space=8 * GiB, processes=512, file_size=4 * GiB, open_files=1024)


class LimitTraits(HasTraits):
    """``memory_limit``, ``max_processes``, ``max_file_size``, ``max_open_files``
    (0: no limit) and the :class:`ResourceLimits` they make."""

    memory_limit = Int(
        DEFAULT_LIMITS.address_space,
        help="Address-space limit of the sandboxed processes, in bytes (0: none).",
    ).tag(config=True)
    max_processes = Int(
        DEFAULT_LIMITS.processes,
        help="RLIMIT_NPROC inside the sandbox (0: none). Not enforced by Linux for "
        "host root; use the docker backend for a hard cap.",
    ).tag(config=True)
    max_file_size = Int(
        DEFAULT_LIMITS.file_size,
        help="Largest file sandboxed code may write, in bytes (0: none).",
    ).tag(config=True)
    max_open_files = Int(
        DEFAULT_LIMITS.open_files,
        help="Open file descriptors per sandboxed process (0: none).",
    ).tag(config=True)

    def resource_limits(self) -> ResourceLimits:
        return ResourceLimits(
            address_space=self.memory_limit or None,
            processes=self.max_processes or None,
            file_size=self.max_file_size or None,
            open_files=self.max_open_files or None,
        )
