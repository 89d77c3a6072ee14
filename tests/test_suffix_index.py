"""The suffix-lookup indexes (csrc/drafting/suffix_index.h) alone, against a brute-force search.

Small alphabets make repeats (and ties) common, so every ranking rule is exercised: longest match, then
the most frequent continuation among equally long matches, then the most recent occurrence."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata_py import _core

BIG = 10**6


def brute(seq, n, max_drafts, max_match=BIG, max_cand=BIG):
    """(match_length, frequency, position, drafts) of the best earlier occurrence of seq's suffix, or None."""
    L = len(seq)
    if L < n + 1:
        return None
    cands = []
    for e in range(L - 2, n - 2, -1):  # most recent first; the key n-gram ends at e
        if seq[e - n + 1:e + 1] != seq[L - n:]:
            continue
        if len(cands) >= max_cand:
            break
        m = 0
        while m < max_match and e - m >= 0 and seq[e - m] == seq[L - 1 - m]:
            m += 1
        cands.append((e, m, seq[e + 1]))
    if not cands:
        return None
    best = max(c[1] for c in cands)
    top = [c for c in cands if c[1] == best]
    freq = {t: sum(1 for c in top if c[2] == t) for _, _, t in top}
    e = max(top, key=lambda c: (freq[c[2]], c[0]))[0]
    return best, freq[seq[e + 1]], e, seq[e + 1:e + 1 + max_drafts]


def got(m):
    return (m.match_length, m.frequency, m.position, list(m.drafts)) if m else None


def brute_global(seqs, query, n, max_drafts, max_match=BIG, max_cand=BIG):
    """Global lookup over held sequences (positions as offsets into their concatenation)."""
    flat, starts = [], []
    for s in seqs:
        starts.append(len(flat))
        flat += s
    cands = []
    Q = len(query)
    if Q < n:
        return None
    for si in range(len(seqs) - 1, -1, -1):
        s, base = seqs[si], starts[si]
        for e in range(len(s) - 2, n - 2, -1):
            if s[e - n + 1:e + 1] != query[Q - n:]:
                continue
            if len(cands) >= max_cand:
                break
            m = 0
            while m < min(max_match, Q) and e - m >= 0 and s[e - m] == query[Q - 1 - m]:
                m += 1
            cands.append((base + e, m, s[e + 1], si, e))
        if len(cands) >= max_cand:
            break
    if not cands:
        return None
    best = max(c[1] for c in cands)
    top = [c for c in cands if c[1] == best]
    freq = {c[2]: sum(1 for d in top if d[2] == c[2]) for c in top}
    w = max(top, key=lambda c: (freq[c[2]], c[0]))
    s, e = seqs[w[3]], w[4]
    return best, freq[w[2]], s[e + 1:e + 1 + max_drafts]


seqs = st.lists(st.integers(0, 3), min_size=0, max_size=80)


@settings(max_examples=300, deadline=None)
@given(seq=seqs, n=st.integers(1, 4), max_drafts=st.integers(0, 8), alphabet=st.integers(1, 4))
def test_lookup_matches_brute_force_at_every_prefix(seq, n, max_drafts, alphabet):
    seq = [t % alphabet for t in seq]
    idx = _core.SuffixIndex(min_match=n, max_match=BIG, max_candidates=BIG)
    for L in range(len(seq) + 1):
        assert got(idx.lookup(max_drafts)) == brute(seq[:L], n, max_drafts), f"prefix {seq[:L]}"
        if L < len(seq):
            idx.append(seq[L])


@settings(max_examples=300, deadline=None)
@given(seq=st.lists(st.integers(0, 2), min_size=1, max_size=80), n=st.integers(1, 3),
       max_match=st.integers(0, 6), max_cand=st.integers(1, 4), max_drafts=st.integers(0, 8))
def test_caps_match_brute_force(seq, n, max_match, max_cand, max_drafts):
    """max_match bounds the backward extension, max_candidates the occurrences visited (most recent)."""
    max_match += n
    idx = _core.SuffixIndex(min_match=n, max_match=max_match, max_candidates=max_cand)
    idx.extend(seq)
    assert got(idx.lookup(max_drafts)) == brute(seq, n, max_drafts, max_match, max_cand)


@settings(max_examples=200, deadline=None)
@given(seq=st.lists(st.integers(0, 3), min_size=0, max_size=120), cuts=st.lists(st.integers(0, 120), max_size=6),
       n=st.integers(1, 5))
def test_incremental_equals_batch(seq, cuts, n):
    batch = _core.SuffixIndex(min_match=n)
    batch.extend(seq)
    inc = _core.SuffixIndex(min_match=n)
    pos = 0
    for c in sorted(min(c, len(seq)) for c in cuts) + [len(seq)]:
        inc.extend(seq[pos:c])
        pos = max(pos, c)
    for t in seq[pos:]:
        inc.append(t)
    assert inc.tokens == batch.tokens == seq
    for d in (0, 1, 7):
        assert got(inc.lookup(d)) == got(batch.lookup(d))


