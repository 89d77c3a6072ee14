// Device decoders of the ggml block formats, one struct per type, mirroring the CPU's scalar code value for value
// (types.cpp / blocks32.cpp dequantizers for the float-activation types, quants.cpp's integer forms for the
// int8-activation types; formulas in quants.h and blocks32.h). Weights stay in their GGUF bytes on the card and
// are decoded here, in the kernel. Loads are bytewise: blocks of 17, 22, 66 or 210 bytes are not word aligned.
// tests/test_cuda_matmul.py checks every type against the CPU `_ref` kernels, bit for bit.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace strata::cuda {

// Lookup tables, copied from the CPU's (iq_tables.h, quants.h, blocks32.h) by init_tables(). Defined here: the
// build is whole-program per file (no -rdc) and only matmul.cu includes this header.
__device__ uint64_t g_iq2xxs_grid[256];
__device__ uint32_t g_iq3xxs_grid[256];
__device__ uint8_t g_ksigns[128];
__device__ int8_t g_iq4_values[16];
__device__ int8_t g_mxfp4_values[16];
// The IQ grids and signs as the product kernel keeps them in shared memory (types with kTables).
struct IqTables {
  uint64_t iq2xxs[256];
  uint32_t iq3xxs[256];
  uint8_t signs[128];
};

