#include "kernels/types.h"

#include "kernels/blocks32.h"
#include "kernels/quants.h"
#include "util/common.h"

namespace strata {

namespace {

void dq_f32(const uint8_t* s, float* d, int64_t n) { std::memcpy(d, s, n * sizeof(float)); }
void dq_f16(const uint8_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint16_t h;
    std::memcpy(&h, s + 2 * i, 2);
    d[i] = fp16_to_f32(h);
  }
}
void dq_bf16(const uint8_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint16_t h;
    std::memcpy(&h, s + 2 * i, 2);
    d[i] = bf16_to_f32(h);
  }
}
// Q8_0: 32 values, 34 bytes = half d; int8 q[32]; y = d*q.
void dq_q8_0(const uint8_t* s, float* d, int64_t n) {
  for (int64_t b = 0; b < n / 32; b++) {
    const uint8_t* blk = s + b * 34;
    uint16_t h;
    std::memcpy(&h, blk, 2);
    const float scale = fp16_to_f32(h);
    for (int i = 0; i < 32; i++) d[b * 32 + i] = scale * (float)(int8_t)blk[2 + i];
  }
}

// Sizes from ggml (GGML_QUANT_SIZES). Types without a dequantizer parse but are refused at model load.
// K/IQ dequantizers live in quants.cpp, the other 32-value block types' in blocks32.cpp.
const TypeTraits kTypes[] = {
    {GGML_F32, "F32", 1, 4, dq_f32},        {GGML_F16, "F16", 1, 2, dq_f16},
    {GGML_Q4_0, "Q4_0", 32, 18, dq_q4_0},   {GGML_Q4_1, "Q4_1", 32, 20, dq_q4_1},
    {GGML_Q5_0, "Q5_0", 32, 22, dq_q5_0},   {GGML_Q5_1, "Q5_1", 32, 24, dq_q5_1},
    {GGML_Q8_0, "Q8_0", 32, 34, dq_q8_0},   {GGML_Q8_1, "Q8_1", 32, 36, nullptr},
    {GGML_Q2_K, "Q2_K", 256, 84, dq_q2_k},  {GGML_Q3_K, "Q3_K", 256, 110, dq_q3_k},
    {GGML_Q4_K, "Q4_K", 256, 144, dq_q4_k}, {GGML_Q5_K, "Q5_K", 256, 176, dq_q5_k},
    {GGML_Q6_K, "Q6_K", 256, 210, dq_q6_k}, {GGML_Q8_K, "Q8_K", 256, 292, nullptr},
    {GGML_IQ2_XXS, "IQ2_XXS", 256, 66, dq_iq2_xxs}, {GGML_IQ2_XS, "IQ2_XS", 256, 74, dq_iq2_xs},
    {GGML_IQ3_XXS, "IQ3_XXS", 256, 98, dq_iq3_xxs}, {GGML_IQ1_S, "IQ1_S", 256, 50, dq_iq1_s},
    {GGML_IQ4_NL, "IQ4_NL", 32, 18, dq_iq4_nl},    {GGML_IQ3_S, "IQ3_S", 256, 110, dq_iq3_s},
    {GGML_IQ2_S, "IQ2_S", 256, 82, dq_iq2_s},     {GGML_IQ4_XS, "IQ4_XS", 256, 136, dq_iq4_xs},
    {GGML_I8, "I8", 1, 1, nullptr},         {GGML_I16, "I16", 1, 2, nullptr},
    {GGML_I32, "I32", 1, 4, nullptr},       {GGML_I64, "I64", 1, 8, nullptr},
    {GGML_F64, "F64", 1, 8, nullptr},       {GGML_IQ1_M, "IQ1_M", 256, 56, dq_iq1_m},
    {GGML_BF16, "BF16", 1, 2, dq_bf16},     {GGML_TQ1_0, "TQ1_0", 256, 54, nullptr},
    {GGML_TQ2_0, "TQ2_0", 256, 66, nullptr}, {GGML_MXFP4, "MXFP4", 32, 17, dq_mxfp4},
};

}  // namespace

const TypeTraits* type_traits(uint32_t id) {
  for (const auto& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

std::string type_name(uint32_t id) {
  const TypeTraits* t = type_traits(id);
  return t ? t->name : cat("type#", id);
}

}  // namespace strata
