"""synth for qwen35moe and qwen4exp (python/strata_py/synth_next.py): the files open with gguf-py, transformers
runs them (through our reverse converter), our converter writes them back byte for byte (so synth and convert
agree on every name, shape, key and value type), and the bench / full sizes and options plan as documented."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from gguf_util import metadata_from_gguf_reader, tensors_by_name  # noqa: F401  (sets sys.path)

from strata_py import convert as cv
from strata_py import ple_constants, synth, synth_next

CASES = [("qwen35moe", True), ("qwen4exp", False)]  # (arch, with an MTP block)


def _read(path):
    r = gguf.GGUFReader(path)
    return tensors_by_name(r), metadata_from_gguf_reader(r), {k: list(f.types) for k, f in r.fields.items()}


@pytest.mark.parametrize("arch,mtp", CASES)
def test_tiny_runs_in_transformers_and_converts_back_identically(tmp_path, arch, mtp):
    from transformers import AutoModelForCausalLM
    src = synth.main(["--arch", arch, "tiny", str(tmp_path / "s.gguf"), "--type", "f32", "--seed", "3",
                      *(["--mtp"] if mtp else [])])
    assert src == 0
    back = cv.gguf_to_hf(tmp_path / "s.gguf", tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 0, 9, 9, 40, 200, 17, 3, 0, 2, 8, 77, 100, 31, 12, 6, 250]])).logits
    assert torch.isfinite(logits).all() and logits.std() > 0
    again = cv.convert(back, tmp_path / "again.gguf", "f32")
    ts_a, md_a, ty_a = _read(tmp_path / "s.gguf")
    ts_b, md_b, ty_b = _read(again)
    assert {k for k in md_a if md_a[k] != md_b.get(k) or ty_a[k] != ty_b.get(k)} == {"general.name"}
    assert set(md_b) == set(md_a)
    assert set(ts_a) == set(ts_b)
    for n, a in ts_a.items():
        b = ts_b[n]
        assert list(a.shape) == list(b.shape) and a.tensor_type == b.tensor_type == QT.F32, n
        x, y = np.asarray(a.data).view(np.int32), np.asarray(b.data).view(np.int32)
        assert np.abs(x.astype(np.int64) - y).max() <= (1 if n.endswith("ssm_a") else 0), n  # exp(log(.)): 1 ulp


@pytest.mark.parametrize("typ", ["q4_k_m", "iq2_xxs", "q8_0"])
def test_tiny_types(tmp_path, typ):
    """Matrices get the type (q4_k_m: Q6_K for output, attn_v, every other ffn_down), rows that are not whole
    blocks fall back to Q8_0 / F16, norms, routers, gates and convs stay F32; every tensor dequantizes finite."""
    p = synth_next.write("qwen4exp", "tiny", tmp_path / "t.gguf", typ, seed=2)
    ts, md, _ = _read(p)
    assert md["general.file_type"] == int(synth.FILE_TYPES[typ])
    main, hi = synth.MIXES[typ] if typ in synth.MIXES else (synth.TYPES[typ],) * 2
    for n, t in ts.items():
        if len(t.shape) == 1 or n.endswith(("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "conv1d.weight")):
            want = QT.F32
        else:
            want = hi if (n == "output.weight" or "attn_v" in n or
                          (n.endswith("ffn_down_exps.weight") and int(n.split(".")[1]) % 2 == 0)) else main
            if int(t.shape[0]) % gguf.GGML_QUANT_SIZES[want][0]:
                want = QT.Q8_0  # per_layer_token_embd: rows of 64
        assert t.tensor_type == want, (n, t.tensor_type.name)
        assert np.isfinite(gguf.quants.dequantize(t.data, t.tensor_type)).all(), n
    assert ts["per_layer_token_embd.weight"].tensor_type == QT.Q8_0


def test_bench_and_full_plans():
    """Sizes as documented, without writing them: bench keeps its PLE table small, full has the real dimensions
    with any expert count and a chosen n-gram vocabulary."""
    def plan(arch, name, typ="q8_0", **kw):
        hp = synth_next.hparams(arch, name, **kw)
        qt, hi = synth.MIXES[typ] if typ in synth.MIXES else (synth.TYPES[typ],) * 2
        outs, ple = synth_next.plan(arch, hp, qt, hi, np.random.default_rng(0), False)
        return hp, {o.name: o for o in outs}, ple

    hp, outs, ple = plan("qwen4exp", "bench")
    assert (hp.n_embd, hp.n_layer, hp.n_expert, hp.budget, hp.ratio, hp.hc) == (1024, 24, 128, 2048, 4, 4)
    t = outs["per_layer_token_embd.weight"]
    assert t.shape == (ple["rows"], 64) and cv._nbytes(t.shape, t.qtype) < 100 * 2**20
    assert sum(ple["head_vocab_sizes"]) <= ple["rows"] < sum(ple["head_vocab_sizes"]) + 128
    hp, outs, ple = plan("qwen4exp", "full", "iq2_xxs", experts=16, ngram_vocab=20_000_000)
    assert (hp.n_vocab, hp.n_embd, hp.n_layer, hp.head_dim, hp.n_expert, hp.nk, hp.nv, hp.hc_rank) == \
        (248320, 2048, 40, 256, 16, 16, 32, 320)
    assert ple["head_vocab_sizes"][:2] == [20_000_003, 20_000_023]  # the real table's first heads (spec 1.7)
    assert outs["per_layer_token_embd.weight"].shape[1] == 128 and outs["blk.0.hc_attn_up.weight"].qtype == QT.Q8_0
    assert outs["blk.7.ffn_up_exps.weight"].shape == (16, 512, 2048)
    assert ple["layer_multipliers"] == ple_constants.layer_multipliers(248320, 3, 0, 1234)
    hp, outs, _ = plan("qwen35moe", "full", experts=512)
    assert (hp.n_expert, hp.n_expert_used, hp.n_layer) == (512, 8, 40) and "output_norm.weight" in outs
    assert sum(hp.recurrent) == 30 and not hp.recurrent[3]


def test_options_refused(tmp_path, capsys):
    for argv, msg in ((["--arch", "qwen35moe", "tiny", "o.gguf", "--ngram-vocab", "10"], "only qwen4exp has a PLE"),
                      (["--arch", "qwen4exp", "tiny", "o.gguf", "--mtp"], "qwen4exp has no MTP"),
                      (["--arch", "qwen4exp", "tiny", "o.gguf", "--experts", "0"], "--experts 0")):
        assert synth.main([*argv[:3], str(tmp_path / argv[3]), *argv[4:]]) == 2
        assert msg in capsys.readouterr().err
        assert not list(tmp_path.iterdir())
    with pytest.raises(SystemExit):
        synth.main(["--arch", "qwen4exp", "stream", str(tmp_path / "o.gguf")])
