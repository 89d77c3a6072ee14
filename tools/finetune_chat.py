#!/usr/bin/env python3
"""Fine-tune the shipped default model to follow instructions (issue 20, item 3). One GPU call does everything:

  1. start   the shipped GGUF (python/strata_py/data/strata-default-q8_0.gguf) back to an HF checkpoint
             (strata_py.convert.gguf_to_hf), loaded into the trainer's model (tools/train_default_model.py)
  2. data    the same corpus walk and held-out split as the trainer (same config and seed); instruction pairs
             mined from the training split with `ast`: a function's docstring (first paragraph) or its leading
             comment as the request and the function's source as the answer; a class's docstring for a class
  3. format  the shipped chat template (strata_py/data/strata-default.jinja, ChatML as plain text):
             <|im_start|>user\\nREQ<|im_end|>\\n<|im_start|>assistant\\nANSWER<|im_end|>\\n then <|endoftext|>;
             the loss covers the answer, its <|im_end|>\\n and the EOS (the request is context only)
  4. train   half of every batch chat windows, half plain code windows of the training split (replay, so the
             held-out bits/byte stays near 0.866); AdamW, short warm-up, cosine, sized to a deadline
  5. eval    held-out bits/byte before and after (the trainer's own held-out set, same cap and order), the answer
             loss on pairs mined from the held-out packages, a few greedy answers
  6. export  bf16 shards + a bundle (config, index, held-out prompts and requests for bench/bench_defaults.py)

Usage (device):  PYTHONUNBUFFERED=1 PYTHONPATH=python python3 tools/finetune_chat.py --out $OUT
CPU check:       python tools/finetune_chat.py --out /tmp/ft --cpu-check   (a few docs, 2 steps, tiny eval)
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import random
import re
import sys
import textwrap
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_default_model as tdm  # noqa: E402

say = tdm.say
USER_OPEN, TURN_END, ASSIST_OPEN = "<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n"

FUNC_TEMPLATES = ["{d}", "Write a Python function: {d}", "Implement this in Python. {d}",
                  "{d}\nWrite it as a Python function.", "Python function wanted: {d}"]
CLASS_TEMPLATES = ["{d}", "Write a Python class: {d}", "Implement this as a Python class. {d}"]
MAX_ANSWER_CHARS = 3000


def chat_prompt(request: str) -> str:
    """The shipped template's rendering of one user message + the generation prompt (tests check it)."""
    return USER_OPEN + request + TURN_END + ASSIST_OPEN


def _first_paragraph(doc: str) -> str:
    para = doc.strip().split("\n\n")[0]
    return re.sub(r"\s+", " ", para).strip()


