// The window transaction (engine spec 2) and checkpoints. State types and their rollback contracts:
//   KvCache (kv_cache.h): by counter.   DeltaNetState (deltanet_state.h): replay inputs + fold.
//   QsaState (qsa_state.h): by counter.  PleState (ple_state.h): saved rows shifted in at commit.
//   Sampler state: none kept; sample() derives penalties from committed tokens + this window's inputs.
//   Steering (sampling/processor.h): state after the committed tokens; sample() steps a copy over the
//   window's inputs, commit() steps it over the kept ones, restore() rescans from the origin.
//
// run / commit as a state machine:
//   1. run(T): refuse if a commit is pending. A pending lazy fold is applied per layer inside the
//      forward, before that layer's new projections overwrite the saved rows.
//   2. T == 1 or T > max_window (prompt window): DeltaNet rows update committed state in the step.
//      Otherwise (verify window): rows run on S_work (Partial: row 0 in place), replay inputs saved.
//   3. commit(keep): refuse keep outside 1..T, or keep < T for a prompt window. Verify windows fold the
//      kept rows now (Eager) or record them for the next run (Lazy / Partial: keep-1 rows from row 1).
//   4. position += keep; committed tokens += the first keep inputs.
#include <algorithm>

#include "model/backend_forward.h"
#include "state/checkpoint_file.h"
#include "strata.h"
#include "sampling/steer.h"
#include "sampling/token_mask.h"
#include "util/memory.h"

