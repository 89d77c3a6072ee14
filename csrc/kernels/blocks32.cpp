// Scalar dequantizers of the 32-value block types (blocks32.h), bit-exact with gguf.quants.dequantize.
#include "kernels/blocks32.h"

#include "kernels/quants.h"
#include "kernels/types.h"
#include "util/common.h"

namespace strata {

namespace {

inline int code4(const uint8_t* qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; }
inline int code5(const uint8_t* qs, uint32_t qh, int i) { return code4(qs, i) | (int)((qh >> i) & 1) << 4; }

// Calls value(block, i) for the 32 values of each of the n / 32 blocks of `bytes` bytes.
template <int bytes, class F>
void each_block(const uint8_t* s, float* out, int64_t n, F&& value) {
  for (int64_t b = 0; b < n / 32; b++)
    for (int i = 0; i < 32; i++) out[b * 32 + i] = value(s + b * bytes, i);
}

}  // namespace

bool act32_type(uint32_t type) {
  return type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q5_0 || type == GGML_Q5_1 || type == GGML_IQ4_NL ||
         type == GGML_MXFP4;
}

float int_block32(uint32_t type, const uint8_t* b, int8_t* v, float* m) {
  *m = 0.f;
  switch (type) {
    case GGML_Q4_1:
      for (int i = 0; i < 32; i++) v[i] = (int8_t)code4(b + 4, i);
      *m = half_at(b + 2);
      return half_at(b);
    case GGML_Q5_1:
      for (int i = 0; i < 32; i++) v[i] = (int8_t)code5(b + 8, u32_at(b + 4), i);
      *m = half_at(b + 2);
      return half_at(b);
    case GGML_Q4_0:
      for (int i = 0; i < 32; i++) v[i] = (int8_t)(code4(b + 2, i) - 8);
      return half_at(b);
    case GGML_Q5_0:
      for (int i = 0; i < 32; i++) v[i] = (int8_t)(code5(b + 6, u32_at(b + 2), i) - 16);
      return half_at(b);
    case GGML_IQ4_NL:
      for (int i = 0; i < 32; i++) v[i] = kIq4Values[code4(b + 2, i)];
      return half_at(b);
    case GGML_MXFP4:
      for (int i = 0; i < 32; i++) v[i] = kMxfp4Values[code4(b + 1, i)];
      return e8m0_half(b[0]);
    default:
      fail<std::invalid_argument>("int_block32: ", type_name(type), " has no int8-activation form");
  }
}

void dq_q4_0(const uint8_t* s, float* d, int64_t n) {
  each_block<18>(s, d, n, [](const uint8_t* b, int i) { return half_at(b) * (float)(code4(b + 2, i) - 8); });
}
void dq_q4_1(const uint8_t* s, float* d, int64_t n) {
  each_block<20>(s, d, n, [](const uint8_t* b, int i) { return half_at(b) * (float)code4(b + 4, i) + half_at(b + 2); });
}
void dq_q5_0(const uint8_t* s, float* d, int64_t n) {
  each_block<22>(s, d, n, [](const uint8_t* b, int i) {
    return half_at(b) * (float)(code5(b + 6, u32_at(b + 2), i) - 16);
  });
}
void dq_q5_1(const uint8_t* s, float* d, int64_t n) {
  each_block<24>(s, d, n, [](const uint8_t* b, int i) {
    return half_at(b) * (float)code5(b + 8, u32_at(b + 4), i) + half_at(b + 2);
  });
}
void dq_iq4_nl(const uint8_t* s, float* d, int64_t n) {
  each_block<18>(s, d, n, [](const uint8_t* b, int i) { return half_at(b) * (float)kIq4Values[code4(b + 2, i)]; });
}
void dq_mxfp4(const uint8_t* s, float* d, int64_t n) {
  each_block<17>(s, d, n, [](const uint8_t* b, int i) { return e8m0_half(b[0]) * (float)kMxfp4Values[code4(b + 1, i)]; });
}

}  // namespace strata
