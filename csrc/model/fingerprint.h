// The model fingerprint: what a checkpoint is bound to (Session::restore / Session::load refuse another's).
//
// A 64-bit FNV-1a hash of the file size, the hyperparameters' summary and, per tensor (of the model file and
// of a separate MTP file), its name, type, shape, offset, byte size and kSamples windows of kSampleBytes of its
// data spread evenly over it (the first and the last bytes included). So another model of the same shapes, a
// fine-tune or a requantization of the same layout hashes differently: they change every tensor's bytes. The
// cost is bounded by the tensor count, not the file size: at most kSamples pages per tensor are touched
// (about 1,500 tensors x 4 pages for a 45 GB Qwen3-Next file, read through the mapping, most of them weights
// that the first token reads anyway).
#pragma once
#include <cstdint>

namespace strata {

class GgufFile;
struct HParams;

constexpr int kFingerprintSamples = 4;        // windows per tensor
constexpr int kFingerprintSampleBytes = 64;   // bytes per window

uint64_t model_fingerprint(const GgufFile& file, const HParams& hp, const GgufFile* mtp_file);

}  // namespace strata
