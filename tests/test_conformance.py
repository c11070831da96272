"""The upstream jupyter_kernel_test conformance suite, on the sandboxed kernel."""

from __future__ import annotations

import os
import tempfile
import unittest

import jupyter_kernel_test as jkt
from kernel_helpers import require_bwrap


class SandboxKernelConformance(jkt.KernelTests):
    kernel_name = "sandbox-python"
    language_name = "python"
    file_extension = ".py"

    @classmethod
    def setUpClass(cls) -> None:
        require_bwrap()
        # The upstream suite starts the kernel in the current directory, which is
        # the repository (an import root: the workspace policy refuses it).
        cls._cwd = os.getcwd()
        cls._tmp = tempfile.TemporaryDirectory()
        os.chdir(cls._tmp.name)
        try:
            super().setUpClass()
        finally:
            os.chdir(cls._cwd)

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        cls._tmp.cleanup()

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [
        {"text": "zi", "matches": {"zip"}},
        {"text": "import ipaddr", "matches": {"ipaddress"}},
    ]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('sandboxed')"
    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))", "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))", "mime": "text/latex"},
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"


if __name__ == "__main__":
    unittest.main()