namespace strata {

Session::Session(std::shared_ptr<const Model> model, const SessionOptions& opt) : model_(std::move(model)), opt_(opt) {
  const HParams& hp = model_->hp();
  STRATA_CHECK(opt_.n_ctx >= 1, "bad option n_ctx=", opt_.n_ctx, ": must be >= 1");
  STRATA_CHECK(opt_.n_ctx <= hp.n_ctx_train, "bad option n_ctx=", opt_.n_ctx, ": the model's context is ", hp.n_ctx_train);
  STRATA_CHECK(opt_.max_window >= 1 && opt_.max_window <= 64, "bad option max_window=", opt_.max_window,
               ": must be in 1..64");
  if (opt_.mtp && !model_->weights().mtp.present)
    fail<std::invalid_argument>("bad option mtp=True: ", model_->file().path(), " has no MTP block (blk.N.nextn.*)");
  if (!is_backend_name(opt_.backend))
    fail<std::invalid_argument>("bad option backend='", opt_.backend, "': expected 'cpu', 'cuda' or 'cpu-backend'");
  if (opt_.backend != "cpu") {
    const std::string& b = opt_.backend;
    if (hp.arch == Arch::Qwen4Exp)
      fail<std::invalid_argument>("bad option backend='", b, "': ", arch_name(hp.arch), " runs only on backend='cpu'");
    if (opt_.fold == FoldMode::Partial)
      fail<std::invalid_argument>("bad option fold='partial': backend='", b, "' folds eagerly ('lazy' or 'eager')");
    if (opt_.chunked_prefill)
      fail<std::invalid_argument>("bad option prefill='chunked': backend='", b, "' runs prompt windows serially");
    if (model_->experts())
      fail<std::invalid_argument>("bad option cache_mib: expert streaming runs only on backend='cpu' (backend='", b,
                                  "' keeps every expert resident; load the model with cache_mib=-1)");
    // the state lives in the backend's memory (BackendSession): none of the host state below is allocated; on
    // the CPU backend it is host memory all the same, so the host check applies
    if (b == "cpu-backend")
      check_fits_in_memory(state_bytes(hp, opt_), cat("a session with n_ctx=", opt_.n_ctx, " (KV cache and DeltaNet state)"));
    bs_ = std::make_unique<BackendSession>(model_, opt_, b);
    return;
  }
  // the state's size, before any of it is allocated: a context far above RAM is an error, not a kill
  check_fits_in_memory(state_bytes(hp, opt_), cat("a session with n_ctx=", opt_.n_ctx, " (KV cache and DeltaNet state)"));
  if (opt_.mtp) mtp_kv_.init(opt_.n_ctx + kMtpCells, hp.n_head_kv * hp.head_dim);
  layer_slot_.resize(hp.n_layer);
  for (int64_t il = 0; il < hp.n_layer; il++) {
    if (hp.recurrent[il]) {
      layer_slot_[il] = (int)dn_.size();
      dn_.emplace_back();
      dn_.back().init(hp.ssm_n_group, hp.ssm_dt_rank, hp.dk(), hp.dv(), hp.ssm_d_conv, opt_.max_window);
    } else {
      layer_slot_[il] = (int)kv_.size();
      kv_.emplace_back();
      kv_.back().init(opt_.n_ctx, hp.n_head_kv * hp.head_dim);
      qsa_.emplace_back();
      if (hp.is_qsa(il)) qsa_.back().init(opt_.n_ctx, hp.qsa.head_dim, hp.qsa.ratio);
    }
  }
  if (hp.ple.layer >= 0) ple_.init(hp.hc * hp.n_embd, hp.ple.history(), opt_.max_window);
}

Session::~Session() = default;

std::string Session::backend_name() const { return bs_ ? bs_->backend_name() : "cpu"; }

void Session::refuse_on_backend(const char* what) const {
  if (bs_)
    fail<std::logic_error>(what, ": not supported on backend='", opt_.backend, "' yet (the session's state is in ",
                           bs_->backend_name(), " memory); use backend='cpu'");
}

uint64_t Session::state_bytes(const HParams& hp, const SessionOptions& opt) {
  const uint64_t width = (uint64_t)(hp.n_head_kv * hp.head_dim), nk = hp.ssm_n_group, nv = hp.ssm_dt_rank;
  const uint64_t dn = 2 * nv * hp.dk() * hp.dv() + (hp.ssm_d_conv - 1) * hp.conv_dim() +
                      (uint64_t)opt.max_window * (nk * hp.dk() + nv * hp.dv() + 2 * nv + hp.conv_dim());
  uint64_t floats = (uint64_t)hp.n_attn_layers() * 2 * opt.n_ctx * width + (uint64_t)hp.n_dn_layers() * dn +
                    (opt.mtp ? 2 * (opt.n_ctx + kMtpCells) * width : 0);
  for (int64_t il = 0; il < hp.n_layer; il++)  // QSA index keys: raw per cell, pooled per block
    if (hp.is_qsa(il)) floats += (uint64_t)(opt.n_ctx + opt.n_ctx / hp.qsa.ratio + 1) * hp.qsa.head_dim;
  if (hp.ple.layer >= 0) floats += (uint64_t)(hp.ple.history() + opt.max_window) * hp.hc * hp.n_embd;
  return floats * 4;
}

const float* Session::run(const int32_t* tokens, int T, bool last_only) {
  const HParams& hp = model_->hp();
  if (last_T_ > 0)
    fail<std::logic_error>("run() while a commit is pending: call commit(keep) for the previous window of ", last_T_,
                           " rows first");
  if (!broken_.empty()) fail<std::logic_error>("run(): refused: ", broken_);
  STRATA_CHECK(T >= 1, "run(): empty window (T = 0)");
  traces_.clear();
  for (int i = 0; i < T; i++)
    STRATA_CHECK(tokens[i] >= 0 && tokens[i] < hp.n_vocab, "run(): token id ", tokens[i], " at row ", i,
                 " is outside the vocabulary [0, ", hp.n_vocab, ")");
  STRATA_CHECK(pos_ + T <= opt_.n_ctx, "run(): ", T, " tokens at position ", pos_, " exceed the context of ",
               opt_.n_ctx, " tokens");
  const bool prompt = T > opt_.max_window;
  const bool in_place = T == 1 || prompt;
  const bool partial = !in_place && opt_.fold == FoldMode::Partial;
  const int n_out = last_only ? 1 : T;
  logits_.resize((size_t)n_out * hp.n_vocab);
  hidden_.resize((size_t)T * hp.n_embd);
  fold_s_ = 0;
  model_->check_files();  // before anything changes: a changed file leaves the session as it was
  flush();  // the lazy fold of the last window's kept rows, before this run overwrites their saved inputs
  if (opt_.mtp && !mtp_backlog_tok_.empty() && mtp_backlog_tok_.back() < 0) mtp_backlog_tok_.back() = tokens[0];
  try {
    const ThreadPool::Wide wide(model_->pool(), prompt);  // a prompt window's regions all run on the pool
    if (bs_) bs_->run(tokens, T, pos_, in_place, last_only, logits_.data(), hidden_.data());
    else forward(*model_, *this, tokens, T, pos_, in_place, partial, last_only, logits_.data(), hidden_.data());
    model_->check_files();  // a truncation during the forward read zeros (gguf/map_guard.h): discard it
  } catch (const std::exception& e) {
    // A failure inside the forward (e.g. a streamed expert read) stops at some layer. A verify window has
    // only written scratch (S_work, KV cells past the position): the session stays usable and the window
    // can be run again. A window that updates DeltaNet state in place (T = 1, prompt, partial row 0) may
    // have updated the layers before the failure: refuse to run until restore() / reset() / load().
    if (!(in_place || partial)) throw;
    broken_ = cat("a ", T, "-row window at position ", pos_, " failed after updating committed state in place (",
                  e.what(), "); restore a checkpoint or reset the session");
    fail<std::runtime_error>(e.what(), " (the session must be restored from a checkpoint or reset before it runs again)");
  }
  last_T_ = T;
  last_prompt_ = prompt;
  last_in_place_ = in_place;
  last_last_only_ = last_only;
  last_tokens_.assign(tokens, tokens + T);
  last_rows_ = n_out;
  last_hidden_rows_ = T;
  return logits_.data();
}

std::vector<int32_t> Session::sample(const SamplingParams& p) const { return sample(p, nullptr, 0); }

std::vector<int32_t> Session::sample(const SamplingParams& p, const uint32_t* masks, int64_t words,
                                     bool verified_prefix) const {
  if (last_T_ == 0) fail<std::logic_error>("sample(): no window to finish (call run first)");
  if (last_last_only_ && last_T_ > 1)
    fail<std::logic_error>("sample(): the last run kept only the last row's logits; run with all rows to sample each");
  p.validate();
  const int64_t V = model_->hp().n_vocab;
  if (masks)
    STRATA_CHECK(words == mask_words(V), "sample(): token masks of ", words, " words per row; the vocabulary of ", V,
                 " tokens needs ", mask_words(V));
  if (steer_ || masks) {  // steering: each row's phrase state, stepped over the inputs from the committed one
    std::vector<PhraseState> st(last_T_);
    PhraseState cur = steer_state_;
    for (int i = 0; i < last_T_; i++) {
      if (steer_ && pos_ + i >= steer_origin_) cur = steer_->step(cur, last_tokens_[i]);
      st[i] = cur;
    }
    SteerRows sr{steer_.get(), steer_ ? st.data() : nullptr, masks};
    std::vector<int32_t> out(last_rows_);
    if (last_last_only_) {
      std::vector<int32_t> hist(tokens_);
      hist.insert(hist.end(), last_tokens_.begin(), last_tokens_.end() - 1);
      if (steer_) sr.states = st.data() + last_T_ - 1;
      steer_rows(logits_.data(), 1, V, p, sr, hist.data(), (int64_t)hist.size(), last_tokens_.data() + last_T_ - 1,
                 pos_ + last_T_ - 1, out.data());
      return out;
    }
    out.resize(steer_rows(logits_.data(), last_T_, V, p, sr, tokens_.data(), (int64_t)tokens_.size(),
                          last_tokens_.data(), pos_, out.data(), verified_prefix));
    return out;
  }
  std::vector<int32_t> out(last_T_);
  if (last_last_only_) {  // one row: the last input, at position pos_ + T - 1
    std::vector<int32_t> hist(tokens_);
    hist.insert(hist.end(), last_tokens_.begin(), last_tokens_.end() - 1);
    sample_rows(logits_.data(), 1, model_->hp().n_vocab, p, hist.data(), (int64_t)hist.size(),
                last_tokens_.data() + last_T_ - 1, pos_ + last_T_ - 1, out.data() + last_T_ - 1);
    out.erase(out.begin(), out.end() - 1);
    return out;
  }
  out.resize(sample_rows(logits_.data(), last_T_, model_->hp().n_vocab, p, tokens_.data(), (int64_t)tokens_.size(),
                         last_tokens_.data(), pos_, out.data(), verified_prefix));
  return out;
}

int32_t Session::sample_row(const SamplingParams& p, int row, const uint32_t* mask, int64_t words) const {
  if (last_T_ == 0) fail<std::logic_error>("sample_row(): no window to finish (call run first)");
  if (last_last_only_) fail<std::logic_error>("sample_row(): the last run kept only the last row's logits");
  STRATA_CHECK(row >= 0 && row < last_T_, "sample_row(): row ", row, " outside 0..", last_T_ - 1);
  const int64_t V = model_->hp().n_vocab;
  STRATA_CHECK(mask && words == mask_words(V), "sample_row(): a token mask of ", mask_words(V), " words is needed");
  PhraseState cur = steer_state_;
  for (int i = 0; i <= row; i++)
    if (steer_ && pos_ + i >= steer_origin_) cur = steer_->step(cur, last_tokens_[i]);
  std::vector<int32_t> hist(tokens_);
  hist.insert(hist.end(), last_tokens_.begin(), last_tokens_.begin() + row);
  SteerRows sr{steer_.get(), steer_ ? &cur : nullptr, mask};
  int32_t out = -1;
  steer_rows(logits_.data() + (size_t)row * V, 1, V, p, sr, hist.data(), (int64_t)hist.size(),
             last_tokens_.data() + row, pos_ + row, &out);
  return out;
}

std::vector<int32_t> Session::sample_traced(const SamplingParams& p, int32_t cap) {
  if (last_T_ == 0) fail<std::logic_error>("sample_traced(): no window to finish (call run first)");
  if (last_last_only_) fail<std::logic_error>("sample_traced(): the last run kept only the last row's logits");
  p.validate();
  STRATA_CHECK(cap >= 1, "sample_traced(): cap must be >= 1, got ", cap);
  std::vector<PhraseState> st(last_T_);
  PhraseState cur = steer_state_;
  for (int i = 0; i < last_T_; i++) {  // as in sample()
    if (steer_ && pos_ + i >= steer_origin_) cur = steer_->step(cur, last_tokens_[i]);
    st[i] = cur;
  }
  traces_.resize(last_T_);
  SteerRows sr{steer_.get(), steer_ ? st.data() : nullptr, nullptr, traces_.data(), cap};
  std::vector<int32_t> out(last_T_);
  steer_rows(logits_.data(), last_T_, model_->hp().n_vocab, p, sr, tokens_.data(), (int64_t)tokens_.size(),
             last_tokens_.data(), pos_, out.data());
  return out;
}

int32_t Session::repick(int row, const uint8_t* allowed, int64_t n) const {
  STRATA_CHECK(last_T_ > 0 && (int)traces_.size() == last_T_, "repick(): no traced window (call sample_traced first)");
  STRATA_CHECK(row >= 0 && row < last_T_, "repick(): row ", row, " outside 0..", last_T_ - 1);
  return strata::repick(traces_[row], allowed, n);
}

void Session::commit(int keep) {
  if (last_T_ == 0) fail<std::logic_error>("commit(", keep, ") with no window to commit (call run first)");
  STRATA_CHECK(keep >= 1 && keep <= last_T_, "commit(", keep, "): keep must be in 1..", last_T_, " (rows of the last run)");
  if (last_prompt_ && keep != last_T_)
    fail<std::invalid_argument>("commit(", keep, "): a prompt window of ", last_T_, " rows (more than max_window = ",
                                opt_.max_window, ") commits all its rows");
  if (bs_) {
    bs_->commit(keep);  // the eager fold on the backend
  } else if (!last_in_place_) {
    const int64_t first = opt_.fold == FoldMode::Partial ? 1 : 0;
    const int64_t n = keep - first;
    if (opt_.fold == FoldMode::Eager) {
      Timer tm;
      fold_layers(model_->pool(), dn_, first, n);
      fold_s_ += tm.seconds();
    } else {
      pend_first_ = first;
      pend_n_ = n;
    }
  }
  if (!last_in_place_ && ple_.active()) ple_.commit_rows(keep);
  if (opt_.mtp) {  // the MTP block consumes (hidden of row i, token i+1) for every committed row
    const int64_t H = model_->hp().n_embd;
    mtp_backlog_h_.insert(mtp_backlog_h_.end(), hidden_.begin(), hidden_.begin() + (size_t)keep * H);
    for (int i = 0; i < keep; i++) mtp_backlog_tok_.push_back(i + 1 < keep ? last_tokens_[i + 1] : -1);
  }
  tokens_.insert(tokens_.end(), last_tokens_.begin(), last_tokens_.begin() + keep);
  if (steer_ && steer_->stateful())  // the processors' state follows the kept rows only (processor.h)
    for (int i = 0; i < keep; i++)
      if (pos_ + i >= steer_origin_) steer_state_ = steer_->step(steer_state_, last_tokens_[i]);
  pos_ += keep;
  last_T_ = 0;
}

void Session::set_steering(std::shared_ptr<const Steering> steer, int64_t origin) {
  if (last_T_ > 0) fail<std::logic_error>("set_steering() while a commit is pending");
  STRATA_CHECK(origin >= 0, "set_steering(): origin ", origin, " must be >= 0");
  if (steer)
    STRATA_CHECK(steer->n_vocab == model_->hp().n_vocab, "set_steering(): the steering was built for ", steer->n_vocab,
                 " tokens, the model has ", model_->hp().n_vocab);
  steer_ = std::move(steer);
  steer_origin_ = origin;
  steer_rescan();
}

void Session::steer_rescan() {
  steer_state_ = PhraseState{};
  if (steer_ && steer_->stateful())
    for (int64_t q = steer_origin_; q < pos_; q++) steer_state_ = steer_->step(steer_state_, tokens_[q]);
}

std::vector<int32_t> Session::mtp_draft(int32_t root, int k, int64_t max_backlog) {
  const HParams& hp = model_->hp();
  if (!opt_.mtp) fail<std::logic_error>("mtp_draft(): the session was created without mtp=True");
  if (last_T_ > 0) fail<std::logic_error>("mtp_draft() while a commit is pending");
  STRATA_CHECK(k >= 1 && k <= 16, "mtp_draft(): k = ", k, " outside 1..16");
  STRATA_CHECK(root >= 0 && root < hp.n_vocab, "mtp_draft(): root token ", root, " out of range");
  int64_t n = (int64_t)mtp_backlog_tok_.size();
  if (n == 0) fail<std::logic_error>("mtp_draft(): no newly committed rows to draft from");
  if (mtp_backlog_tok_.back() < 0) mtp_backlog_tok_.back() = root;
  STRATA_CHECK(mtp_pos_ + n == pos_, "mtp_draft(): MTP state out of step (", mtp_pos_, " + ", n, " != ", pos_, ")");
  const int64_t H = hp.n_embd;
  if (max_backlog >= 1 && n > max_backlog) {
    // The drafter has not drafted for a while (it judged drafting not to pay): re-sync from the last
    // max_backlog rows instead of running the block over all of them for one probe; the older ones become
    // empty history (zero cells, as after restoring a checkpoint without MTP state).
    const int64_t skip = n - max_backlog;
    if (bs_) {
      bs_->mtp_zero(mtp_pos_, skip);
    } else {
      std::fill(mtp_kv_.k_at(mtp_pos_), mtp_kv_.k_at(mtp_pos_ + skip), 0.f);
      std::fill(mtp_kv_.v_at(mtp_pos_), mtp_kv_.v_at(mtp_pos_ + skip), 0.f);
    }
    mtp_backlog_h_.erase(mtp_backlog_h_.begin(), mtp_backlog_h_.begin() + (size_t)skip * H);
    mtp_backlog_tok_.erase(mtp_backlog_tok_.begin(), mtp_backlog_tok_.begin() + skip);
    mtp_pos_ += skip;
    n -= skip;
  }
  model_->check_files();
  if (bs_) {  // the block's work on the backend (feed, chain, argmax), the drafts in one download
    const int64_t after = mtp_pos_ + n;  // the chain's first position (the cells bound it as below)
    const int kk = (int)std::min<int64_t>(k, 1 + std::max<int64_t>(0, opt_.n_ctx + kMtpCells - after));
    std::vector<int32_t> drafts(kk);
    bs_->mtp_draft(mtp_backlog_h_.data(), mtp_backlog_tok_.data(), (int)n, mtp_pos_, kk, drafts.data());
    mtp_pos_ = after;
    mtp_backlog_h_.clear();
    mtp_backlog_tok_.clear();
    mtp_logits_.clear();  // on the backend: mtp_logits() downloads them
    model_->check_files();
    return drafts;
  }
  std::vector<float> logits(hp.n_vocab);
  auto best = [&]() {
    const int32_t b = argmax(logits.data(), hp.n_vocab);
    return b < 0 ? 0 : b;  // all NaN: any token is a valid (rejected) draft
  };
  std::vector<float> h_last = mtp_feed(n, logits.data());
  std::vector<int32_t> drafts{best()};
  mtp_logits_ = logits;
  // chain: the block's own output hidden state with the token it just drafted, at the next position
  for (int j = 1; j < k && mtp_pos_ + j - 1 < opt_.n_ctx + kMtpCells; j++) {
    const int32_t tok = drafts.back();
    std::vector<float> nh(H);
    mtp_run(h_last.data(), &tok, 1, mtp_pos_ + j - 1, nh.data(), logits.data());
    h_last.swap(nh);
    drafts.push_back(best());
    mtp_logits_.insert(mtp_logits_.end(), logits.begin(), logits.end());
  }
  model_->check_files();  // drafts read from a truncated mapping are discarded (they never touch output)
  return drafts;
}

int64_t Session::cold_steps() const { return bs_ ? bs_->cold_steps() : 0; }

std::vector<float> Session::mtp_logits() const { return bs_ ? bs_->mtp_logits() : mtp_logits_; }

// The MTP block's forward on this session's backend (the native function, or the backend session's twin).
void Session::mtp_run(const float* hidden, const int32_t* next_tokens, int T, int64_t pos0, float* out_hidden,
                      float* logits_last) {
  if (bs_) bs_->mtp_forward(hidden, next_tokens, T, pos0, out_hidden, logits_last);
  else mtp_forward(*model_, mtp_kv_, hidden, next_tokens, T, pos0, out_hidden, logits_last);
}

void Session::mtp_prefill() {
  if (!opt_.mtp) fail<std::logic_error>("mtp_prefill(): the session was created without mtp=True");
  if (last_T_ > 0) fail<std::logic_error>("mtp_prefill() while a commit is pending");
  const int64_t n = (int64_t)mtp_backlog_tok_.size() - 1;  // rows whose next token is known
  if (n <= 0) return;
  STRATA_CHECK(mtp_pos_ + n + 1 == pos_, "mtp_prefill(): MTP state out of step (", mtp_pos_, " + ", n + 1, " != ", pos_, ")");
  mtp_feed(n, nullptr);
}

std::vector<float> Session::mtp_feed(int64_t n, float* logits_last) {
  const int64_t H = model_->hp().n_embd;
  constexpr int64_t kChunk = 256;
  std::vector<float> out_h;
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t m = std::min(kChunk, n - c);
    out_h.resize((size_t)m * H);
    mtp_run(mtp_backlog_h_.data() + (size_t)c * H, mtp_backlog_tok_.data() + c, (int)m, mtp_pos_ + c, out_h.data(),
            c + m == n ? logits_last : nullptr);
  }
  mtp_pos_ += n;
  mtp_backlog_h_.erase(mtp_backlog_h_.begin(), mtp_backlog_h_.begin() + (size_t)n * H);
  mtp_backlog_tok_.erase(mtp_backlog_tok_.begin(), mtp_backlog_tok_.begin() + n);
  return std::vector<float>(out_h.end() - H, out_h.end());
}

