// The expert cache: a fixed set of equal-size, 4096-aligned slots holding experts (keyed by
// layer * n_expert + expert) read from the model file. Bookkeeping only; expert_stream.h does the reads.
//
// Slot states and the contract that keeps output exact:
//   1. A slot is Free, Loading (a read in flight), Ready, or Failed (its read failed; already unmapped).
//   2. try_acquire() pins every requested key, all or nothing: Ready and Loading keys are pinned where they
//      are; each missing key takes a slot from the LRU list (Free slots first, then the least recently used
//      unpinned Ready slot) and becomes Loading, and the caller must read it. Pinned and Loading slots are
//      never on the LRU list, so they are never evicted. A caller that cannot get every slot holds nothing
//      while it waits, so callers cannot deadlock each other.
//   3. Only finish_load(ok) makes a slot Ready: a half-read slot is never used. A failed read leaves the slot
//      Failed (unmapped: the next acquire reads the key again) with its error for the pinned waiters; it
//      becomes Free when the last of them releases it.
//   4. release() unpins; an unpinned Ready slot goes to the most-recently-used end of the LRU list.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata {

struct CacheCounters {
  uint64_t lookups = 0;        // keys asked for by demand (acquire)
  uint64_t hits = 0;           // ... found Ready
  uint64_t hits_inflight = 0;  // ... found Loading (a prefetch or another caller's read): no new read
  uint64_t misses = 0;         // ... missing: a synchronous read
  uint64_t evictions = 0;      // Ready slots reused for another key
  uint64_t prefetch_issued = 0, prefetch_used = 0, prefetch_wasted = 0;  // wasted: evicted before any use
  uint64_t load_failures = 0;
};

class ExpertCache {
 public:
  enum State : uint8_t { Free, Loading, Ready, Failed };
  struct Pin {
    int slot = -1;
    bool load = false;  // the caller must read the key into the slot and call finish_load
  };

  // host_memory = false: bookkeeping only, for slots that live elsewhere (a GPU's, model/backend_experts.h);
  // data() is then null.
  ExpertCache(int n_slots, size_t slot_bytes, bool host_memory = true);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  int slots() const { return n_; }
  size_t slot_bytes() const { return slot_bytes_; }
  uint8_t* data(int slot) const { return mem_ ? mem_ + (size_t)slot * slot_bytes_ : nullptr; }

  // Pins all n (distinct) keys or none; false when fewer slots can be freed than keys are missing.
  bool try_acquire(const uint32_t* keys, int n, Pin* out);
  // Like try_acquire, but waits (without holding anything) until it succeeds; throws std::runtime_error
  // when it never can (n > slots()).
  void acquire(const uint32_t* keys, int n, Pin* out);
  // Low priority: a Loading slot for a missing key when a Free or unpinned Ready slot exists (unpinned;
  // the caller must read it). -1 when the key is present or nothing can be evicted.
  int try_prefetch(uint32_t key);
  void finish_load(int slot, bool ok, const std::string& err = "");
  void release(int slot);

  // Blocks until at least one of slots[0..n) is not Loading; sets done[i] for every such slot.
  // Returns the seconds spent blocked.
  double wait_some(const int* slots, int n, char* done);
  State state(int slot) const;
  std::string error(int slot) const;
  // mask[e] = 1 when key base+e is Ready or Loading (no new read needed), for e in [0, n).
  void resident_mask(uint32_t base, int n, uint8_t* mask) const;
  int lru_size() const;

  CacheCounters counters() const;
  void reset_counters();
  // Checks the bookkeeping invariants (tests): throws std::logic_error naming the broken one.
  void check_invariants() const;

 private:
  struct Slot {
    uint32_t key = 0;
    State st = Free;
    int pins = 0;
    bool prefetched = false;  // loaded by a prefetch and not used by demand yet
    int prev = -1, next = -1; // LRU list links (only while on the list)
    bool on_lru = false;
    std::string err;
  };
  void lru_remove(int s);
  void lru_push_back(int s);   // most recently used end
  void lru_push_front(int s);  // Free slots: reused first
  int take_victim();           // pops the LRU head, unmapping its key; -1 when empty
  bool acquire_locked(const uint32_t* keys, int n, Pin* out);

  int n_;
  size_t slot_bytes_;
  uint8_t* mem_ = nullptr;
  std::vector<Slot> s_;
  std::unordered_map<uint32_t, int> map_;  // key -> slot (Loading or Ready)
  int head_ = -1, tail_ = -1, lru_n_ = 0;
  CacheCounters c_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // a load finished or a slot was released
};

}  // namespace strata
