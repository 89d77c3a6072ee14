// The model fingerprint: see fingerprint.h.
#include "model/fingerprint.h"

#include <algorithm>
#include <string>

#include "gguf/gguf.h"
#include "model/hparams.h"

namespace strata {

namespace {

uint64_t fnv1a(uint64_t h, const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

uint64_t hash_tensors(uint64_t h, const GgufFile& f) {
  const uint64_t size = f.file_size();
  h = fnv1a(h, &size, sizeof size);
  for (const auto& t : f.tensors()) {
    h = fnv1a(h, t.name.data(), t.name.size());
    h = fnv1a(h, &t.type, sizeof t.type);
    h = fnv1a(h, &t.offset, sizeof t.offset);
    h = fnv1a(h, &t.nbytes, sizeof t.nbytes);
    h = fnv1a(h, t.ne.data(), t.ne.size() * sizeof(int64_t));
    if (!t.data || t.nbytes == 0) continue;
    // windows at 0, 1/(k-1), ..., the end: [start, start + w) with start = i * (nbytes - w) / (k - 1)
    const uint64_t w = std::min<uint64_t>(t.nbytes, kFingerprintSampleBytes);
    for (int i = 0; i < kFingerprintSamples; i++) {
      const uint64_t start = (t.nbytes - w) * (uint64_t)i / (kFingerprintSamples - 1);
      h = fnv1a(h, t.data + start, w);
    }
  }
  return h;
}

}  // namespace

uint64_t model_fingerprint(const GgufFile& file, const HParams& hp, const GgufFile* mtp_file) {
  uint64_t h = hash_tensors(1469598103934665603ull, file);
  if (mtp_file) h = hash_tensors(h, *mtp_file);
  const std::string s = hp.summary();
  return fnv1a(h, s.data(), s.size());
}

}  // namespace strata
