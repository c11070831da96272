"""Attacks from cell code: each must fail safely while the kernel keeps serving.

Guarantees 1 (mounts), 5 (no host unpickling), 7 (bad input), 8 (outputs)
and 9 (host secrets stay out).
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

from kernel_helpers import SandboxKernelHandle, require_bwrap


def test_host_files_outside_the_mounts_are_invisible(kernel: SandboxKernelHandle, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("TOP-SECRET")
    code = (
        "import os\nresults = {}\n"
        f"for p in [{str(secret)!r}, '/etc/shadow', '/etc/hostname', '/root/.bashrc', '/run', '/var/run/docker.sock', '/home', '/proc/1/root/etc/shadow']:\n"
        "    try:\n        open(p).read(); results[p] = 'READ'\n"
        "    except IsADirectoryError:\n        results[p] = 'EXISTS'\n"
        "    except OSError as e:\n        results[p] = type(e).__name__\n"
        "print(results)"
    )
    run = kernel.run(code)
    assert run.status == "ok"
    assert "READ" not in run.stdout and "EXISTS" not in run.stdout, run.stdout
    assert "TOP-SECRET" not in run.stdout


def test_writes_outside_workspace_fail_or_stay_inside(kernel: SandboxKernelHandle, tmp_path: Path) -> None:
    marker = f"sk-escape-{os.getpid()}-{time.time_ns()}"
    code = (
        "import os\nout = {}\n"
        f"for p in ['/usr/{marker}', '/etc/{marker}', '{tmp_path}/{marker}', '/{marker}']:\n"
        "    try:\n        open(p, 'w').write('x'); out[p] = 'WROTE'\n"
        "    except OSError as e:\n        out[p] = type(e).__name__\n"
        f"open('/tmp/{marker}', 'w').write('private tmp')\n"
        f"open('/workspace/{marker}', 'w').write('granted')\n"
        "print(out)"
    )
    run = kernel.run(code)
    assert run.status == "ok", run.reply
    assert "WROTE" not in run.stdout, run.stdout
    assert not (tmp_path / marker).exists()
    assert not Path(f"/etc/{marker}").exists() and not Path(f"/{marker}").exists()
    assert not Path(f"/tmp/{marker}").exists(), "the sandbox's /tmp must be private"
    assert (kernel.workspace / marker).read_text() == "granted"


def test_environment_secrets_of_the_kernel_stay_out(tmp_path: Path) -> None:
    require_bwrap()
    (tmp_path / "ws").mkdir()
    (tmp_path / "tmp").mkdir()
    handle = SandboxKernelHandle(tmp_path / "ws", tmp_path / "tmp", env={"SK_TEST_API_KEY": "sk-live-12345"})
    try:
        run = handle.run(
            "import os, glob\nfound = [k for k, v in os.environ.items() if 'sk-live' in v]\n"
            "for f in glob.glob('/proc/*/environ'):\n"
            "    try:\n        found += [f] if b'sk-live' in open(f, 'rb').read() else []\n"
            "    except OSError:\n        pass\n"
            "print('FOUND', found, sorted(os.environ))"
        )
        assert run.status == "ok"
        assert "FOUND []" in run.stdout, run.stdout
        assert "SK_TEST_API_KEY" not in run.stdout
    finally:
        handle.shutdown()


def test_no_capabilities_and_unprivileged_uid(kernel: SandboxKernelHandle) -> None:
    run = kernel.run(
        "import os\n"
        "status = open('/proc/self/status').read()\n"
        "print([l for l in status.splitlines() if l.startswith(('CapEff', 'NoNewPrivs'))], os.getuid())"
    )
    assert run.status == "ok"
    assert "CapEff:\\t0000000000000000" in run.stdout
    assert "NoNewPrivs:\\t1" in run.stdout
    assert run.stdout.strip().endswith("1000")


def test_malicious_checkpoint_pickle_never_runs_on_the_host(fresh_kernel: SandboxKernelHandle, tmp_path: Path) -> None:
    host_marker = tmp_path / "pwned-by-pickle"
    k = fresh_kernel
    k.run("x = 1")
    time.sleep(1.5)  # the first checkpoint exists

    class Evil:
        def __reduce__(self):  # the payload a cell would write
            return (open, (str(host_marker), "w"))

    payload = pickle.dumps({"vars": {"evil": pickle.dumps(Evil())}, "modules": {}})
    run = k.run(
        "import glob\n"
        "state = '/.sandbox_kernel/state'\n"
        f"open(state + '/checkpoint.bin', 'wb').write({payload!r})\n"
        "import json, os\n"
        "json.dump({'version': 1, 'cell': 999999, 'variables': ['evil'], 'modules': [], 'dropped': {}}, open(state + '/checkpoint.json', 'w'))\n"
        "print(sorted(os.listdir(state)))"
    )
    assert run.status == "ok" and "checkpoint.bin" in run.stdout, run.reply
    assert k.kill_sandboxes() >= 1
    run = k.run("print('serving')")
    assert run.status == "ok" and "serving" in run.stdout
    assert not host_marker.exists(), "a sandbox-written pickle was loaded on the host"
    assert "evil" in run.stderr  # it failed to load inside the new sandbox and was named


def test_symlinked_manifest_is_refused(fresh_kernel: SandboxKernelHandle) -> None:
    k = fresh_kernel
    k.run("y = 2")
    time.sleep(1.5)
    run = k.run(
        "import os\nstate = '/.sandbox_kernel/state'\nos.remove(state + '/checkpoint.json')\n"
        "open('/workspace/decoy.json', 'w').write('{\"cell\": 999999}')\n"
        "try:\n    os.symlink('/workspace/decoy.json', state + '/checkpoint.json')\n"
        "except PermissionError:\n    print('refused')\nelse:\n    print('planted')"
    )
    # the seccomp filter refuses symlinks in the sandbox; plant it from the host
    # to check that the host-side reader refuses it as well (defence in depth)
    assert "refused" in run.stdout, run.stdout
    (state,) = (k.data_dir / "state").glob("*/*/sandbox")  # the session's checkpoints (they outlive a killed kernel)
    (state / "checkpoint.json").unlink(missing_ok=True)
    (state / "checkpoint.json").symlink_to(k.workspace / "decoy.json")
    assert k.kill_sandboxes() >= 1
    run = k.run("print('still serving')")
    assert run.status == "ok" and "still serving" in run.stdout
    assert "No checkpoint existed" in run.stderr


def test_flood_of_output_is_truncated_and_kernel_survives(kernel: SandboxKernelHandle) -> None:
    run = kernel.run(
        "import sys\nchunk = 'y' * (1 << 20)\nfor _ in range(60):\n    sys.stdout.write(chunk)\nprint('end')",
        timeout=120,
    )
    assert run.status == "ok"
    assert len(run.stdout) <= 11 * (1 << 20)
    assert "output truncated" in run.stderr
    assert kernel.run("1 + 1").result["text/plain"] == "2"


def test_html_scripts_and_handlers_are_removed(kernel: SandboxKernelHandle) -> None:
    run = kernel.run(
        "from IPython.display import HTML, Javascript, display\n"
        'display(HTML(\'<b>bold</b><script>fetch("/api/terminals", {method: "POST"})</script><img src=x onerror="alert(1)">\'))\n'
        "display(Javascript('alert(1)'))"
    )
    assert run.status == "ok"
    html = [d["data"]["text/html"] for d in run.of("display_data") if "text/html" in d["data"]]
    assert html and "<b>bold</b>" in html[0]
    assert "<script" not in html[0] and "onerror" not in html[0]
    assert not any("application/javascript" in d["data"] for d in run.of("display_data"))
    assert "JavaScript" in run.stderr or "javascript" in run.stderr
