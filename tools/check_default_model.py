#!/usr/bin/env python3
"""Check the default model's HF checkpoint on the CPU (issue 5).

1. transformers' Qwen3NextForCausalLM.from_pretrained loads it: no missing or mismatched keys, nothing unexpected
   except the `mtp.*` block (which transformers ignores by design).
2. Its float32 logits equal our own implementation's (tools/train_default_model.py) on held-out snippets,
   relative error <= --tol (default 1e-4).
3. The checkpoint carries the whole MTP block in the official layout, the tokenizer round-trips, ids agree.

Usage: python tools/check_default_model.py [--dir tools/default_model_run] [--tol 1e-4] [--max-tokens 512]
Exit status 0 when every check passes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_default_model as tdm  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_model_run"))
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    import transformers
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(0)
    d = args.dir
    failures, res = [], {"transformers": transformers.__version__, "torch": torch.__version__, "dir": d}

    def check(ok: bool, what: str):
        print(f"  [{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            failures.append(what)

    cfg_hf = json.load(open(os.path.join(d, "config.json")))
    cfg = tdm.ModelConfig.from_hf(cfg_hf)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    eos = tok.token_to_id(tdm.EOS)
    print(f"checkpoint {d}")
    check(cfg_hf["model_type"] == "qwen3_next" and cfg_hf["architectures"] == ["Qwen3NextForCausalLM"],
          "config: model_type qwen3_next / Qwen3NextForCausalLM")
    check(cfg_hf.get("num_nextn_predict_layers") == 1 and cfg_hf.get("mtp_num_hidden_layers") == 1,
          "config: num_nextn_predict_layers = mtp_num_hidden_layers = 1")
    check(eos == cfg_hf["eos_token_id"] and tok.get_vocab_size() == cfg.vocab_size,
          f"tokenizer: eos id {eos} == config eos, vocab {tok.get_vocab_size()} == {cfg.vocab_size}")

    # ---- tensors on disk: official per-expert layout, MTP block present, bf16, shard sizes
    names, shapes, dtypes, shard_sizes = set(), {}, set(), {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            shard_sizes[fn] = os.path.getsize(os.path.join(d, fn))
            with safe_open(os.path.join(d, fn), "pt") as f:
                for n in f.keys():
                    names.add(n)
                    sl = f.get_slice(n)
                    shapes[n] = tuple(sl.get_shape())
                    dtypes.add(sl.get_dtype())
    ref = tdm.to_checkpoint_tensors(tdm.Qwen3NextLM(cfg), torch.bfloat16)
    check(set(ref) == names, f"tensor names: {len(names)} on disk == {len(ref)} expected (per-expert layout)")
    check(all(shapes.get(n) == tuple(t.shape) for n, t in ref.items()), "tensor shapes match the architecture")
    mtp = sorted(n for n in names if n.startswith("mtp."))
    check(len(mtp) > 0 and "mtp.fc.weight" in names and "mtp.layers.0.self_attn.q_proj.weight" in names,
          f"MTP block present ({len(mtp)} mtp.* tensors)")
    check(dtypes == {"BF16"}, f"dtypes {sorted(dtypes)}")
    res["shards"] = shard_sizes
    res["params_total"] = sum(int(torch.tensor(s).prod()) for s in shapes.values())
    print(f"  shards: {', '.join(f'{k} {v / 2**20:.2f} MiB' for k, v in shard_sizes.items())}; "
          f"{res['params_total']:,} parameters")

    # ---- transformers loads it
    hf, info = Qwen3NextForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    hf.eval()
    unexpected = sorted(info["unexpected_keys"])
    check(not info["missing_keys"] and not info["mismatched_keys"],
          f"from_pretrained: missing {sorted(info['missing_keys'])[:3]}, mismatched {info['mismatched_keys']}")
    check(all(u.startswith("mtp.") for u in unexpected), f"from_pretrained: unexpected keys only mtp.* ({len(unexpected)})")
    ours = tdm.load_model_dir(d, "cpu", torch.float32)

    # ---- logits parity on held-out snippets (files of packages the model never saw)
    snippets = json.load(open(os.path.join(d, "heldout_snippets.json")))
    res["snippets"] = []
    for i, s in enumerate(snippets):
        ids = tok.encode(s).ids
        check(tok.decode(ids) == s, f"snippet {i}: tokenizer round-trips {len(s)} chars")
        x = torch.tensor([[eos] + ids[: args.max_tokens - 1]])
        with torch.no_grad():
            a = ours(x)
            b = hf(x).logits
            h, _ = ours.backbone(x)
            draft = ours.lm_head(ours.mtp_hidden(h[:, :-1], x[:, 1:])[0]).argmax(-1)   # predicts x[:, i+2]
        rel = ((a - b).norm() / b.norm()).item()
        agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        greedy = a.argmax(-1)
        acc = (draft[0, :-1] == greedy[0, 1:-1]).float().mean().item()
        nll = torch.nn.functional.cross_entropy(a[0, :-1], x[0, 1:]).item()
        r = {"tokens": x.shape[1], "rel_err": rel, "max_abs": (a - b).abs().max().item(), "argmax_agree": agree,
             "loss_nats": nll, "mtp_accept_teacher_forced": acc}
        res["snippets"].append(r)
        check(rel <= args.tol and agree == 1.0,
              f"snippet {i}: {x.shape[1]} tokens, logits rel err {rel:.2e} (max abs {r['max_abs']:.1e}), argmax "
              f"agreement {agree:.4f}; loss {nll:.3f} nats/token, MTP accept {acc:.3f}")
    res["failures"] = failures
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    print("PASS" if not failures else f"FAIL ({len(failures)}): {failures}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
