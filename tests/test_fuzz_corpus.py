"""The fuzz regression corpus (tests/fuzz_corpus/, docs/FUZZING.md): every crash the fuzzers found and a few
inputs of each campaign's corpus, replayed against this build exactly as each harness feeds them
(fuzz/replay.py), in a subprocess so that a crash names its input. Every input must be loaded or refused with
a ValueError / RuntimeError; the sanitizer run (test_sanitizers.py) replays them under ASan + UBSan too."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fuzz_corpus"


@pytest.mark.parametrize("harness", ["gguf", "checkpoint", "python"])
def test_fuzz_corpus_replays_cleanly(harness):
    inputs = sorted(str(p) for p in (CORPUS / harness).iterdir() if p.is_file())
    assert inputs, f"no regression inputs in {CORPUS / harness}"
    bases = ",".join(str(p) for p in sorted(CORPUS.glob("*-base.gguf")))
    r = subprocess.run([sys.executable, str(ROOT / "fuzz" / "replay.py"), harness, bases, *inputs],
                       capture_output=True, text=True, timeout=600)
    lines = r.stdout.splitlines()
    done = [ln for ln in lines if ln.startswith(("OK ", "REFUSED ", "BUG "))]
    last = next((ln for ln in reversed(lines) if ln.startswith("FILE ")), "")
    assert r.returncode == 0, f"the replay died ({r.returncode}) on {last[5:]}: {r.stderr[-3000:]}"
    bugs = [ln for ln in done if ln.startswith("BUG ")]
    assert not bugs and len(done) == len(inputs), "\n".join(bugs) or r.stdout[-3000:]
    # the kept inputs include files that load and run (coverage past the validation), not only refusals
    if harness != "gguf":
        assert any(ln.startswith("OK ") for ln in done), r.stdout[-2000:]
