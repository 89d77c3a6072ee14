"""Grammar constraints (JSON Schema, regular expression, Lark) through llguidance, as per-row token masks.

Why llguidance: it is the constraint engine llama.cpp and vLLM ship; it computes a token mask from a
token trie in native code (Rust) in tens of microseconds with no per-grammar precompilation pass, compiles
JSON Schema (nested objects, arrays, enums, numbers, string patterns), regular expressions and Lark
grammars itself, and its matcher rolls back consumed tokens (`rollback(n)`), which is exactly what a
rejected draft needs. xgrammar was the alternative: its masks need a per-grammar compile step that pays
off with large batches, and it has no Lark front end.

GrammarMatcher keeps the processor contract of csrc/sampling/processor.h on the Python side:
  1. Its committed state is the matcher after the committed tokens at positions [origin, position).
  2. window_masks(inputs, pos0): for row i it consumes input i (when pos0 + i >= origin) and writes the
     mask of the state after it into row i. A draft the grammar does not allow (its bit is 0 in the
     previous row's mask) ends the walk: that row and the rows after it get all-ones masks, and they can
     never be kept, because the row before cannot choose the disallowed draft.
  3. commit(keep) rolls back what the window consumed beyond the kept rows.
  4. sync(tokens, origin) rebuilds the committed state from scratch when the session's committed tokens
     are not the ones the matcher consumed (a restored checkpoint, a reused session).
"""
from __future__ import annotations

import json
from typing import Sequence

import numpy as np

_PROTOTYPES = 8
# JSON layout: json.dumps's separators and no free whitespace (free whitespace lets a model pad forever; a
# schema's "x-guidance" object overrides these, e.g. {"whitespace_flexible": true}).
JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # compiled matchers kept per model (keyed by the grammar text)


def _lltokenizer(model):
    """The model's llguidance tokenizer (built once per model): our token bytes, our encoder, our EOG ids."""
    lt = model.__dict__.get("_lltokenizer")
    if lt is None:
        import llguidance

        tok = model.tokenizer

        class _Wrapped:
            def __init__(self):
                self.eos_token_id = min(tok.eog_ids) if tok.eog_ids else 0
                self.bos_token_id = tok.bos_id
                self.tokens = [tok.token_bytes(i) for i in range(tok.n_vocab)]
                self.special_token_ids = [i for i in range(tok.n_vocab) if tok.is_control(i)]

                self.memo: dict = {}

            def __call__(self, text):
                # llguidance tokenizes the bytes a grammar forces (a JSON key and its separator: the same few
                # strings again and again) for every mask there: remembered, as encoding is a pure function
                ids = self.memo.get(text)
                if ids is None:
                    if len(self.memo) >= 4096:
                        self.memo.clear()
                    raw = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
                    ids = self.memo[text] = tok.encode(raw)
                return ids

        lt = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapped()), n_vocab=model.n_vocab,
                                    eos_token=sorted(tok.eog_ids) or [0])
        model._lltokenizer = lt
    return lt


def grammar_text(cfg) -> tuple[str, str] | None:
    """(field name, llguidance grammar) for cfg's constraint, or None when there is none."""
    import llguidance

    if cfg.json_schema is not None:
        try:
            return "json_schema", llguidance.LLMatcher.grammar_from_json_schema(json.dumps(cfg.json_schema),
                                                                                defaults=JSON_DEFAULTS)
        except ValueError as e:
            raise ValueError(f"bad option json_schema: {e}") from None
    if cfg.regex is not None:
        return "regex", llguidance.LLMatcher.grammar_from_regex(cfg.regex)
    if cfg.grammar is not None:
        return "grammar", llguidance.LLMatcher.grammar_from_lark(cfg.grammar)
    return None


