"""Byte-level BPE tokenizer rebuilt from GGUF metadata (`tokenizer.ggml.*`, spec §4).

The GGUF carries everything a GPT-2-style tokenizer needs: the token strings (byte-level text, a space is
"Ġ"), their types, the merges in rank order and the pre-tokenizer name. We rebuild a `tokenizers.Tokenizer`
from them, so encoding runs in Rust and matches the model's own tokenizer.json token for token.

Accepted `tokenizer.ggml.pre` values:
- `qwen2`  Qwen2/Qwen3/Qwen3-Next: Split on the Qwen2 regex (digits one at a time), then byte-level.
- `qwen35` Qwen3.5/3.6 and Qwen4-Exp: the Qwen2 regex with combining marks (category M) joining letter runs
           (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35), then byte-level.
- `gpt-2`  small byte-level BPE vocabularies (our test models): GPT-2's regex, then byte-level.
Anything else is refused with a ValueError naming it. Unicode normalisation (Qwen's tokenizer.json has NFC)
is not applied: the GGUF does not record it and llama.cpp does not apply it either.

Decoding goes through bytes (`token_bytes`), never through the Rust decoder, so `decode` and `StreamDecoder`
agree exactly and invalid UTF-8 becomes U+FFFD the same way in both.
"""
from __future__ import annotations

import codecs
from functools import lru_cache
from typing import Iterable, Mapping

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

# token types, as llama.cpp's llama_token_type / gguf.TokenType
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# The Qwen2 pre-tokenizer regex exactly as Qwen's tokenizer.json spells it (spec §4).
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's hand-expanded, case-insensitive-free spelling of the same regex.
QWEN2_REGEX_EXPANDED = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
                        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Qwen3.5's: letters and combining marks form one run, and a mark never starts a punctuation run
# (tokenizer.json's spelling; llama.cpp src/llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_QWEN35).
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_REGEX_EXPANDED = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"
                         r"|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

_PRE_REGEX = {"qwen2": QWEN2_REGEX, "qwen35": QWEN35_REGEX, "gpt-2": GPT2_REGEX}

# Token texts that end generation when present in the vocabulary (llama.cpp marks the same ones, spec §2.7).
EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|eot_id|>")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE (a space byte is "Ġ")."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def byte_level_text_to_bytes(text: str) -> bytes:
    """Invert the byte-level encoding of one token's text. Characters outside the 256-entry map (only in
    malformed vocabularies) are kept as their UTF-8 bytes rather than dropped."""
    table = _unicode_to_byte()
    out = bytearray()
    for ch in text:
        b = table.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


def _split_merge(m: str, i: int) -> tuple[str, str]:
    # llama.cpp splits at the first space after position 0 (a byte-level token never holds a raw space,
    # but a merge's left side may itself start with one in hand-made vocabularies).
    k = m.find(" ", 1)
    if k < 0:
        raise ValueError(f"tokenizer.ggml.merges[{i}] = {m!r} has no space separating the pair")
    return m[:k], m[k + 1:]