def test_ranking_rules_by_hand():
    # longest match wins even when older: "9 1 2" matches 3 tokens at the first occurrence, 2 at the others
    idx = _core.SuffixIndex(min_match=2)
    idx.extend([9, 1, 2, 5, 0, 1, 2, 6, 0, 1, 2, 6, 9, 1, 2])
    m = idx.lookup(3)
    assert (m.match_length, m.frequency, m.position, list(m.drafts)) == (3, 1, 2, [5, 0, 1])
    # equal lengths: the continuation seen twice (6) beats the more recent one seen once (7)
    idx = _core.SuffixIndex(min_match=2)
    idx.extend([1, 2, 6, 3, 1, 2, 6, 4, 1, 2, 7, 5, 1, 2])
    m = idx.lookup(2)
    assert (m.match_length, m.frequency, list(m.drafts)) == (2, 2, [6, 4])  # the more recent of the two 6's
    # no match shorter than min_match
    idx = _core.SuffixIndex(min_match=4)
    idx.extend([1, 2, 3, 9, 2, 3])
    assert not idx.lookup(4) and idx.lookup(4).match_length == 0 and list(idx.lookup(4).drafts) == []


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="min_match"):
        _core.SuffixIndex(min_match=0)
    with pytest.raises(ValueError, match="max_match"):
        _core.SuffixIndex(min_match=4, max_match=3)
    with pytest.raises(ValueError, match="max_candidates"):
        _core.SuffixIndex(max_candidates=0)
    with pytest.raises(ValueError, match="max_drafts"):
        _core.SuffixIndex().lookup(-1)
    with pytest.raises(ValueError, match="max_drafts"):
        _core.GlobalSuffixIndex(10).lookup([1, 2, 3, 4], -1)


def test_lookup_cost_is_bounded_on_degenerate_input():
    """A run of one token puts every position under one key: a lookup's work (occurrences visited + tokens
    compared, counted by the index) stays within the caps and does not grow with the index."""
    work = {}
    for n in (2_000, 200_000):
        idx = _core.SuffixIndex(min_match=4)
        idx.extend([7] * n)
        m = idx.lookup(7)
        assert m.match_length == idx.max_match and list(m.drafts) == [7]  # the most recent full-length match
        work[n] = m.work
        g = _core.GlobalSuffixIndex(n + 10, min_match=4)
        g.add([7] * n)
        gm = g.lookup([7] * 100, 7)
        assert gm.match_length == idx.max_match and 0 < gm.work <= (idx.max_candidates + 1) * (idx.max_match + 1)
    assert work[2_000] == work[200_000] <= (idx.max_candidates + 1) * (idx.max_match + 1)
    assert work[2_000] >= idx.max_candidates * idx.max_match  # the count is real: every candidate was extended


# ------------------------------------------------------------------------------------------------ global

@settings(max_examples=200, deadline=None)
@given(adds=st.lists(st.lists(st.integers(0, 2), max_size=30), max_size=10), cap=st.integers(0, 60),
       query=st.lists(st.integers(0, 2), max_size=12), n=st.integers(1, 3), max_drafts=st.integers(0, 6))
def test_global_eviction_and_lookup(adds, cap, query, n, max_drafts):
    g = _core.GlobalSuffixIndex(cap, min_match=n, max_match=BIG, max_candidates=BIG)
    held: list[list[int]] = []
    for s in adds:
        s = s[-cap:] if cap else []          # an over-long sequence keeps its last `cap` tokens
        if s:
            while held and sum(map(len, held)) + len(s) > cap:
                held.pop(0)                  # oldest first
            held.append(s)
        g.add(s if s else [])
        assert g.size_tokens <= cap
        assert g.sequences() == held
        assert g.n_sequences == len(held) and g.size_tokens == sum(map(len, held))
    m = g.lookup(query, max_drafts)
    want = brute_global(held, query, n, max_drafts)
    assert ((m.match_length, m.frequency, list(m.drafts)) if m else None) == want


def test_global_capacity_bound_over_many_requests():
    import random
    r = random.Random(0)
    g = _core.GlobalSuffixIndex(5000, min_match=4)
    total = 0
    for _ in range(300):
        s = [r.randrange(50) for _ in range(r.randrange(1, 400))]
        g.add(s)
        total += len(s)
        assert g.size_tokens <= 5000
    assert total > 5000 * 10
    last = [r.randrange(50) for _ in range(100)]
    g.add(last)
    assert g.lookup(last[:-3], 3).drafts == last[-3:]  # the newest sequence is found
    g.clear()
    assert g.size_tokens == 0 and g.n_sequences == 0 and not g.lookup(last[:-3], 3)