def _leading_comment(lines: list[str], start: int) -> str:
    """Comment lines directly above line index `start` (0-based), joined."""
    out = []
    i = start - 1
    while i >= 0 and lines[i].strip().startswith("#"):
        out.append(lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(reversed([o for o in out if o]))


def _good_request(r: str) -> bool:
    if not (15 <= len(r) <= 300) or len(r.split()) < 3:
        return False
    if any(w in r.lower() for w in ("todo", "fixme", "copyright", "license", "http://", "https://", ">>>", "noqa")):
        return False
    return sum(c.isalpha() for c in r) >= 0.6 * len(r)


def mine_text(text: str) -> list[tuple[str, str, str, str]]:
    """Pairs (kind, name, request, answer) from one module's source. Functions and methods (dedented) with a
    docstring or a leading comment; classes with a docstring. Answers over MAX_ANSWER_CHARS are skipped."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lines = text.split("\n")
    out = []

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
                src = textwrap.dedent("\n".join(lines[start: node.end_lineno])).rstrip()
                is_class = isinstance(node, ast.ClassDef)
                doc = ast.get_docstring(node, clean=True)
                req = _first_paragraph(doc) if doc else ("" if is_class else _leading_comment(lines, start))
                ok_name = not node.name.startswith(("test", "_"))
                if req and ok_name and _good_request(req) and 40 <= len(src) <= MAX_ANSWER_CHARS \
                        and src.count("\n") >= 2:
                    out.append(("class" if is_class else "function", node.name, req, src))
                if is_class:
                    visit(node.body)
    visit(tree.body)
    return out


def request_text(kind: str, name: str, doc: str) -> str:
    tpl = CLASS_TEMPLATES if kind == "class" else FUNC_TEMPLATES
    h = int(hashlib.sha1((name + doc).encode()).hexdigest()[:8], 16)
    return tpl[h % len(tpl)].format(d=doc)


def mine_docs(docs, workers: int) -> list[tuple[str, str, str, str, str]]:
    """(kind, name, request, answer, pkg) for every doc, deduplicated by answer."""
    texts = [d["text"] for d in docs]
    if workers > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(workers) as pool:
            res = pool.map(mine_text, texts, chunksize=16)
    else:
        res = [mine_text(t) for t in texts]
    seen, pairs = set(), []
    for d, ps in zip(docs, res):
        for kind, name, doc, src in ps:
            h = hashlib.sha1(src.encode()).digest()
            if h in seen:
                continue
            seen.add(h)
            pairs.append((kind, name, request_text(kind, name, doc), src, d["pkg"]))
    return pairs


def encode_chat(tok, pairs, eos_id: int, multi_turn_every: int = 5):
    """Stream [EOS] turn.. [EOS] ... with a 0/1 loss mask (1 on answers, their <|im_end|>\\n and the EOS).
    Every multi_turn_every-th conversation holds two turns, so a request that follows history also trains."""
    users, answers = [], []
    for _, _, req, ans, _ in pairs:
        users.append(USER_OPEN + req + TURN_END + ASSIST_OPEN)
        answers.append(ans + TURN_END)
    enc = getattr(tok, "encode_batch_fast", tok.encode_batch)
    U = [e.ids for e in enc(users, add_special_tokens=False)]
    A = [e.ids for e in enc(answers, add_special_tokens=False)]
    ids, mask = [eos_id], [0]
    for i in range(len(pairs)):
        ids += U[i]
        mask += [0] * len(U[i])
        ids += A[i]
        mask += [1] * len(A[i])
        if multi_turn_every and i % multi_turn_every == 0 and i + 1 < len(pairs):
            continue                                                  # the next pair is this chat's 2nd turn
        ids.append(eos_id)
        mask.append(1)
    return np.array(ids, dtype=np.uint16), np.array(mask, dtype=np.uint8)


def masked_loss(model, x, w, tc):
    """x: [B, L+2] tokens, w: [B, L+2] loss weights (of the target positions). Main + MTP as in training."""
    L = x.shape[1] - 2
    V = model.cfg.vocab_size
    h, aux = model.backbone(x[:, :L])
    lm = F.cross_entropy(model.lm_head(h).float().view(-1, V), x[:, 1:L + 1].reshape(-1), reduction="none")
    w1 = w[:, 1:L + 1].reshape(-1)
    loss_main = (lm * w1).sum() / w1.sum().clamp(min=1)
    hm, aux_m = model.mtp_hidden(h, x[:, 1:L + 1])
    lt = F.cross_entropy(model.lm_head(hm).float().view(-1, V), x[:, 2:L + 2].reshape(-1), reduction="none")
    w2 = w[:, 2:L + 2].reshape(-1)
    loss_mtp = (lt * w2).sum() / w2.sum().clamp(min=1)
    aux = (aux + aux_m) / (model.cfg.num_hidden_layers + model.cfg.mtp_num_hidden_layers)
    return loss_main + tc["mtp_loss_weight"] * loss_mtp + tc["aux_loss_coef"] * aux, loss_main.detach(), \
        loss_mtp.detach()


def finetune(model, chat, chat_w, code, fc, tc, log, seed, device, deadline):
    """Half chat windows (masked), half code windows per batch; cosine schedule sized from the measured rate."""
    L, B = tc["seq_len"], fc["batch_size"]
    Bc = B // 2
    nw_chat = (chat.numel() - 2) // L
    nw_code = (code.numel() - 2) // L
    assert nw_chat >= Bc and nw_code >= B - Bc, f"streams too short: {nw_chat} chat / {nw_code} code windows"
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if (p.ndim >= 2 and "conv1d" not in n) else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=fc["lr"], betas=tuple(tc["betas"]),
                            eps=1e-8, fused=(device.type == "cuda"))
    gen = torch.Generator().manual_seed(seed)
    pc, pk = torch.randperm(nw_chat, generator=gen), torch.randperm(nw_code, generator=gen)
    ic = ik = 0
    ar = torch.arange(L + 2, device=device)
    sched = {"lr": fc["lr"], "min_lr_ratio": fc["min_lr_ratio"], "warmup_steps": fc["warmup_steps"]}
    total, sized, step, t_probe, hist, chat_epochs = fc["max_steps"], False, 0, None, [], 0
    compiled = [m for m in model.modules() if isinstance(m, (tdm.GatedDeltaNet, tdm.SparseMoE, tdm.GatedAttention))]
    if tc.get("compile") and device.type == "cuda":
        for m in compiled:
            m.compile()
    model.train()
    acc = torch.zeros(2, device=device)
    n_acc = 0
    while step < total and tdm.elapsed() < deadline:
        if ic + Bc > nw_chat:
            pc, ic, chat_epochs = torch.randperm(nw_chat, generator=gen), 0, chat_epochs + 1
        if ik + (B - Bc) > nw_code:
            pk, ik = torch.randperm(nw_code, generator=gen), 0
        sc = (pc[ic: ic + Bc] * L).to(device)
        sk = (pk[ik: ik + B - Bc] * L).to(device)
        ic, ik = ic + Bc, ik + B - Bc
        x = torch.cat([chat[sc[:, None] + ar], code[sk[:, None] + ar]]).long()          # [B, L+2]
        w = torch.cat([chat_w[sc[:, None] + ar].float(), torch.ones(B - Bc, L + 2, device=device)])
        for g in opt.param_groups:
            g["lr"] = tdm.lr_at(step, total, sched)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=(device.type == "cuda")):
            loss, lm, lt = masked_loss(model, x, w, tc)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc += torch.stack([lm, lt])
        n_acc += 1
        step += 1
        if not sized and step == 3:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_probe = time.time()
        if not sized and step == fc["rate_probe_steps"] + 3:
            if device.type == "cuda":
                torch.cuda.synchronize()
            sps = fc["rate_probe_steps"] / (time.time() - t_probe)
            total = max(step + 1, min(fc["max_steps"], step + int(0.97 * (deadline - tdm.elapsed()) * sps)))
            sized = True
            log(f"rate probe: {sps:.3f} steps/s; schedule sized to {total} steps")
        if step % tc["log_every"] == 0 or step == total:
            a = (acc / n_acc).tolist()
            rec = {"step": step, "loss": round(a[0], 4), "mtp_loss": round(a[1], 4),
                   "lr": round(opt.param_groups[0]["lr"], 7), "t": round(tdm.elapsed(), 1)}
            hist.append(rec)
            log(json.dumps(rec))
            acc.zero_()
            n_acc = 0
    for m in compiled:
        m._compiled_call_impl = None
    return {"steps": step, "planned_steps": total, "tokens": step * B * L, "chat_windows": nw_chat,
            "code_windows": nw_code, "chat_epochs": chat_epochs + ic / max(1, nw_chat), "history": hist}


@torch.no_grad()
def answer_loss(model, tok, pairs, eos_id, device, n_max=400):
    """Mean loss per answer token (nats) of held-out pairs, each alone: [EOS] prompt answer <|im_end|>\\n."""
    tot, n = 0.0, 0
    for _, _, req, ans, _ in pairs[:n_max]:
        u = tok.encode(chat_prompt(req), add_special_tokens=False).ids
        a = tok.encode(ans + TURN_END, add_special_tokens=False).ids
        ids = torch.tensor([[eos_id] + u + a], device=device)[:, :1024]
        lp = torch.log_softmax(model(ids[:, :-1]).float(), -1)[0]
        tgt = ids[0, 1:]
        k0 = 1 + len(u) - 1                                            # first answer target index
        nll = -lp[torch.arange(len(tgt), device=device), tgt][k0:]
        tot += nll.sum().item()
        n += nll.numel()
    return {"pairs": min(n_max, len(pairs)), "answer_tokens": n, "answer_loss_nats": tot / max(1, n)}


@torch.no_grad()
def greedy_answers(model, tok, pairs, eos_id, device, n=4, new=160):
    out = []
    for _, _, req, _, _ in pairs[:n]:
        ids = torch.tensor([[eos_id] + tok.encode(chat_prompt(req), add_special_tokens=False).ids], device=device)
        seq = tdm.greedy_generate(model, ids, new, eos_id)
        text = tok.decode(seq[0, ids.shape[1]:].tolist())
        out.append({"request": req, "answer": text.split("<|im_end|>")[0]})
    return out


def heldout_material(docs, seed: int, n_prompts: int = 20, n_requests: int = 100):
    """From the held-out packages only: 20 completion prompts (a def line cut after its '(' plus the true function
    as the reference continuation) and instruction requests (mined pairs) for bench/bench_defaults.py."""
    held = sorted((d for d in docs if d["split"] == "heldout_packages"), key=lambda d: (d["pkg"], d["path"]))
    pairs = mine_docs(held, 1)
    rng = random.Random(seed + 20)
    funcs = [p for p in pairs if p[0] == "function" and p[3].startswith("def ")]
    rng.shuffle(funcs)
    prompts, files = [], set()
    for kind, name, req, src, pkg in funcs:
        key = (pkg, name)
        if key in files or len(src) < 300:
            continue
        files.add(key)
        cut = src.index("(") + 1
        prompts.append({"package": pkg, "name": name, "prompt": src[:cut], "reference": src})
        if len(prompts) >= n_prompts:
            break
    reqs = [p for p in pairs if p[0] == "function"]
    rng.shuffle(reqs)
    requests = [{"package": p[4], "name": p[1], "request": p[2]} for p in reqs[:n_requests]]
    return pairs, prompts, requests


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.path.join(HERE, "..", "python", "strata_py", "data",
                                                   "strata-default-q8_0.gguf"))
    ap.add_argument("--run-dir", default=os.path.join(HERE, "default_model_run"), help="tokenizer.json from here")
    ap.add_argument("--config", default=os.path.join(HERE, "default_model.json"))
    ap.add_argument("--out", default=os.environ.get("OUT", "out_finetune"))
    ap.add_argument("--deadline", type=float, default=330.0, help="seconds since start when training stops")
    ap.add_argument("--cpu-check", action="store_true", help="CPU: 300 docs, 2 tiny steps, tiny eval")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = tdm.Log(os.path.join(args.out, "train.log"))
    cfg = json.load(open(args.config))
    seed, dc, tc = cfg["seed"], cfg["data"], cfg["train"]
    fc = {"batch_size": 128, "lr": 4e-4, "min_lr_ratio": 0.1, "warmup_steps": 20, "rate_probe_steps": 20,
          "max_steps": 100000}
    if args.cpu_check:
        tc = dict(tc, seq_len=128, compile=False)
        fc.update(batch_size=4, max_steps=2, rate_probe_steps=100)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    metrics = {"fc": fc, "timings": {}}
    tm = metrics["timings"]

    def save():
        with open(os.path.join(args.out, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)

    # ---- 1. start from the shipped GGUF -------------------------------------------------------------------
    from strata_py.convert import gguf_to_hf
    hf_dir = "/tmp/ft_start_hf"
    gguf_to_hf(args.gguf, hf_dir)
    model = tdm.load_model_dir(hf_dir, device=device)
    model.set_delta(tc["delta_chunk"], tc["delta_solver"])
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.run_dir, "tokenizer.json"))
    eos_id = tok.token_to_id(tdm.EOS)
    tok_bytes = tdm.token_byte_lengths(tok, model.cfg.vocab_size)
    tm["load_s"] = round(tdm.elapsed(), 1)
    log(f"start model from {args.gguf}; eos {eos_id}")

    # ---- 2. data: the trainer's walk and split --------------------------------------------------------------
    docs, manifest, heldout = tdm.walk_corpus(dc, seed)
    want = json.load(open(os.path.join(args.run_dir, "heldout.json")))
    metrics["heldout_packages"] = [e["package"] for e in heldout["packages"]]
    metrics["heldout_same_as_shipped"] = metrics["heldout_packages"] == [e["package"] for e in want["packages"]]
    if args.cpu_check:
        random.Random(seed).shuffle(docs)
        docs = docs[:300] + [d for d in docs if d["split"] == "heldout_packages"][:20]
    train_docs = [d for d in docs if d["split"] == "train"]
    tm["walk_s"] = round(tdm.elapsed(), 1)
    log(f"walk: {len(docs)} docs; held-out {metrics['heldout_packages']} (same as shipped: "
        f"{metrics['heldout_same_as_shipped']})")
    pairs = mine_docs(train_docs, 1 if args.cpu_check else (os.cpu_count() or 2))
    random.Random(seed + 10).shuffle(pairs)
    held_pairs, prompts, requests = heldout_material(docs, seed)
    kinds = {}
    for p in pairs:
        kinds[p[0]] = kinds.get(p[0], 0) + 1
    metrics["pairs"] = {"train": len(pairs), "by_kind": kinds, "heldout": len(held_pairs),
                        "answer_chars_mean": float(np.mean([len(p[3]) for p in pairs])) if pairs else 0,
                        "examples": [{"request": p[2], "answer": p[3][:400]} for p in pairs[:6]]}
    tm["mine_s"] = round(tdm.elapsed(), 1)
    log(f"mined {len(pairs)} training pairs {kinds}, {len(held_pairs)} held-out; prompts {len(prompts)}, "
        f"requests {len(requests)}")
    chat, chat_w = encode_chat(tok, pairs, eos_id)
    code = tdm.encode_docs(tok, [d["text"] for d in train_docs], eos_id)
    metrics["streams"] = {"chat_tokens": int(len(chat)), "chat_loss_tokens": int(chat_w.sum()),
                          "code_tokens": int(len(code))}
    tm["tokenize_s"] = round(tdm.elapsed(), 1)
    log(f"streams: {metrics['streams']}")

    def eval_set(split, cap):                                          # the trainer's eval_set, same order and cap
        ds = sorted((d for d in docs if d["split"] == split), key=lambda d: d["path"])
        random.Random(seed + 3).shuffle(ds)
        parts, n = [np.array([eos_id], np.uint16)], 1
        for d in ds:
            if n >= cap:
                break
            ids = np.array(tok.encode(d["text"], add_special_tokens=False).ids, dtype=np.uint16)
            parts += [ids, np.array([eos_id], np.uint16)]
            n += len(ids) + 1
        return np.concatenate(parts)
    cap = 20000 if args.cpu_check else dc["eval_max_tokens_packages"]
    ev_stream = eval_set("heldout_packages", cap)
    eL = tc["seq_len"]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    ev = metrics.setdefault("eval", {})
    model.eval()
    ev["before_heldout_packages"] = tdm.eval_model(model, ev_stream, tok_bytes, 32, eL, device)
    ev["before_answers"] = answer_loss(model, tok, held_pairs, eos_id, device, 8 if args.cpu_check else 200)
    tm["eval_before_s"] = round(tdm.elapsed(), 1)
    log(f"before: bpb {ev['before_heldout_packages']['bits_per_byte']:.4f}, answers {ev['before_answers']}")
    save()

    # ---- 4. fine-tune ---------------------------------------------------------------------------------------
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    dev = lambda a: torch.from_numpy(a.astype(np.int32)).to(device)    # noqa: E731
    res = finetune(model, dev(chat), dev(chat_w), dev(code), fc, tc, log, seed, device,
                   tdm.elapsed() + 5 if args.cpu_check else args.deadline)
    metrics["train"] = res
    tm["train_end_s"] = round(tdm.elapsed(), 1)
    log(f"fine-tuned {res['steps']} steps, {res['tokens'] / 1e6:.1f}M tokens, {res['chat_epochs']:.2f} chat epochs")

    # ---- 6. export first, then evaluate what ships (bf16 weights, fp32 math) ----------------------------------
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    ex = tdm.export_checkpoint(model, args.out, cfg["export"]["shard_max_bytes"], eos_id)
    tdm.write_bundle(os.path.join(args.out, "bundle.tar.gz"), {
        "config.json": ex["config"], "generation_config.json": ex["generation_config"],
        "model.safetensors.index.json": ex["index"], "heldout_prompts.json": prompts,
        "heldout_requests.json": requests, "finetune_metrics.json": metrics})
    tm["export_s"] = round(tdm.elapsed(), 1)
    save()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    ev["after_heldout_packages"] = tdm.eval_model(model, ev_stream, tok_bytes, 32, eL, device)
    ev["after_answers"] = answer_loss(model, tok, held_pairs, eos_id, device, 8 if args.cpu_check else 200)
    log(f"after: bpb {ev['after_heldout_packages']['bits_per_byte']:.4f}, answers {ev['after_answers']}")
    save()
    ev["samples"] = greedy_answers(model, tok, held_pairs, eos_id, device, 2 if args.cpu_check else 3,
                                   16 if args.cpu_check else 128)
    tm["total_s"] = round(tdm.elapsed(), 1)
    save()
    tdm.write_bundle(os.path.join(args.out, "bundle.tar.gz"), {
        "config.json": ex["config"], "generation_config.json": ex["generation_config"],
        "model.safetensors.index.json": ex["index"], "heldout_prompts.json": prompts,
        "heldout_requests.json": requests, "finetune_metrics.json": metrics})
    log(f"done in {tm['total_s']} s: {sorted(os.listdir(args.out))}")


if __name__ == "__main__":
    main()
