// Routed experts streamed into a bounded cache in backend memory: backend_experts.h.
#include "model/backend_experts.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "strata.h"
#include "util/memory.h"

namespace strata {

namespace {
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
const ExpertMat& part_of(const MoeWeights& m, int p) { return p == 0 ? m.gate_exps : p == 1 ? m.up_exps : m.down_exps; }

// The slot layout: region[p] = where part p (gate, up, down) starts, each part's largest expert rounded to kRegion;
// returns the slot's bytes (rounded to 4096).
size_t slot_layout(const Weights& w, size_t region[3]) {
  size_t off = 0;
  for (int p = 0; p < 3; p++) {
    region[p] = off;
    size_t mx = 0;
    for (const auto& l : w.layers) mx = std::max(mx, part_of(l.moe, p).expert_bytes());
    off += round_up(mx, BackendExperts::kRegion);
  }
  return round_up(off, 4096);
}
}  // namespace

int64_t BackendExperts::slot_bytes_for(const Weights& w) {
  size_t region[3];
  return (int64_t)slot_layout(w, region);
}

int64_t BackendExperts::slots_for(const Model& m, int64_t cache_mib) {
  const HParams& hp = m.hp();
  const int64_t sb = slot_bytes_for(m.weights()), total = hp.n_layer * hp.n_expert;
  STRATA_CHECK(cache_mib >= 0, "bad option cache_mib=", cache_mib, ": must be >= 0 (or -1 / 'full')");
  const double want_d = (double)cache_mib * (1 << 20) / (double)sb;  // clamped before the cast: no overflow
  const int64_t want = want_d >= (double)total ? total : (int64_t)want_d;
  if (want < hp.n_expert_used)
    fail<std::invalid_argument>("bad option cache_mib=", cache_mib, ": ", m.file().path(), " needs at least ",
                                (hp.n_expert_used * sb + (1 << 20) - 1) >> 20, " MiB of backend memory (",
                                hp.n_expert_used, " experts of ", sb, " bytes) for one row's experts");
  return want;
}

namespace {
std::atomic<int> g_staging_cap{0};
}  // namespace

void BackendExperts::set_staging_cap(int slots) {
  STRATA_CHECK(slots >= 0, "staging cap ", slots, ": must be >= 0");
  g_staging_cap = slots;
}

bool BackendExperts::reads_file(const Model& m, const ExpertOptions& o, uint64_t also) {
  if (o.source == ExpertOptions::Source::File) return true;
  const HParams& hp = m.hp();
  const uint64_t host = (uint64_t)(hp.n_layer * hp.n_expert) * (uint64_t)slot_bytes_for(m.weights()) + also;
  if (o.source == ExpertOptions::Source::Host) {
    // (2 GiB for the rest of the process: an 18.6 GiB copy of the 80B IQ2_XXS's experts over the CPU backend, whose
    // slot pool is 4.6 GiB of the same RAM, was killed by the OOM killer on a 23.6 GiB machine)
    check_fits_in_memory(host + (2ull << 30), cat("bad option expert_source='host': ", m.file().path(), "'s ",
                                                  hp.n_layer * hp.n_expert, " routed experts in pinned host memory",
                                                  also ? " beside the backend's expert slots in the same memory" : "",
                                                  " (and 2 GiB for the rest)"));
    return false;
  }
  const uint64_t lim = memory_limit_bytes();
  const uint64_t spare = std::max<uint64_t>(8ull << 30, lim / 4);
  return lim < spare || host > lim - spare;
}

BackendExperts::BackendExperts(Backend& be, const Model& m, const ExpertOptions& o, int max_rows)
    : be_(be), opt_(o), max_rows_(max_rows) {
  const HParams& hp = m.hp();
  const Weights& w = m.weights();
  L_ = hp.n_layer;
  E_ = hp.n_expert;
  k_ = hp.n_expert_used;
  slot_bytes_ = slot_layout(w, region_);
  const int64_t n_slots = slots_for(m, o.cache_mib);
  cache_ = std::make_unique<ExpertCache>((int)n_slots, slot_bytes_, /*host_memory=*/false);
  pool_ = be_.alloc((size_t)n_slots * slot_bytes_);
  views_.resize((size_t)L_ * 3);
  copy_bytes_.resize((size_t)L_);
  for (int64_t l = 0; l < L_; l++) {
    for (int p = 0; p < 3; p++) {
      MatView v = part_of(w.layers[l].moe, p).all;
      v.rows = part_of(w.layers[l].moe, p).rows;
      v.data = static_cast<const uint8_t*>(pool_) + region_[p];
      views_[(size_t)l * 3 + p] = v;
    }
    copy_bytes_[l] = region_[2] + w.layers[l].moe.down_exps.expert_bytes();
  }
  stage_ = static_cast<int32_t*>(be_.host_alloc((size_t)max_rows_ * k_ * sizeof(int32_t)));
  selbuf_ = static_cast<int32_t*>(be_.host_alloc((size_t)2 * max_rows_ * k_ * sizeof(int32_t)));
  st_.slots = (uint64_t)n_slots;
  st_.slot_bytes = slot_bytes_;
  st_.experts_total = (uint64_t)(L_ * E_);
  // the CPU backend's slot pool is host memory too (tests, benches of the backend forward)
  const uint64_t pool_on_host = be_.name() == "cpu" ? (uint64_t)n_slots * slot_bytes_ : 0;
  if (reads_file(m, o, pool_on_host)) {
    STRATA_CHECK(o.io_threads >= 1 && o.io_threads <= 64, "bad option io_threads=", o.io_threads, ": must be 1..64");
    path_ = m.file().path();
    w_ = &w;
    // about 64 MiB of staging, at least a slot per reader (and 2), at most 64 slots
    n_stage_ = (int)std::clamp<int64_t>((int64_t)(64u << 20) / (int64_t)slot_bytes_, std::max(2, o.io_threads), 64);
    if (g_staging_cap > 0) n_stage_ = std::min(n_stage_, g_staging_cap.load());
    staging_ = static_cast<uint8_t*>(be_.host_alloc((size_t)n_stage_ * slot_bytes_));  // (read_expert writes all of a slot)
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail<std::invalid_argument>(path_, ": cannot open for expert reads: ", std::strerror(errno));
    io_ = std::make_unique<IoPool>(o.io_threads, [this](const IoPool::Task& t) { read_expert(t); });
    return;
  }
  // the host copy in slot format, filled from the mapping by a few threads of its own, layers split between them
  // (not the model's pool: another session may be running a forward on it)
  host_ = static_cast<uint8_t*>(be_.host_alloc((size_t)L_ * E_ * slot_bytes_));
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>({8, (int64_t)std::thread::hardware_concurrency(), L_}));
  std::vector<std::thread> th;
  for (int t = 0; t < nt; t++)
    th.emplace_back([&, t] {
      for (int64_t l = t; l < L_; l += nt)
        for (int64_t e = 0; e < E_; e++) {
          uint8_t* dst = host_ + (size_t)(l * E_ + e) * slot_bytes_;
          for (int p = 0; p < 3; p++) {  // each part, then zeros up to the next region
            const ExpertMat& em = part_of(w.layers[l].moe, p);
            const size_t n = em.expert_bytes(), end = p < 2 ? region_[p + 1] : slot_bytes_;
            std::memcpy(dst + region_[p], em.all.data + (size_t)e * n, n);
            std::memset(dst + region_[p] + n, 0, end - region_[p] - n);
          }
        }
    });
  for (auto& x : th) x.join();
}

