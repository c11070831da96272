"""The host's caches for sandboxes (engine/completer_seed.py): a new
sandbox's first Tab starts from jedi's, its first plot from matplotlib's font
list, and no sandbox can write them.

The cache is made of pickles that every later sandbox loads: a seed one
sandbox could change would run its code in all the others, past the
ratchet. So the attacks here write where the seed is mounted, and poison the
sandbox's own copy to see that it dies with the sandbox.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from kernel_helpers import bwrap_kernel

from sandbox_kernel.engine import completer_seed


@pytest.fixture(scope="module")
def seed() -> Path:
    """This installation's seed (scripts/setup.sh's `install` made it; made here if not)."""
    found = completer_seed.find() or completer_seed.build()
    assert found is not None, "no completion cache could be made for this installation"
    return found


def font_manager_version() -> str:
    from matplotlib import font_manager

    return str(font_manager.FontManager.__version__)


def _digests(root: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), stat.S_IMODE(p.stat().st_mode))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_seed_is_readable_by_sandboxes_and_writable_by_none(seed: Path) -> None:
    files = [p.relative_to(seed) for p in seed.rglob("*") if p.is_file()]
    pickles = [p for p in files if p.parts[0] == "jedi"]
    font_lists = [p for p in files if p.parts[0] == "matplotlib"]
    assert pickles and all(p.suffix == ".pkl" for p in pickles), files
    assert [p.name for p in font_lists] == [f"fontlist-v{font_manager_version()}.json"], files
    assert len(pickles) + len(font_lists) == len(files), files
    for path in [seed, *seed.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert not stat.S_ISLNK(path.lstat().st_mode), path
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))
        assert path.stat().st_uid == os.geteuid(), path
    assert completer_seed.build() == seed  # made once per installation, not again


LIST_CACHE = """
import json, os, jedi
root = jedi.settings.cache_directory
print(json.dumps({os.path.relpath(os.path.join(d, n), root): os.stat(os.path.join(d, n)).st_mtime
                  for d, _, names in os.walk(root) for n in names}))
"""

ATTACK_SEED = """
import os, glob
seed = os.environ["SANDBOX_KERNEL_COMPLETER_SEED"]
victim = sorted(glob.glob(seed + "/jedi/*/*.pkl"))[0]
refused = []
for name, attempt in [
    ("overwrite", lambda: open(victim, "wb").write(b"x")),
    ("append", lambda: open(victim, "ab").write(b"x")),
    ("create", lambda: open(os.path.dirname(victim) + "/new.pkl", "wb").write(b"x")),
    ("unlink", lambda: os.unlink(victim)),
    ("rename", lambda: os.rename(victim, victim + ".old")),
    ("chmod", lambda: os.chmod(victim, 0o666)),
    ("utime", lambda: os.utime(victim, (0, 0))),
    ("symlink", lambda: os.symlink("/workspace/evil.pkl", os.path.dirname(victim) + "/link.pkl")),
]:
    try:
        attempt()
    except OSError:
        refused.append(name)
print(",".join(refused))
"""

# a pickle that, once loaded, leaves a file in the workspace
POISON = """
import os, jedi, pickle
class Payload:
    def __reduce__(self):
        return (os.system, ("touch /workspace/poison-ran",))
data = pickle.dumps(Payload())
root = jedi.settings.cache_directory
for d, _, names in os.walk(root):
    for n in names:
        path = os.path.join(d, n)
        with open(path, "wb") as f:
            f.write(data)
        os.utime(path, (2**33, 2**33))  # newer than any source: parso would trust it
