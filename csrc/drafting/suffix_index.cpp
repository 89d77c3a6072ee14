// Suffix lookup: n-gram hash index extended backwards. See suffix_index.h for the ranking rule.
#include "drafting/suffix_index.h"

#include <algorithm>
#include <stdexcept>

#include "util/common.h"

namespace strata {

namespace {

inline uint64_t mix(uint64_t h, int32_t t) {  // splitmix64 step over the running hash and the token
  uint64_t z = h ^ ((uint64_t)(uint32_t)t + 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Hash of the n tokens ending at `end` (inclusive); get(i) reads token i.
template <class Get>
uint64_t gram_hash(const Get& get, int64_t end, int32_t n) {
  uint64_t h = 0x6a09e667f3bcc909ULL;
  for (int64_t i = end - n + 1; i <= end; ++i) h = mix(h, get(i));
  return h;
}

struct Cand {
  int64_t end;    // where the occurrence ends
  int32_t len;    // match length there (capped)
  int32_t next;   // the token that followed it
};

// Index into cands (most recent first) of the best candidate by (length, frequency of next, recency);
// -1 if empty. *freq receives the winner's frequency.
int pick(const std::vector<Cand>& cands, int32_t* freq) {
  int32_t best_len = 0;
  for (const Cand& c : cands) best_len = std::max(best_len, c.len);
  int best = -1;
  int32_t best_f = 0;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (cands[i].len != best_len) continue;
    int32_t f = 0;
    for (const Cand& c : cands) f += (c.len == best_len && c.next == cands[i].next);
    if (f > best_f) {  // strict: the first (most recent) of equally frequent ones stays
      best_f = f;
      best = (int)i;
    }
  }
  *freq = best_f;
  return best;
}

}  // namespace

void SuffixParams::validate() const {
  STRATA_CHECK(min_match >= 1, "suffix index: min_match must be >= 1, got ", min_match);
  STRATA_CHECK(max_match >= min_match, "suffix index: max_match must be >= min_match (", min_match, "), got ",
               max_match);
  STRATA_CHECK(max_candidates >= 1, "suffix index: max_candidates must be >= 1, got ", max_candidates);
}

// ---------------------------------------------------------------------------------------------- request

SuffixIndex::SuffixIndex(const SuffixParams& p) : p_(p) { p_.validate(); }

void SuffixIndex::append(int32_t tok) {
  toks_.push_back(tok);
  const int64_t end = (int64_t)toks_.size() - 1;
  if (end + 1 >= p_.min_match)
    ends_[gram_hash([this](int64_t i) { return toks_[(size_t)i]; }, end, p_.min_match)].push_back(end);
}

void SuffixIndex::extend(const int32_t* toks, size_t n) {
  toks_.reserve(toks_.size() + n);
  for (size_t i = 0; i < n; ++i) append(toks[i]);
}

void SuffixIndex::clear() {
  toks_.clear();
  ends_.clear();
}

SuffixMatch SuffixIndex::lookup(int32_t max_drafts) const {
  STRATA_CHECK(max_drafts >= 0, "suffix lookup: max_drafts must be >= 0, got ", max_drafts);
  SuffixMatch r;
  const int64_t L = (int64_t)toks_.size(), n = p_.min_match;
  if (L < n + 1) return r;
  const int64_t last = L - 1;
  auto get = [this](int64_t i) { return toks_[(size_t)i]; };
  auto it = ends_.find(gram_hash(get, last, (int32_t)n));
  if (it == ends_.end()) return r;
  const std::vector<int64_t>& ends = it->second;
  std::vector<Cand> cands;
  // ends is ascending and its last entry is `last` itself (the current suffix): skip it.
  for (auto e = ends.rbegin(); e != ends.rend() && (int)cands.size() < p_.max_candidates; ++e) {
    ++r.work;
    if (*e >= last) continue;
    int32_t len = 0;
    while (len < p_.max_match && *e - len >= 0 && toks_[(size_t)(*e - len)] == toks_[(size_t)(last - len)]) ++len;
    r.work += len;
    if (len < n) continue;  // hash collision
    cands.push_back({*e, len, toks_[(size_t)(*e + 1)]});
  }
  const int b = pick(cands, &r.frequency);
  if (b < 0) return r;
  r.match_length = cands[b].len;
  r.position = cands[b].end;
  const int64_t stop = std::min<int64_t>(L, r.position + 1 + max_drafts);
  r.drafts.assign(toks_.begin() + (r.position + 1), toks_.begin() + stop);
  return r;
}

// ---------------------------------------------------------------------------------------------- global

GlobalSuffixIndex::GlobalSuffixIndex(size_t capacity_tokens, const SuffixParams& p) : p_(p), cap_(capacity_tokens) {
  p_.validate();
}

size_t GlobalSuffixIndex::size_tokens() const {
  std::lock_guard<std::mutex> g(mu_);
  return toks_.size();
}

size_t GlobalSuffixIndex::n_sequences() const {
  std::lock_guard<std::mutex> g(mu_);
  return seqs_.size();
}

void GlobalSuffixIndex::clear() {
  std::lock_guard<std::mutex> g(mu_);
  base_ += (int64_t)toks_.size();
  toks_.clear();
  seqs_.clear();
  ends_.clear();
}

std::vector<std::vector<int32_t>> GlobalSuffixIndex::sequences() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::vector<int32_t>> out;
  for (const Seq& s : seqs_) {
    std::vector<int32_t> v;
    for (int64_t i = s.start; i < s.end; ++i) v.push_back(at(i));
    out.push_back(std::move(v));
  }
  return out;
}

const GlobalSuffixIndex::Seq& GlobalSuffixIndex::seq_of(int64_t pos) const {
  auto it = std::upper_bound(seqs_.begin(), seqs_.end(), pos, [](int64_t p, const Seq& s) { return p < s.start; });
  return *(it - 1);  // callers pass held positions, so some sequence starts at or before pos
}

void GlobalSuffixIndex::evict_front() {
  const Seq s = seqs_.front();
  auto get = [this](int64_t i) { return at(i); };
  // Positions in each key's list are ascending and this sequence is the oldest, so its ends are the fronts.
  for (int64_t e = s.start + p_.min_match - 1; e < s.end; ++e) {
    auto it = ends_.find(gram_hash(get, e, p_.min_match));
    if (it == ends_.end() || it->second.empty() || it->second.front() != e)
      fail("global suffix index: eviction found an inconsistent key list at position ", e);
    it->second.pop_front();
    if (it->second.empty()) ends_.erase(it);
  }
  for (int64_t i = s.start; i < s.end; ++i) toks_.pop_front();
  base_ = s.end;
  seqs_.pop_front();
}

void GlobalSuffixIndex::add(const int32_t* toks, size_t n) {
  std::lock_guard<std::mutex> g(mu_);
  if (n > cap_) {  // keep the most recent part of an over-long sequence
    toks += n - cap_;
    n = cap_;
  }
  if (n == 0) return;
  while (!seqs_.empty() && toks_.size() + n > cap_) evict_front();
  const int64_t start = base_ + (int64_t)toks_.size();
  for (size_t i = 0; i < n; ++i) toks_.push_back(toks[i]);
  seqs_.push_back({start, start + (int64_t)n});
  auto get = [this](int64_t i) { return at(i); };
  for (int64_t e = start + p_.min_match - 1; e < start + (int64_t)n; ++e)
    ends_[gram_hash(get, e, p_.min_match)].push_back(e);
}

SuffixMatch GlobalSuffixIndex::lookup(const int32_t* query, size_t nq, int32_t max_drafts) const {
  STRATA_CHECK(max_drafts >= 0, "global suffix lookup: max_drafts must be >= 0, got ", max_drafts);
  std::lock_guard<std::mutex> g(mu_);
  SuffixMatch r;
  const int64_t n = p_.min_match, Q = (int64_t)nq;
  if (Q < n) return r;
  auto it = ends_.find(gram_hash([query](int64_t i) { return query[i]; }, Q - 1, (int32_t)n));
  if (it == ends_.end()) return r;
  const int32_t cap_len = (int32_t)std::min<int64_t>(p_.max_match, Q);
  std::vector<Cand> cands;
  for (auto e = it->second.rbegin(); e != it->second.rend() && (int)cands.size() < p_.max_candidates; ++e) {
    ++r.work;
    const Seq& s = seq_of(*e);
    if (*e + 1 >= s.end) continue;  // no continuation inside its sequence
    int32_t len = 0;
    while (len < cap_len && *e - len >= s.start && at(*e - len) == query[Q - 1 - len]) ++len;
    r.work += len;
    if (len < n) continue;  // hash collision
    cands.push_back({*e, len, at(*e + 1)});
  }
  const int b = pick(cands, &r.frequency);
  if (b < 0) return r;
  r.match_length = cands[b].len;
  r.position = cands[b].end;
  const int64_t stop = std::min<int64_t>(seq_of(r.position).end, r.position + 1 + max_drafts);
  for (int64_t i = r.position + 1; i < stop; ++i) r.drafts.push_back(at(i));
  return r;
}

}  // namespace strata
