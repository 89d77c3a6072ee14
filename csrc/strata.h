// strata: the narrow C++ API.
//
// The engine is the loaded Model (immutable after load, shareable); a Session is one mutable inference
// timeline over it. A session advances by windows (engine spec 2):
//   1. run(tokens[T])    computes all layers for T rows at positions pos0..pos0+T-1 and returns per-row
//                        next-token logits [T, n_vocab]; committed state is untouched except where
//                        noted in each state type's rollback contract.
//   2. sample(params)    (optional, "finish") applies the logit processors per row and picks one token
//                        per row with the position-keyed RNG.
//   3. commit(keep)      makes the first keep rows history; the position advances by keep.
// Exactly one commit per run; run with a commit pending, commit with no run, keep out of 1..T, and a
// partial commit of a prompt window (T > max_window) are errors that leave the session usable.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "experts/expert_stream.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "sampling/processor.h"
#include "sampling/sampler.h"
#include "state/checkpoint_file.h"
#include "state/deltanet_state.h"
#include "state/kv_cache.h"
#include "state/ple_state.h"
#include "state/qsa_state.h"
#include "util/common.h"
#include "util/threads.h"

namespace strata {

struct ModelOptions {
  int threads = 0;       // 0 = default_threads(): physical cores, at most the CPUs this process may use
  std::string mtp_path;  // a separate MTP-only GGUF (llama.cpp --mtp output); overrides a built-in block
  ExpertOptions experts; // cache_mib = -1: every expert resident (mapped); else streamed (experts/expert_stream.h)
  int64_t ple_map_mib = 4096;    // a PLE table larger than this is read by pread instead of through the mapping
  bool dense_attention = false;  // benches only: qwen4exp QSA layers run dense (this changes the model)
};

class PleTable;

class Model {
 public:
  static std::shared_ptr<Model> load(const std::string& path, const ModelOptions& opt = {});
  const HParams& hp() const { return hp_; }
  const Weights& weights() const { return w_; }
  const GgufFile& file() const { return *file_; }
  ThreadPool& pool() const { return *pool_; }
  int threads() const { return pool_->size(); }
  // Identifies the model a checkpoint belongs to: hash of the file size, tensor table, hyperparameters and
  // sampled bytes of every tensor (model/fingerprint.h).
  uint64_t fingerprint() const { return fingerprint_; }
  // The expert cache and its readers; null when every expert is resident. Internally synchronised: the
  // Model stays logically immutable (the cache changes speed, never output, unless routing is approximate).
  ExpertStream* experts() const { return experts_.get(); }
  // The expert options it was loaded with (device: backend sessions stream experts, model/backend_experts.h).
  const ExpertOptions& expert_options() const { return expert_opt_; }
  // Whether backend sessions stream the routed experts through a budget of backend memory (cache_mib with device).
  bool streams_on_backend() const { return expert_opt_.device && expert_opt_.cache_mib != -1; }
  // Throws std::runtime_error naming the file when the model file (or the MTP file) changed or was
  // truncated since load (GgufFile::check_intact); Session::run calls it before and after each forward.
  void check_files() const;
  // The qwen4exp PLE table reader; null without a PLE layer.
  const PleTable* ple_table() const { return ple_.get(); }
  ~Model();

