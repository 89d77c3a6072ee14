// Model and Session for Python. Tokens cross as int32 arrays, logits as float32 arrays; the GIL is
// released inside run().
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "model/backend_experts.h"
#include "model/backend_forward.h"
#include "model/ple_table.h"
#include "sampling/logprobs.h"
#include "sampling/token_mask.h"
#include "strata.h"
#include "util/background.h"

namespace nb = nanobind;
using namespace strata;

using I32 = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <class T>
static nb::ndarray<nb::numpy, T> to_numpy(const T* src, std::vector<size_t> shape) {
  size_t n = 1;
  for (auto s : shape) n *= s;
  T* out = new T[n ? n : 1];
  if (n) std::memcpy(out, src, n * sizeof(T));
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return nb::ndarray<nb::numpy, T>(out, shape.size(), shape.data(), owner);
}

// Token masks for `rows` rows handed from Python: None, or a C-contiguous uint32 [rows, ceil(V / 32)] array.
struct MaskRows {
  nb::object keep;  // holds the array alive
  const uint32_t* ptr = nullptr;
  int64_t words = 0;
};
// (out, cands, complete) of a traced finish (Session::sample_traced), as Python lists.
static nb::tuple traced_rows(const Session& s, const std::vector<int32_t>& out) {
  nb::list o, cands, complete;
  for (size_t i = 0; i < out.size(); i++) {
    const PickTrace& tr = s.traces()[i];
    o.append(out[i]);
    if (tr.kind == PickTrace::kOver) {
      cands.append(nb::none());
    } else {
      nb::list ids;
      for (int32_t t : tr.ids) ids.append(t);
      cands.append(ids);
    }
    complete.append(tr.kind == PickTrace::kComplete);
  }
  return nb::make_tuple(o, cands, complete);
}

static MaskRows mask_rows(nb::handle masks, int64_t rows, int64_t V) {
  MaskRows r;
  if (masks.is_none()) return r;
  using M = nb::ndarray<const uint32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
  M a;
  if (!nb::try_cast<M>(masks, a))
    fail<std::invalid_argument>("token masks: expected a C-contiguous uint32 array [", rows, ", ", mask_words(V), "]");
  STRATA_CHECK((int64_t)a.shape(0) == rows && (int64_t)a.shape(1) == mask_words(V), "token masks: shape [", a.shape(0),
               ", ", a.shape(1), "], the window needs [", rows, ", ", mask_words(V), "] (1 bit per token of ", V, ")");
  r.keep = nb::borrow(masks);
  r.ptr = a.data();
  r.words = (int64_t)a.shape(1);
  return r;
}

static FoldMode parse_fold(const std::string& s) {
  if (s == "lazy") return FoldMode::Lazy;
  if (s == "eager") return FoldMode::Eager;
  if (s == "partial") return FoldMode::Partial;
  fail<std::invalid_argument>("bad option fold='", s, "': expected 'lazy', 'eager' or 'partial'");
}
static const char* fold_name(FoldMode f) {
  return f == FoldMode::Lazy ? "lazy" : f == FoldMode::Eager ? "eager" : "partial";
}

static nb::dict config_dict(const HParams& h) {
  nb::dict d;
  d["n_vocab"] = h.n_vocab;
  d["n_embd"] = h.n_embd;
  d["n_layer"] = h.n_layer;
  d["n_ctx_train"] = h.n_ctx_train;
  d["n_head"] = h.n_head;
  d["n_head_kv"] = h.n_head_kv;
  d["head_dim"] = h.head_dim;
  d["n_rot"] = h.n_rot;
  d["rope_theta"] = h.rope_theta;
  d["rms_eps"] = h.rms_eps;
  d["n_expert"] = h.n_expert;
  d["n_expert_used"] = h.n_expert_used;
  d["n_ff_exp"] = h.n_ff_exp;
  d["n_ff_shexp"] = h.n_ff_shexp;
  d["ssm_d_conv"] = h.ssm_d_conv;
  d["ssm_d_state"] = h.ssm_d_state;
  d["ssm_n_group"] = h.ssm_n_group;
  d["ssm_dt_rank"] = h.ssm_dt_rank;
  d["ssm_d_inner"] = h.ssm_d_inner;
  d["full_attention_interval"] = h.full_attn_interval;
  d["n_nextn"] = h.n_nextn;
  d["arch"] = std::string(arch_name(h.arch));
  if (h.arch == Arch::Qwen4Exp) {
    d["hc"] = h.hc;
    d["hc_rank"] = h.hc_rank;
    d["qsa_heads"] = h.qsa.n_head;
    d["qsa_head_dim"] = h.qsa.head_dim;
    d["qsa_budget"] = h.qsa.budget;
    d["qsa_ratio"] = h.qsa.ratio;
    nb::list ratios;
    for (int64_t r : h.qsa_ratio) ratios.append(r);
    d["qsa_ratios"] = ratios;
    d["ple_layer"] = h.ple.layer;
    d["dn_gate"] = std::string(h.dn_gate_sigmoid ? "sigmoid" : "silu");
  }
  nb::list rec;
  for (bool r : h.recurrent) rec.append(r);
  d["recurrent"] = rec;
  return d;
}

