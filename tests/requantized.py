"""The shipped default model requantized to another weight type, for the end-to-end tests of that type's products
(tests/test_kquant_model.py, tests/test_act32_model.py): the copy, and its logits against transformers on exactly
the dequantized weights over a held-out snippet (not a test module)."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

from corrupt import copy_field


def requantize(src, out, typ, quantize, accept=lambda shape: True) -> int:
    """A copy of the GGUF src at out with each Q8_0 tensor whose shape `accept`s requantized to the type typ
    (quantize: float rows [n][cols] -> the type's bytes); every field and other tensor as it was. Returns how many
    tensors changed type."""
    QT = gguf.GGMLQuantizationType
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(out), "qwen3next")
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        copy_field(w, name, f)
    n = 0
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        if t.tensor_type == QT.Q8_0 and accept(shape):
            x = gguf.quants.dequantize(np.array(t.data), QT.Q8_0).reshape(-1, shape[-1])
            w.add_tensor(t.name, quantize(x).reshape(*shape[:-1], -1), raw_dtype=typ)
            n += 1
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n


def against_transformers(path, tmp_path) -> tuple[np.ndarray, float]:
    """The engine on the GGUF at path against transformers on its dequantized weights (float32), over the first
    held-out snippet's first 200 tokens: per position ||ours - ref|| / ||ref||, and the fraction of positions whose
    greedy tokens agree."""
    import torch
    from transformers import Qwen3NextForCausalLM

    from strata_py.convert import gguf_to_hf
    from strata_py.model import Model
    ref_model = Qwen3NextForCausalLM.from_pretrained(gguf_to_hf(path, tmp_path / "hf"), dtype=torch.float32).eval()
    model = Model.load(path, threads=2)
    snippets = Path(__file__).resolve().parent.parent / "tools" / "default_model_run" / "heldout_snippets.json"
    ids = model.tokenizer.encode(json.loads(snippets.read_text())[0])[:200]
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
    ours = model.session(n_ctx=256).run(ids)
    rel = np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    return rel, float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
