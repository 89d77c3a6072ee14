#include "experts/expert_cache.h"

#include <cstdlib>
#include <stdexcept>

#include "util/common.h"
#include "util/threads.h"

namespace strata {

ExpertCache::ExpertCache(int n_slots, size_t slot_bytes, bool host_memory)
    : n_(n_slots), slot_bytes_(slot_bytes), s_(n_slots) {
  STRATA_CHECK(n_slots >= 1 && slot_bytes % 4096 == 0, "expert cache: bad geometry (", n_slots, " slots of ",
               slot_bytes, " bytes)");
  if (host_memory) {
    mem_ = static_cast<uint8_t*>(std::aligned_alloc(4096, (size_t)n_slots * slot_bytes));
    if (!mem_) fail("expert cache: cannot allocate ", n_slots, " slots of ", slot_bytes, " bytes");
  }
  for (int i = 0; i < n_; i++) lru_push_back(i);
}

ExpertCache::~ExpertCache() { std::free(mem_); }

void ExpertCache::lru_remove(int i) {
  Slot& s = s_[i];
  if (!s.on_lru) return;
  if (s.prev >= 0) s_[s.prev].next = s.next; else head_ = s.next;
  if (s.next >= 0) s_[s.next].prev = s.prev; else tail_ = s.prev;
  s.prev = s.next = -1;
  s.on_lru = false;
  lru_n_--;
}

void ExpertCache::lru_push_back(int i) {
  Slot& s = s_[i];
  s.prev = tail_;
  s.next = -1;
  if (tail_ >= 0) s_[tail_].next = i; else head_ = i;
  tail_ = i;
  s.on_lru = true;
  lru_n_++;
}

void ExpertCache::lru_push_front(int i) {
  Slot& s = s_[i];
  s.prev = -1;
  s.next = head_;
  if (head_ >= 0) s_[head_].prev = i; else tail_ = i;
  head_ = i;
  s.on_lru = true;
  lru_n_++;
}

int ExpertCache::take_victim() {
  const int v = head_;
  if (v < 0) return -1;
  lru_remove(v);
  Slot& s = s_[v];
  if (s.st == Ready) {
    map_.erase(s.key);
    c_.evictions++;
    if (s.prefetched) c_.prefetch_wasted++;
  }
  s.st = Free;
  s.prefetched = false;
  s.err.clear();
  return v;
}

bool ExpertCache::acquire_locked(const uint32_t* keys, int n, Pin* out) {
  // all or nothing: count the slots this request needs against those it can free without using its own
  int missing = 0, own_on_lru = 0;
  for (int i = 0; i < n; i++) {
    auto it = map_.find(keys[i]);
    if (it == map_.end()) missing++;
    else if (s_[it->second].on_lru) own_on_lru++;
  }
  if (missing > lru_n_ - own_on_lru) return false;
  for (int i = 0; i < n; i++) {
    c_.lookups++;
    auto it = map_.find(keys[i]);
    if (it != map_.end()) {
      Slot& s = s_[it->second];
      lru_remove(it->second);
      s.pins++;
      if (s.st == Ready) c_.hits++; else c_.hits_inflight++;
      if (s.prefetched) {
        c_.prefetch_used++;
        s.prefetched = false;
      }
      out[i] = {it->second, false};
    }
  }
  for (int i = 0; i < n; i++) {
    if (map_.count(keys[i])) continue;
    const int v = take_victim();  // cannot fail: counted above
    Slot& s = s_[v];
    s.key = keys[i];
    s.st = Loading;
    s.pins = 1;
    map_[keys[i]] = v;
    c_.misses++;
    out[i] = {v, true};
  }
  return true;
}

bool ExpertCache::try_acquire(const uint32_t* keys, int n, Pin* out) {
  std::lock_guard<std::mutex> lk(mu_);
  return acquire_locked(keys, n, out);
}

void ExpertCache::acquire(const uint32_t* keys, int n, Pin* out) {
  if (n > n_) fail("expert cache: ", n, " experts requested at once but the cache has ", n_, " slots");
  std::unique_lock<std::mutex> lk(mu_);
  // Anything on the way to freeing a slot (a release, a finished load) notifies cv_; n <= slots, and every
  // pin is held only for one layer of one caller, so the wait ends.
  cv_.wait(lk, [&] { return acquire_locked(keys, n, out); });
}

int ExpertCache::try_prefetch(uint32_t key) {
  std::lock_guard<std::mutex> lk(mu_);
  if (map_.count(key)) return -1;
  const int v = take_victim();
  if (v < 0) return -1;
  Slot& s = s_[v];
  s.key = key;
  s.st = Loading;
  s.pins = 0;
  s.prefetched = true;
  map_[key] = v;
  c_.prefetch_issued++;
  return v;
}

void ExpertCache::finish_load(int i, bool ok, const std::string& err) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    Slot& s = s_[i];
    if (ok) {
      s.st = Ready;
      if (s.pins == 0) lru_push_back(i);
    } else {
      c_.load_failures++;
      map_.erase(s.key);
      s.err = err;
      s.prefetched = false;
      if (s.pins == 0) {
        s.st = Free;
        lru_push_front(i);
      } else {
        s.st = Failed;
      }
    }
  }
  cv_.notify_all();
}

