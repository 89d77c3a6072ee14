#include "util/region_modes.h"

#include <algorithm>
#include <cmath>

namespace strata {

namespace {
inline uint64_t mix(uint64_t h, uint64_t v) {  // splitmix64 step over h ^ v
  uint64_t z = (h ^ v) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr double kMinWallUs = 0.05;  // walls below this (a clock tick) count as this in the logs
}  // namespace

RegionModes::RegionModes() : kinds_(kSlots) {}

uint64_t RegionModes::key(uint64_t site, int64_t n, int64_t align, int64_t tag) {
  return mix(mix(mix(mix(0, site), (uint64_t)n), (uint64_t)align), (uint64_t)tag);
}

int RegionModes::class_of(double ref_us) {
  if (!(ref_us >= 4)) return 0;
  const int c = (int)(std::log(ref_us) / std::log(4.0));  // ref in [4^c, 4^(c+1))
  return std::min(c, kClasses - 1);
}

RegionModes::Kind& RegionModes::kind(uint64_t key) {
  Kind& k = kinds_[key % kSlots];
  if (!k.used || k.key != key) {
    k = Kind{};
    k.key = key;
    k.used = true;
    stats_.kinds++;
  }
  return k;
}

double RegionModes::Kind::ref() const { return std::exp(n[1] ? log_ref[1] : log_ref[0]); }

double RegionModes::uniform() {
  rng_ ^= rng_ << 13;
  rng_ ^= rng_ >> 7;
  rng_ ^= rng_ << 17;
  return (double)(rng_ >> 11) * (1.0 / 9007199254740992.0);
}

bool RegionModes::serial(uint64_t key) {
  const Kind& k = kind(key);
  if (k.n[0] + k.n[1] == 0) {  // no ref yet, so no class: its first region runs in parallel, outside any block
    stats_.parallel++;
    return false;
  }
  const Class& c = classes_[class_of(k.ref())];
  (c.serial ? stats_.serial : stats_.parallel)++;
  stats_.tried += c.tried;
  return c.serial;
}

void RegionModes::next_block(Class& c) {
  c.wall = c.ref = 0;
  c.tried = false;
  if (c.blocks[0] < kWarmup || c.blocks[1] < kWarmup) {
    c.serial = c.blocks[1] < c.blocks[0];  // alternate, parallel first
    return;
  }
  const bool faster_serial = c.score[1] < c.score[0];
  const double lo = std::min(c.score[0], c.score[1]), hi = std::max(c.score[0], c.score[1]);
  const double gap = lo > 0 ? hi / lo : 1e9;
  // a tried block costs at most its (short) length x (1 - 1/gap), whatever the gap
  // a young class's scores rest on few blocks (whose first ones may have paged the weights in): it tries more
  const double lo_p = c.blocks[0] + c.blocks[1] < kYoungBlocks ? kTryMax : kTryMin;
  const double p = gap > 1 ? std::clamp(kTryCost / (kShortBlock * (1 - 1 / gap)), lo_p, kTryMax) : kTryMax;
  c.tried = uniform() < p;
  c.serial = faster_serial != c.tried;
}

void RegionModes::record(uint64_t key, bool serial, double wall_us) {
  Kind& k = kind(key);
  const double lw = std::log(std::max(wall_us, kMinWallUs));
  const int m = serial ? 1 : 0;
  const bool fresh = k.n[0] + k.n[1] == 0;
  const double ref = fresh ? 0 : k.ref();  // the class this region ran in chose its way by this ref
  // a moving median in log space: each region moves it by kRefStep towards its wall, a stall no further
  k.log_ref[m] = k.n[m] == 0 ? lw : k.log_ref[m] + (lw > k.log_ref[m] ? kRefStep : -kRefStep);
  k.n[m]++;
  if (fresh) return;
  Class& c = classes_[class_of(ref)];
  if (serial != c.serial) return;  // not run the block's way (the kind's class changed): not measured
  c.wall += std::max(wall_us, 0.0);
  c.ref += ref;
  if (c.wall < (c.blocks[m] == 0 || c.tried ? kShortBlock * kBlockUs : kBlockUs)) return;
  // sums, not a mean of the blocks' ratios: a block cut short by one stalled region weighs its wall, not 1
  // A tried block weighs at least as much as its way's older sums: they date from before the way lost its
  // turn (e.g. from before the caller moved to a free CPU).
  const double keep = c.blocks[m] == 0 ? 0
                      : c.tried       ? std::min(1.0, c.ref / c.sum_ref[m])
                                      : std::exp(-c.ref / kMemoryUs);
  c.sum_wall[m] = keep * c.sum_wall[m] + c.wall;
  c.sum_ref[m] = keep * c.sum_ref[m] + c.ref;
  c.score[m] = c.sum_wall[m] / c.sum_ref[m];
  c.blocks[m]++;
  stats_.blocks++;
  next_block(c);
}

void RegionModes::scores(int cls, double* parallel, double* serial) const {
  const Class& c = classes_[std::clamp(cls, 0, kClasses - 1)];
  *parallel = c.blocks[0] ? c.score[0] : -1;
  *serial = c.blocks[1] ? c.score[1] : -1;
}

}  // namespace strata
