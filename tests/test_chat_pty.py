"""`python -m strata_py.chat` driven through a pseudo-terminal: turns reuse the last state, Ctrl-C interrupts a
reply without leaving, /stats, /save, /reset, /load, /quit."""
from __future__ import annotations

import json
import os
import sys

import pytest

import server_util
from server_util import TEMPLATES

pexpect = pytest.importorskip("pexpect")

PROMPT = ">>> "


def test_chat_through_a_pty(tmp_path):
    saved = tmp_path / "conv.json"
    isa = server_util.ISA
    # the end-of-text token banned (--logit-bias): a reply runs until interrupted, whatever the kernels' ISA
    child = pexpect.spawn(sys.executable, ["-m", "strata_py.chat", "--threads", "2", "-n", "3000", "--temperature",
                                           "0", "--logit-bias", "0=-inf", "--chat-template-file",
                                           str(TEMPLATES / "plain.jinja"),
                                           *(["--isa", isa] if isa else [])],
                          env={**os.environ, "TERM": "dumb", "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
                          encoding="utf-8", timeout=120, dimensions=(50, 200))
    try:
        child.expect("strata chat")
        child.expect_exact(PROMPT)
        for turn, text in enumerate(["def parse_args(argv):", "class Config:"]):
            child.sendline(text)
            child.expect_exact(text)                         # the terminal's echo
            # the reply is streaming: any three visible characters after the echo (not words: turn 2's prompt holds
            # turn 1's reply, cut wherever the interrupt landed, and from some cuts the greedy reply is only
            # quote marks, e.g. '"""' lines, which a pattern of words never matched: a 120 s timeout under load)
            child.expect(r"\S{3}")
            child.sendintr()                                 # Ctrl-C: stop this reply, stay in the chat
            child.expect_exact("[interrupted]")
            child.expect_exact(PROMPT)
            child.sendline("/stats")
            child.expect(r"reused from a checkpoint\s*[│|]\s*(\d+)")
            cached = int(child.match.group(1))
            assert (cached > 0) == (turn > 0)               # the second turn reused the first
            child.expect(r"finish\s*[│|]\s*cancelled")
            child.expect_exact(PROMPT)
        child.sendline(f"/save {saved}")
        child.expect("saved 4 messages")
        child.expect_exact(PROMPT)
        child.sendline("/reset")
        child.expect("conversation cleared")
        child.expect_exact(PROMPT)
        child.sendline(f"/load {saved}")
        child.expect(r"loaded 4 messages [\s\S]*?(\d+) tokens of state")
        child.expect_exact(PROMPT)
        child.sendline("/load /nonexistent/file.json")
        child.expect("error")
        child.expect_exact(PROMPT)
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    data = json.loads(saved.read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user", "assistant"]
    assert data["messages"][0]["content"] == "def parse_args(argv):"
    assert saved.with_name(saved.name + ".session").stat().st_size > 0