void Session::flush() {
  if (pend_n_ > 0) {
    Timer tm;
    fold_layers(model_->pool(), dn_, pend_first_, pend_n_);
    fold_s_ += tm.seconds();
  }
  pend_n_ = 0;
}

void Session::reset() {
  broken_.clear();
  mtp_pos_ = 0;
  mtp_backlog_h_.clear();
  mtp_backlog_tok_.clear();
  pos_ = 0;
  tokens_.clear();
  last_T_ = 0;
  pend_n_ = 0;
  for (auto& st : dn_) st.reset();
  if (bs_) bs_->reset();
  ple_.reset();
  steer_origin_ = 0;
  steer_rescan();
}

Checkpoint Session::checkpoint() {
  if (last_T_ > 0) fail<std::logic_error>("checkpoint() while a commit is pending: commit the last window first");
  flush();
  Checkpoint cp;
  cp.fingerprint = model_->fingerprint();
  cp.model_file = model_->file().path();
  cp.n_ctx = opt_.n_ctx;
  cp.position = pos_;
  cp.tokens = tokens_;
  cp.steer_origin = steer_origin_;
  if (bs_) {  // the state from the backend's memory, in these layouts; no QSA or PLE runs there (qwen4exp refused)
    bs_->save_state(pos_, opt_.mtp ? mtp_pos_ : 0, cp);
    cp.idx_raw.assign(cp.k.size(), {});
    cp.idx_pooled.assign(cp.k.size(), {});
    if (opt_.mtp) {
      cp.mtp_pos = mtp_pos_;
      cp.mtp_backlog_h = mtp_backlog_h_;
      cp.mtp_backlog_tok = mtp_backlog_tok_;
    }
    return cp;
  }
  for (auto& kv : kv_) {
    cp.k.emplace_back(kv.k.begin(), kv.k.begin() + (size_t)pos_ * kv.width);
    cp.v.emplace_back(kv.v.begin(), kv.v.begin() + (size_t)pos_ * kv.width);
  }
  for (auto& st : dn_) {
    cp.S.push_back(st.S);
    cp.conv.push_back(st.conv);
  }
  for (auto& q : qsa_) {
    cp.idx_raw.emplace_back(q.raw.begin(), q.raw.begin() + (q.active() ? (size_t)pos_ * q.dim : 0));
    cp.idx_pooled.emplace_back(q.pooled.begin(),
                               q.pooled.begin() + (q.active() ? (size_t)q.blocks_below(pos_) * q.dim : 0));
  }
  cp.ple_conv = ple_.conv;
  if (opt_.mtp) {
    cp.mtp_pos = mtp_pos_;
    cp.mtp_k.assign(mtp_kv_.k.begin(), mtp_kv_.k.begin() + (size_t)mtp_pos_ * mtp_kv_.width);
    cp.mtp_v.assign(mtp_kv_.v.begin(), mtp_kv_.v.begin() + (size_t)mtp_pos_ * mtp_kv_.width);
    cp.mtp_backlog_h = mtp_backlog_h_;
    cp.mtp_backlog_tok = mtp_backlog_tok_;
  }
  return cp;
}

