"""Code that runs INSIDE the sandbox.

Standard library + IPython only, relative imports only: the directory is
mounted read-only into the sandbox under another package name, and it must
never import the host side (``sandbox_kernel.*``).
"""
