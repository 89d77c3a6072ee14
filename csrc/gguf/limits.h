// Limits of the GGUF reader (docs/SECURITY.md). A file outside them is refused before anything is
// allocated, with the file and the field named. Each is far above any real model and small enough that
// no file can make the reader allocate much more than its own size (a metadata value costs at most
// ~100 bytes of memory per element, so kMaxArrayElements bounds all arrays together to ~400 MiB).
#pragma once
#include <cstdint>

namespace strata::gguf_limits {

constexpr uint64_t kMaxTensors = 1 << 16;          // tensor_count (Qwen3-Next 80B: ~850)
constexpr uint64_t kMaxKeys = 1 << 16;             // metadata_kv_count (real files: ~50)
constexpr uint64_t kMaxKeyBytes = 65535;           // the GGUF spec's bound on a key
constexpr uint64_t kMaxTensorNameBytes = 64;       // the GGUF spec's bound (ggml's GGML_MAX_NAME)
constexpr uint64_t kMaxStringBytes = 1ull << 26;   // one metadata string (chat templates: ~10 KiB)
constexpr uint64_t kMaxArrayElements = 1ull << 22; // all metadata arrays of one file together
                                                   // (a 152k vocabulary: tokens + types + merges ~ 460k)
constexpr uint32_t kMaxDims = 4;                   // n_dims (GGML_MAX_DIMS)
constexpr uint64_t kMaxAlignment = 1 << 16;        // general.alignment: a power of two in 1..this

}  // namespace strata::gguf_limits
