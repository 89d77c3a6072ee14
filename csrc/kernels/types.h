// The ggml type table: block size, block bytes and, for the types this engine computes with, a scalar
// dequantizer and the row-product kernels. Adding a quant type is a local change: a row in the table
// (types.cpp), its dequantizer, and its kernels in matmul_*.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace strata {

enum GgmlType : uint32_t {
  GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
  GGML_Q8_1 = 9, GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14,
  GGML_Q8_K = 15, GGML_IQ2_XXS = 16, GGML_IQ2_XS = 17, GGML_IQ3_XXS = 18, GGML_IQ1_S = 19,
  GGML_IQ4_NL = 20, GGML_IQ3_S = 21, GGML_IQ2_S = 22, GGML_IQ4_XS = 23, GGML_I8 = 24, GGML_I16 = 25,
  GGML_I32 = 26, GGML_I64 = 27, GGML_F64 = 28, GGML_IQ1_M = 29, GGML_BF16 = 30, GGML_TQ1_0 = 34,
  GGML_TQ2_0 = 35, GGML_MXFP4 = 39,
};

using DequantFn = void (*)(const uint8_t* src, float* dst, int64_t n);  // n % block_size == 0

struct TypeTraits {
  uint32_t id;
  const char* name;
  int block_size;      // values per block
  int type_size;       // bytes per block
  DequantFn dequant;   // scalar reference dequantizer; nullptr = the engine cannot compute with this type
};

// Every ggml type the container may hold (for sizes); nullptr for an unknown id.
const TypeTraits* type_traits(uint32_t id);
inline bool type_supported(uint32_t id) {
  const TypeTraits* t = type_traits(id);
  return t && t->dequant;
}
std::string type_name(uint32_t id);
inline size_t row_bytes(uint32_t id, int64_t cols) {
  const TypeTraits* t = type_traits(id);
  return (size_t)(cols / t->block_size) * t->type_size;
}

}  // namespace strata