void Session::restore(const Checkpoint& cp) {
  if (cp.fingerprint != model_->fingerprint())
    fail<std::invalid_argument>("restore(): the checkpoint was taken with model ", cp.model_file, " (fingerprint ",
                                std::hex, cp.fingerprint, "); this session's model is ", model_->file().path(),
                                " (fingerprint ", model_->fingerprint(), ")");
  STRATA_CHECK(cp.position <= opt_.n_ctx, "restore(): checkpoint position ", cp.position, " exceeds this session's context ",
               opt_.n_ctx);
  // every size against this session's shape (the same on every backend) before anything is written
  const CheckpointShape sh = checkpoint_shape();
  STRATA_CHECK(cp.k.size() == sh.kv_width.size() && cp.S.size() == sh.dn_S.size() &&
                   (int64_t)cp.tokens.size() == cp.position,
               "restore(): checkpoint layout does not match this model");
  for (size_t i = 0; i < sh.kv_width.size(); i++) {
    STRATA_CHECK(cp.k[i].size() == (size_t)(cp.position * sh.kv_width[i]) && cp.v[i].size() == cp.k[i].size(),
                 "restore(): checkpoint KV size mismatch in attention layer ", i);
  }
  for (size_t i = 0; i < sh.dn_S.size(); i++)
    STRATA_CHECK(cp.S[i].size() == (size_t)sh.dn_S[i] && cp.conv[i].size() == (size_t)sh.dn_conv[i],
                 "restore(): checkpoint DeltaNet size mismatch in layer ", i);
  STRATA_CHECK(cp.idx_raw.size() == sh.qsa_dim.size() && cp.idx_pooled.size() == sh.qsa_dim.size(),
               "restore(): checkpoint QSA layout does not match this model");
  for (size_t i = 0; i < qsa_.size(); i++) {
    const QsaState& q = qsa_[i];
    STRATA_CHECK(cp.idx_raw[i].size() == (q.active() ? (size_t)cp.position * q.dim : 0) &&
                     cp.idx_pooled[i].size() == (q.active() ? (size_t)q.blocks_below(cp.position) * q.dim : 0),
                 "restore(): checkpoint QSA index-key size mismatch in attention layer ", i);
  }
  for (size_t i = 0; bs_ && i < cp.idx_raw.size(); i++)  // no QSA layer runs on a backend
    STRATA_CHECK(cp.idx_raw[i].empty() && cp.idx_pooled[i].empty(),
                 "restore(): checkpoint QSA index-key size mismatch in attention layer ", i);
  STRATA_CHECK(cp.ple_conv.size() == (size_t)sh.ple_conv, "restore(): checkpoint PLE history size ",
               cp.ple_conv.size(), " does not match this model's ", sh.ple_conv);
  STRATA_CHECK(cp.steer_origin >= 0, "restore(): checkpoint steering origin ", cp.steer_origin, " is negative");
  if (bs_) return restore_backend(cp);
  for (size_t i = 0; i < kv_.size(); i++) {
    std::copy(cp.k[i].begin(), cp.k[i].end(), kv_[i].k.begin());
    std::copy(cp.v[i].begin(), cp.v[i].end(), kv_[i].v.begin());
  }
  for (size_t i = 0; i < dn_.size(); i++) {
    dn_[i].S = cp.S[i];
    dn_[i].conv = cp.conv[i];
    dn_[i].work_rows = 0;
  }
  for (size_t i = 0; i < qsa_.size(); i++) {
    std::copy(cp.idx_raw[i].begin(), cp.idx_raw[i].end(), qsa_[i].raw.begin());
    std::copy(cp.idx_pooled[i].begin(), cp.idx_pooled[i].end(), qsa_[i].pooled.begin());
  }
  ple_.conv = cp.ple_conv;
  ple_.n_rows = 0;
  restore_position(cp);
  if (opt_.mtp) {
    // MTP drafts only change speed, never output. A checkpoint without MTP state (from a file, or a
    // session without mtp) leaves the block with empty history up to the restored position.
    // (a checkpoint taken before the block ran, mtp_pos 0, holds its whole history as backlog: that is state too)
    const int64_t nb = (int64_t)cp.mtp_backlog_tok.size();
    const bool have = cp.mtp_pos + nb == cp.position && cp.mtp_k.size() == (size_t)cp.mtp_pos * mtp_kv_.width &&
                      cp.mtp_backlog_h.size() == (size_t)nb * model_->hp().n_embd && (cp.mtp_pos > 0 || nb > 0);
    std::fill(mtp_kv_.k.begin(), mtp_kv_.k.end(), 0.f);
    std::fill(mtp_kv_.v.begin(), mtp_kv_.v.end(), 0.f);
    if (have && cp.mtp_k.size() <= mtp_kv_.k.size()) {
      std::copy(cp.mtp_k.begin(), cp.mtp_k.end(), mtp_kv_.k.begin());
      std::copy(cp.mtp_v.begin(), cp.mtp_v.end(), mtp_kv_.v.begin());
      mtp_pos_ = cp.mtp_pos;
      mtp_backlog_h_ = cp.mtp_backlog_h;
      mtp_backlog_tok_ = cp.mtp_backlog_tok;
    } else {
      mtp_pos_ = pos_;
      mtp_backlog_h_.clear();
      mtp_backlog_tok_.clear();
    }
  }
}