BackendExperts::~BackendExperts() {
  io_.reset();  // the readers finish what they were given (nothing is queued between two calls: finish)
  be_.fence_uploads();  // no copy still reads the host memory or writes the pool
  be_.sync();
  if (fd_ >= 0) ::close(fd_);
  be_.host_release(staging_);
  be_.host_release(selbuf_);
  be_.host_release(stage_);
  be_.host_release(host_);
  be_.release(pool_);
}

void BackendExperts::copy_in(int64_t l, int32_t e, int slot, bool demand) {
  if (fd_ < 0) {
    const size_t n = copy_bytes_[l];
    be_.upload_async(static_cast<uint8_t*>(pool_) + (size_t)slot * slot_bytes_, host_ + (size_t)(l * E_ + e) * slot_bytes_, n);
    copied_.push_back(slot);
    st_.bytes_read += n;
    st_.experts_read++;
    return;
  }
  if ((int)queued_.size() == n_stage_) flush(demand);
  const int stage = next_stage_;
  next_stage_ = (next_stage_ + 1) % n_stage_;
  be_.wait_uploads(stage);  // its last copy has read it
  queued_.push_back({l, e, slot, stage});
  {
    std::lock_guard<std::mutex> lk(io_mu_);
    io_pending_++;
  }
  io_->submit({stage, key(l, e)}, true);
}

