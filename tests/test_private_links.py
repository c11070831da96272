"""Once private, no output of any type carries a followable external URL
(class 6): links are neutralised in HTML, markdown, LaTeX and SVG, and URLs in
text (stream, text/plain, errors, JSON) are defanged so JupyterLab's autolink
does not make links of them. Public sessions keep their links."""

from __future__ import annotations

import re

import pytest
from kernel_helpers import SandboxKernelHandle

from sandbox_kernel.outputs import sanitize_bundle
from sandbox_kernel.outputs.links import defang_json, defang_text

SECRET_URL = "https://evil.example/c?d=ada,42"
#: JupyterLab 4's webLinkRegex (@jupyterlab/rendermime renderers.ts): what it would link in text
LAB_AUTOLINK = re.compile(
    r"(?:[a-zA-Z][a-zA-Z0-9+.-]{2,}://|data:|www\.)[^\s\x00-\x20\x7f-\x9f\"]{2,}[^\s\x00-\x20\x7f-\x9f\"')}\],:;.!?]"
)


@pytest.mark.parametrize(
    "text",
    [
        f"see {SECRET_URL} now",
        "www.evil.example/x?d=1",
        "ftp://evil.example/x",
        "ws://evil.example/socket?d=1",
        "data:text/html,evil<script>x</script>",
        "\x1b[31mhttps://evil.example/x?d=1\x1b[0m",
        "ht\x1b[0mtps://evil.example/split",
        "HTTPS://EVIL.EXAMPLE/UPPER",
        "mailto:someone@evil.example?body=ada,42",
    ],
)
def test_defanged_text_is_not_linked_by_jupyterlab(text: str) -> None:
    out = defang_text(text)
    assert not LAB_AUTOLINK.search(out), out
    assert "evil" in out.lower()  # still readable


def test_defang_is_linear_on_adversarial_text() -> None:
    big = "https://" * 1_000_000 + "www." * 500_000
    out = defang_text(big)
    assert "://" not in out and not LAB_AUTOLINK.search(out[:10_000])


def test_json_values_and_keys_are_defanged_deeply() -> None:
    value = {SECRET_URL: [{"u": SECRET_URL}, 1, None, ["www.evil.example"]]}
    out = defang_json(value)
    assert "://" not in str(out) and "www." not in str(out)
    deep: object = SECRET_URL
    for _ in range(10_000):
        deep = [deep]
    out = defang_json(deep)  # iterative: no RecursionError however deep
    for _ in range(10_000):
        assert isinstance(out, list) and len(out) == 1
        out = out[0]
    assert out == defang_text(SECRET_URL)


@pytest.mark.parametrize(
    ("mime", "value", "must_not"),
    [
        ("text/html", f'<a href="{SECRET_URL}">click</a>', 'href="https://'),
        ("text/html", '<a href="//evil.example/x">click</a>', 'href="//'),
        ("text/html", '<a href="mailto:x@evil.example?body=1">m</a>', "mailto:"),
        ("text/markdown", f"[click]({SECRET_URL})", "](https://"),
        ("text/markdown", f"<{SECRET_URL}>", "https://"),
        ("text/markdown", f"bare {SECRET_URL} url", "https://"),
        ("text/markdown", f"[click][1]\n\n[1]: {SECRET_URL}", "https://"),
        ("text/markdown", "www.evil.example/x", "www.evil"),
        ("text/latex", f"$\\href{{{SECRET_URL}}}{{click}}$", "https://"),
        ("text/latex", f"$\\url{{{SECRET_URL}}}$", "https://"),
        ("text/plain", f"go to {SECRET_URL}", "https://"),
        ("application/json", {"link": SECRET_URL}, "https://"),
        (
            "application/vnd.dataresource+json",
            {"schema": {"fields": [{"name": "u"}]}, "data": [{"u": SECRET_URL}]},
            "https://",
        ),
    ],
)
def test_private_bundles_carry_no_followable_url(mime: str, value: object, must_not: str) -> None:
    private = sanitize_bundle({mime: value}, private=True).data
    assert must_not not in str(private), private
    public = sanitize_bundle({mime: value}, private=False).data
    assert str(public) != str(private) or must_not not in str(value)  # public sessions keep them


