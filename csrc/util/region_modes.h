// Which way the adaptive thread pool (util/threads.h) runs its parallel regions: on the pool's threads, or on
// the calling thread alone. Both ways are measured, wall against wall, in blocks of consecutive regions run
// the same way; the faster way is kept and the other is tried now and then, one block at a time, so that both
// measurements follow the machine's load. Results never depend on the choice (the chunk bounds are the same
// either way).
//
//   1. A kind of region is a call site, size, alignment and a caller's tag (e.g. the token count): regions of
//      one kind cost alike. Each kind keeps its typical wall time `ref`: a moving median (a stall moves it
//      no more than any other region) of its serial walls, of its parallel walls until it has run serially,
//      so that a kind's ref and class do not follow the way it runs.
//   2. Kinds are grouped in classes by ref (factors of 4: ~1, 4, 16 ... us), and each class decides on its own:
//      a decode step's small regions and a prompt window's large ones can want different ways.
//   3. A class runs a block in one way until its regions' walls add up to kBlockUs. A way's score is
//      sum(wall) / sum(ref) over the regions of its blocks (older blocks decayed, see kMemoryUs):
//      the cost relative to the kinds' typical costs, so that blocks of different kinds compare, and
//      weighted by time, so that a block cut short by one stalled region counts as its time, not as a block.
//   4. The next block runs the way with the lower score, or, with a probability within [kTryMin, kTryMax],
//      the other way for a short block (kShortBlock of the length): a tried block costs at most its length x
//      (1 - 1 / gap) (gap = higher / lower score), so the probability is set for ~kTryCost of the time. A
//      tried block weighs at least as much as its way's older sums, which date from before the way lost its
//      turn. Each way first runs kWarmup blocks, the first a short one (the warm-up costs a fresh process
//      little), and a class tries at kTryMax until it has kYoungBlocks blocks.
//
// Why blocks and not single regions: with another program on a core, a region's typical (median) wall is the
// same both ways; what differs is how often a descheduled thread stalls it for a time slice (milliseconds
// against tens of microseconds), so a decision needs the mean over many regions; and a region run in parallel
// among regions run serially finds the workers asleep, which a block of them does not (docs/BENCHMARKS.md,
// issue 17).
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

class RegionModes {
 public:
  static constexpr int kSlots = 512;           // kinds remembered (direct-mapped by key; a collision re-learns)
  static constexpr int kClasses = 8;           // ref < 4 us, < 16 us, ..., >= 16 ms
  static constexpr double kBlockUs = 8000;     // a block's regions' walls add up to at least this,
  static constexpr double kShortBlock = 0.25;  // a tried block's and a class's first each way: this share
  static constexpr int kWarmup = 1;            // blocks run each way before the scores choose
  static constexpr double kMemoryUs = 131072; // a way's sums decay by exp(-ref / kMemoryUs) at each block
  static constexpr double kRefStep = 0.05;     // a region moves its kind's log ref by this (a moving median)
  static constexpr double kTryCost = 0.01;     // of the time, spent on tried blocks of the slower way
  static constexpr double kTryMin = 1.0 / 16, kTryMax = 0.25;  // of the blocks, tried
  static constexpr int kYoungBlocks = 16;      // a class with fewer blocks tries at kTryMax

  RegionModes();
  // The kind of a region: call site (the job's type), size, alignment and the caller's tag.
  static uint64_t key(uint64_t site, int64_t n, int64_t align, int64_t tag);
  // Whether the next region of this kind runs on the caller alone.
  bool serial(uint64_t key);
  // The wall time of the region of this kind just run, and which way it ran.
  void record(uint64_t key, bool serial, double wall_us);

  struct Stats {
    int64_t parallel = 0, serial = 0;  // regions run each way
    int64_t tried = 0;                 // of which, in blocks of the way whose score was higher
    int64_t kinds = 0;                 // kinds of region seen (slots taken, re-learnt collisions included)
    int64_t blocks = 0;                // blocks measured
  };
  Stats stats() const { return stats_; }
  // A class's scores (-1 before its first block of that way), for tests and benches.
  void scores(int cls, double* parallel, double* serial) const;
  static int class_of(double ref_us);

 private:
  struct Kind {
    uint64_t key = 0;
    bool used = false;
    double log_ref[2] = {0, 0};  // natural log of the typical wall in us, [0] parallel, [1] serial
    int64_t n[2] = {0, 0};       // regions measured each way
    double ref() const;
  };
  struct Class {
    bool serial = false;  // the way of the block in progress
    bool tried = false;   // the block in progress runs the way with the higher score
    double wall = 0, ref = 0;  // the block in progress: sums over its regions
    double sum_wall[2] = {0, 0}, sum_ref[2] = {0, 0};  // over its blocks each way, older blocks decayed
    double score[2] = {0, 0};  // sum_wall / sum_ref: [0] parallel, [1] serial
    int64_t blocks[2] = {0, 0};
  };
  Kind& kind(uint64_t key);
  void next_block(Class& c);
  double uniform();  // [0, 1), a fixed xorshift sequence (the choices are reproducible from the walls)
  std::vector<Kind> kinds_;
  Class classes_[kClasses];
  uint64_t rng_ = 0x9E3779B97F4A7C15ull;
  Stats stats_;
};

}  // namespace strata