 private:
  std::shared_ptr<GgufFile> file_;
  std::shared_ptr<GgufFile> mtp_file_;
  HParams hp_;
  Weights w_;
  std::unique_ptr<ThreadPool> pool_;
  uint64_t fingerprint_ = 0;
  std::unique_ptr<ExpertStream> experts_;
  ExpertOptions expert_opt_;
  std::unique_ptr<PleTable> ple_;
};

enum class FoldMode { Lazy = 0, Eager = 1, Partial = 2 };

struct SessionOptions {
  int64_t n_ctx = 4096;    // context (KV cells); at most the model's trained context
  int max_window = 8;      // largest verify window; longer runs are prompt windows (commit all)
  bool mtp = false;        // keep the MTP block's inputs so that mtp_draft() can draft
  FoldMode fold = FoldMode::Lazy;
  // Prompt windows run the DeltaNet rows in the chunked form (state/deltanet_chunked.h: within float rounding
  // of serial steps) instead of the serial recurrence (bit-identical to T = 1 steps). Off by default: on the
  // CPUs measured (docs/BENCHMARKS.md, issue 17) the strip-mined recurrence is the faster of the two.
  bool chunked_prefill = false;
  // Where the forward runs (issue 19): "cpu" (the native CPU forward), "cuda" (model/backend_forward.h on the
  // CUDA backend: weights and state on the GPU, device 0) or "cpu-backend" (that forward over the CPU backend:
  // tests and benches). Not "cpu": no MTP, checkpoints, fold="partial", chunked prefill, expert streaming or
  // qwen4exp yet (refused by name).
  std::string backend = "cpu";
};

class BackendSession;

// Committed state at one position, flushed (no pending fold). Restore is bit-identical.
struct Checkpoint {
  uint64_t fingerprint = 0;
  std::string model_file;  // the model file it was taken with (refusals name it; files: section "model.file")
  int64_t n_ctx = 0;
  int64_t position = 0;
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> k, v;      // per attention layer: cells [0, position)
  std::vector<std::vector<float>> S, conv;   // per DeltaNet layer
  std::vector<std::vector<float>> idx_raw, idx_pooled;  // per attention layer (QSA: cells / blocks below position)
  std::vector<float> ple_conv;               // the PLE conv history
  // MTP drafting state (in-memory checkpoints only; it affects speed, never output)
  int64_t mtp_pos = 0;
  std::vector<float> mtp_k, mtp_v, mtp_backlog_h;
  std::vector<int32_t> mtp_backlog_tok;
  // steering (sampling/processor.h): restore() rescans the committed tokens [steer_origin, position)
  int64_t steer_origin = 0;
  // Bytes held (a prefix cache's budget counts these): every array above. A new field goes in here too.
  size_t nbytes() const {
    size_t n = tokens.size() * sizeof(int32_t) + mtp_backlog_tok.size() * sizeof(int32_t);
    for (const auto* vs : {&k, &v, &S, &conv, &idx_raw, &idx_pooled})
      for (const auto& a : *vs) n += a.size() * sizeof(float);
    return n + (ple_conv.size() + mtp_k.size() + mtp_v.size() + mtp_backlog_h.size()) * sizeof(float);
  }
};

class Session {
 public:
  Session(std::shared_ptr<const Model> model, const SessionOptions& opt);
  ~Session();
  // The backend's name ("cpu" for the native forward, "cuda:0 (NVIDIA H200)", ...).
  std::string backend_name() const;
  // Bytes of state a session with these options allocates (checked against RAM before it does).
  static uint64_t state_bytes(const HParams& hp, const SessionOptions& opt);

