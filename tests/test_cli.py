"""The CLI as a user drives it: prompt from an argument, a file or stdin; --json; a bad option; Ctrl-C keeps what
was produced, prints the stats and exits 130."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

CLI = [sys.executable, "-m", "strata_py.generate"]


GREEDY = ["--temperature", "0", "--draft", "none", "--threads", "2"]  # stated: not GenerationConfig's defaults


def _expected(model, prompt, n):
    """What generate() gives in this process for the CLI's options: the CLI must print exactly this."""
    from strata_py.generate import generate
    text = "".join(generate(model, prompt, max_tokens=n, temperature=0.0, draft="none"))
    assert text  # the comparison would be void with nothing generated
    return text


def test_json_and_stdin(tiny_gguf, tiny_model):
    r = subprocess.run(CLI + ["--model", str(tiny_gguf), "--json", "-n", "6"] + GREEDY, input="hello",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["prompt"] == "hello" and "decode_tok_s" in d["stats"]
    assert d["text"] == _expected(tiny_model, "hello", 6) and 1 <= d["stats"]["generated_tokens"] <= 6


def test_prompt_file(tiny_gguf, tiny_model, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("def f(x):\n")
    r = subprocess.run(CLI + ["--model", str(tiny_gguf), "--file", str(f), "-n", "4"] + GREEDY, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "def f(x):\n" + _expected(tiny_model, "def f(x):\n", 4) + "\n"  # the prompt, the text, a newline


def test_bad_option_is_named(tiny_gguf):
    r = subprocess.run(CLI + ["--model", str(tiny_gguf), "x", "--top-p", "1.5"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "top_p=1.5" in r.stderr


def test_missing_model_is_named(tmp_path):
    r = subprocess.run(CLI + ["--model", str(tmp_path / "nope.gguf"), "x"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "nope.gguf" in r.stderr


def test_ctrl_c_keeps_output():
    # the default model, greedy, writes code without an end-of-text for thousands of tokens
    # a SIGINT that this process ignores (run as a background job of a shell) would be ignored by the child
    # too; a handler here is reset to the default in the child, where Python then raises KeyboardInterrupt
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        p = subprocess.Popen(CLI + ["def main(", "-n", "100000", *GREEDY, "--stats"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        signal.signal(signal.SIGINT, old)
    got = b""
    while len(got) < 200:  # interrupt mid-stream, once text is flowing
        c = p.stdout.read(1)
        if not c:  # the child ended before 200 bytes: say why instead of reading an empty pipe forever
            p.wait(timeout=60)
            raise AssertionError(f"exited {p.returncode} after {got!r}: {p.stderr.read().decode()[-2000:]}")
        got += c
    p.send_signal(signal.SIGINT)
    rest, err = p.communicate(timeout=60)
    out, err = (got + rest).decode(), err.decode()
    assert p.returncode == 130, err[-2000:]
    assert out.startswith("def main(") and len(out) > 200
    assert "interrupted" in err and "Traceback" not in err and "RuntimeWarning" not in err
