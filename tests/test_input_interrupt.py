"""A cell waiting in input() that the user interrupts (no input_reply ever
comes) ends with KeyboardInterrupt, keeps the state and leaves the kernel
serving, as in ipykernel; a reply that arrives too late never answers a later
prompt."""

from __future__ import annotations

import time

from kernel_helpers import SandboxKernelHandle, reply_to


def _wait_for_input_request(k: SandboxKernelHandle, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = k.kc.get_stdin_msg(timeout=0.2)
        except Exception:
            continue
        if msg["msg_type"] == "input_request":
            return msg
    raise AssertionError("no input_request")


def test_interrupting_a_prompt_ends_the_cell_and_keeps_the_state(fresh_kernel: SandboxKernelHandle) -> None:
    k = fresh_kernel
    assert k.run("kept = 'earlier state'").status == "ok"
    msg_id = k.kc.execute("partial = 1\nname = input('who? ')\nnever = 1", allow_stdin=True, stop_on_error=False)
    request = _wait_for_input_request(k)
    assert request["content"]["prompt"] == "who? "
    k.km.interrupt_kernel()
    reply = reply_to(k, msg_id, 60)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    # the kernel serves and nothing earlier was lost
    run = k.run("print(kept, partial, 'never' in globals())")
    assert run.stdout.split() == ["earlier", "state", "1", "False"], (run.stdout, run.stderr, run.errors, run.reply)
    # a late reply to the interrupted prompt does not answer the next one
    k.kc.input("late")
    time.sleep(0.5)
    run = k.run("print('got', input('again? '))", allow_stdin=True, stdin_answers=["fresh"])
    assert run.stdout.strip() == "got fresh", (run.stdout, run.stderr, run.errors)


def test_interrupting_getpass_too(fresh_kernel: SandboxKernelHandle) -> None:
    k = fresh_kernel
    msg_id = k.kc.execute("import getpass\nsecret = getpass.getpass('pw: ')", allow_stdin=True, stop_on_error=False)
    request = _wait_for_input_request(k)
    assert request["content"]["password"] is True
    k.km.interrupt_kernel()
    assert reply_to(k, msg_id, 60)["ename"] == "KeyboardInterrupt"
    assert k.run("1 + 1").result["text/plain"] == "2"


def test_client_gone_during_a_prompt_another_client_interrupts(fresh_kernel: SandboxKernelHandle) -> None:
    """The client that opened the prompt disconnects and never answers: a new
    client (a reloaded page) interrupts, and the kernel serves it with the state kept."""
    k = fresh_kernel
    assert k.run("kept = 'earlier'").status == "ok"
    k.kc.execute("name = input('who? ')", allow_stdin=True, stop_on_error=False)
    _wait_for_input_request(k)
    k.kc.stop_channels()  # gone, without a reply
    k.kc = k.km.client()
    k.kc.start_channels()
    k.km.interrupt_kernel()
    k.kc.wait_for_ready(timeout=60)  # answered once the interrupted cell is over; iopub is joined by then
    run = k.run("print(kept, 'name' in globals())")
    assert run.stdout.split() == ["earlier", "False"], (run.stdout, run.stderr, run.reply)


THREAD_ASKS = (
    "import threading, time\n"
    "got = []\n"
    "def ask():\n"
    "    try:\n"
    "        got.append(input('thread? '))\n"
    "    except BaseException as e:\n"
    "        got.append(f'{type(e).__name__}: {e}')\n"
    "t = threading.Thread(target=ask)\n"
    "t.start()\n"
)


def test_a_thread_still_in_input_when_its_cell_ends_gets_an_error(fresh_kernel: SandboxKernelHandle) -> None:
    """ipykernel keeps such a prompt open; here the host answers only while
    the cell runs, so the thread is told, and the process that holds the
    state reads its private pipe alone. Before, the waiting thread read (and
    dropped) the frame that hands the state over: the state's process exited,
    a note said so, and the thread got ChannelClosed."""
    k = fresh_kernel
    assert k.run("kept = 41").status == "ok"
    msg_id = k.kc.execute(THREAD_ASKS + "time.sleep(0.3)", allow_stdin=True)
    assert _wait_for_input_request(k)["content"]["prompt"] == "thread? "
    assert reply_to(k, msg_id, 60)["status"] == "ok"  # the cell ends, the prompt unanswered
    run = k.run("t.join(10)\nprint(kept + 1, t.is_alive(), got)")
    assert run.stdout.startswith("42 False ['StdinNotImplementedError: input() was still waiting when its cell"), (
        run.stdout,
        run.stderr,
    )
    assert run.stderr == "", run.stderr  # no note of a lost holder


def test_a_prompt_without_stdin_names_its_caller(kernel: SandboxKernelHandle) -> None:
    """As ipykernel: ``input()`` and ``getpass`` each say which was called."""
    for code, caller in (("input('x')", "input()"), ("import getpass\ngetpass.getpass()", "getpass")):
        run = kernel.run(code)
        assert run.reply["ename"] == "StdinNotImplementedError"
        assert run.reply["evalue"].startswith(f"{caller} was called, but this frontend does not support input")
