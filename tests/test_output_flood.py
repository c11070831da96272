"""Output floods never reach the host (class 9): one huge write no longer
kills the sandbox, the output budget is enforced before any expensive host
work (the worker stops sending once the budget is spent), the kernel answers
during a flood, and the earlier state is kept."""

from __future__ import annotations

import time

import psutil
from kernel_helpers import SandboxKernelHandle


def test_one_huge_write_is_cut_and_the_namespace_survives(kernel: SandboxKernelHandle) -> None:
    assert kernel.run("kept = 'earlier state'").status == "ok"
    run = kernel.run("import sys\nsys.stdout.write('x' * 400_000_000)\nsurvived = True", timeout=300)
    assert run.status == "ok", (run.reply, run.stderr[-500:])
    assert len(run.stdout) <= 12 * 1024 * 1024, len(run.stdout)
    assert "truncated" in run.stderr.lower() or "output" in run.stderr.lower(), run.stderr[-500:]
    after = kernel.run("print(kept, survived)")
    assert after.stdout.strip() == "earlier state True", (after.stdout, after.stderr)


def test_many_large_html_outputs_cost_the_host_little(kernel: SandboxKernelHandle) -> None:
    assert kernel.run("kept2 = 2").status == "ok"
    host = psutil.Process(kernel.pid)
    cpu_before = sum(host.cpu_times()[:2])
    run = kernel.run(
        "from IPython.display import display, HTML\n"
        "chunk = '<b>x</b>' * 12_500  # 100 KB\n"
        "for i in range(10_000):\n"
        "    display(HTML(chunk))\n",
        timeout=600,
    )
    cpu = sum(host.cpu_times()[:2]) - cpu_before
    assert run.status == "ok", run.reply
    shown = run.of("display_data")
    assert 0 < len(shown) < 10_000, len(shown)  # the budget cut it
    assert "truncated" in run.stderr.lower() or "output" in run.stderr.lower()
    print(f"host CPU for 10,000 x 100 KB HTML: {cpu:.2f} s, {len(shown)} outputs shown")
    assert kernel.run("print(kept2)").stdout.strip() == "2"


def test_an_endless_flood_can_be_interrupted(kernel: SandboxKernelHandle) -> None:
    assert kernel.run("kept3 = 3").status == "ok"
    msg_id = kernel.kc.execute("while True:\n    print('y' * 10_000)", stop_on_error=False)
    time.sleep(2)
    started = time.monotonic()
    kernel.km.interrupt_kernel()
    while True:
        reply = kernel.kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    assert reply["content"]["status"] == "error", reply["content"]
    assert time.monotonic() - started < 60
    # kernel_info and the next cell are answered, the state is kept
    info = kernel.kc.kernel_info(reply=True, timeout=30)
    assert info["content"]["status"] == "ok"
    assert kernel.run("print(kept3)").stdout.strip() == "3"