__device__ __forceinline__ float half_at(const uint8_t* p) {
  return __half2float(__ushort_as_half((unsigned short)(p[0] | p[1] << 8)));
}
__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
// A little-endian u32 at an even address, in two 16-bit loads.
__device__ __forceinline__ uint32_t u32_at2(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return (uint32_t)h[0] | (uint32_t)h[1] << 16;
}
__device__ __forceinline__ int code4(const uint8_t* qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; }
__device__ __forceinline__ int code5(const uint8_t* qs, uint32_t qh, int i) {
  return code4(qs, i) | (int)((qh >> i) & 1) << 4;
}
__device__ __forceinline__ float e8m0_half(uint8_t e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

// ---- float-activation types: value(row, c) = the dequantized weight c of the row, as the CPU dequantizer -------
struct F32 {
  static constexpr bool kPlain = true;
  static __device__ __forceinline__ float value(const uint8_t* row, int64_t c) {
    return reinterpret_cast<const float*>(row)[c];
  }
};
struct F16 {
  static constexpr bool kPlain = true;
  static __device__ __forceinline__ float value(const uint8_t* row, int64_t c) {
    return __half2float(reinterpret_cast<const __half*>(row)[c]);
  }
};
struct BF16 {
  static constexpr bool kPlain = true;
  static __device__ __forceinline__ float value(const uint8_t* row, int64_t c) {
    return __uint_as_float((uint32_t)reinterpret_cast<const uint16_t*>(row)[c] << 16);
  }
};
template <int kBytes>
struct Block32 {
  static constexpr bool kPlain = false;
  static constexpr int kSize = kBytes;
  static __device__ __forceinline__ const uint8_t* block(const uint8_t* row, int64_t c) { return row + (c / 32) * kBytes; }
};
struct Q8_0 : Block32<34> {
  static __device__ __forceinline__ float value(const uint8_t* row, int64_t c) {
    const uint8_t* b = block(row, c);
    return __fmul_rn(half_at(b), (float)(int8_t)b[2 + c % 32]);
  }
};

// ---- int8-activation 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4; blocks32.h's integer form) -------------------
// vals4(b, k): values 4k..4k+3 of the block as 4 signed bytes of a word (matmul.h's lane sum P[i] is k = i and
// k = i + 4, by two dp4a); scale(b): s. The codes 4k..4k+3: low nibbles of qs[4k..] for k < 4, high nibbles of qs[4(k-4)..] for k >= 4.
__device__ __forceinline__ int code4_of4(const uint8_t* qs, int k, int j) { return (qs[4 * (k & 3) + j] >> (4 * (k >> 2))) & 15; }
template <class F>
__device__ __forceinline__ int pack4(F&& value) {
  uint32_t w = 0;
#pragma unroll
  for (int j = 0; j < 4; j++) w |= (uint32_t)(uint8_t)(int8_t)value(j) << (8 * j);
  return (int)w;
}
// min(b): Q4_1 / Q5_1's m (kMin); the others have none.
struct NoMin {
  static constexpr bool kMin = false;
  static __device__ __forceinline__ float min(const uint8_t*) { return 0.f; }
};
struct Q4_0 : Block32<18>, NoMin {
  static __device__ __forceinline__ int vals4(const uint8_t* b, int k) {
    return pack4([&](int j) { return code4_of4(b + 2, k, j) - 8; });
  }
  static __device__ __forceinline__ float scale(const uint8_t* b) { return half_at(b); }
};
struct Q4_1 : Block32<20> {
  static constexpr bool kMin = true;
  static __device__ __forceinline__ int vals4(const uint8_t* b, int k) {
    return pack4([&](int j) { return code4_of4(b + 4, k, j); });
  }
  static __device__ __forceinline__ float scale(const uint8_t* b) { return half_at(b); }
  static __device__ __forceinline__ float min(const uint8_t* b) { return half_at(b + 2); }
};
struct Q5_1 : Block32<24> {
  static constexpr bool kMin = true;
  static __device__ __forceinline__ int vals4(const uint8_t* b, int k) {
    const uint32_t qh = u32_at(b + 4);
    return pack4([&](int j) { return code4_of4(b + 8, k, j) | (int)((qh >> (4 * k + j)) & 1) << 4; });
  }
  static __device__ __forceinline__ float scale(const uint8_t* b) { return half_at(b); }
  static __device__ __forceinline__ float min(const uint8_t* b) { return half_at(b + 2); }
};
struct Q5_0 : Block32<22>, NoMin {
  static __device__ __forceinline__ int vals4(const uint8_t* b, int k) {
    const uint32_t qh = u32_at(b + 2);
    return pack4([&](int j) { return (code4_of4(b + 6, k, j) | (int)((qh >> (4 * k + j)) & 1) << 4) - 16; });
  }
  static __device__ __forceinline__ float scale(const uint8_t* b) { return half_at(b); }
};
struct IQ4_NL : Block32<18>, NoMin {
  static __device__ __forceinline__ int vals4(const uint8_t* b, int k) {
    return pack4([&](int j) { return (int)g_iq4_values[code4_of4(b + 2, k, j)]; });
  }
  static __device__ __forceinline__ float scale(const uint8_t* b) { return half_at(b); }
};
struct MXFP4 : Block32<17>, NoMin {
  static __device__ __forceinline__ int vals4(const uint8_t* b, int k) {
    return pack4([&](int j) { return (int)g_mxfp4_values[code4_of4(b + 1, k, j)]; });
  }
  static __device__ __forceinline__ float scale(const uint8_t* b) { return e8m0_half(b[0]); }
};

// ---- int8-activation types (256-value blocks): the integer form of quants.h, for the 16 values of lane k --------
// Lane k (0..15) owns the values v = 32 s + 2 k + i (s = 0..7, i = 0..1) of each block: exactly the values whose
// products the CPU sums into its lane sum P[k] ((v mod 32) / 2 == k). lane() fills w[2 s + i] and returns d;
// types with mins also give dmin and the min of each of the lane's values (mins()).
struct Q4_K {
  static constexpr int kBytes = 144;
  static constexpr bool kTables = false;
  static constexpr bool kMins = true;
  static __device__ __forceinline__ void scale_min(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
      *sc = s[j] & 63;
      *m = s[j + 4] & 63;
    } else {
      *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
      *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
  }
  static __device__ __forceinline__ float lane(const uint8_t* b, int k, int* w, const IqTables& tab) {
    for (int s = 0; s < 8; s++) {
      int sc, m;
      scale_min(b + 4, s, &sc, &m);
      for (int i = 0; i < 2; i++) w[2 * s + i] = sc * ((b[16 + 32 * (s / 2) + 2 * k + i] >> (4 * (s % 2))) & 0xF);
    }
    return half_at(b);
  }
  static __device__ __forceinline__ float mins(const uint8_t* b, int k, int* mv) {
    for (int s = 0; s < 8; s++) {
      int sc, m;
      scale_min(b + 4, s, &sc, &m);
      mv[2 * s] = mv[2 * s + 1] = m;
    }
    return half_at(b + 2);
  }
};
// A Q4_K / Q5_K block's 16-byte header h read as words (the one-row lane kernel and the tensor-core source read it so):
// d, dmin, and the 6-bit scales (or mins) of sub-blocks 4 half .. 4 half + 3 as the bytes of a word (Q4_K::scale_min's
// bits).
__device__ __forceinline__ float k4_d(uint4 h) { return __half2float(__ushort_as_half((unsigned short)(h.x & 0xffffu))); }
__device__ __forceinline__ float k4_dmin(uint4 h) { return __half2float(__ushort_as_half((unsigned short)(h.x >> 16))); }
__device__ __forceinline__ uint32_t k4_word(uint4 h, int half, bool mins) {
  const uint32_t s0 = h.y, s1 = h.z, s2 = h.w;
  return half == 0 ? (mins ? s1 : s0) & 0x3f3f3f3fu
         : mins    ? ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u)  // bits 6, 7 of bytes 0..3 above
                   : (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u);
}
struct Q5_K {
  static constexpr int kBytes = 176;
  static constexpr bool kTables = false;
  static constexpr bool kMins = true;
  static __device__ __forceinline__ float lane(const uint8_t* b, int k, int* w, const IqTables& tab) {
    for (int s = 0; s < 8; s++) {
      int sc, m;
      Q4_K::scale_min(b + 4, s, &sc, &m);
      for (int i = 0; i < 2; i++) {
        const int l = 2 * k + i;
        const int q = ((b[48 + 32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF) | ((b[16 + l] >> s) & 1) << 4;
        w[2 * s + i] = sc * q;
      }
    }
    return half_at(b);
  }
  static __device__ __forceinline__ float mins(const uint8_t* b, int k, int* mv) { return Q4_K::mins(b, k, mv); }
};
struct Q6_K {
  static constexpr int kBytes = 210;
  static constexpr bool kTables = false;
  static constexpr bool kMins = false;
  static __device__ __forceinline__ float lane(const uint8_t* b, int k, int* w, const IqTables& tab) {
    for (int s = 0; s < 8; s++)
      for (int i = 0; i < 2; i++) {
        const int v = 32 * s + 2 * k + i, h = v / 128, l = v % 32, kk = (v % 128) / 32;
        const int lo = (b[64 * h + l + 32 * (kk & 1)] >> (4 * (kk >> 1))) & 0xF;
        const int hb = (b[128 + 32 * h + l] >> (2 * kk)) & 3;
        w[2 * s + i] = (int)(int8_t)b[192 + v / 16] * ((lo | hb << 4) - 32);
      }
    return half_at(b + 208);
  }
  static __device__ __forceinline__ float mins(const uint8_t*, int, int*) { return 0.f; }
};
struct Q2_K {
  static constexpr int kBytes = 84;
  static constexpr bool kTables = false;
  static constexpr bool kMins = true;
  static __device__ __forceinline__ float lane(const uint8_t* b, int k, int* w, const IqTables& tab) {
    for (int s = 0; s < 8; s++)
      for (int i = 0; i < 2; i++) {
        const int v = 32 * s + 2 * k + i;
        const int code = (b[16 + 32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3;
        w[2 * s + i] = (b[v / 16] & 0xF) * code;
      }
    return half_at(b + 80);
  }
  static __device__ __forceinline__ float mins(const uint8_t* b, int k, int* mv) {  // per 16 values
    for (int s = 0; s < 8; s++)
      for (int i = 0; i < 2; i++) mv[2 * s + i] = b[(32 * s + 2 * k + i) / 16] >> 4;
    return half_at(b + 82);
  }
};
struct Q3_K {
  static constexpr int kBytes = 110;
  static constexpr bool kTables = false;
  static constexpr bool kMins = false;
  static __device__ __forceinline__ float lane(const uint8_t* b, int k, int* w, const IqTables& tab) {
    for (int s = 0; s < 8; s++)
      for (int i = 0; i < 2; i++) {
        const int v = 32 * s + 2 * k + i, sb = v / 16;
        const int lo = (b[96 + sb % 8] >> (4 * (sb / 8))) & 0xF, hi = (b[96 + 8 + sb % 4] >> (2 * (sb / 4))) & 3;
        const int sc = (lo | hi << 4) - 32;
        const int h = v / 128, kk = (v % 128) / 32, l = v % 32;
        const int ql = (b[32 + 32 * h + l] >> (2 * kk)) & 3, qh = (b[l] >> (v / 32)) & 1;
        w[2 * s + i] = sc * (ql - (qh ? 0 : 4));
      }
    return half_at(b + 108);
  }
  static __device__ __forceinline__ float mins(const uint8_t*, int, int*) { return 0.f; }
};
struct IQ2_XXS {
  static constexpr int kBytes = 66;
  static constexpr bool kTables = true;
  static constexpr bool kMins = false;
  static __device__ __forceinline__ float lane(const uint8_t* b, int k, int* w, const IqTables& tab) {
    const int l = k / 4;  // value e = 2k + i of sub-block s: grid byte l = e / 8, element j = e % 8
    for (int s = 0; s < 8; s++) {
      const uint8_t* q = b + 2 + 8 * s;
      const uint32_t aux1 = u32_at2(q + 4);  // even: 66-byte blocks, rows of 66 nb bytes
      const int sc = (int)(aux1 >> 28);
      const int signs = tab.signs[(aux1 >> (7 * l)) & 127];
      const uint64_t grid = tab.iq2xxs[q[l]];
      for (int i = 0; i < 2; i++) {
        const int j = 2 * (k % 4) + i;
        const int g = (int)((grid >> (8 * j)) & 0xFF);
        w[2 * s + i] = (2 * sc + 1) * (((signs >> j) & 1) ? -g : g);
      }
    }
    return __fmul_rn(half_at(b), 0.125f);
  }
  static __device__ __forceinline__ float mins(const uint8_t*, int, int*) { return 0.f; }
};
struct IQ3_XXS {
  static constexpr int kBytes = 98;
  static constexpr bool kTables = true;
  static constexpr bool kMins = false;
  static __device__ __forceinline__ float lane(const uint8_t* b, int k, int* w, const IqTables& tab) {
    const int l = k / 4;
    for (int s = 0; s < 8; s++) {
      const uint8_t* qs = b + 2 + 8 * s;
      const uint32_t aux = u32_at2(b + 2 + 64 + 4 * s);  // even: 98-byte blocks
      const int sc = (int)(aux >> 28);
      const int signs = tab.signs[(aux >> (7 * l)) & 127];
      for (int i = 0; i < 2; i++) {
        const int j = 2 * (k % 4) + i;
        const int g = (int)((tab.iq3xxs[qs[2 * l + j / 4]] >> (8 * (j % 4))) & 0xFF);
        w[2 * s + i] = (2 * sc + 1) * (((signs >> j) & 1) ? -g : g);
      }
    }
    return __fmul_rn(half_at(b), 0.25f);
  }
  static __device__ __forceinline__ float mins(const uint8_t*, int, int*) { return 0.f; }
};
struct IQ4_XS {
  static constexpr int kBytes = 136;
  static constexpr bool kTables = false;
  static constexpr bool kMins = false;
  static __device__ __forceinline__ float lane(const uint8_t* b, int k, int* w, const IqTables& tab) {
    const int sh = b[2] | b[3] << 8;
    for (int s = 0; s < 8; s++) {
      const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | ((sh >> (2 * s)) & 3) << 4;
      for (int i = 0; i < 2; i++) {
        const int j = 2 * k + i;
        const int code = (b[8 + 16 * s + j % 16] >> (4 * (j / 16))) & 0xF;
        w[2 * s + i] = (ls - 32) * g_iq4_values[code];
      }
    }
    return half_at(b);
  }
  static __device__ __forceinline__ float mins(const uint8_t*, int, int*) { return 0.f; }
};

}  // namespace strata::cuda
