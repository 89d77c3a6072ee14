// Routed experts streamed into a bounded cache in backend memory (issue 19: "experts from host memory"), the
// backend forward's counterpart of experts/expert_stream.h. With Model::load's cache_mib on a backend session
// (ExpertOptions::device), cache_mib is the budget of the backend's memory (the GPU's, on CUDA) for routed experts;
// every other weight stays resident there.
//
//   host:    every routed expert once, in pinned host memory (Backend::host_alloc), in slot format: expert e of
//            layer l at (l * E + e) * slot_bytes, its gate, up and down bytes at the regions below (a copy of the
//            file's bytes, made at load)
//   backend: `slots` slots of slot_bytes; gate / up / down of slot s at pool + s * slot_bytes + region[part], so one
//            MatView per part and layer with stride slot_bytes is matmul_sel's W0 over slot numbers
//
// Per layer and window (backend_forward.cpp route_part / host_part / expert_part), as expert_stream.h's steps:
//   1. route every row on the backend; the selection comes back to the host (one small download into pinned memory)
//   2. acquire(): pin the union's slots (ExpertCache, bookkeeping only), copy each missing expert from host memory
//      (Backend::upload_async, the copy lane) and the window's slot numbers, then fence: the expert products that
//      follow wait for those copies only
//   3. prefetch(): layer+1's router on this layer's rows predicts its union; missing experts are copied behind
//      the demand copies, while this layer's products and the next layer's mixer run
//   4. the pins are released (slots stay cached, least recently used first out)
// A window whose union is larger than the cache runs in groups of rows whose union fits (degraded: more copies,
// same output).
//
// Exactness: a slot holds the expert's exact bytes and matmul_sel computes each slot's row as a one-row matmul of
// its expert, so output equals full residency bit for bit at every budget.
// Hazards: a slot is overwritten only by a copy issued after the host saw every kernel that read it finish: the host
// acts on a layer's selection only after a sync that follows the previous layer's expert products, and a group
// after the first waits for the previous group (sync) before it takes slots; prefetches take only unpinned slots,
// while the layer's own are pinned. The slot numbers' staging and the selection buffer are reused only after the
// sync that follows their last use.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "experts/expert_cache.h"
#include "experts/expert_stream.h"

namespace strata {

class Model;
struct HParams;
struct Weights;

class BackendExperts {
 public:
  // Slot geometry of a model: each part's largest expert rounded to kRegion, the slot to 4096.
  static constexpr size_t kRegion = 256;
  static int64_t slot_bytes_for(const Weights& w);
  // Slots for a budget of cache_mib MiB (at most every expert); std::invalid_argument naming the file and the least
  // budget when it is below one row's k experts.
  static int64_t slots_for(const Model& m, int64_t cache_mib);

  // max_rows: the most rows a window hands moe at once (the slot-number staging).
  BackendExperts(Backend& be, const Model& m, const ExpertOptions& o, int max_rows);
  ~BackendExperts();
  BackendExperts(const BackendExperts&) = delete;
  BackendExperts& operator=(const BackendExperts&) = delete;

  size_t slot_bytes() const { return slot_bytes_; }
  int slots() const { return cache_->slots(); }
  bool prefetch_on() const { return opt_.prefetch; }
  // part 0 / 1 / 2 (gate / up / down) of layer l over the slot pool (data: slot 0's part; stride slot_bytes()).
  const MatView& view(int64_t l, int part) const { return views_[(size_t)l * 3 + part]; }

  // Pinned host memory for a window's selection and prediction ([2][max_rows][k]): the download lands there.
  int32_t* selection_buffer() const { return selbuf_; }
  // The end of the group of rows from r0 whose expert union fits the cache (sel: [T][k] host).
  int group_end(const int32_t* sel, int r0, int T, int k) const;

  // The experts of one group pinned for its products (RAII).
  class Pins {
   public:
    // sel[off .. off + n) of the window's selection (host) -> dslot[off .. off + n) (backend): slot numbers, after
    // every missing expert's copy; the copies fenced on the current lane.
    Pins(BackendExperts& x, int64_t layer, const int32_t* sel, int off, int n, int32_t* dslot);
    ~Pins();
    Pins(const Pins&) = delete;
    Pins& operator=(const Pins&) = delete;

   private:
    BackendExperts& x_;
    std::vector<int> held_;
  };
  // Bookkeeping of one layer's window (sel: n host ids): its union and the predictor's score (before prefetch(l + 1));
  // then the groups it ran in.
  void note_window(int64_t l, const int32_t* sel, int n);
  void note_groups(int groups) {
    if (groups > 1) st_.degraded_groups += (uint64_t)groups;
  }
  // Layer l's predicted experts (sel: n host ids, repeats allowed) copied into free or least recently used slots.
  void prefetch(int64_t l, const int32_t* sel, int n);

  ExpertStats stats() const;
  void reset_stats();

 private:
  uint32_t key(int64_t l, int32_t e) const { return (uint32_t)(l * E_ + e); }
  void copy_in(int64_t l, int32_t e, int slot);

  Backend& be_;
  ExpertOptions opt_;
  int64_t L_ = 0, E_ = 0, k_ = 0;
  size_t slot_bytes_ = 0;
  size_t region_[3] = {0, 0, 0};
  std::vector<size_t> copy_bytes_;  // [L]: slot bytes up to the end of the layer's down part (one copy an expert)
  std::vector<MatView> views_;   // [L][3]
  uint8_t* host_ = nullptr;      // [L * E] slots (host_alloc)
  void* pool_ = nullptr;         // [slots] slots (backend memory)
  int32_t* stage_ = nullptr;     // [max_rows * k] slot numbers (host_alloc)
  int32_t* selbuf_ = nullptr;    // [2 * max_rows * k] the selection and the prediction, downloaded (host_alloc)
  int max_rows_ = 0;
  std::unique_ptr<ExpertCache> cache_;
  ExpertStats st_;
  int64_t pred_layer_ = -1;     // the layer prefetch() last predicted, and its predicted experts (sorted)
  std::vector<int32_t> pred_;
};

}  // namespace strata
