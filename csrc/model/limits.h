// Limits on model geometry read from a GGUF (docs/SECURITY.md), shared by every architecture's
// hyperparameter reader (HParams::from_gguf and its siblings use them through GgufFile::get_int_in).
// Far above any real model (Qwen3-Next 80B: 48 layers, 512 experts, hidden 2048, vocabulary 151936),
// and small enough that sizes derived from them (state per layer, scratch per row) cannot overflow
// 64-bit arithmetic. What they cannot bound by themselves (the KV cache of a long context, an expert
// cache budget) is checked against the machine's memory where it is allocated (util/memory.h).
#pragma once
#include <cstdint>

namespace strata::model_limits {

constexpr int64_t kMaxLayers = 1024;            // block_count (llama.cpp: 512)
constexpr int64_t kMaxExperts = 1 << 14;        // expert_count
constexpr int64_t kMaxExpertsUsed = 1 << 10;    // expert_used_count
constexpr int64_t kMaxVocab = 1 << 22;          // token_embd rows, tokenizer entries
constexpr int64_t kMaxEmbd = 1 << 17;           // embedding_length
constexpr int64_t kMaxHeads = 1 << 12;          // attention heads, DeltaNet key / value heads
constexpr int64_t kMaxHeadDim = 1 << 12;        // attention key_length, DeltaNet state_size, value head size
constexpr int64_t kMaxFF = 1 << 20;             // (shared) expert feed-forward length, ssm.inner_size
constexpr int64_t kMaxConvKernel = 64;          // ssm.conv_kernel
constexpr int64_t kMaxContext = 1ll << 26;      // context_length
// float32 copies made at load (norms, routers, conv taps: dequantized once) may exceed the file's own
// size by at most this much, so a file cannot make the loader allocate much more than it holds
// (Qwen3-Next 80B: ~200 MiB of copies for an 80 GiB file).
constexpr uint64_t kCopyBytesOverFile = 256ull << 20;

}  // namespace strata::model_limits
