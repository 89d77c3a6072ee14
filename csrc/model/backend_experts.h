// Routed experts streamed into a bounded cache in backend memory (issue 19: "experts from host memory"), the
// backend forward's counterpart of experts/expert_stream.h. With Model::load's cache_mib on a backend session
// (ExpertOptions::device), cache_mib is the budget of the backend's memory (the GPU's, on CUDA) for routed experts;
// every other weight stays resident there.
//
//   host:    (source Host) every routed expert once, in pinned host memory (Backend::host_alloc), in slot format:
//            expert e of layer l at (l * E + e) * slot_bytes, its gate, up and down bytes at the regions below (a
//            copy of the file's bytes, made at load);
//            (source File) none: a missing expert's three parts are read from the GGUF (pread by io_threads reader
//            threads) into a slot of a pinned staging ring in slot format and copied from there. A staging slot is
//            rewritten only after the copy that read it finished (Backend::mark_uploads / wait_uploads). Needs RAM for
//            the page cache only, where Host needs all the experts' bytes (an 80B Q4_K_M: 44 GiB) pinned.
//   backend: `slots` slots of slot_bytes; gate / up / down of slot s at pool + s * slot_bytes + region[part], so one
//            MatView per part and layer with stride slot_bytes is matmul_sel's W0 over slot numbers
//
// Per layer and window (backend_forward.cpp route_part / host_part / expert_part), as expert_stream.h's steps:
//   1. route every row on the backend; the selection comes back to the host (one small download into pinned memory)
//   2. acquire(): pin the union's slots (ExpertCache, bookkeeping only), copy each missing expert from its source
//      (Backend::upload_async, the copy lane: from the host copy, or from the staging ring once read) and the
//      window's slot numbers, then fence: the expert products that follow wait for those copies only
//   3. prefetch(): layer+1's router on this layer's rows predicts its union; missing experts are copied behind
//      the demand copies, while this layer's products and the next layer's mixer run
//   (a batch's slots become Ready together at its end: a prefetch never evicts what it predicted just before)
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
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
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
  // Whether o.source reads the experts from the file: File, or Auto when the Host copy (L * E slots, plus `also`:
  // other host memory the backend takes, the CPU backend's slot pool) would take more than memory_limit_bytes() less
  // max(8 GiB, a quarter of it). Host whose copy and `also` leave less than 2 GiB of memory_limit_bytes() is refused
  // (std::invalid_argument naming the option, the file and the bytes).
  static bool reads_file(const Model& m, const ExpertOptions& o, uint64_t also = 0);

  // Tests: source File's staging ring in BackendExperts made later has at most this many slots (0: the default, about
  // 64 MiB), so that small models wrap it within one window's reads.
  static void set_staging_cap(int slots);

  // max_rows: the most rows a window hands moe at once (the slot-number staging).
  BackendExperts(Backend& be, const Model& m, const ExpertOptions& o, int max_rows);
  ~BackendExperts();
  BackendExperts(const BackendExperts&) = delete;
  BackendExperts& operator=(const BackendExperts&) = delete;

  size_t slot_bytes() const { return slot_bytes_; }
  bool from_file() const { return fd_ >= 0; }
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
  // Test hook (source File): the next `count` expert reads fail (kind 1: short read, 2: EIO; 0 clears). Never set by
  // the engine itself.
  void inject_fault(int kind, int count) { faults_.inject(kind, count); }

 private:
  uint32_t key(int64_t l, int32_t e) const { return (uint32_t)(l * E_ + e); }
  // Expert e of layer l into backend slot `slot` (the cache made it Loading), Ready at the next finish(), so that a
  // prefetch never evicts the experts it predicted just before and both sources take the same cache decisions: Host
  // issues the copy at once; File queues the read into a staging slot (flush(demand) first when every staging slot
  // is taken).
  void copy_in(int64_t l, int32_t e, int slot, bool demand);
  // File: waits for the queued reads, then issues their copies in order, marking each staging slot. After a read
  // error, abandon(): `demand` throws the first error (naming the file, tensor and expert); a prefetch only counts it.
  void flush(bool demand);
  // flush(demand), then every slot copied since the last finish Ready.
  void finish(bool demand);
  // Waits for the readers, then every slot queued or copied since the last finish Failed (read again when asked).
  void abandon(const std::string& err);
  void read_expert(const IoPool::Task& t);  // (a reader thread) the expert's parts into staging slot t.slot
  std::string what(int64_t l, int32_t e, int part) const;

  struct Queued {
    int64_t l;
    int32_t e;
    int slot, stage;
  };

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
  // source File
  int fd_ = -1;
  std::string path_;
  const Weights* w_ = nullptr;      // the model's: each part's file offset and bytes (the Model outlives its backends)
  uint8_t* staging_ = nullptr;      // [n_stage_] slots (host_alloc)
  int n_stage_ = 0, next_stage_ = 0;
  std::vector<Queued> queued_;      // reads issued, not yet copied
  std::vector<int> copied_;         // slots whose copies were issued, not yet Ready (finish)
  std::unique_ptr<IoPool> io_;
  std::mutex io_mu_;                // io_pending_, io_err_ (the readers')
  std::condition_variable io_cv_;
  int io_pending_ = 0;
  std::string io_err_;
  ReadFaults faults_;
  int max_rows_ = 0;
  std::unique_ptr<ExpertCache> cache_;
  ExpertStats st_;
  int64_t pred_layer_ = -1;     // the layer prefetch() last predicted, and its predicted experts (sorted)
  std::vector<int32_t> pred_;
};

}  // namespace strata
