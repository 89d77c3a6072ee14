"""Tokenizer rebuilt from GGUF metadata vs the HF `tokenizers` tokenizer.json it was converted from."""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
from tokenizers import Regex, pre_tokenizers
from tokenizers import Tokenizer as HFTok

from gguf_util import metadata_from_gguf_reader  # noqa: F401  (sets sys.path)
from hf_tiny import make_tiny_hf, tiny_tokenizer_json

from strata_py.convert import convert
from strata_py.tokenizer import QWEN2_REGEX, StreamDecoder, Tokenizer

TEXTS = [
    "",
    "hello world",
    "def f(x):\n    return x ** 2  # square\n",
    "class A(object):\n\tpass\n\n\n\n",
    "   leading spaces and trailing   ",
    "tabs\t\tand\r\nwindows\r\nlines",
    "whitespace runs:      x\n\n   \n\t y",
    "digits 0 12 345 6789 3.14159 1e-9 2024-01-31",
    "I'm sure they'll say it's what we've done, DON'T YOU'LL",
    "unicode: café naïve Ωmega Straße façade",
    "CJK: 日本語のテキスト 中文测试 한국어",
    "emoji: 😀👍🏽 🇫🇷 👨‍👩‍👧‍👦 done",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<think>reasoning</think>answer<|endoftext|>",
    "a<|im_end|>b<|endoftext|><|endoftext|>c",
    "x" * 300,
]


@pytest.fixture(scope="module")
def md(tmp_path_factory):
    """Metadata of a real GGUF written by our converter (vocab padded to 400 to have UNUSED entries)."""
    d = tmp_path_factory.mktemp("hf")
    make_tiny_hf(d, vocab_size=400)
    out = convert(d, d.parent / "tok.gguf", "f32")
    return metadata_from_gguf_reader(out)


@pytest.fixture(scope="module")
def tok(md):
    return Tokenizer.from_metadata(md)


@pytest.fixture(scope="module")
def hf():
    return HFTok.from_str(tiny_tokenizer_json())


def _stdlib_text():
    return (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text(encoding="utf-8")[:20000]


@pytest.mark.parametrize("text", TEXTS + ["__stdlib__"])
def test_encode_decode_match_hf(tok, hf, text):
    if text == "__stdlib__":
        text = _stdlib_text()
    ids = tok.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=False) == text


def test_basic_attributes(tok, md):
    assert tok.n_vocab == 400 == len(md["tokenizer.ggml.tokens"])
    assert tok.bos_id == 0 and tok.eos_id == 381 and tok.pad_id == 0
    assert tok.eog_ids == {0, 381}  # eos <|im_end|> and <|endoftext|>
    assert tok.token_bytes(tok.encode(" ")[0]) == b" "
    assert tok.token_bytes(381) == b"<|im_end|>" and tok.token_bytes(382) == b"<think>"
    assert tok.token_bytes(390) == b""  # [PAD390], UNUSED
    assert tok.decode([5, 381, 6], skip_special=True) == tok.decode([5, 6])
    with pytest.raises(ValueError, match="400"):
        tok.token_bytes(400)


def test_add_bos(md):
    assert Tokenizer.from_metadata(md).encode("hi", add_special=True) == Tokenizer.from_metadata(md).encode("hi")
    t = Tokenizer.from_metadata({**md, "tokenizer.ggml.add_bos_token": True})
    assert t.encode("hi", add_special=True) == [0] + t.encode("hi")
    assert t.encode("hi", add_special=False) == t.encode("hi")


def test_eog_ids_from_names_and_eot(md):
    t = Tokenizer.from_metadata({**md, "tokenizer.ggml.eot_token_id": 380, "tokenizer.ggml.eos_token_id": 5})
    assert t.eog_ids == {5, 380, 381, 0}


def test_refuses_unknown_pre_tokenizer(md):
    with pytest.raises(ValueError, match="llama-bpe"):
        Tokenizer.from_metadata({**md, "tokenizer.ggml.pre": "llama-bpe"})
    with pytest.raises(ValueError, match="'llama'"):
        Tokenizer.from_metadata({**md, "tokenizer.ggml.model": "llama"})
    bad = dict(md)
    del bad["tokenizer.ggml.pre"]
    with pytest.raises(ValueError, match="tokenizer.ggml.pre"):
        Tokenizer.from_metadata(bad)


def test_qwen2_pre_tokenizer_matches_hf(md, hf):
    """pre = qwen2 over the same vocabulary equals an HF tokenizer whose pre_tokenizer is Qwen's own
    Split(regex) + ByteLevel(use_regex=False); digits are split one at a time."""
    ref = HFTok.from_str(tiny_tokenizer_json())
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    t = Tokenizer.from_metadata({**md, "tokenizer.ggml.pre": "qwen2"})
    for text in TEXTS + [_stdlib_text()]:
        assert t.encode(text) == ref.encode(text, add_special_tokens=False).ids, text[:40]
        assert t.decode(t.encode(text)) == text
    digits = t.encode("x 1234567890")
    assert [t.decode([i]) for i in digits[-10:]] == list("1234567890")
    # the two regexes really differ: GPT-2 keeps " 1" and "\n\n   " together, Qwen2 does not
    g = Tokenizer.from_metadata(md)
    for text in ("x 12", "def  f():\n\n    return"):
        assert g.encode(text) != t.encode(text)


def test_stream_decoder_never_splits_utf8(tok):
    for text in ["emoji: 😀👍🏽 🇫🇷 👨‍👩‍👧‍👦", "日本語のテキスト 中文测试", "mixé ñ 😀<|im_end|>漢字"]:
        ids = tok.encode(text)
        assert any(len(tok.token_bytes(i).decode("utf-8", errors="ignore")) == 0 for i in ids), \
            "expected some tokens holding only part of a character"
        sd = StreamDecoder(tok)
        pieces = [sd.push(i) for i in ids]
        pieces.append(sd.flush())
        assert "".join(pieces) == text
        assert all("\ufffd" not in p for p in pieces)
        assert "" in pieces  # a token that completed no character yielded nothing


def test_stream_decoder_incomplete_tail(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1
    sd = StreamDecoder(tok)
    assert "".join(sd.push(i) for i in ids[:-1]) == ""
    assert sd.flush() == "\ufffd"  # the held bytes never completed a character
    assert sd.push(ids[0]) == ""   # flush reset the decoder
    assert "".join(sd.push(i) for i in ids[1:]) + sd.flush() == "😀"
    assert tok.decode(ids[:-1]) == "\ufffd"


def test_stream_decoder_skip_special(tok):
    ids = tok.encode("a<|im_end|>b")
    sd = StreamDecoder(tok, skip_special=True)
    assert "".join(sd.push(i) for i in ids) + sd.flush() == "ab"


def test_converter_detects_qwen2_tokenizer_json(tmp_path):
    """A tokenizer.json with Qwen's pre_tokenizer is written as pre = qwen2 and round-trips."""
    d = tmp_path / "hf"
    make_tiny_hf(d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    (d / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    md = metadata_from_gguf_reader(convert(d, tmp_path / "q.gguf", "f32"))
    assert md["tokenizer.ggml.pre"] == "qwen2"
    hf = HFTok.from_file(str(d / "tokenizer.json"))
    t = Tokenizer.from_metadata(md)
    for text in TEXTS:
        assert t.encode(text) == hf.encode(text, add_special_tokens=False).ids
