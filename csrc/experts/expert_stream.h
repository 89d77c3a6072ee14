// ExpertStream (engine spec 6): with a cache budget below "every expert", routed experts are read on
// demand from their slices of blk.L.ffn_{gate,up,down}_exps by reader threads (pread, optionally
// O_DIRECT) into ExpertCache slots; everything else stays in the mapping. A slot holds the expert's exact
// file bytes (at the same offset modulo 4096 as in the file), so kernels compute bit-identical results.
//
// Per layer and window (moe.cpp):
//   1. route every row; U = the union of chosen experts
//   2. Pins(U): check the file is unchanged, pin what is resident, urgent reads for what is missing
//   3. prefetch(layer): layer+1's router applied to this layer's post-attention normed rows predicts the
//      next union; its missing experts become low-priority reads
//   4. compute the shared expert and the resident experts; then the others as their reads land
//   5. release the pins (the slots stay cached, least recently used first out)
// A union larger than the cache runs in groups of at most `slots` experts (degraded: more reads, same output).
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "experts/expert_cache.h"
#include "experts/io_pool.h"
#include "kernels/matmul.h"

namespace strata {

class GgufFile;
class ThreadPool;
struct HParams;
struct Weights;
struct MoeWeights;

struct ExpertOptions {
  int64_t cache_mib = -1;          // -1: every expert resident (the mapping, no cache); else the slot budget
  // cache_mib is the budget of a backend session's memory (the GPU's: model/backend_experts.h), not a host cache:
  // the Model opens no ExpertStream, and backend='cpu' sessions of it keep every expert in the mapping
  bool device = false;
  // (device) where a backend's missing experts are copied from (model/backend_experts.h): every routed expert once in
  // pinned host memory (Host: the fastest copies, RAM for all of them), or read from the GGUF for each copy by the
  // io_threads readers into a small pinned staging ring (File: RAM for the page cache only); Auto: Host when that
  // copy fits the machine's memory with room to spare (BackendExperts::reads_file), else File
  enum class Source : int { Auto = 0, Host = 1, File = 2 };
  Source source = Source::Auto;
  bool o_direct = false;           // read with O_DIRECT (bypass the page cache; aligned reads)
  int io_threads = 4;              // reader threads
  bool prefetch = true;            // predict layer+1's experts and read them at low priority
  bool prefetch_root_only = false; // only row 0 of a window predicts (drafts may be rejected)
  // Cache-aware routing (MoCE): APPROXIMATE, changes the model's output. Off by default.
  bool approximate = false;
  int protect = -1;                // natural top-j kept for row 0 (-1: n_expert_used / 2)
  float bonus = 0.85f;             // resident experts' probabilities x exp(bonus) for the other slots
  int draft_protect = -1;          // the same for rows > 0 (-1: same as protect)
  float draft_bonus = -1.f;        // (< 0: same as bonus)
};

struct ExpertStats {
  uint64_t slots = 0, slot_bytes = 0, experts_total = 0;
  CacheCounters cache;
  uint64_t bytes_read = 0, experts_read = 0, read_errors = 0;
  uint64_t late_waits = 0;  // waits that blocked a window
  double late_wait_s = 0;
  uint64_t union_sum = 0, union_layers = 0, degraded_groups = 0;
  uint64_t pred_size = 0, pred_hit = 0, pred_actual = 0;  // predictor: |P|, |P & U|, |U|
  uint64_t moce_changed = 0, moce_rows = 0;  // approximate routing: (row, slot) choices that differ
  bool from_file = false;  // (backend streaming) the missing experts are read from the file, not a pinned copy
};

class ExpertStream {
 public:
  // Validates the budget (at least n_expert_used slots: throws std::invalid_argument naming the minimum MiB)
  // and opens the file for reading.
  ExpertStream(const GgufFile& f, const HParams& hp, const Weights& w, const ExpertOptions& o);
  ~ExpertStream();

  const ExpertOptions& options() const { return opt_; }
  ExpertCache& cache() { return *cache_; }
  int layer_of(const MoeWeights* w) const;  // -1: not streamed (the MTP block stays mapped)
  uint32_t key(int layer, int e) const { return (uint32_t)layer * (uint32_t)E_ + (uint32_t)e; }
  // The three matrices of expert e of `layer` in its (Ready) slot.
  void views(int layer, int e, int slot, MatView* gate, MatView* up, MatView* down) const;
  // Throws std::runtime_error when the file changed since load (size, mtime, inode or header bytes).
  void check_file(int layer, int e) const;
  static int64_t slot_bytes_for(const HParams& hp, const Weights& w);

  // The experts of one layer pinned for one window (RAII: released on destruction, also on errors).
  class Pins {
   public:
    Pins(ExpertStream& s, int layer, const int32_t* experts, int n);
    ~Pins();
    int slot(int i) const { return pins_[i].slot; }
    bool ready(int i) const { return ready_[i]; }
    bool pending() const { return n_pending_ > 0; }
    // Blocks until some pending experts are Ready; returns their indices. Throws the read error (naming
    // file, tensor and expert) if one failed.
    std::vector<int> wait();

   private:
    ExpertStream& s_;
    int layer_;
    std::vector<int32_t> experts_;
    std::vector<ExpertCache::Pin> pins_;
    std::vector<char> ready_;
    int n_pending_ = 0;
  };

  // Low-priority reads for layer+1's predicted experts (see step 3); x: [T][H] post-attention normed.
  void prefetch(ThreadPool& pool, int layer, const float* x, int T);
  // Predictor bookkeeping: the actual union of `layer` against what was predicted for it on this thread.
  void score_prediction(int layer, const std::vector<int32_t>& uni);

  void note_union(int n, int groups);
  void note_moce(uint64_t changed, uint64_t rows);
  ExpertStats stats() const;
  void reset_stats();
  // Test hook: the next `count` reads fail (kind 1: short read, 2: EIO). Never set by the engine itself.
  void inject_fault(int kind, int count);

 private:
  struct Part {
    uint64_t file_off = 0;  // of expert 0
    size_t bytes = 0;       // per expert
    MatView view;           // shape/type (data unset)
    std::string tensor;
  };
  void load(const IoPool::Task& t);
  std::string what(int layer, int e, int part) const;
  std::string changed() const;  // "" when the file is as loaded

  ExpertOptions opt_;
  std::string path_;
  uint64_t serial_ = 0;  // unique per stream in this process (the predictor's per-thread record names it)
  int64_t L_ = 0, E_ = 0, k_ = 0, H_ = 0;
  std::vector<const MoeWeights*> layers_;
  std::vector<std::array<Part, 3>> parts_;  // per layer: gate, up, down
  size_t region_[3] = {0, 0, 0};            // byte offset of each part in a slot
  int fd_ = -1, dfd_ = -1;                  // buffered / O_DIRECT
  uint64_t size_ = 0, ino_ = 0, dev_ = 0;
  int64_t mtime_ns_ = 0;
  std::vector<uint8_t> head_;               // sampled header bytes
  std::unique_ptr<ExpertCache> cache_;
  std::unique_ptr<IoPool> io_;
  ReadFaults faults_;
  mutable std::mutex mu_;                   // the counters below
  ExpertStats st_;
};

}  // namespace strata
