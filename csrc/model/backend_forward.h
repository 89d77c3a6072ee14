// The Qwen3-Next forward over the backend interface (backend/backend.h), written once for every backend, and the
// session state it keeps in backend memory (issue 19, third milestone).
//
// BackendModel: every weight the forward reads, resident in the backend's memory (uploaded once; the CPU backend
// points at the mapping). The token embedding is the one exception: the window's T rows are dequantized on the
// host from the mapping and uploaded (T x H floats), exactly as the native forward dequantizes them.
// BackendSession: the KV cells, DeltaNet S / S_work / conv history and a verify window's replay inputs, in backend
// memory. run() mirrors Session::run's window modes: T = 1 and prompt windows update committed state in place
// (prompt windows in pieces of kChunk rows, the same values), verify windows run on S_work and save their replay
// inputs; commit(keep) folds the kept rows at once (the eager fold: its state equals the lazy fold's bit for
// bit), swapping S_work in when every row is kept. Logits and hidden rows come back to the host (the sampler,
// steering and drafting run there, unchanged).
//
// Exactness: every operation equals the native CPU forward's (model/qwen3next.cpp, deltanet.cpp, attention.cpp,
// moe.cpp) on the CPU backend bit for bit (tests/test_backend_forward.py), and the CUDA backend's operations
// equal the CPU backend's (tests/test_cuda_*.py), so a GPU session gives the CPU session's logits.
// What runs here: qwen3next and qwen35moe graphs (DeltaNet layouts Current and Split), dense attention; every
// expert resident, or routed experts streamed into a bounded cache of backend memory
// (backend_experts.h); the MTP block; checkpoints. Session refuses the rest by name (qwen4exp, export_state, ...).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "experts/expert_stream.h"

namespace strata {

class Model;
struct SessionOptions;
struct Checkpoint;
struct BackendModel;

// Whether `name` is a backend a session can run on ("cpu" is the native forward, not this file's).
bool is_backend_name(const std::string& name);
// How many recorded steps (CUDA graphs) the backend sessions of this process replayed: tests check that the
// recorded path ran.
int64_t recorded_step_replays();

// The expert-streaming counters (experts/expert_stream.h ExpertStats) of the model's live backend sessions that
// stream experts (backend_experts.h; the first such backend's); false when none is open. reset: zero them instead.
bool backend_expert_stats(const Model* m, ExpertStats* out, bool reset = false);
// Test hook: BackendExperts::inject_fault on the model's live backend sessions that read experts from the file; false
// when none is open.
bool backend_expert_fault(const Model* m, int kind, int count);

// How many backend sessions took over a closed session's buffers and recorded steps (BackendModel::parked).
int64_t adopted_backend_sessions();

// Keeps a model's backend copy alive between sessions (Python's Model holds one per backend its sessions ran on):
// the weights in backend memory, the expert cache, and the last closed session's buffers and recorded steps, so
// the next session of the same n_ctx and max_window (with MTP: one whose buffers have MTP cells) replays what
// earlier requests recorded.
class BackendHold {
 public:
  BackendHold(std::shared_ptr<const Model> model, const std::string& backend);
  ~BackendHold();

 private:
  std::shared_ptr<BackendModel> p_;
};

class BackendSession {
 public:
  // backend: "cuda" (device 0) or "cpu-backend" (this forward over the CPU backend: tests and benches).
  BackendSession(std::shared_ptr<const Model> model, const SessionOptions& opt, const std::string& backend);
  ~BackendSession();
  std::string backend_name() const;
  // T rows at pos0: in_place (T = 1, prompt windows) or a verify window (rows on S_work). logits: [T or 1][n_vocab]
  // (host), hidden [T][H] (host).
  void run(const int32_t* tokens, int T, int64_t pos0, bool in_place, bool last_only, float* logits, float* hidden);
  // The kept rows of the last verify window become DeltaNet history (no-op after an in-place window).
  void commit(int keep);
  void reset();
  // The MTP block (model/mtp.cpp mtp_forward) on the backend, with its own cells (SessionOptions::mtp): host in and
  // out, the native function's values.
  void mtp_forward(const float* hidden, const int32_t* next_tokens, int T, int64_t pos0, float* out_hidden,
                   float* logits_last);
  // Session::mtp_draft's block work on the backend: the block over the n backlog rows at pos0 (hidden [n][H] and the
  // next tokens [n], host), then k - 1 chained steps, each from the block's own last output row and the token it
  // drafted; drafts [k] (host) get each depth's argmax (0 where no logit is above -inf). Each shape is a recorded
  // step where the backend records; the chain stays on the backend where it decodes the embedding table's type
  // (one download of the k drafts). mtp_logits: the k depths' logits of the last mtp_draft, [k][n_vocab] (host).
  void mtp_draft(const float* hidden, const int32_t* next_tokens, int n, int64_t pos0, int k, int32_t* drafts);
  std::vector<float> mtp_logits();
  void mtp_zero(int64_t pos, int64_t n);  // cells [pos, pos + n) back to zeros
  // Checkpoints (Session::checkpoint / restore): the committed state to the host and back, in the CPU session's
  // layouts (state/deltanet_state.h, kv_cache), so a checkpoint moves between backends. save_state fills cp.k / cp.v
  // with cells [0, pos) of each attention layer, cp.S / cp.conv per DeltaNet layer, and with the MTP block's cells
  // [0, mtp_pos) into cp.mtp_k / mtp_v (opt.mtp); load_state writes them back (sizes checked by the caller), the
  // MTP cells past cp.mtp_pos zeroed. No window may be pending (the caller checks).
  void save_state(int64_t pos, int64_t mtp_pos, Checkpoint& cp);
  void load_state(const Checkpoint& cp, bool mtp);
  // Recorded steps (backends that record) that ran cold: recorded (capture and instantiation) at the first sight of
  // their shape and buffers, or unrecorded there when a buffer had to grow first; replays and steps that cannot be
  // recorded do not count.
  int64_t cold_steps() const;

  struct Impl;  // backend_forward.cpp (BackendModel parks a closed session's)

 private:
  std::unique_ptr<Impl> p_;
};

}  // namespace strata