// The session's own fields from a checkpoint (restore() and restore_backend(), after the state).
void Session::restore_position(const Checkpoint& cp) {
  pos_ = cp.position;
  tokens_ = cp.tokens;
  steer_origin_ = cp.steer_origin;
  steer_rescan();
  last_T_ = 0;
  pend_n_ = 0;
  broken_.clear();
}

// restore() on a backend, after its checks: the state into the backend's memory, then this session's own fields as
// restore() sets them.
void Session::restore_backend(const Checkpoint& cp) {
  const int64_t nb = (int64_t)cp.mtp_backlog_tok.size();
  const int64_t width = model_->hp().n_head_kv * model_->hp().head_dim;
  const bool mtp = opt_.mtp && cp.mtp_pos + nb == cp.position && cp.mtp_k.size() == (size_t)(cp.mtp_pos * width) &&
                   cp.mtp_v.size() == cp.mtp_k.size() &&
                   cp.mtp_backlog_h.size() == (size_t)(nb * model_->hp().n_embd) && (cp.mtp_pos > 0 || nb > 0) &&
                   cp.mtp_pos <= opt_.n_ctx + kMtpCells;
  bs_->load_state(cp, mtp);
  restore_position(cp);
  if (opt_.mtp) {  // as restore(): a checkpoint without MTP state leaves the block empty up to the position
    mtp_pos_ = mtp ? cp.mtp_pos : pos_;
    mtp_backlog_h_ = mtp ? cp.mtp_backlog_h : std::vector<float>{};
    mtp_backlog_tok_ = mtp ? cp.mtp_backlog_tok : std::vector<int32_t>{};
  }
}