std::string BackendExperts::what(int64_t l, int32_t e, int p) const {
  static const char* const kPart[3] = {"gate", "up", "down"};
  const ExpertMat& em = part_of(w_->layers[l].moe, p);
  const uint64_t off = em.file_offset + (uint64_t)e * em.expert_bytes();
  return cat(path_, ": expert ", e, " of layer ", l, " (tensor 'blk.", l, ".ffn_", kPart[p], "_exps.weight', file bytes [",
             off, ", ", off + em.expert_bytes(), "))");
}

void BackendExperts::read_expert(const IoPool::Task& t) {
  const int64_t l = t.key / (uint32_t)E_;
  const int32_t e = (int32_t)(t.key % (uint32_t)E_);
  uint8_t* dst = staging_ + (size_t)t.slot * slot_bytes_;
  std::string err;
  for (int p = 0; p < 3 && err.empty(); p++) {
    const ExpertMat& em = part_of(w_->layers[l].moe, p);
    const size_t n = em.expert_bytes(), end = p < 2 ? region_[p + 1] : slot_bytes_;
    const uint64_t off = em.file_offset + (uint64_t)e * n;
    const int64_t r = faults_.pread(fd_, dst + region_[p], n, off, n);
    if (r < 0) err = cat(what(l, e, p), ": I/O error: ", std::strerror(errno));
    else if ((size_t)r < n)
      err = cat(what(l, e, p), ": short read (", r, " of ", n, " bytes): the file was truncated or changed since it was loaded");
    std::memset(dst + region_[p] + n, 0, end - region_[p] - n);  // another layer's larger part may have been here
  }
  {
    std::lock_guard<std::mutex> lk(io_mu_);
    if (!err.empty() && io_err_.empty()) io_err_ = err;
    io_pending_--;
  }
  io_cv_.notify_all();
}

void BackendExperts::flush(bool demand) {
  if (queued_.empty()) return;
  std::string err;
  {
    std::unique_lock<std::mutex> lk(io_mu_);
    io_cv_.wait(lk, [&] { return io_pending_ == 0; });
    err.swap(io_err_);
  }
  if (!err.empty()) {
    st_.read_errors++;
    abandon(err);
    if (demand) fail(err);
    return;
  }
  for (const Queued& q : queued_) {
    be_.upload_async(static_cast<uint8_t*>(pool_) + (size_t)q.slot * slot_bytes_, staging_ + (size_t)q.stage * slot_bytes_,
                     copy_bytes_[q.l]);
    be_.mark_uploads(q.stage);
    copied_.push_back(q.slot);
    st_.bytes_read += copy_bytes_[q.l];  // the bytes copied to the backend, as Host's
    st_.experts_read++;
  }
  queued_.clear();
}

void BackendExperts::finish(bool demand) {
  flush(demand);
  for (int slot : copied_) cache_->finish_load(slot, true);  // ordered before every product that reads it (fence_uploads)
  copied_.clear();
}

void BackendExperts::abandon(const std::string& err) {
  {
    std::unique_lock<std::mutex> lk(io_mu_);  // no reader writes a staging slot after this
    io_cv_.wait(lk, [&] { return io_pending_ == 0; });
    io_err_.clear();
  }
  // Failed: unmapped, so the next acquire reads the key again (a copy still in flight into such a slot is ordered
  // before any later copy into it: the same copy lane)
  for (const Queued& q : queued_) cache_->finish_load(q.slot, false, err);
  for (int slot : copied_) cache_->finish_load(slot, false, err);
  queued_.clear();
  copied_.clear();
}

int BackendExperts::group_end(const int32_t* sel, int r0, int T, int k) const {
  std::vector<char> in(E_, 0);  // in the union of rows [r0, r)
  int n = 0, r = r0;
  for (; r < T; r++) {
    int fresh = 0;  // row r's experts not in the union yet (marked now: the group ends here if they do not fit)
    for (int j = 0; j < k; j++) {
      const int32_t e = sel[(size_t)r * k + j];
      if (e >= 0 && e < E_ && !in[e]) in[e] = 1, fresh++;
    }
    if (n + fresh > slots() && r > r0) break;  // one row always fits (slots >= k)
    n += fresh;
  }
  return r;
}