void ExpertCache::release(int i) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    Slot& s = s_[i];
    if (s.pins <= 0) fail<std::logic_error>("expert cache: release of unpinned slot ", i);
    if (--s.pins > 0) return;
    if (s.st == Ready) lru_push_back(i);
    else if (s.st == Failed) {
      s.st = Free;
      lru_push_front(i);
    }
    // Loading with no pins: finish_load puts it on the list
  }
  cv_.notify_all();
}

double ExpertCache::wait_some(const int* slots, int n, char* done) {
  std::unique_lock<std::mutex> lk(mu_);
  auto scan = [&] {
    bool any = false;
    for (int i = 0; i < n; i++) {
      done[i] = s_[slots[i]].st != Loading;
      any = any || done[i];
    }
    return any;
  };
  if (scan()) return 0.0;
  Timer t;
  cv_.wait(lk, scan);
  return t.seconds();
}

ExpertCache::State ExpertCache::state(int slot) const {
  std::lock_guard<std::mutex> lk(mu_);
  return s_[slot].st;
}

std::string ExpertCache::error(int slot) const {
  std::lock_guard<std::mutex> lk(mu_);
  return s_[slot].err;
}

void ExpertCache::resident_mask(uint32_t base, int n, uint8_t* mask) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (int e = 0; e < n; e++) mask[e] = map_.count(base + (uint32_t)e) ? 1 : 0;
}

int ExpertCache::lru_size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return lru_n_;
}

CacheCounters ExpertCache::counters() const {
  std::lock_guard<std::mutex> lk(mu_);
  return c_;
}

void ExpertCache::reset_counters() {
  std::lock_guard<std::mutex> lk(mu_);
  c_ = CacheCounters{};
}

void ExpertCache::check_invariants() const {
  std::lock_guard<std::mutex> lk(mu_);
  auto bad = [](auto... a) { fail<std::logic_error>("expert cache invariant: ", a...); };
  int count = 0;
  for (int i = head_, prev = -1; i >= 0; prev = i, i = s_[i].next) {
    if (++count > n_) bad("LRU list has a cycle");
    if (s_[i].prev != prev) bad("LRU back link of slot ", i);
    if (!s_[i].on_lru) bad("slot ", i, " is linked but not marked on the list");
  }
  if (count != lru_n_) bad("LRU size ", lru_n_, " but ", count, " linked");
  for (int i = 0; i < n_; i++) {
    const Slot& s = s_[i];
    if (s.pins < 0) bad("slot ", i, " has ", s.pins, " pins");
    if (s.on_lru && (s.pins > 0 || s.st == Loading || s.st == Failed)) bad("pinned/loading slot ", i, " is evictable");
    if (!s.on_lru && s.pins == 0 && (s.st == Ready || s.st == Free)) bad("unpinned slot ", i, " is not on the LRU list");
    const bool mapped = (s.st == Ready || s.st == Loading);
    auto it = map_.find(s.key);
    if (mapped && (it == map_.end() || it->second != i)) bad("slot ", i, " holds key ", s.key, " but is not mapped");
  }
  for (auto& [k, v] : map_)
    if (s_[v].key != k || (s_[v].st != Ready && s_[v].st != Loading)) bad("key ", k, " maps to slot ", v, " in state ", (int)s_[v].st);
}

}  // namespace strata
