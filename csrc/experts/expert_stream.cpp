#include "experts/expert_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "gguf/gguf.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "util/common.h"
#include "util/memory.h"
#include "util/threads.h"

namespace strata {

namespace {
constexpr size_t kAlign = 4096;  // O_DIRECT alignment of buffer, offset and length
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
const char* kPartName[3] = {"gate", "up", "down"};

// What the predictor said about each layer, per decoding thread (a session runs its window on one thread).
// The owner is the stream's serial number, not its address: a stream freed and another allocated at the same
// address (a model unloaded, another with more layers loaded on the same thread) would otherwise index the
// old stream's by_layer past its end (found by replaying the gguf fuzz corpus in one process).
struct Predictions {
  uint64_t owner = 0;
  std::vector<std::vector<int32_t>> by_layer;
};
thread_local Predictions t_pred;
std::atomic<uint64_t> g_stream_serial{0};
}  // namespace

int64_t ExpertStream::slot_bytes_for(const HParams& hp, const Weights& w) {
  size_t mx[3] = {0, 0, 0};
  for (const auto& l : w.layers) {
    const ExpertMat* m[3] = {&l.moe.gate_exps, &l.moe.up_exps, &l.moe.down_exps};
    for (int p = 0; p < 3; p++) mx[p] = std::max(mx[p], m[p]->expert_bytes());
  }
  // an expert's part at any offset modulo 4096 fits in round_up(bytes + 4095) bytes of 4096-aligned reads
  int64_t total = 0;
  for (int p = 0; p < 3; p++) total += (int64_t)round_up(mx[p] + kAlign - 1, kAlign);
  return total;
}

ExpertStream::ExpertStream(const GgufFile& f, const HParams& hp, const Weights& w, const ExpertOptions& o)
    : opt_(o), path_(f.path()), serial_(++g_stream_serial), L_(hp.n_layer), E_(hp.n_expert), k_(hp.n_expert_used), H_(hp.n_embd) {
  STRATA_CHECK(o.cache_mib >= 0, "bad option cache_mib=", o.cache_mib, ": must be >= 0 (or -1 / 'full')");
  STRATA_CHECK(o.io_threads >= 1 && o.io_threads <= 64, "bad option io_threads=", o.io_threads, ": must be 1..64");
  STRATA_CHECK(o.protect >= -1 && o.protect <= k_ && o.draft_protect >= -1 && o.draft_protect <= k_,
               "bad option protect=", o.protect, "/draft_protect=", o.draft_protect, ": must be -1..", k_);
  if (opt_.protect < 0) opt_.protect = (int)(k_ / 2);
  if (opt_.draft_protect < 0) opt_.draft_protect = opt_.protect;
  if (opt_.draft_bonus < 0) opt_.draft_bonus = opt_.bonus;

  const int64_t sb = slot_bytes_for(hp, w);
  region_[0] = 0;
  size_t off = 0;
  for (int p = 0; p < 3; p++) {
    region_[p] = off;
    size_t mx = 0;
    for (const auto& l : w.layers) {
      const ExpertMat* m[3] = {&l.moe.gate_exps, &l.moe.up_exps, &l.moe.down_exps};
      mx = std::max(mx, m[p]->expert_bytes());
    }
    off += round_up(mx + kAlign - 1, kAlign);
  }
  const int64_t total = L_ * E_;
  const double want_d = (double)o.cache_mib * (1 << 20) / (double)sb;  // clamped before the cast: no overflow
  const int64_t want = want_d >= (double)total ? total : (int64_t)want_d;
  const int64_t min_mib = (k_ * sb + (1 << 20) - 1) >> 20;
  if (want < k_)
    fail<std::invalid_argument>("bad option cache_mib=", o.cache_mib, ": ", path_, " needs at least ", min_mib,
                                " MiB of expert cache (", k_, " experts of ", sb, " bytes: one row's experts), or 'full'");
  const int n_slots = (int)std::min(want, total);
  // a budget above RAM is refused now, not by the OOM killer once the slots fill
  check_fits_in_memory((uint64_t)n_slots * (uint64_t)sb,
                       cat("bad option cache_mib=", o.cache_mib, ": an expert cache of ", n_slots, " slots of ", sb, " bytes"));

  for (int64_t il = 0; il < L_; il++) {
    const MoeWeights& m = w.layers[il].moe;
    layers_.push_back(&m);
    const ExpertMat* em[3] = {&m.gate_exps, &m.up_exps, &m.down_exps};
    std::array<Part, 3> ps;
    for (int p = 0; p < 3; p++) {
      ps[p].file_off = em[p]->file_offset;
      ps[p].bytes = em[p]->expert_bytes();
      ps[p].view = em[p]->expert(0);
      ps[p].view.data = nullptr;
      ps[p].tensor = cat("blk.", il, ".ffn_", kPartName[p], "_exps.weight");
    }
    parts_.push_back(ps);
  }

  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail<std::invalid_argument>(path_, ": cannot open for expert reads: ", std::strerror(errno));
  if (o.o_direct) {
    dfd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (dfd_ < 0)
      fail<std::invalid_argument>("o_direct: ", path_, " cannot be opened with O_DIRECT (", std::strerror(errno),
                                  "; the filesystem may not support it)");
  }
  struct stat sbuf;
  if (fstat(fd_, &sbuf) != 0) fail<std::invalid_argument>(path_, ": cannot stat: ", std::strerror(errno));
  size_ = (uint64_t)sbuf.st_size;
  ino_ = (uint64_t)sbuf.st_ino;
  dev_ = (uint64_t)sbuf.st_dev;
  mtime_ns_ = (int64_t)sbuf.st_mtim.tv_sec * 1000000000 + sbuf.st_mtim.tv_nsec;
  head_.resize((size_t)std::min<uint64_t>(256, size_));
  if (pread_full(fd_, head_.data(), head_.size(), 0) != (int64_t)head_.size())
    fail<std::invalid_argument>(path_, ": cannot read the header: ", std::strerror(errno));

  cache_ = std::make_unique<ExpertCache>(n_slots, (size_t)sb);
  st_.slots = (uint64_t)n_slots;
  st_.slot_bytes = (uint64_t)sb;
  st_.experts_total = (uint64_t)total;
  io_ = std::make_unique<IoPool>(o.io_threads, [this](const IoPool::Task& t) { load(t); });
}

ExpertStream::~ExpertStream() {
  io_.reset();  // finishes queued reads into the cache before the cache goes
  cache_.reset();
  if (fd_ >= 0) ::close(fd_);
  if (dfd_ >= 0) ::close(dfd_);
}

int ExpertStream::layer_of(const MoeWeights* w) const {
  for (size_t i = 0; i < layers_.size(); i++)
    if (layers_[i] == w) return (int)i;
  return -1;
}

void ExpertStream::views(int layer, int e, int slot, MatView* gate, MatView* up, MatView* down) const {
  MatView* out[3] = {gate, up, down};
  const uint8_t* base = cache_->data(slot);
  for (int p = 0; p < 3; p++) {
    const Part& P = parts_[layer][p];
    const uint64_t off = P.file_off + (uint64_t)e * P.bytes;
    *out[p] = P.view;
    out[p]->data = base + region_[p] + off % kAlign;
  }
}

std::string ExpertStream::what(int layer, int e, int p) const {
  const Part& P = parts_[layer][p];
  const uint64_t off = P.file_off + (uint64_t)e * P.bytes;
  return cat(path_, ": expert ", e, " of layer ", layer, " (tensor '", P.tensor, "', file bytes [", off, ", ",
             off + P.bytes, "))");
}

std::string ExpertStream::changed() const {
  struct stat a, b;
  if (fstat(fd_, &a) != 0) return cat("cannot stat the open file: ", std::strerror(errno));
  const int64_t mt = (int64_t)a.st_mtim.tv_sec * 1000000000 + a.st_mtim.tv_nsec;
  if ((uint64_t)a.st_size != size_) return cat("its size changed from ", size_, " to ", a.st_size, " bytes");
  if (mt != mtime_ns_) return "its modification time changed";
  if (::stat(path_.c_str(), &b) != 0) return cat("the path no longer exists (", std::strerror(errno), ")");
  if ((uint64_t)b.st_ino != ino_ || (uint64_t)b.st_dev != dev_) return "the path now names another file";
  uint8_t h[256];
  if (pread_full(fd_, h, head_.size(), 0) != (int64_t)head_.size() || std::memcmp(h, head_.data(), head_.size()) != 0)
    return "its header bytes changed";
  return "";
}

void ExpertStream::check_file(int layer, int e) const {
  const std::string c = changed();
  if (!c.empty())
    fail(path_, ": the model file changed since it was loaded (", c, "); cannot read expert ", e, " of layer ", layer,
         " (tensor '", parts_[layer][0].tensor, "'). Reload the model.");
}

void ExpertStream::load(const IoPool::Task& t) {
  const int layer = (int)(t.key / (uint32_t)E_), e = (int)(t.key % (uint32_t)E_);
  uint8_t* base = cache_->data(t.slot);
  std::string err;
  uint64_t bytes = 0;
  for (int p = 0; p < 3 && err.empty(); p++) {
    const Part& P = parts_[layer][p];
    const uint64_t off = P.file_off + (uint64_t)e * P.bytes;
    uint64_t roff = off;
    size_t len = P.bytes;
    uint8_t* dst = base + region_[p] + off % kAlign;
    int fd = fd_;
    if (dfd_ >= 0) {  // aligned superset straight into the slot: no bounce buffer
      roff = off / kAlign * kAlign;
      len = round_up(off - roff + P.bytes, kAlign);
      dst = base + region_[p];
      fd = dfd_;
    }
    const size_t need = (size_t)(off - roff) + P.bytes;
    const int64_t r = faults_.pread(fd, dst, len, roff, need);
    if (r < 0) {
      err = cat(what(layer, e, p), ": I/O error: ", std::strerror(errno));
    } else if ((size_t)r < need) {
      const std::string c = changed();
      err = c.empty() ? cat(what(layer, e, p), ": short read (", r, " of ", need, " bytes)")
                      : cat(what(layer, e, p), ": the model file changed since it was loaded (", c, ")");
    }
    if (r > 0) bytes += (uint64_t)r;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    st_.bytes_read += bytes;
    if (err.empty()) st_.experts_read++;
    else st_.read_errors++;
  }
  cache_->finish_load(t.slot, err.empty(), err);
}

ExpertStream::Pins::Pins(ExpertStream& s, int layer, const int32_t* experts, int n)
    : s_(s), layer_(layer), experts_(experts, experts + n), pins_(n), ready_(n, 0) {
  std::vector<uint32_t> keys(n);
  for (int i = 0; i < n; i++) keys[i] = s.key(layer, experts[i]);
  std::vector<uint8_t> res(n);
  // a read batch: refuse to mix bytes of a changed file with what is cached
  bool any_missing = false;
  {
    std::vector<uint8_t> mask((size_t)s.E_);
    s.cache_->resident_mask(s.key(layer, 0), (int)s.E_, mask.data());
    for (int i = 0; i < n && !any_missing; i++) any_missing = !mask[experts[i]];
  }
  if (any_missing) s.check_file(layer, experts[0]);
  s.cache_->acquire(keys.data(), n, pins_.data());
  for (int i = 0; i < n; i++) {
    if (pins_[i].load) {
      s.io_->submit({pins_[i].slot, keys[i]}, true);
      n_pending_++;
    } else if (s.cache_->state(pins_[i].slot) == ExpertCache::Ready) {
      ready_[i] = 1;
    } else {
      s.io_->promote(pins_[i].slot);  // a queued prefetch that this window needs now
      n_pending_++;
    }
  }
}

ExpertStream::Pins::~Pins() {
  for (auto& p : pins_)
    if (p.slot >= 0) s_.cache_->release(p.slot);
}

std::vector<int> ExpertStream::Pins::wait() {
  std::vector<int> idx, slots;
  for (int i = 0; i < (int)pins_.size(); i++)
    if (!ready_[i]) {
      idx.push_back(i);
      slots.push_back(pins_[i].slot);
    }
  std::vector<char> done(slots.size());
  const double w = s_.cache_->wait_some(slots.data(), (int)slots.size(), done.data());
  if (w > 0) {
    std::lock_guard<std::mutex> lk(s_.mu_);
    s_.st_.late_waits++;
    s_.st_.late_wait_s += w;
  }
  std::vector<int> arrived;
  for (size_t j = 0; j < slots.size(); j++) {
    if (!done[j]) continue;
    if (s_.cache_->state(slots[j]) != ExpertCache::Ready) fail(s_.cache_->error(slots[j]));
    ready_[idx[j]] = 1;
    n_pending_--;
    arrived.push_back(idx[j]);
  }
  return arrived;
}

void ExpertStream::prefetch(ThreadPool& pool, int layer, const float* x, int T) {
  if (!opt_.prefetch || layer + 1 >= L_) return;
  const int rows = opt_.prefetch_root_only ? 1 : T;
  const MoeWeights& nw = *layers_[layer + 1];
  thread_local FBuf logits;
  logits.resize((size_t)rows * E_);
  MatView router{reinterpret_cast<const uint8_t*>(nw.gate_inp.data()), GGML_F32, E_, H_, (size_t)H_ * sizeof(float)};
  matmul(pool, router, x, H_, rows, logits.data(), E_);
  // top-k of the logits (the softmax keeps the order), rank by rank over rows: strongest first
  std::vector<std::vector<int32_t>> top(rows);
  std::vector<int32_t> idx(E_);
  for (int t = 0; t < rows; t++) {
    const float* l = logits.data() + (size_t)t * E_;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k_, idx.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    top[t].assign(idx.begin(), idx.begin() + k_);
  }
  std::vector<int32_t> order;
  std::vector<char> seen(E_, 0);
  for (int j = 0; j < k_; j++)
    for (int t = 0; t < rows; t++)
      if (!seen[top[t][j]]) {
        seen[top[t][j]] = 1;
        order.push_back(top[t][j]);
      }
  if (t_pred.owner != serial_) {
    t_pred.owner = serial_;
    t_pred.by_layer.assign(L_, {});
  }
  t_pred.by_layer[layer + 1] = order;
  for (int32_t e : order) {
    const int slot = cache_->try_prefetch(key(layer + 1, e));
    if (slot >= 0) io_->submit({slot, key(layer + 1, e)}, false);
  }
}

void ExpertStream::score_prediction(int layer, const std::vector<int32_t>& uni) {
  if (t_pred.owner != serial_ || t_pred.by_layer[layer].empty()) return;
  std::vector<int32_t>& p = t_pred.by_layer[layer];
  uint64_t hit = 0;
  for (int32_t e : p) hit += std::binary_search(uni.begin(), uni.end(), e) ? 1 : 0;
  std::lock_guard<std::mutex> lk(mu_);
  st_.pred_size += p.size();
  st_.pred_hit += hit;
  st_.pred_actual += uni.size();
  p.clear();
}

void ExpertStream::note_union(int n, int groups) {
  std::lock_guard<std::mutex> lk(mu_);
  st_.union_sum += (uint64_t)n;
  st_.union_layers++;
  if (groups > 1) st_.degraded_groups += (uint64_t)groups;
}

void ExpertStream::note_moce(uint64_t changed, uint64_t rows) {
  std::lock_guard<std::mutex> lk(mu_);
  st_.moce_changed += changed;
  st_.moce_rows += rows;
}

ExpertStats ExpertStream::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  ExpertStats s = st_;
  s.cache = cache_->counters();
  return s;
}

void ExpertStream::reset_stats() {
  std::lock_guard<std::mutex> lk(mu_);
  ExpertStats s;
  s.slots = st_.slots;
  s.slot_bytes = st_.slot_bytes;
  s.experts_total = st_.experts_total;
  st_ = s;
  cache_->reset_counters();
}

void ExpertStream::inject_fault(int kind, int count) { faults_.inject(kind, count); }

}  // namespace strata
