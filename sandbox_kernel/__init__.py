"""sandbox_kernel: a Jupyter kernel that runs every cell inside a sandbox."""

__version__ = "0.1.0"