class GrammarMatcher:
    """One generation's grammar state and its per-row masks (see the module docstring)."""

    def __init__(self, model, field: str, grammar: str, max_window: int):
        import llguidance

        cache: dict = model.__dict__.setdefault("_grammar_prototypes", {})
        proto = cache.get(grammar)
        if proto is None:
            proto = llguidance.LLMatcher(_lltokenizer(model), grammar, log_level=0)
            if proto.is_error():
                raise ValueError(f"bad option {field}: {proto.get_error()}")
            if len(cache) >= _PROTOTYPES:
                cache.pop(next(iter(cache)))
            cache[grammar] = proto
        self.matcher = proto.deep_copy()
        self.field = field
        self.n_vocab = model.n_vocab
        self.words = (self.n_vocab + 31) // 32
        self._buf = np.empty((max(1, max_window), self.words), dtype=np.uint32)
        self._consumed: list[int] = []   # committed tokens the matcher has consumed (positions origin..)
        self._window = 0                 # tokens consumed by the pending window
        self._took: list[bool] = []      # per row of the pending window: its input went into the matcher
        self.origin = 0
        # fix_rows: rows checked, candidates validated, full masks computed, rows finished again from their trace /
        # under their full mask
        self.checked = self.validated = self.masks = self.repicked = self.full = 0
        self._row = np.empty(self.words, dtype=np.uint32)
        self._vetted = None         # (position, token): the next window's row 0 input, chosen under the grammar
        self._pending_out = None    # fix_rows: (the window's fixed choices, rows walked)
        # once the grammar is complete and an end-of-generation token was consumed, the matcher is stopped:
        # from then on only end-of-generation tokens are allowed, and they change nothing
        self._eog = frozenset(model.tokenizer.eog_ids)
        self._eog_mask = np.zeros(self.words, dtype=np.uint32)
        for t in self._eog:
            if t < self.n_vocab:
                self._eog_mask[t >> 5] |= np.uint32(1 << (t & 31))

    def sync(self, tokens: Sequence[int], origin: int) -> None:
        """Make the committed state that of the committed tokens [origin, len(tokens))."""
        want = list(tokens[origin:]) if origin < len(tokens) else []
        self.origin = origin
        self._window = 0
        self._vetted = None
        self._pending_out = None
        if want == self._consumed:
            return
        m = self.matcher
        m.reset()
        for t in want:
            if m.is_stopped() and t in self._eog:
                continue
            if m.validate_tokens([t]) != 1 or not m.consume_token(t):
                raise ValueError(f"{self.field}: the session's committed output does not satisfy the grammar "
                                 f"(token {t})")
        self._consumed = want

    def window_masks(self, inputs: Sequence[int], pos0: int) -> np.ndarray:
        """uint32 [T, words]: row i = tokens allowed after input i (rows after a disallowed draft: all ones)."""
        T = len(inputs)
        if T > len(self._buf):
            self._buf = np.empty((T, self.words), dtype=np.uint32)
        buf = self._buf[:T]
        m = self.matcher
        base, stride = buf.ctypes.data, self.words * 4
        n = 0
        took = [False] * T
        for i in range(T):
            t = int(inputs[i])
            if pos0 + i >= self.origin:
                if i > 0:
                    ok = (int(buf[i - 1, t >> 5]) >> (t & 31)) & 1
                else:
                    ok = (m.is_stopped() and t in self._eog) or m.validate_tokens([t]) == 1
                if not ok:
                    if i == 0:
                        raise ValueError(f"{self.field}: the window's first token {t} does not satisfy the grammar")
                    buf[i:] = 0xFFFFFFFF
                    break
                if not (m.is_stopped() and t in self._eog):
                    if not m.consume_token(t):
                        raise RuntimeError(f"{self.field}: the grammar matcher refused token {t}: {m.get_error()}")
                    took[i] = True
                    n += 1
            if m.is_stopped():
                buf[i] = self._eog_mask
            else:
                m.unsafe_compute_mask_ptr(base + i * stride, stride)
        self._window = n
        self._took = took
        self._pending_inputs = [int(x) for x in inputs[:T]]
        self._pending_pos0 = pos0
        self._pending_out = None
        return buf

    def fix_rows(self, inputs: Sequence[int], pos0: int, out: list[int], cands: list, complete: list[bool],
                 refinish, repick) -> list[int]:
        """Lazy masks, greedy and sampled: out[i] is row i finished without a mask, cands[i] and complete[i] its
        trace (Session.run_sample_traced; csrc/sampling/sampler.h PickTrace). Under the row's mask:
          1. if the grammar refuses cands[i][0] (the row's best token) or cands[i] is None (too many
             candidates), the row needs its full mask: out[i] = refinish(i, mask);
          2. else if it allows every candidate, out[i] stands (the masked row keeps the same candidates);
          3. else a complete trace gives the masked choice from the candidates' bits alone:
             out[i] = repick(i, bits); an incomplete one (top-k cut them) needs the full mask.
        The grammar's bit of a token is validate_tokens([t]) except where the grammar forces tokens: where the
        forced bytes make one (compute_ff_tokens), llguidance's mask is the first forced token alone
        (compute_mask: "forcing ff_token by mask"; it refuses '"' where '": ' is forced, which validate_tokens
        accepts). Elsewhere the mask is exactly the tokens validate_tokens accepts: without forced bytes
        (compute_mask walks the token trie from the empty prefix, plus end-of-generation when accepting), and
        where forced bytes make no token (the tokenization's tail could still merge with what follows, so it is
        chopped: compute_mask walks the trie from those bytes, allowing the tokens that match them or a prefix
        of them and continue as the grammar allows, which is what validate_tokens checks). One llguidance call
        (compute_ff_tokens, which forces the bytes itself) tells the two apart. tests/test_lazy_masks.py checks
        all three on every token of the vocabulary at real states.
        Greedy rows have cands[i] = [out[i]].
        Walks the rows the acceptance walk can reach (until a row's choice differs from the next input),
        consuming inputs as window_masks does; commit(keep) is the same.
        Inputs are not validated again where that is proven: row i > 0's input is row i - 1's checked choice,
        and row 0's is the last window's kept choice (self._vetted)."""
        T = len(inputs)
        m = self.matcher
        eog = self._eog
        first = self.origin - pos0  # rows before it hold prompt tokens: not consumed
        n = 0
        took = [False] * T
        vetted = self._vetted == (pos0, int(inputs[0]))
        walked = checked = validated = repicked = full = 0
        for i in range(T):
            t = int(inputs[i])
            # (an end-of-generation token at a stopped state changes nothing: is_stopped only asked for those)
            if i >= first and not (t in eog and m.is_stopped()):
                if i == 0 and not vetted and m.validate_tokens([t]) != 1:
                    raise ValueError(f"{self.field}: the window's input {t} at row 0 does not satisfy the grammar")
                if not m.consume_token(t):
                    raise RuntimeError(f"{self.field}: the grammar matcher refused token {t}: {m.get_error()}")
                took[i] = True
                n += 1
            walked = i + 1
            checked += 1
            ids = cands[i]
            if ids is None:  # too many candidates to check one by one
                ok = False
            elif m.is_stopped():
                bits = [x in eog for x in ids]
                ok = bits[0]
            elif ff := m.compute_ff_tokens():  # forced tokens: the mask is the first alone
                f0 = ff[0]
                bits = [x == f0 for x in ids]
                ok = bits[0]
            else:  # the mask is validate_tokens: up to the first refused candidate when the trace is incomplete;
                # only the first when it is refused
                ok = m.validate_tokens([ids[0]]) == 1
                bits = [ok]
                if ok:
                    done = complete[i]
                    for x in ids[1:]:
                        b = m.validate_tokens([x]) == 1
                        bits.append(b)
                        if not b and not done:
                            break
                validated += len(bits)
            if ok and len(bits) > 1 and not all(bits):
                if complete[i]:
                    repicked += 1
                    out[i] = repick(i, bytes(bits))
                else:
                    full += 1
                    out[i] = refinish(i, self._mask())
            elif not ok:  # the best token refused, or the trace cannot decide
                full += 1
                out[i] = refinish(i, self._mask())
            if i + 1 >= T or out[i] != int(inputs[i + 1]):
                break
        self.checked += checked
        self.validated += validated
        self.repicked += repicked
        self.full += full
        self._window = n
        self._took = took
        self._pending_inputs = [int(x) for x in inputs]
        self._pending_pos0 = pos0
        self._pending_out = (out, walked)
        return out

    def _mask(self) -> np.ndarray:
        """The current state's full mask (a buffer reused by every row)."""
        if self.matcher.is_stopped():
            return self._eog_mask
        self.masks += 1
        self.matcher.unsafe_compute_mask_ptr(self._row.ctypes.data, self.words * 4)
        return self._row

    def commit(self, keep: int) -> None:
        """Keep the state after the first `keep` rows of the last window."""
        pos0 = self._pending_pos0
        kept = keep - min(keep, max(0, self.origin - pos0))  # the kept rows at or after the origin
        took_kept = sum(self._took[:keep])
        if self._window > took_kept:
            self.matcher.rollback(self._window - took_kept)
        self._consumed += self._pending_inputs[keep - kept:keep]
        self._window = 0
        po, self._pending_out = self._pending_out, None
        # the kept row's choice, checked by fix_rows, is the next window's input at row 0
        self._vetted = (pos0 + keep, int(po[0][keep - 1])) if po is not None and keep <= po[1] else None