CheckpointShape Session::checkpoint_shape() const {
  CheckpointShape sh;
  sh.fingerprint = model_->fingerprint();
  sh.model_file = model_->file().path();
  sh.n_ctx = opt_.n_ctx;
  if (bs_) {  // no host state here: the sizes the CPU session's states have (deltanet_state, kv_cache; no QSA, PLE)
    const HParams& hp = model_->hp();
    for (int64_t il = 0; il < hp.n_layer; il++) {
      if (hp.recurrent[il]) {
        sh.dn_S.push_back(hp.ssm_dt_rank * hp.dk() * hp.dv());
        sh.dn_conv.push_back((hp.ssm_d_conv - 1) * hp.conv_dim());
      } else {
        sh.kv_width.push_back(hp.n_head_kv * hp.head_dim);
        sh.qsa_dim.push_back(0);
        sh.qsa_ratio.push_back(QsaState{}.ratio);
      }
    }
    return sh;
  }
  for (const auto& kv : kv_) sh.kv_width.push_back(kv.width);
  for (const auto& q : qsa_) {
    sh.qsa_dim.push_back(q.active() ? q.dim : 0);
    sh.qsa_ratio.push_back(q.ratio);
  }
  for (const auto& st : dn_) {
    sh.dn_S.push_back((int64_t)st.S.size());
    sh.dn_conv.push_back((int64_t)st.conv.size());
  }
  sh.ple_conv = (int64_t)ple_.conv.size();
  return sh;
}