class Tokenizer:
    """A byte-level BPE tokenizer with the ids of the GGUF it came from.

    Build it with `Tokenizer.from_metadata(md)`. Attributes: `bos_id`, `eos_id`, `pad_id` (int or None),
    `eog_ids` (frozenset of ids that end generation), `n_vocab`, `add_bos` (from `tokenizer.ggml.add_bos_token`),
    `pre` (the pre-tokenizer name), `tokens` and `token_types` (lists, index = id).
    """

    def __init__(self, *, tokens: list[str], token_types: list[int], merges: list[str], pre: str,
                 bos_id: int | None, eos_id: int | None, pad_id: int | None, eot_id: int | None,
                 add_bos: bool):
        if pre not in _PRE_REGEX:
            raise ValueError(f"unsupported tokenizer.ggml.pre {pre!r} (supported: {', '.join(_PRE_REGEX)})")
        if len(token_types) != len(tokens):
            raise ValueError(f"tokenizer.ggml.token_type has {len(token_types)} entries but "
                             f"tokenizer.ggml.tokens has {len(tokens)}")
        n = len(tokens)
        for key, v in (("bos_token_id", bos_id), ("eos_token_id", eos_id), ("padding_token_id", pad_id),
                       ("eot_token_id", eot_id)):
            if v is not None and not (0 <= v < n):
                raise ValueError(f"tokenizer.ggml.{key} = {v} is outside the vocabulary [0, {n})")
        self.tokens = tokens
        self.token_types = token_types
        self.pre = pre
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.add_bos = bool(add_bos)
        self.n_vocab = n

        # BPE vocabulary: every token string -> its first id (llama.cpp keeps the first on duplicates too).
        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)
        pairs = [_split_merge(m, i) for i, m in enumerate(merges)]
        for i, (a, b) in enumerate(pairs):
            if a not in vocab or b not in vocab or (a + b) not in vocab:
                raise ValueError(f"tokenizer.ggml.merges[{i}] = {merges[i]!r} refers to a token not in the vocabulary")
        tk = _HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_PRE_REGEX[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
        tk.decoder = decoders.ByteLevel()
        # Control and user-defined tokens are matched whole in the raw text before pre-tokenisation.
        # AddedVocabulary reuses the id the BPE vocab already gives the same string.
        control = [AddedToken(t, special=True, normalized=False)
                   for t, ty in zip(tokens, token_types) if ty == CONTROL]
        user = [AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, token_types) if ty == USER_DEFINED]
        if control:
            tk.add_special_tokens(control)
        if user:
            tk.add_tokens(user)
        self._tk = tk

        ids = {t: i for i, t in reversed(list(enumerate(tokens)))}
        eog = {eos_id} if eos_id is not None else set()
        eog |= {ids[t] for t in EOG_TEXTS if t in ids}
        if eot_id is not None:
            eog.add(eot_id)
        self.eog_ids: frozenset[int] = frozenset(eog)
        self._bytes: list[bytes | None] = [None] * n

    @classmethod
    def from_metadata(cls, md: Mapping[str, object], max_vocab: int | None = None) -> "Tokenizer":
        """Build from GGUF metadata: a mapping of key -> Python value (str, int, float, bool, list for arrays),
        as `_core.gguf_metadata(path)` returns. Requires `tokenizer.ggml.model = gpt2`, `.pre` in {qwen2, qwen35, gpt-2},
        `.tokens` and `.merges`; `.token_type` defaults to all NORMAL. Each value must have its type; with
        `max_vocab` (the model's token_embd rows), more tokens than that are refused before anything is built."""
        def get(key, kind, default=None, required=False):
            # every value is checked for the type it must have (a hostile file may hold anything under a key);
            # kind is (str | int | bool) or a list of one of them
            full = f"tokenizer.ggml.{key}"
            if full not in md:
                if required:
                    raise ValueError(f"GGUF metadata has no {full}")
                return default
            v = md[full]
            elem = kind[0] if isinstance(kind, list) else None
            ok = (isinstance(v, list) and all(isinstance(x, elem) for x in v)) if elem else isinstance(v, kind)
            if not ok or (kind is int and isinstance(v, bool)):
                want = f"a list of {elem.__name__}" if elem else kind.__name__
                raise ValueError(f"GGUF metadata {full} has the wrong type (expected {want})")
            return v

        model = get("model", str, required=True)
        if model != "gpt2":
            raise ValueError(f"unsupported tokenizer.ggml.model {model!r} (only byte-level BPE 'gpt2')")
        pre = get("pre", str, required=True)
        if pre not in _PRE_REGEX:
            raise ValueError(f"unsupported tokenizer.ggml.pre {pre!r} (supported: {', '.join(_PRE_REGEX)})")
        tokens = get("tokens", [str], required=True)
        if max_vocab is not None and len(tokens) > max_vocab:
            raise ValueError(f"tokenizer.ggml.tokens has {len(tokens)} entries but the model has {max_vocab} "
                             "token embeddings")
        types = get("token_type", [int])
        types = [NORMAL] * len(tokens) if types is None else types
        merges = get("merges", [str], required=True)

        def opt_int(key):
            return get(key, int)

        return cls(tokens=tokens, token_types=types, merges=merges, pre=pre,
                   bos_id=opt_int("bos_token_id"), eos_id=opt_int("eos_token_id"),
                   pad_id=opt_int("padding_token_id"), eot_id=opt_int("eot_token_id"),
                   add_bos=get("add_bos_token", bool, False))

    @property
    def hf_tokenizer(self) -> _HFTokenizer:
        """The underlying `tokenizers.Tokenizer` (for saving as tokenizer.json)."""
        return self._tk

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids for `text`. Control/user-defined token strings in `text` are matched whole.
        With `add_special`, a BOS id is prepended when the GGUF says `add_bos_token = true`."""
        ids = self._tk.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for: byte-level-decoded text for normal tokens, the UTF-8 text for
        control and user-defined tokens, nothing for unused padding entries."""
        if not (0 <= token_id < self.n_vocab):
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.n_vocab})")
        b = self._bytes[token_id]
        if b is None:
            ty = self.token_types[token_id]
            text = self.tokens[token_id]
            if ty in (CONTROL, USER_DEFINED):
                b = text.encode("utf-8")
            elif ty == UNUSED:
                b = b""
            else:
                b = byte_level_text_to_bytes(text)
            self._bytes[token_id] = b
        return b

    def is_control(self, token_id: int) -> bool:
        """True for CONTROL tokens (e.g. `<|im_end|>`)."""
        return self.token_types[token_id] == CONTROL

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text for `ids`; bytes that are not valid UTF-8 become U+FFFD. `skip_special` drops control tokens."""
        data = b"".join(self.token_bytes(i) for i in ids if not (skip_special and self.is_control(i)))
        return data.decode("utf-8", errors="replace")


class StreamDecoder:
    """Turns a stream of token ids into text without ever splitting a multi-byte UTF-8 character.

    `push(id)` returns the text completed by this token (possibly ""), holding back an incomplete trailing
    character; `flush()` returns whatever is held (as U+FFFD if it never completed). The concatenation of
    all returned pieces equals `tokenizer.decode(all_ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Feed one token; return the newly completed text."""
        if self._skip and self._tok.is_control(token_id):
            return ""
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        """End of stream: return held bytes (incomplete ones as U+FFFD) and reset."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out