  int64_t position() const { return pos_; }
  int64_t n_ctx() const { return opt_.n_ctx; }
  const SessionOptions& options() const { return opt_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // committed tokens
  bool pending_commit() const { return last_T_ > 0; }
  int64_t pending_fold() const { return pend_n_; }

  // Runs T rows; returns logits [T, n_vocab] (or [1, n_vocab] for the last row when last_only).
  const float* run(const int32_t* tokens, int T, bool last_only = false);
  int last_T() const { return last_T_; }
  const float* logits() const { return logits_.data(); }
  const float* hidden() const { return hidden_.data(); }  // [T, H] post-final-norm of the last run (every row)
  int64_t logits_rows() const { return last_rows_; }
  int64_t logits_cols() const { return model_->hp().n_vocab; }
  int64_t hidden_cols() const { return model_->hp().n_embd; }
  int64_t hidden_rows() const { return last_hidden_rows_; }
  const Model& model() const { return *model_; }

  // MTP drafting (needs SessionOptions::mtp and a model with an MTP block). After commit(keep), with the
  // new root token: feeds the MTP block every committed row it has not seen (hidden state of row t and the
  // token at t+1), then chains k drafts, each from the block's own output hidden state. The MTP KV cache
  // rolls back by counter: only cells of committed rows persist; chain cells are scratch.
  // max_backlog >= 1: a backlog longer than that (no draft for a while) is cut to its last max_backlog rows
  // first, the older ones left as empty history (drafts only; output never depends on them).
  std::vector<int32_t> mtp_draft(int32_t root, int k, int64_t max_backlog = -1);
  // The prompt's share of that work, at prefill: feeds the MTP block every committed row whose next token
  // is known (all but the last; mtp_draft feeds that one with its root), without drafting.
  void mtp_prefill();
  int64_t mtp_position() const { return mtp_pos_; }
  // How many of this session's steps so far ran cold on a backend that records them (BackendSession::cold_steps;
  // 0 elsewhere): a window or draft during which it grew is a warm-up sample, not its steady cost.
  int64_t cold_steps() const;
  std::vector<float> mtp_logits() const;  // [k][V] of the last mtp_draft (for tests; a download on a backend)
  // Finish: processors + choice for every row of the last run (needs all-row logits).
  std::vector<int32_t> sample(const SamplingParams& p) const;
  // Steering (sampling/processor.h): with masks ([logits_rows()][mask_words] or null), each output row also
  // gets the row's token mask; the session's steering processors apply to every row. verified_prefix: only the
  // rows up to the first whose token is not the next input (sampler.h sample_rows): a speculative window's kept
  // rows, the same tokens as when every row is finished.
  std::vector<int32_t> sample(const SamplingParams& p, const uint32_t* masks, int64_t mask_words,
                              bool verified_prefix = false) const;
  // One row of the last run finished again with this token mask (lazy grammar masks: a row that needs its full mask).
  int32_t sample_row(const SamplingParams& p, int row, const uint32_t* mask, int64_t mask_words) const;
  // Lazy grammar masks (python/strata_py/steering/grammar.py): sample(p) without masks, also recording per row
  // what its choice depends on under a mask (sampler.h PickTrace, at most `cap` candidates), for repick().
  std::vector<int32_t> sample_traced(const SamplingParams& p, int32_t cap);
  const std::vector<PickTrace>& traces() const { return traces_; }
  // Row `row` of the last sample_traced finished under a mask that allows exactly its trace's candidates j with
  // allowed[j] (a kComplete trace whose best token is allowed): the token sample() would give with that mask.
  int32_t repick(int row, const uint8_t* allowed, int64_t n) const;
  // The processors of the generation whose first output token is at position `origin` (null: none);
  // their committed state is rebuilt from the committed tokens [origin, position).
  void set_steering(std::shared_ptr<const Steering> steer, int64_t origin);
  const Steering* steering() const { return steer_.get(); }
  int64_t steer_origin() const { return steer_origin_; }
  PhraseState steer_state() const { return steer_state_; }
  void commit(int keep);

  void flush();  // applies a pending lazy fold now
  Checkpoint checkpoint();
  void restore(const Checkpoint& cp);
  void save(const std::string& path);  // write-then-rename; state/checkpoint_file.h
  void load(const std::string& path);  // validated in full before anything is restored
  CheckpointShape checkpoint_shape() const;  // what a checkpoint of this session must hold
  void reset();

  // Debug export of committed state (flushes a pending fold first).
  std::map<std::string, std::vector<float>> export_state();
  // Tests: record each QSA layer's selected blocks per row of every later run; qsa_selected()[layer][row]
  // is the last run's sorted block list of that row (empty: the row attended densely). Keys: main layer index.
  void record_qsa(bool on);
  std::map<int64_t, std::vector<std::vector<int32_t>>> qsa_selected() const;

  // Per-phase timing of the last run (seconds), for benches.
  double last_fold_seconds() const { return fold_s_; }

  static constexpr int64_t kMtpCells = 16;  // the MTP block's cells past n_ctx (its drafts run ahead)

 private:
  friend void forward(const Model&, Session&, const int32_t*, int, int64_t, bool, bool, bool, float*, float*);
  // Feeds the first n backlog rows to the MTP block (in chunks), drops them from the backlog and returns the
  // block's output hidden state of the last one; logits_last (or null) receives that row's logits.
  std::vector<float> mtp_feed(int64_t n, float* logits_last);
  void mtp_run(const float* hidden, const int32_t* next_tokens, int T, int64_t pos0, float* out_hidden,
               float* logits_last);
  std::shared_ptr<const Model> model_;
  SessionOptions opt_;
  int64_t pos_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<KvCache> kv_;            // per attention layer
  std::vector<QsaState> qsa_;          // per attention layer (inactive unless the layer is QSA)
  std::vector<DeltaNetState> dn_;      // per DeltaNet layer
  PleState ple_;                       // the PLE layer's conv history (inactive without one)
  std::vector<int> layer_slot_;        // layer -> index into kv_ or dn_
  // last window
  int last_T_ = 0;
  bool last_prompt_ = false;
  bool last_in_place_ = false;
  bool last_last_only_ = false;
  int64_t last_rows_ = 0;
  std::vector<int32_t> last_tokens_;
  std::vector<PickTrace> traces_;  // of the last window's sample_traced (cleared by run)
  std::vector<float> logits_, hidden_;
  int64_t pend_first_ = 0, pend_n_ = 0;  // pending lazy fold: saved rows [first, first+n)
  double fold_s_ = 0;
  int64_t last_hidden_rows_ = 0;
  std::string broken_;  // non-empty: a failed in-place run left committed state partial (see run())
  // MTP: its own KV cache; committed rows whose (hidden, next token) pair it has not consumed yet
  KvCache mtp_kv_;
  int64_t mtp_pos_ = 0;                  // MTP cells [0, mtp_pos_) hold committed rows
  std::vector<float> mtp_backlog_h_;     // [n][H] hidden states of rows mtp_pos_ .. mtp_pos_+n-1
  std::vector<int32_t> mtp_backlog_tok_; // the token after each backlog row (-1: not known yet)
  std::vector<float> mtp_logits_;
  // steering: configuration, where the generation began, the processors' state after the committed tokens
  std::shared_ptr<const Steering> steer_;
  int64_t steer_origin_ = 0;
  PhraseState steer_state_;
  void steer_rescan();
  std::unique_ptr<BackendSession> bs_;  // the forward on a backend (options().backend != "cpu"), else null
  void refuse_on_backend(const char* what) const;
  void restore_backend(const Checkpoint& cp);  // restore() on a backend, after its checks
  void restore_position(const Checkpoint& cp);  // position, tokens, steering; no window pending
};

// The MTP block (spec qwen3next.md 1.8) over T rows at positions pos0..: input rows are main hidden states
// (or the block's own output, when chaining) and the tokens that follow them. Writes MTP KV cells, returns
// the block's output hidden states (after shared_head_norm) [T][H] and the last row's logits [V]
// (logits_last may be null: no head).
void mtp_forward(const Model& m, KvCache& kv, const float* hidden, const int32_t* next_tokens, int T, int64_t pos0,
                 float* out_hidden, float* logits_last);

// The graph: embeds tokens, runs every layer over T rows at pos0, final norm, output head.
// Expects no pending fold (Session::run flushes it first).
// in_place: DeltaNet rows update committed state in the step (T = 1 and prompt windows);
// partial: row 0 updates committed state, rows 1.. run on S_work.
void forward(const Model& m, Session& s, const int32_t* tokens, int T, int64_t pos0, bool in_place, bool partial,
             bool last_only, float* logits, float* hidden);

}  // namespace strata