static nb::dict expert_stats_dict(const Model& mo) {
  nb::dict d;
  const ExpertStream* es = mo.experts();
  // backend sessions' streaming (model/backend_experts.h): their counters, or the geometry before any session opened
  const bool dev = !es && mo.streams_on_backend();
  d["streaming"] = es != nullptr || dev;
  if (!es && !dev) return d;
  d["where"] = dev ? "backend" : "host";
  ExpertStats s;
  const ExpertOptions& o = es ? es->options() : mo.expert_options();
  if (es) {
    s = es->stats();
  } else if (!backend_expert_stats(&mo, &s)) {
    s.slots = (uint64_t)BackendExperts::slots_for(mo, mo.expert_options().cache_mib);
    s.slot_bytes = (uint64_t)BackendExperts::slot_bytes_for(mo.weights());
    s.experts_total = (uint64_t)(mo.hp().n_layer * mo.hp().n_expert);
    s.from_file = BackendExperts::reads_file(mo, o);  // (a CPU backend's session may still choose the file: its slots)
  }
  const int64_t k = mo.hp().n_expert_used;
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  d["slots"] = s.slots;
  d["slot_bytes"] = s.slot_bytes;
  d["cache_mib"] = (double)s.slots * (double)s.slot_bytes / (1 << 20);
  d["experts_total"] = s.experts_total;
  d["resident_frac"] = ratio((double)s.slots, (double)s.experts_total);
  d["o_direct"] = o.o_direct;
  if (dev) d["source"] = s.from_file ? "file" : "host";  // where the missing experts come from
  d["lookups"] = s.cache.lookups;
  d["hits"] = s.cache.hits;
  d["hits_inflight"] = s.cache.hits_inflight;
  d["sync_misses"] = s.cache.misses;
  d["hit_rate"] = ratio((double)s.cache.hits, (double)s.cache.lookups);
  d["evictions"] = s.cache.evictions;
  d["bytes_read"] = s.bytes_read;
  d["experts_read"] = s.experts_read;
  d["read_errors"] = s.read_errors;
  d["late_waits"] = s.late_waits;
  d["late_wait_s"] = s.late_wait_s;
  d["union_mean"] = ratio((double)s.union_sum, (double)s.union_layers);
  d["union_layers"] = s.union_layers;
  d["degraded_groups"] = s.degraded_groups;
  d["prefetch"] = o.prefetch ? (o.prefetch_root_only ? "root" : "all rows") : "off";
  d["prefetch_issued"] = s.cache.prefetch_issued;
  d["prefetch_used"] = s.cache.prefetch_used;
  d["prefetch_wasted"] = s.cache.prefetch_wasted;
  d["prefetch_precision"] = ratio((double)s.pred_hit, (double)s.pred_size);  // predicted experts the layer used
  d["prefetch_recall"] = ratio((double)s.pred_hit, (double)s.pred_actual);   // used experts that were predicted
  d["routing"] = o.approximate ? "approximate" : "natural";
  if (o.approximate) {
    d["approx_changed_frac"] = ratio((double)s.moce_changed, (double)(s.moce_rows * k));
    d["approx_protect"] = o.protect;
    d["approx_bonus"] = o.bonus;
    d["approx_draft_protect"] = o.draft_protect;
    d["approx_draft_bonus"] = o.draft_bonus;
  }
  return d;
}