print(sum(len(n) for _, _, n in os.walk(root)) > 0)
"""


def test_a_new_sandboxs_first_completion_starts_from_the_seed(tmp_path: Path, seed: Path) -> None:
    """Without the seed, the sandbox's warm-up parsed the stubs itself: its
    cache files would be new ones, dated now. With it, each seed file is in
    the sandbox's cache with the seed's own time (copied, not parsed)."""
    seeded = {os.path.relpath(p, seed / "jedi"): p.stat().st_mtime for p in (seed / "jedi").rglob("*") if p.is_file()}
    k = bwrap_kernel(tmp_path)
    try:
        assert k.stdout_of("import sys\nprint('jedi' in sys.modules)") == "False\n"
        reply = k.kc.complete("int.rea", 7, reply=True)["content"]
        assert reply["status"] == "ok" and "real" in reply["matches"], reply
        in_sandbox = json.loads(k.stdout_of(LIST_CACHE))
        for name, mtime in seeded.items():
            assert in_sandbox.get(name) == pytest.approx(mtime, abs=1e-3), (name, in_sandbox.get(name), mtime)
    finally:
        k.shutdown()


def test_no_sandbox_can_write_the_seed_and_a_poisoned_copy_dies_with_its_sandbox(tmp_path: Path, seed: Path) -> None:
    before = _digests(seed)
    k = bwrap_kernel(tmp_path)
    try:
        assert k.stdout_of(ATTACK_SEED).strip().split(",") == [
            "overwrite",
            "append",
            "create",
            "unlink",
            "rename",
            "chmod",
            "utime",
            "symlink",
        ]
        # the sandbox's own copy is its to spoil
        assert "real" in k.kc.complete("int.rea", 7, reply=True)["content"]["matches"]
        assert k.stdout_of(POISON) == "True\n"
        k.stdout_of("def from_the_first_sandbox():\n    return 42")
        # a new sandbox of the session (the old one killed, as the OOM killer would)
        assert k.kill_sandboxes() >= 1
        assert k.stdout_of("print(from_the_first_sandbox())").endswith("42\n")
        reply = k.kc.complete("int.rea", 7, reply=True)["content"]
        assert "real" in reply["matches"], reply
        assert k.stdout_of("import os\nprint(os.path.exists('/workspace/poison-ran'))") == "False\n"
    finally:
        k.shutdown()
    assert not (tmp_path / "ws" / "poison-ran").exists()
    assert _digests(seed) == before


FONT_LIST = """
import glob, hashlib, os
from pathlib import Path
lists = glob.glob(os.environ["MPLCONFIGDIR"] + "/fontlist-*.json")
print(" ".join(Path(p).name + ":" + hashlib.sha256(open(p, "rb").read()).hexdigest() for p in lists))
"""


def test_a_new_sessions_first_plot_starts_from_the_seeds_font_list(tmp_path: Path, seed: Path) -> None:
    """Without the seed, matplotlib scanned every font of the system in each
    new session ("generated new fontManager"; seconds on a desktop). The
    seed cannot be written; a copy one session spoils is that session's only."""
    (font_list,) = (seed / "matplotlib").glob("fontlist-*.json")
    expected = f"{font_list.name}:{hashlib.sha256(font_list.read_bytes()).hexdigest()}\n"
    before = _digests(seed)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    k = bwrap_kernel(tmp_path / "a")
    try:
        assert k.stdout_of(FONT_LIST) == expected  # before matplotlib is imported
        run = k.run(
            "import logging\nlogging.basicConfig(level=logging.INFO)\n"
            "import matplotlib.pyplot as plt\nplt.figure(); plt.plot([1, 2]); plt.savefig('/tmp/plot.png')"
        )
        assert run.reply["status"] == "ok", run.reply
        assert "generated new fontManager" not in run.stderr, run.stderr
        writable = k.stdout_of(
            "import os, glob\nseed = glob.glob(os.environ['SANDBOX_KERNEL_COMPLETER_SEED'] + '/matplotlib/*.json')[0]\n"
            "try:\n    open(seed, 'w')\nexcept OSError:\n    print('refused')"
        )
        assert writable == "refused\n"
        k.stdout_of(
            "import glob, os\nopen(glob.glob(os.environ['MPLCONFIGDIR'] + '/fontlist-*.json')[0], 'w').write('{}')"
        )
    finally:
        k.shutdown()
    other = bwrap_kernel(tmp_path / "b")
    try:
        assert other.stdout_of(FONT_LIST) == expected
    finally:
        other.shutdown()
    assert _digests(seed) == before