BackendExperts::Pins::Pins(BackendExperts& x, int64_t layer, const int32_t* sel, int off, int n, int32_t* dslot)
    : x_(x) {
  STRATA_CHECK(off >= 0 && n >= 0 && off + n <= x.max_rows_ * x.k_, "backend experts: slots ", off, "..", off + n,
               " exceed the staging of ", x.max_rows_, " rows");
  std::vector<uint32_t> keys;
  for (int i = 0; i < n; i++) {
    const int32_t e = sel[off + i];
    STRATA_CHECK(e >= 0 && e < x.E_, "backend experts: layer ", layer, " routed to expert ", e, " of ", x.E_);
    keys.push_back(x.key(layer, e));
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<ExpertCache::Pin> pins(keys.size());
  x.cache_->acquire(keys.data(), (int)keys.size(), pins.data());  // n <= slots (group_end); nothing else holds pins
  for (size_t i = 0; i < keys.size(); i++) held_.push_back(pins[i].slot);
  size_t h = 0;  // pins before h were handed to copy_in
  try {
    for (; h < keys.size(); h++)
      if (pins[h].load) x.copy_in(layer, (int32_t)(keys[h] - (uint32_t)(layer * x.E_)), pins[h].slot, true);
    x.finish(true);
  } catch (const std::exception& ex) {  // a read failed: every slot still to load Failed, every pin released (the
    x.abandon(ex.what());               // destructor does not run), so that nothing waits on them
    for (; h < keys.size(); h++)
      if (pins[h].load) x.cache_->finish_load(pins[h].slot, false, ex.what());
    for (int s : held_) x.cache_->release(s);
    throw;
  }
  for (int i = 0; i < n; i++) {
    const uint32_t kk = x.key(layer, sel[off + i]);
    x.stage_[off + i] = pins[std::lower_bound(keys.begin(), keys.end(), kk) - keys.begin()].slot;
  }
  x.be_.upload_async(dslot + off, x.stage_ + off, (size_t)n * sizeof(int32_t));
  x.be_.fence_uploads();
}

void BackendExperts::note_window(int64_t l, const int32_t* sel, int n) {
  std::vector<int32_t> uni(sel, sel + n);
  std::sort(uni.begin(), uni.end());
  uni.erase(std::unique(uni.begin(), uni.end()), uni.end());
  st_.union_sum += uni.size();
  st_.union_layers++;
  if (pred_layer_ == l) {  // the predictor against this layer's actual union
    for (int32_t e : uni) st_.pred_hit += std::binary_search(pred_.begin(), pred_.end(), e);
    st_.pred_actual += uni.size();
    pred_layer_ = -1;
  }
}

BackendExperts::Pins::~Pins() {
  for (int s : held_) x_.cache_->release(s);
}

void BackendExperts::prefetch(int64_t l, const int32_t* sel, int n) {
  if (l >= L_) return;
  std::vector<int32_t> uni(sel, sel + n);
  std::sort(uni.begin(), uni.end());
  uni.erase(std::unique(uni.begin(), uni.end()), uni.end());
  // a long prompt window predicts nearly every expert: at most 4 rows' worth of copies a layer
  const size_t cap = (size_t)(4 * k_);
  size_t issued = 0;
  for (int32_t e : uni) {
    if (e < 0 || e >= E_ || issued >= cap) continue;
    const int s = cache_->try_prefetch(key(l, e));
    if (s < 0) continue;
    copy_in(l, e, s, false);  // (File: a read error is counted, not thrown: the demand read of it reports it)
    issued++;
  }
  finish(false);
  st_.pred_size += uni.size();
  pred_layer_ = l;
  pred_.swap(uni);
}

ExpertStats BackendExperts::stats() const {
  ExpertStats s = st_;
  s.from_file = fd_ >= 0;
  s.cache = cache_->counters();
  return s;
}

void BackendExperts::reset_stats() {
  const uint64_t slots = st_.slots, sb = st_.slot_bytes, total = st_.experts_total;
  st_ = {};
  st_.slots = slots;
  st_.slot_bytes = sb;
  st_.experts_total = total;
  cache_->reset_counters();
}

}  // namespace strata
