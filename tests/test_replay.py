"""The replay log (imports and definitions carried to a new sandbox), cut out of
cell source on the host: the same statements ``ast.get_source_segment`` finds,
for tricky sources, without its per-statement re-split of the whole cell."""

from __future__ import annotations

import ast

from sandbox_kernel.engine.replay import ReplayLog, python_source

CELL = """\
import os, sys
from collections import (OrderedDict,
    defaultdict)   # a comment
x = "é€😀"; import json as j  # non-ASCII before an import on the same line
%matplotlib inline
@property
@staticmethod
def f(a,
      b):
    return "ü"

class K(object):
    def m(self):
        pass
async def g():
    import math
if True:
    import shutil
!ls
"""


def test_matches_ast_segments_for_tricky_source() -> None:
    log = ReplayLog()
    log.record(CELL)
    source = python_source(CELL)
    assert source is not None
    tree = ast.parse(source)
    want_imports = [ast.get_source_segment(source, n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert log.imports == want_imports
    assert log.imports == [
        "import os, sys",
        "from collections import (OrderedDict,\n    defaultdict)",
        "import json as j",
    ]
    assert list(log.defs) == ["f", "K", "g"]
    assert log.defs["f"].startswith("@property\n@staticmethod\ndef f(a,\n      b):")
    assert log.defs["g"] == "async def g():\n    import math"
    for text in log.defs.values():
        ast.parse(text)  # each definition is replayable on its own


def test_redefinition_goes_last_and_imports_are_not_repeated() -> None:
    log = ReplayLog()
    log.record("import os\ndef a(): pass\ndef b(): pass")
    log.record("import os\ndef a(): return 1")
    assert log.imports == ["import os"]
    assert list(log.defs) == ["b", "a"] and log.defs["a"] == "def a(): return 1"


def test_long_generated_cell_keeps_only_what_replays() -> None:
    body = "\n".join(f"v_{i} = {i}" for i in range(20_000))
    log = ReplayLog()
    log.record(body + "\nimport math\ndef last():\n    return v_1\n")
    assert log.imports == ["import math"] and list(log.defs) == ["last"]