// File I/O and its validation: state/checkpoint_file.h. A failed save leaves the session untouched (it only
// reads state); a failed load leaves it as it was (restore() runs only on a fully validated checkpoint).
void Session::save(const std::string& path) { write_checkpoint_file(path, checkpoint(), checkpoint_shape()); }

void Session::load(const std::string& path) { restore(read_checkpoint_file(path, checkpoint_shape())); }

std::map<std::string, std::vector<float>> Session::export_state() {
  refuse_on_backend("export_state()");
  if (last_T_ > 0) fail<std::logic_error>("export_state() while a commit is pending");
  flush();
  std::map<std::string, std::vector<float>> out;
  const HParams& hp = model_->hp();
  for (int64_t il = 0; il < hp.n_layer; il++) {
    const std::string p = cat("layer.", il, ".");
    if (hp.recurrent[il]) {
      const DeltaNetState& st = dn_[layer_slot_[il]];
      out[p + "S"] = st.S;
      out[p + "conv"] = st.conv;
    } else {
      const KvCache& kv = kv_[layer_slot_[il]];
      out[p + "k"].assign(kv.k.begin(), kv.k.begin() + (size_t)pos_ * kv.width);
      out[p + "v"].assign(kv.v.begin(), kv.v.begin() + (size_t)pos_ * kv.width);
      const QsaState& q = qsa_[layer_slot_[il]];
      if (q.active()) {
        out[p + "idx_raw"].assign(q.raw.begin(), q.raw.begin() + (size_t)pos_ * q.dim);
        out[p + "idx_pooled"].assign(q.pooled.begin(), q.pooled.begin() + (size_t)q.blocks_below(pos_) * q.dim);
      }
    }
    if (il == hp.ple.layer) out[p + "ple_conv"] = ple_.conv;
  }
  return out;
}

void Session::record_qsa(bool on) {
  for (auto& q : qsa_) {
    q.record = on;
    q.selected.clear();
  }
}

std::map<int64_t, std::vector<std::vector<int32_t>>> Session::qsa_selected() const {
  if (bs_) return {};  // no QSA layer runs on a backend (qwen4exp is refused)
  std::map<int64_t, std::vector<std::vector<int32_t>>> out;
  const HParams& hp = model_->hp();
  for (int64_t il = 0; il < hp.n_layer; il++)
    if (!hp.recurrent[il] && qsa_[layer_slot_[il]].active()) out[il] = qsa_[layer_slot_[il]].selected;
  return out;
}

}  // namespace strata
