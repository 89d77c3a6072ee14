"""Seeds for the fuzzers, from real files: `synth micro` models (qwen3next f32, q8_0, iq4_nl and with an MTP
block; qwen35moe with MTP; qwen4exp with QSA and PLE), the shipped default model, and checkpoints saved by real
sessions of the two micro models in tests/fuzz_corpus/ (qwen3next, qwen4exp).

    python fuzz/make_seeds.py OUT_DIR      (tools/fuzz.sh runs it; deterministic, skips what exists)
    python fuzz/make_seeds.py --refresh-corpus   (from the repository root: the corpus checkpoints, rewritten)

OUT_DIR/gguf/*            GGUF seeds (fuzz_gguf)
OUT_DIR/checkpoint/*      checkpoint seeds of micro.gguf (fuzz_checkpoint)
OUT_DIR/python/*          both, behind the target byte of fuzz_python.py (0: GGUF, 1: checkpoint)
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from strata_py import synth, synth_next
from strata_py.model import Model, default_model_path

# the models checkpoints are read for (tools/fuzz.sh passes them to the harnesses), committed so that the kept
# checkpoint corpus keeps fitting them: synth micro q8_0 seed 1 --mtp, and synth_next qwen4exp micro q8_0 seed 1
CORPUS = Path(__file__).resolve().parents[1] / "tests" / "fuzz_corpus"
BASES = (CORPUS / "micro-base.gguf", CORPUS / "qwen4exp-micro-base.gguf")


def make(out: Path) -> None:
    for d in ("gguf", "checkpoint", "python"):
        (out / d).mkdir(parents=True, exist_ok=True)
    for arch, seed, mtp in (("qwen35moe", 4, True), ("qwen4exp", 5, False)):
        p = out / "gguf" / f"{arch}-micro.gguf"
        if not p.exists():
            synth_next.write(arch, "micro", p, "q8_0", seed=seed, mtp=mtp)
    for typ, seed, mtp in (("f32", 1, False), ("q8_0", 2, True), ("iq4_nl", 3, False)):
        p = out / "gguf" / f"micro-{typ}{'-mtp' if mtp else ''}.gguf"
        if not p.exists():
            synth.write("micro", p, typ, seed=seed, mtp=mtp)
    shipped = out / "gguf" / "default-model.gguf"
    if not shipped.exists() and default_model_path().exists():
        shutil.copy(default_model_path(), shipped)  # libFuzzer reads its first -max_len bytes: the metadata
    for base in BASES:
        m = Model.load(base, threads=1)
        for pos in (0, 3, 17):
            p = out / "checkpoint" / f"{base.stem}-pos{pos}.cp"
            if not p.exists():
                s = m.session(n_ctx=64)
                if pos:
                    s.run([(7 * i + 1) % m.n_vocab for i in range(pos)])
                    s.commit(pos)
                s.save(p)
    for d, tag in (("gguf", 0), ("checkpoint", 1)):
        for p in sorted((out / d).iterdir()):
            q = out / "python" / p.name
            if not q.exists() and p.stat().st_size < (1 << 20):
                q.write_bytes(bytes([tag]) + p.read_bytes())


def refresh_corpus() -> None:
    """Rewrite the regression corpus's checkpoints of the two base models (tests/fuzz_corpus/{checkpoint,python}/
    *-base-pos*.cp) as this build saves them: after a change of the model fingerprint (csrc/model/fingerprint.h)
    or of the file layout they would no longer fit their model. Paths relative to the repository root, so the
    recorded model file is tests/fuzz_corpus/NAME."""
    root = CORPUS.parents[1]
    for base in BASES:
        m = Model.load(base.relative_to(root), threads=1)
        for pos in (0, 3, 17):
            p = CORPUS / "checkpoint" / f"{base.stem}-pos{pos}.cp"
            s = m.session(n_ctx=64)
            if pos:
                s.run([(7 * i + 1) % m.n_vocab for i in range(pos)])
                s.commit(pos)
            s.save(p)
            (CORPUS / "python" / p.name).write_bytes(bytes([1]) + p.read_bytes())


if __name__ == "__main__":
    if sys.argv[1:] == ["--refresh-corpus"]:  # run from the repository root
        refresh_corpus()
        sys.exit(0)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    make(Path(sys.argv[1]))
