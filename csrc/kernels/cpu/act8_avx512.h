// The int8 activation rows of the AVX-512 byte kernels (kquants8_avx512.cpp, kquants_avx512vbmi.cpp), made once
// per prepared pass into QAct::il by interleave_act_avx512 (kquants8_avx512.cpp): quants.h stores each value as
// int16; these kernels multiply bytes (vpmaddubsw) and read them interleaved per 64 values
// so that a vpmaddubsw + vpdpwssd pair lands every product in its canonical lane (matmul.h: lane k sums the
// values v with (v mod 32) / 2 == k). Internal linkage: each translation unit has its own ISA flags.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels/quants.h"

namespace strata {
namespace {

// Rows [0, T) of the activation (int8 values stored as int16, quants.h) -> int8, interleaved per 64 values, into
// out [T][cols] (64-byte aligned); with kOffset, as the unsigned bytes q + 128 (for weights that carry signs, see
// rows_many_iq2xxs8).
template <bool kOffset = false>
void interleave_act(const QAct& q, int T, int8_t* out) {
  alignas(64) int16_t idx16[32];
  for (int k = 0; k < 16; k++) {
    idx16[2 * k] = (int16_t)k;             // word k of values 0-31: values 2k, 2k+1
    idx16[2 * k + 1] = (int16_t)(16 + k);  // word k of values 32-63
  }
  const __m512i idx = _mm512_load_si512(idx16);
  for (int t = 0; t < T; t++) {
    const int16_t* src = q.q + (int64_t)t * q.ldq;
    int8_t* dst = out + (int64_t)t * q.cols;
    for (int64_t c = 0; c < q.cols; c += 64) {
      const __m256i a = _mm512_cvtepi16_epi8(_mm512_loadu_si512(src + c));
      const __m256i b = _mm512_cvtepi16_epi8(_mm512_loadu_si512(src + c + 32));
      const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
      const __m512i v = _mm512_permutexvar_epi16(idx, ab);
      _mm512_store_si512(dst + c, kOffset ? _mm512_xor_si512(v, _mm512_set1_epi8(-128)) : v);
    }
  }
}

}  // namespace
}  // namespace strata