def test_private_svg_links_removed() -> None:
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"><a xlink:href="{SECRET_URL}"><text>x</text></a></svg>'
    out = str(sanitize_bundle({"image/svg+xml": svg}, private=True).data)
    assert "evil.example" not in out, out


def test_public_links_unchanged() -> None:
    html = f'<a href="{SECRET_URL}">click</a>'
    assert 'href="https://evil.example' in sanitize_bundle({"text/html": html}).data["text/html"]
    assert sanitize_bundle({"text/plain": SECRET_URL}).data["text/plain"] == SECRET_URL


def test_private_kernel_defangs_streams_errors_and_outputs(fresh_kernel: SandboxKernelHandle) -> None:
    k = fresh_kernel
    public = k.run(f"print({SECRET_URL!r})")
    assert SECRET_URL in public.stdout  # a public session's text is untouched
    k.run("%private patients CONFIDENTIAL")
    run = k.run(
        f"import sys\nprint({SECRET_URL!r})\nprint('www.evil.example', file=sys.stderr)\n"
        f"from IPython.display import display, HTML, Markdown\n"
        f"display(HTML('<a href=\"{SECRET_URL}\">h</a>'), Markdown('[m]({SECRET_URL})'))\n"
        f"{SECRET_URL!r}"
    )
    # what the sandbox sent (the cell's own source, echoed as execute_input, is the user's)
    everything = str([m["content"] for m in run.messages if m["msg_type"] != "execute_input"])
    assert "evil.example" in everything  # readable, not removed
    assert "https://evil" not in everything and "www.evil" not in everything, everything
    err = k.run(f"raise ValueError({SECRET_URL!r})")
    assert err.errors and "https://evil" not in str(err.errors) and "https://evil" not in str(err.reply), err.errors
    # an exception's class name is any string a cell chooses: on iopub and in the reply
    err = k.run(f"raise type({SECRET_URL!r}, (Exception,), {{}})('v')")
    assert err.errors and "evil.example" in err.errors[0]["ename"], err.errors
    assert "https://evil" not in str(err.errors) and "https://evil" not in err.reply["ename"], (err.errors, err.reply)
    # reply fields too: user_expressions and the pager
    run = k.run("1", user_expressions={"u": repr(SECRET_URL)})
    assert "https://evil" not in str(run.reply["user_expressions"])
    # and an input() prompt (JupyterLab shows it as text; other frontends may link it)
    run = k.run(f"print(input({SECRET_URL!r}))", allow_stdin=True, stdin_answers=["typed"])
    prompts = [m["content"]["prompt"] for m in run.messages if m["msg_type"] == "input_request"]
    assert len(prompts) == 1 and "evil.example" in prompts[0] and "https://evil" not in prompts[0], prompts
    assert run.stdout == "typed\n"


def test_policy_notes_quote_no_link_once_private(fresh_kernel: SandboxKernelHandle) -> None:
    """A note says what the policy dropped and names it: a MIME type or a
    metadata key the cell chose, such as ``text/x-https://host/?d=...``.
    Once private it went out as stderr text that JupyterLab links."""
    k = fresh_kernel
    k.run("%private patients CONFIDENTIAL")
    run = k.run(
        "from IPython.display import display\n"
        f"display({{'text/x-{SECRET_URL}': 'a', 'text/plain': 'kept'}}, raw=True)\n"
        "display({'text/x-' + 'www.evil.example/' + 'y' * 100000: 'a', 'text/plain': 'kept'}, raw=True)\n"
        f"display({{'text/plain': 'kept'}}, metadata={{'text/plain': {{'{SECRET_URL}': object}}}}, raw=True)"
    )
    notes = run.stderr
    assert "output dropped" in notes, notes
    assert not LAB_AUTOLINK.search(notes), notes
    assert all(len(line) < 400 for line in notes.splitlines()), [len(line) for line in notes.splitlines()]