// Concurrency test of the cache contract (expert_cache.h): `threads` threads acquire random key sets,
// load what is missing (writing the key into the slot; every `fail_every`-th load fails), verify that every
// pinned slot holds its key before and after a yield, and release; one more thread prefetches. Throws
// std::logic_error on any broken invariant; returns the counters.
static nb::dict cache_stress(int slots, int keys, int threads, int iters, int max_n, int fail_every, uint64_t seed) {
  ExpertCache c(slots, 4096);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> failures_seen{0}, verified{0};
  std::string err;
  std::mutex err_mu;
  auto record = [&](const std::string& e) {
    std::lock_guard<std::mutex> lk(err_mu);
    if (err.empty()) err = e;
    stop = true;
  };
  auto stamp = [&](int slot, uint32_t key) { std::memcpy(c.data(slot), &key, 4); };
  auto holds = [&](int slot, uint32_t key) {
    uint32_t v;
    std::memcpy(&v, c.data(slot), 4);
    return v == key;
  };
  std::atomic<uint64_t> load_no{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(seed * 1000 + id);
    std::vector<uint32_t> ks;
    std::vector<ExpertCache::Pin> pins;
    try {
      for (int it = 0; it < iters && !stop; it++) {
        const int n = 1 + (int)(rng() % (uint64_t)max_n);
        ks.clear();
        while ((int)ks.size() < n) {
          const uint32_t k = (uint32_t)(rng() % (uint64_t)keys);
          if (std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
        }
        pins.assign(n, {});
        c.acquire(ks.data(), n, pins.data());
        for (int i = 0; i < n; i++)
          if (pins[i].load) {
            const bool ok = fail_every <= 0 || (++load_no % (uint64_t)fail_every) != 0;
            if (ok) stamp(pins[i].slot, ks[i]);
            else std::memset(c.data(pins[i].slot), 0xff, 4);  // a half-read slot
            c.finish_load(pins[i].slot, ok, "injected");
          }
        std::vector<int> sl(n);
        for (int i = 0; i < n; i++) sl[i] = pins[i].slot;
        std::vector<char> done(n, 0);
        int left = n;
        std::vector<char> seen(n, 0);
        while (left > 0) {
          c.wait_some(sl.data(), n, done.data());
          for (int i = 0; i < n; i++)
            if (done[i] && !seen[i]) {
              seen[i] = 1;
              left--;
              const auto st = c.state(sl[i]);
              if (st == ExpertCache::Failed) failures_seen++;
              else if (st != ExpertCache::Ready) fail<std::logic_error>("pinned slot ", sl[i], " in state ", (int)st);
              else if (!holds(sl[i], ks[i])) fail<std::logic_error>("slot ", sl[i], " ready for key ", ks[i], " holds other bytes");
            }
        }
        std::this_thread::yield();
        for (int i = 0; i < n; i++)
          if (c.state(sl[i]) == ExpertCache::Ready) {
            if (!holds(sl[i], ks[i])) fail<std::logic_error>("pinned slot ", sl[i], " was overwritten (key ", ks[i], ")");
            verified++;
          }
        for (int i = 0; i < n; i++) c.release(sl[i]);
        if (it % 64 == 0) c.check_invariants();
      }
    } catch (const std::exception& e) {
      record(e.what());
    }
  };
  auto prefetcher = [&] {
    std::mt19937_64 rng(seed);
    try {
      while (!stop) {
        const uint32_t k = (uint32_t)(rng() % (uint64_t)keys);
        const int s = c.try_prefetch(k);
        if (s >= 0) {
          stamp(s, k);
          c.finish_load(s, true);
        }
        std::this_thread::yield();
      }
    } catch (const std::exception& e) {
      record(e.what());
    }
  };
  std::vector<std::thread> ts;
  {
    nb::gil_scoped_release rel;
    std::thread pf(prefetcher);
    for (int i = 0; i < threads; i++) ts.emplace_back(worker, i);
    for (auto& t : ts) t.join();
    stop = true;
    pf.join();
  }
  if (!err.empty()) throw std::logic_error(err);
  c.check_invariants();
  if (c.lru_size() != slots) throw std::logic_error(cat("after all releases ", c.lru_size(), " of ", slots, " slots are evictable"));
  const CacheCounters k = c.counters();
  nb::dict d;
  d["lookups"] = k.lookups;
  d["hits"] = k.hits;
  d["hits_inflight"] = k.hits_inflight;
  d["misses"] = k.misses;
  d["evictions"] = k.evictions;
  d["prefetch_issued"] = k.prefetch_issued;
  d["prefetch_used"] = k.prefetch_used;
  d["load_failures"] = k.load_failures;
  d["failures_seen"] = failures_seen.load();
  d["verified"] = verified.load();
  return d;
}

void init_model(nb::module_& m) {
  m.def(
      "_pool_selftest",
      [](int threads, int64_t n, int64_t throw_at, int64_t align, int regions, bool adaptive, int slow_worker_us,
         int work_us, bool vary) {
        // `regions` parallel regions over [0, n) (vary: over [0, n_r), n_r cycling through n, n/4, n/2, 1, so
        // consecutive regions have different chunk counts): every index visited once per region whoever claims
        // the chunks, chunk bounds multiples of align; an exception in any chunk reaches the caller. Every
        // chunk computes for work_us; a worker's chunk that first sleeps slow_worker_us stands in for a worker
        // whose core another program took. "Bad" chunks: misaligned ones, and any that runs while its region is
        // not the one in progress (a region returned before all of its chunks had finished).
        nb::gil_scoped_release rel;
        ThreadPool pool(threads, adaptive);
        std::vector<int> seen(n, 0);
        std::atomic<int> misaligned{0};
        std::atomic<int> current{-1};
        for (int r = 0; r < regions; r++) {
          const int64_t cycle[4] = {n, n / 4, n / 2, 1};
          const int64_t nr = vary ? std::max<int64_t>(1, cycle[r % 4]) : n;
          current.store(r);
          pool.parallel_for(nr, [&, r, nr](int64_t b, int64_t e, int idx) {
            if (current.load() != r) misaligned++;
            if (b % align != 0 || (e % align != 0 && e != nr)) misaligned++;
            if (idx != 0 && slow_worker_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(slow_worker_us));
            for (Timer tm; tm.seconds() * 1e6 < work_us;) {
            }
            for (int64_t i = b; i < e; i++) {
              if (i == throw_at) throw std::runtime_error(cat("chunk failed at ", i));
              seen[i]++;
            }
            if (current.load() != r) misaligned++;
          }, align);
          current.store(-1);
        }
        const RegionModes::Stats s = pool.stats();
        return std::make_tuple(seen, misaligned.load(), s.serial, s.parallel);
      },
      nb::arg("threads"), nb::arg("n"), nb::arg("throw_at") = -1, nb::arg("align") = 1, nb::arg("regions") = 1,
      nb::arg("adaptive") = false, nb::arg("slow_worker_us") = 0, nb::arg("work_us") = 0, nb::arg("vary") = false,
      "Thread pool self-test (tests only): (visits per index, bad chunks, regions run serially, in parallel).");

  m.def(
      "_pool_linger",
      [](int threads, double linger_us, double idle_us, double wait_s) {
        // tests only. A region of two 2 ms chunks; then, once a worker has gone to sleep (a known start; up to 10 s),
        // linger(linger_us), a second such region and idle_us of the caller's own work: (workers' sleeps from
        // the linger() call to the idle's end, microseconds from the linger() call to the first sleep after it,
        // -1 if none within wait_s).
        nb::gil_scoped_release rel;
        ThreadPool pool(threads);
        const ThreadPool::Fn work = [](int64_t, int64_t, int) {
          for (Timer tm; tm.seconds() < 2e-3;) {
          }
        };
        pool.parallel_for(2, work);
        for (Timer w; pool.sleeps() == 0 && w.seconds() < 10;) std::this_thread::sleep_for(std::chrono::microseconds(100));
        const int64_t s0 = pool.sleeps();
        Timer tm;
        pool.linger(linger_us);
        pool.parallel_for(2, work);
        while (tm.seconds() * 1e6 < idle_us) {
        }
        const int64_t during = pool.sleeps() - s0;
        while (pool.sleeps() == s0 && tm.seconds() < wait_s) std::this_thread::sleep_for(std::chrono::microseconds(100));
        return std::make_tuple(during, pool.sleeps() > s0 ? tm.seconds() * 1e6 : -1.0);
      },
      nb::arg("threads"), nb::arg("linger_us"), nb::arg("idle_us"), nb::arg("wait_s") = 5.0,
      "ThreadPool::linger (tests only): (workers' sleeps while lingering, us to the first sleep or -1).");

  m.def(
      "_region_modes_sim",
      [](const std::vector<std::tuple<uint64_t, double, double>>& regions) {
        // The adaptive mode's choice on synthetic walls (tests only, nothing is timed): for each region
        // (kind, parallel us, serial us), ask which way it runs and record the wall of that way.
        RegionModes modes;
        std::vector<bool> serial;
        serial.reserve(regions.size());
        for (const auto& [k, par_us, ser_us] : regions) {
          const bool s = modes.serial(k);
          modes.record(k, s, s ? ser_us : par_us);
          serial.push_back(s);
        }
        const RegionModes::Stats st = modes.stats();
        return std::make_tuple(serial, st.tried, st.blocks);
      },
      nb::arg("regions"),
      "RegionModes on synthetic walls (tests only): (serial chosen per region, regions in tried blocks, blocks).");

  m.def(
      "_pool_told",
      [](int threads, int64_t n, double parallel_us, double serial_us, int told, int regions, bool wide,
         double chunk_us) {
        // An adaptive pool told, through `told` regions' walls fed to its RegionModes, that one kind of
        // region costs parallel_us in parallel and serial_us serially; then `regions` real regions of that
        // kind (tests only): (chunks run by workers, regions run serially, in parallel, both counted after
        // the telling). wide: the regions run inside a ThreadPool::Wide scope; chunk_us: each chunk spins this long.
        nb::gil_scoped_release rel;
        ThreadPool pool(threads, true);
        std::atomic<int64_t> by_workers{0};
        const ThreadPool::Fn fn = [&](int64_t b, int64_t e, int idx) {
          if (idx != 0) by_workers++;
          const auto t0 = std::chrono::steady_clock::now();
          while (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() < chunk_us) {
          }
        };
        const uint64_t kind = RegionModes::key(fn.target_type().hash_code(), n, 1, 0);
        for (int i = 0; i < told; i++) {
          const bool s = pool.modes().serial(kind);
          pool.modes().record(kind, s, s ? serial_us : parallel_us);
        }
        const RegionModes::Stats s0 = pool.stats();
        {
          const ThreadPool::Wide scope(pool, wide);
          for (int r = 0; r < regions; r++) pool.parallel_for(n, fn);
        }
        const RegionModes::Stats s = pool.stats();
        return std::make_tuple(by_workers.load(), s.serial - s0.serial, s.parallel - s0.parallel);
      },
      nb::arg("threads"), nb::arg("n"), nb::arg("parallel_us"), nb::arg("serial_us"), nb::arg("told"),
      nb::arg("regions"), nb::arg("wide") = false, nb::arg("chunk_us") = 0.0,
      "An adaptive pool told which way a region kind is faster (tests only): (worker chunks, serial, parallel).");

  m.def("backend_expert_staging_cap", &BackendExperts::set_staging_cap, nb::arg("slots"),
        "Tests: the staging ring of backend expert streams from the file made later has at most this many slots (0: the\n"
        "default), so that small models wrap it within one window.");
  m.def("expert_cache_stress", &cache_stress, nb::arg("slots"), nb::arg("keys"), nb::arg("threads"), nb::arg("iters"),
        nb::arg("max_n"), nb::arg("fail_every") = 0, nb::arg("seed") = 1,
        "Test: many threads acquire/load/verify/release on an ExpertCache; throws on a broken invariant.");
  nb::class_<Model>(m, "Model")
      .def_static(
          "load",
          [](const std::string& path, int threads, const std::string& mtp_path, int64_t cache_mib, bool o_direct,
             int io_threads, bool prefetch, bool prefetch_root_only, bool approximate, int protect, float bonus,
             int draft_protect, float draft_bonus, int64_t ple_map_mib, bool dense_attention, bool device_experts,
             int expert_source) {
            ModelOptions o;
            o.threads = threads;
            o.mtp_path = mtp_path;
            o.ple_map_mib = ple_map_mib;
            o.dense_attention = dense_attention;
            ExpertOptions& e = o.experts;
            e.cache_mib = cache_mib;
            e.o_direct = o_direct;
            e.io_threads = io_threads;
            e.prefetch = prefetch;
            e.prefetch_root_only = prefetch_root_only;
            e.approximate = approximate;
            e.protect = protect;
            e.bonus = bonus;
            e.draft_protect = draft_protect;
            e.draft_bonus = draft_bonus;
            e.device = device_experts;
            STRATA_CHECK(expert_source >= 0 && expert_source <= 2, "bad option expert_source=", expert_source,
                         ": expected 0 (auto), 1 (host) or 2 (file)");
            e.source = (ExpertOptions::Source)expert_source;
            nb::gil_scoped_release rel;
            return Model::load(path, o);
          },
          nb::arg("path"), nb::arg("threads") = 0, nb::arg("mtp_path") = "", nb::arg("cache_mib") = -1,
          nb::arg("o_direct") = false, nb::arg("io_threads") = 4, nb::arg("prefetch") = true,
          nb::arg("prefetch_root_only") = false, nb::arg("approximate") = false, nb::arg("protect") = -1,
          nb::arg("bonus") = 0.85f, nb::arg("draft_protect") = -1, nb::arg("draft_bonus") = -1.f,
          nb::arg("ple_map_mib") = 4096, nb::arg("dense_attention") = false, nb::arg("device_experts") = false,
          nb::arg("expert_source") = 0,
          "Open, validate and map a qwen3next / qwen35moe / qwen4exp GGUF (and optionally a separate MTP-only GGUF). cache_mib >= 0\n"
          "streams experts through a cache of that size (-1: all resident); see csrc/experts/expert_stream.h. device_experts:\n"
          "cache_mib is the budget of backend sessions' memory instead (csrc/model/backend_experts.h); expert_source: where\n"
          "their missing experts are copied from: 0 auto, 1 pinned host memory, 2 the file.")
      .def_prop_ro("config", [](const Model& mo) { return config_dict(mo.hp()); })
      .def_prop_ro("threads", &Model::threads)
      .def_prop_ro("pool_sleeps", [](const Model& m) { return m.pool().sleeps(); },
                   "Times a worker of the thread pool went to sleep (benches: wake-ups between regions).")
      .def(
          "pool_stats",
          [](const Model& m) {
            const RegionModes::Stats s = m.pool().stats();
            nb::dict d;
            d["adaptive"] = m.pool().adaptive();
            d["parallel_regions"] = s.parallel;
            d["serial_regions"] = s.serial;
            d["tried"] = s.tried;
            d["kinds"] = s.kinds;
            d["blocks"] = s.blocks;
            nb::list scores;  // per size class (util/region_modes.h): (parallel, serial), -1 before measured
            for (int c = 0; c < RegionModes::kClasses; c++) {
              double par, ser;
              m.pool().scores(c, &par, &ser);
              scores.append(nb::make_tuple(par, ser));
            }
            d["scores"] = scores;
            return d;
          },
          "The thread pool's adaptive mode (util/region_modes.h): regions run in parallel and on the caller alone,\n"
          "of which in blocks run the way that scored slower (to keep its score current), kinds of region seen, blocks\n"
          "measured, and each size class's scores (parallel, serial; lower is faster, -1 before measured).")
      .def_prop_ro("fingerprint", &Model::fingerprint)
      .def_prop_ro("path", [](const Model& mo) { return mo.file().path(); })
      .def_prop_ro("has_mtp", [](const Model& mo) { return mo.weights().mtp.present; })
      .def_prop_ro("dn_layout", [](const Model& mo) {
        for (const auto& l : mo.weights().layers)
          if (l.recurrent)
            return std::string(l.dn.layout == DnLayout::Legacy ? "legacy" : l.dn.layout == DnLayout::Split ? "split" : "current");
        return std::string("none");
      })
      .def("summary", [](const Model& mo) { return mo.hp().summary(); })
      .def_prop_ro("ple_pread", [](const Model& mo) { return mo.ple_table() && mo.ple_table()->uses_pread(); },
                   "True when the PLE table is read by pread (larger than ple_map_mib) rather than the mapping.")
      .def("expert_stats", &expert_stats_dict, "Expert streaming counters since load or the last reset.")
      .def("reset_expert_stats", [](const Model& mo) {
        if (mo.experts()) mo.experts()->reset_stats();
        ExpertStats unused;
        backend_expert_stats(&mo, &unused, /*reset=*/true);
      })
      .def_prop_ro("streaming", [](const Model& mo) {
        return mo.experts() != nullptr || mo.streams_on_backend();
      })
      .def(
          "_inject_io_fault",
          [](const Model& mo, int kind, int count) {
            if (mo.experts()) return mo.experts()->inject_fault(kind, count);
            if (mo.streams_on_backend() && backend_expert_fault(&mo, kind, count)) return;
            throw std::invalid_argument("_inject_io_fault: this model does not read experts from its file (no cache_mib, "
                                        "or a backend session whose experts come from pinned host memory, or none open)");
          },
          nb::arg("kind"), nb::arg("count") = 1,
          "Test hook: the next `count` expert reads fail (kind 1: short read, 2: EIO, 0: clear); with backend streaming,\n"
          "of the open backend sessions reading from the file.")
      .def(
          "_touch_mapping",
          [](const Model& mo) {
            // reads one byte of every page of every tensor through the mapping, then checks the file
            const GgufFile& f = mo.file();
            uint64_t sum = 0;
            {
              nb::gil_scoped_release rel;
              for (const auto& t : f.tensors())
                for (uint64_t o = 0; o < t.nbytes; o += 4096) sum += ((const volatile uint8_t*)t.data)[o];
            }
            mo.check_files();
            return sum;
          },
          "Test hook for the truncation guard (gguf/map_guard.h): touches every mapped tensor page, then "
          "check_files(); a truncated file raises RuntimeError instead of SIGBUS.");

  m.def(
      "_inject_checkpoint_fault",
      [](int err, uint64_t after_bytes, int op) { checkpoint_inject_fault(err, after_bytes, op); },
      nb::arg("err"), nb::arg("after_bytes") = 0, nb::arg("op") = 0,
      "Test hook: the next checkpoint save fails with errno `err` after `after_bytes` bytes (op 0) or at fsync "
      "(op 1); err = 0 clears.");
  m.def(
      "_checkpoint_reseal",
      [](nb::bytes b) {
        std::string s(b.c_str(), b.size());
        checkpoint_reseal(reinterpret_cast<uint8_t*>(s.data()), s.size());
        return nb::bytes(s.data(), s.size());
      },
      nb::arg("data"), "Test/fuzz hook: the checkpoint image with its checksums recomputed (state/checkpoint_file.h).");
  m.def(
      "session_state_bytes",
      [](const Model& mo, int64_t n_ctx, int max_window, bool mtp) {
        SessionOptions o;
        o.n_ctx = n_ctx;
        o.max_window = max_window;
        o.mtp = mtp;
        return Session::state_bytes(mo.hp(), o);
      },
      nb::arg("model"), nb::arg("n_ctx"), nb::arg("max_window") = 8, nb::arg("mtp") = false,
      "Bytes of state a session with these options allocates (checked against RAM before it does).");
  nb::class_<Checkpoint>(m, "Checkpoint")
      .def_prop_ro("position", [](const Checkpoint& c) { return c.position; })
      .def_prop_ro("steer_origin", [](const Checkpoint& c) { return c.steer_origin; })
      .def_prop_ro("nbytes", &Checkpoint::nbytes, "Bytes of state held (what a prefix cache budgets).");

  nb::class_<BackendHold>(m, "BackendHold",
                          "Keeps a model's copy on a backend ('cuda', 'cpu-backend') alive between sessions: weights, "
                          "expert cache, the last closed session's buffers and recorded steps (backend_forward.h).")
      .def(
          "__init__",
          [](BackendHold* h, std::shared_ptr<Model> model, const std::string& backend) {
            if (!is_backend_name(backend) || backend == "cpu")
              fail<std::invalid_argument>("bad option backend='", backend, "': expected 'cuda' or 'cpu-backend'");
            nb::gil_scoped_release rel;
            new (h) BackendHold(model, backend);
          },
          nb::arg("model"), nb::arg("backend"));
  m.def("adopted_backend_sessions", &adopted_backend_sessions,
        "How many backend sessions took over a closed session's buffers and recorded steps.");

  nb::class_<Session>(m, "Session")
      .def(
          "__init__",
          [](Session* s, std::shared_ptr<Model> model, int64_t n_ctx, int max_window, const std::string& fold, bool mtp,
             const std::string& prefill, const std::string& backend) {
            SessionOptions o;
            o.backend = backend;
            o.mtp = mtp;
            if (prefill != "chunked" && prefill != "serial")
              fail<std::invalid_argument>("bad option prefill='", prefill, "': expected 'chunked' or 'serial'");
            o.chunked_prefill = prefill == "chunked";
            o.n_ctx = n_ctx;
            o.max_window = max_window;
            o.fold = parse_fold(fold);
            new (s) Session(model, o);
          },
          nb::arg("model"), nb::arg("n_ctx") = 4096, nb::arg("max_window") = 8, nb::arg("fold") = "lazy",
          nb::arg("mtp") = false, nb::arg("prefill") = "serial", nb::arg("backend") = "cpu")
      .def_prop_ro("backend", [](const Session& s) { return s.options().backend; })
      .def_prop_ro("backend_name", &Session::backend_name)
      .def_prop_ro("position", &Session::position)
      .def_prop_ro("n_ctx", &Session::n_ctx)
      .def_prop_ro("max_window", [](const Session& s) { return s.options().max_window; })
      .def_prop_ro("fold", [](const Session& s) { return std::string(fold_name(s.options().fold)); })
      .def_prop_ro("prefill", [](const Session& s) { return std::string(s.options().chunked_prefill ? "chunked" : "serial"); })
      .def_prop_ro("tokens", [](const Session& s) { return s.tokens(); })
      .def_prop_ro("pending_commit", &Session::pending_commit)
      .def_prop_ro("pending_fold", &Session::pending_fold)
      .def_prop_ro("last_fold_seconds", &Session::last_fold_seconds)
      .def(
          "run",
          [](Session& s, I32 tokens, bool last_only) {
            const int T = (int)tokens.shape(0);
            {
              nb::gil_scoped_release rel;
              s.run(tokens.data(), T, last_only);
            }
            const size_t rows = last_only ? 1 : (size_t)T;
            return to_numpy<float>(s.logits(), {rows, (size_t)s.logits_cols()});
          },
          nb::arg("tokens"), nb::arg("last_only") = false)
      .def("hidden", [](const Session& s) { return to_numpy<float>(s.hidden(), {(size_t)s.hidden_rows(), (size_t)s.hidden_cols()}); })
      .def(
          "mtp_draft",
          [](Session& s, int32_t root, int k, int64_t max_backlog) {
            std::vector<int32_t> d;
            {
              nb::gil_scoped_release rel;
              d = s.mtp_draft(root, k, max_backlog);
            }
            return d;
          },
          nb::arg("root"), nb::arg("k"), nb::arg("max_backlog") = -1,
          "After commit: k greedy drafts from the MTP block (see strata.h).")
      .def(
          "mtp_prefill",
          [](Session& s) {
            nb::gil_scoped_release rel;
            s.mtp_prefill();
          },
          "At prefill: feed the MTP block the committed rows whose next token is known (see strata.h).")
      .def_prop_ro("mtp_position", &Session::mtp_position)
      .def_prop_ro("cold_steps", &Session::cold_steps,
                   "Steps that ran cold (unrecorded first sight, or recording) on a backend that records them.")
      .def("mtp_logits", [](const Session& s) {
        const std::vector<float> l = s.mtp_logits();
        const size_t V = (size_t)s.logits_cols();
        return to_numpy<float>(l.data(), {l.size() / V, V});
      }, "Logits of each draft step of the last mtp_draft [k, n_vocab] (for tests).")
      .def_prop_ro("mtp", [](const Session& s) { return s.options().mtp; })
      .def(
          "sample",
          [](const Session& s, const SamplingParams& p, nb::object masks, bool verified_prefix) {
            MaskRows mr = mask_rows(masks, s.logits_rows(), s.logits_cols());
            std::vector<int32_t> out;
            {
              nb::gil_scoped_release rel;
              out = s.sample(p, mr.ptr, mr.words, verified_prefix);
            }
            return to_numpy<int32_t>(out.data(), {out.size()});
          },
          nb::arg("params"), nb::arg("masks").none() = nb::none(), nb::arg("verified_prefix") = false,
          "Finish the last run: int32 [rows]. masks: uint32 [rows, ceil(n_vocab / 32)] token masks (1 = allowed) or None.\n"
          "verified_prefix: only the rows up to the first whose token is not the next input (run_sample's).")
      .def(
          "run_sample",
          [](Session& s, I32 tokens, const SamplingParams& p, nb::object masks, double linger_us, bool verified_prefix) {
            // one crossing per window: run + finish, logits stay in C++. masks may be a callable returning the
            // window's token masks: it runs on a helper thread (holding the GIL) while the forward runs here.
            const int T = (int)tokens.shape(0);
            std::vector<int32_t> out;
            if (!masks.is_none() && PyCallable_Check(masks.ptr())) {
              thread_local Background helper;  // one per calling thread, reused every window
              nb::object got;
              std::string err;
              {
                nb::gil_scoped_release rel;
                helper.start([&] {
                  nb::gil_scoped_acquire gil;
                  try {
                    got = masks();
                  } catch (const std::exception& e) {
                    err = e.what();
                  }
                });
                try {
                  s.run(tokens.data(), T, false);
                } catch (...) {
                  helper.wait();
                  throw;
                }
                if (linger_us > 0) s.model().pool().linger(linger_us);
                helper.wait();
              }
              if (!err.empty())  // the window stays uncommitted: restore() or commit() it
                throw std::runtime_error("token mask computation failed: " + err);
              MaskRows mr = mask_rows(got, T, s.logits_cols());
              nb::gil_scoped_release rel;
              out = s.sample(p, mr.ptr, mr.words, verified_prefix);
            } else {
              MaskRows mr = mask_rows(masks, T, s.logits_cols());
              nb::gil_scoped_release rel;
              s.run(tokens.data(), T, false);
              if (linger_us > 0) s.model().pool().linger(linger_us);
              out = s.sample(p, mr.ptr, mr.words, verified_prefix);
            }
            return to_numpy<int32_t>(out.data(), {out.size()});
          },
          nb::arg("tokens"), nb::arg("params"), nb::arg("masks").none() = nb::none(), nb::arg("linger_us") = 0.0,
          nb::arg("verified_prefix") = false,
          "run(tokens) then sample(params, masks); returns the chosen token per row. masks: None, uint32\n"
          "[T, ceil(n_vocab / 32)], or a callable returning them (computed while the forward runs).\n"
          "linger_us: the caller's next window comes within about this many microseconds of the forward's end\n"
          "(ThreadPool::linger: the workers keep polling until then rather than sleep); only timing changes.\n"
          "verified_prefix: only the rows up to the first whose token is not the next input (the rows a\n"
          "speculative window keeps; the same tokens as when every row is finished).")
      .def(
          "run_sample_traced",
          [](Session& s, I32 tokens, const SamplingParams& p, int cap, double linger_us) {
            // lazy grammar masks: run + an unmasked finish that records each row's candidates (sampler.h PickTrace)
            std::vector<int32_t> out;
            {
              nb::gil_scoped_release rel;
              s.run(tokens.data(), (int)tokens.shape(0), false);
              if (linger_us > 0) s.model().pool().linger(linger_us);
              out = s.sample_traced(p, cap);
            }
            return traced_rows(s, out);
          },
          nb::arg("tokens"), nb::arg("params"), nb::arg("cap"), nb::arg("linger_us") = 0.0,
          "run(tokens), then finish every row without masks: (out, cands, complete), lists per row. cands[i]:\n"
          "the row's candidates in the sampler's order (cands[i][0] its best token), or None when there are more\n"
          "than cap; complete[i]: any mask allowing cands[i][0] gives repick(i, its bits of cands[i]); otherwise\n"
          "the row's choice stands under a mask allowing all of cands[i], and needs its full mask if not.\n"
          "linger_us: as in run_sample.")
      .def(
          "sample_traced",
          [](Session& s, const SamplingParams& p, int cap) {
            std::vector<int32_t> out;
            {
              nb::gil_scoped_release rel;
              out = s.sample_traced(p, cap);
            }
            return traced_rows(s, out);
          },
          nb::arg("params"), nb::arg("cap"), "The finish of run_sample_traced, for the last run.")
      .def(
          "repick",
          [](const Session& s, int row, nb::bytes allowed) {
            return s.repick(row, reinterpret_cast<const uint8_t*>(allowed.c_str()), (int64_t)allowed.size());
          },
          nb::arg("row"), nb::arg("allowed"),
          "Row `row` of the last traced finish under a mask allowing cands[row][j] where allowed[j] != 0 (bytes;\n"
          "complete rows, allowed[0] set): the token sample() gives with such a mask.")
      .def(
          "sample_row",
          [](const Session& s, const SamplingParams& p, int row, nb::object mask) {
            using M = nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
            M a;
            if (!nb::try_cast<M>(mask, a)) fail<std::invalid_argument>("sample_row: the mask must be a uint32 array");
            nb::gil_scoped_release rel;
            return s.sample_row(p, row, a.data(), (int64_t)a.shape(0));
          },
          nb::arg("params"), nb::arg("row"), nb::arg("mask"),
          "Row `row` of the last run finished again with this token mask (uint32 [ceil(n_vocab / 32)]).")
      .def(
          "set_steering",
          [](Session& s, std::shared_ptr<Steering> steer, int64_t origin) { s.set_steering(steer, origin); },
          nb::arg("steering").none(), nb::arg("origin"),
          "The processors of the generation whose first output token is at `origin` (None: none); the state is\n"
          "rebuilt from the committed tokens [origin, position) (csrc/sampling/processor.h).")
      .def_prop_ro("steer_origin", &Session::steer_origin)
      .def_prop_ro("steer_state", [](const Session& s) {
        const PhraseState st = s.steer_state();
        return std::make_pair(st.node, (int)st.boundary);
      })
      .def(
          "logprobs",
          [](const Session& s, I32 tokens, int top_n) {
            // rows 0..n-1 of the last run's logits (raw): log-probability of tokens[i] and the top_n alternatives
            const size_t n = tokens.shape(0), V = (size_t)s.logits_cols();
            STRATA_CHECK((int64_t)n <= s.logits_rows(), "logprobs(): ", n, " tokens but the last run kept logits of ",
                         s.logits_rows(), " rows");
            std::vector<float> lp(n), top_lp(n * (size_t)std::max(top_n, 0));
            std::vector<int32_t> top_ids(top_lp.size());
            token_logprobs(s.logits(), (int64_t)n, (int64_t)V, tokens.data(), top_n, lp.data(), top_ids.data(),
                           top_lp.data());
            const size_t k = (size_t)std::max(top_n, 0);
            return nb::make_tuple(to_numpy<float>(lp.data(), {n}), to_numpy<int32_t>(top_ids.data(), {n, k}),
                                  to_numpy<float>(top_lp.data(), {n, k}));
          },
          nb::arg("tokens"), nb::arg("top_n") = 0,
          "Log-probabilities of tokens[i] under row i of the last run's raw logits, and the top_n most likely\n"
          "ids per row with theirs (csrc/sampling/logprobs.h). Valid after commit until the next run.")
      .def("commit", &Session::commit, nb::arg("keep"))
      .def("flush", &Session::flush)
      .def("reset", &Session::reset)
      .def("checkpoint", &Session::checkpoint)
      .def("restore", &Session::restore, nb::arg("checkpoint"))
      .def("save", &Session::save, nb::arg("path"))
      .def("load", &Session::load, nb::arg("path"))
      .def("record_qsa", &Session::record_qsa, nb::arg("on"),
           "Tests: record the selected QSA blocks of every later run (qsa_selected()).")
      .def("qsa_selected", &Session::qsa_selected,
           "{layer: [row: sorted selected block ids, empty for a dense row]} of the last run (after record_qsa).")
      .def("export_state", [](Session& s) {
        nb::dict d;
        for (auto& [k, v] : s.export_state()) d[nb::str(k.data(), k.size())] = to_numpy<float>(v.data(), {v.size()});
        return d;
      });
}
