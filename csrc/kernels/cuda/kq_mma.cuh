// The MMA sources (mma.cuh) of Q4_K, Q5_K and Q6_K: prompt pieces' dense products and the experts' tiles on the int8
// tensor cores. Included by matmul.cu after mma.cuh and kq_lanes.cuh. No namespace of its own: it is included
// inside matmul.cu's (anonymous, in strata::cuda).
//
// The integer weights of a block, value v = 32 s + l of sub-block s (decode.cuh, the CPU's quants.cpp):
//   Q4_K: w = sc_s q, q the 4-bit code (low nibble of byte 16 + 32 (s / 2) + l for even s, high for odd), sc_s and
//         m_s 6 bits from the 12 scale bytes (Q4_K::scale_min); mins M = sum m_s q[v]; |w| <= 63 * 15, so
//         |P| <= 16 * 945 * 127 < 2^22 (the bias conversion) and |M| <= 256 * 63 * 127 < 2^22;
//   Q5_K: as Q4_K with q's fifth bit, bit s of byte 16 + l; the codes from byte 48 + 32 (s / 2) + l; |w| <= 63 * 31,
//         |P| <= 16 * 1953 * 127 < 2^22;
//   Q6_K: w = sc (q - 32), q 6 bits (low 4 from byte 64 h + 32 (j & 1) + l, nibble j / 2, high 2 from byte
//         128 + 32 h + l, bits 2 j; s = 4 h + j), sc the int8 at 192 + v / 16; |w| <= 128 * 32, so |P| up to
//         16 * 4096 * 127 > 2^22: the int to float conversion (exact under 2^24).
// Thread (g, c4) takes sub-blocks 2 c4 and 2 c4 + 1 of rows g and g + 8; lane k's values in a sub-block are l = 2 k,
// 2 k + 1: bytes 2 k, 2 k + 1 of each 32-byte run, i.e. half k % 2 of word k / 2. frags forms each pair of w as two
// 16-bit halves of a word (no carry between them), then the lo and hi bytes of both sub-blocks as iq2_mma_frags does.
#pragma once

// k_mma / k_tiles_mma for these types (the callers' launches are compiled for these alone).
template <class D>
constexpr bool kHasKqMma = std::is_same_v<D, Q4_K> || std::is_same_v<D, Q5_K> || std::is_same_v<D, Q6_K>;

// Lo bytes (sel 0x6420) or hi bytes (0x7531) of sub-blocks 2 c4 (x) and 2 c4 + 1 (y), both 16-bit pairs: the A word
// at K 4 c4 .. 4 c4 + 3.
__device__ __forceinline__ void kq_mma_pack(const uint32_t (&wp)[2][2][4], uint4 (&a)[4]) {
#pragma unroll
  for (int m = 0; m < 4; m++)
    a[m] = make_uint4(__byte_perm(wp[0][0][m], wp[0][1][m], 0x6420), __byte_perm(wp[1][0][m], wp[1][1][m], 0x6420),
                      __byte_perm(wp[0][0][m], wp[0][1][m], 0x7531), __byte_perm(wp[1][0][m], wp[1][1][m], 0x7531));
}
// Bytes 2 k and 2 k + 1 of word w (k = 4 l + m: half m % 2) as the two 16-bit halves of a word.
__device__ __forceinline__ uint32_t kq_pair16(uint32_t w, int m) { return __byte_perm(w, 0, (m & 1) ? 0x4342 : 0x4140); }

// Q4_K's and Q5_K's 16-byte block header of rows g, g + 8 (i): d, dmin and the 12 scale bytes.
struct KqHeader {
  uint4 h[2];
  __device__ __forceinline__ float d(int i) const { return k4_d(h[i]); }
  __device__ __forceinline__ float dmin(int i) const { return k4_dmin(h[i]); }
  // sub-blocks 2 c4 and 2 c4 + 1's scales (or mins) as bytes 0 and 1
  __device__ __forceinline__ uint32_t scm(int i, bool mins) const {
    const int c4 = threadIdx.x & 3;
    return (k4_word(h[i], c4 >> 1, mins) >> (16 * (c4 & 1))) & 0xffffu;
  }
  // the m16n8k32 A word of row i: (m_2c4, m_2c4, m_2c4+1, m_2c4+1)
  __device__ __forceinline__ uint32_t mins(int i) const { return __byte_perm(scm(i, true), 0, 0x1100); }
};
// Word j (0..7) of a 32-byte run held as two uint4: lanes 4 l + m read word 2 l + m / 2.
__device__ __forceinline__ uint32_t kq_word(const uint4 (&c)[2], int l, int m) {
  const uint4 cc = c[l >> 1];
  return (m >> 1) ? ((l & 1) ? cc.w : cc.y) : ((l & 1) ? cc.z : cc.x);
}

// Q4_K (kBits 4) and Q5_K (5): q = the nibble, | the fifth bit << 4 for Q5_K.
template <int kBits>
struct Q45kMma {
  static constexpr int kBytes = kBits == 4 ? 144 : 176;
  static constexpr bool kMins = true, kBiasP = true, kAhead = false;
  struct Tabs {
    __device__ __forceinline__ void load() {}
  };
  // rows g, g + 8 (i): the header, the 32 code bytes of sub-blocks 2 c4 (low nibbles) and 2 c4 + 1 (high) (Q4_K at
  // 16 + 32 c4, Q5_K at 48 + 32 c4) and Q5_K's 32 fifth-bit bytes (16 ..: bit s for sub-block s); 16-byte loads
  // (kq_mma_fit: the matrix on 16 bytes)
  struct Part : KqHeader {
    uint4 c[2][2], hb[kBits == 5 ? 2 : 1][2];
    __device__ __forceinline__ void load(const uint8_t* b0, const uint8_t* b1, int c4) {
      constexpr int kCodes = kBits == 4 ? 16 : 48;
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const uint8_t* blk = i ? b1 : b0;
        h[i] = __ldg(reinterpret_cast<const uint4*>(blk));
        c[i][0] = __ldg(reinterpret_cast<const uint4*>(blk + kCodes + 32 * c4));
        c[i][1] = __ldg(reinterpret_cast<const uint4*>(blk + kCodes + 16 + 32 * c4));
        if constexpr (kBits == 5) {
          hb[i][0] = __ldg(reinterpret_cast<const uint4*>(blk + 16));
          hb[i][1] = __ldg(reinterpret_cast<const uint4*>(blk + 32));
        }
      }
    }
  };
  static __device__ __forceinline__ void frags(const Part& p, int l, const Tabs&, uint4 (&a)[4]) {
    const int c4 = threadIdx.x & 3;
    uint32_t wp[2][2][4];
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const uint32_t sc = p.scm(i, false), sa = sc & 0xffu, sb = sc >> 8;
#pragma unroll
      for (int m = 0; m < 4; m++) {
        const uint32_t cw = kq_word(p.c[i], l, m);
        uint32_t qa = cw & 0x0f0f0f0fu, qb = (cw >> 4) & 0x0f0f0f0fu;
        if constexpr (kBits == 5) {
          const uint32_t hw = kq_word(p.hb[i], l, m);
          qa |= ((hw >> (2 * c4)) & 0x01010101u) << 4;
          qb |= ((hw >> (2 * c4 + 1)) & 0x01010101u) << 4;
        }
        wp[i][0][m] = kq_pair16(qa, m) * sa;  // <= 31 * 63 a half: no carry
        wp[i][1][m] = kq_pair16(qb, m) * sb;
      }
    }
    kq_mma_pack(wp, a);
  }
};
using Q4kMma = Q45kMma<4>;
using Q5kMma = Q45kMma<5>;

struct Q6kMma {
  static constexpr int kBytes = 210;
  static constexpr bool kMins = false, kBiasP = false, kAhead = false;
  struct Tabs {
    __device__ __forceinline__ void load() {}
  };
  // rows g, g + 8 (i), h = c4 / 2: the low-bit runs 64 h + 32 jj .. of sub-blocks 2 c4 + jj, the high-bit run
  // 128 + 32 h .., the 4 scale bytes 192 + 4 c4 .. (sub-block 2 c4 + jj, lanes 8 (k / 8) ..: byte 2 jj + k / 8), d.
  // 210-byte blocks: 16-bit loads.
  struct Part {
    uint32_t ql[2][2][8], qh[2][8], sc[2];
    uint16_t dh[2];
    __device__ __forceinline__ void load(const uint8_t* b0, const uint8_t* b1, int c4) {
      const int h = c4 >> 1;
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const uint8_t* blk = i ? b1 : b0;
#pragma unroll
        for (int w = 0; w < 8; w++) {
          ql[i][0][w] = u32_at2(blk + 64 * h + 4 * w);
          ql[i][1][w] = u32_at2(blk + 64 * h + 32 + 4 * w);
          qh[i][w] = u32_at2(blk + 128 + 32 * h + 4 * w);
        }
        sc[i] = u32_at2(blk + 192 + 4 * c4);
        dh[i] = __ldg(reinterpret_cast<const uint16_t*>(blk + 208));
      }
    }
    __device__ __forceinline__ float d(int i) const { return __half2float(__ushort_as_half(dh[i])); }
  };
  static __device__ __forceinline__ void frags(const Part& p, int l, const Tabs&, uint4 (&a)[4]) {
    const int c4 = threadIdx.x & 3, ns = 4 * (c4 & 1);
    uint32_t wp[2][2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
      for (int jj = 0; jj < 2; jj++) {
        const int j = 2 * (c4 & 1) + jj;                                   // sub-block 2 c4 + jj = 4 h + j
        const int sc = (int)(int8_t)(p.sc[i] >> (8 * (2 * jj + (l >> 1))));  // lanes 4 l ..: k / 8 = l / 2
        const uint32_t mag = (uint32_t)(sc < 0 ? -sc : sc), bias = 32u * mag * 0x10001u;
#pragma unroll
        for (int m = 0; m < 4; m++) {
          const int w = 2 * l + (m >> 1);
          const uint32_t q = ((p.ql[i][jj][w] >> ns) & 0x0f0f0f0fu) | (((p.qh[i][w] >> (2 * j)) & 0x03030303u) << 4);
          const uint32_t x = kq_pair16(q, m) * mag;  // q |sc| per half, <= 63 * 128: no carry
          wp[i][jj][m] = sc >= 0 ? __vsub2(x, bias) : __vsub2(bias, x);  // sc (q - 32) per half, as int16
        }
      }
    kq_mma_pack(wp, a);
  }
};

template <class D>
struct KqMmaOf;
template <>
struct KqMmaOf<Q4_K> {
  using type = Q4kMma;
};
template <>
struct KqMmaOf<Q5_K> {
  using type = Q5kMma;
};
template <>
struct KqMmaOf<Q6_K> {
  using type = Q6kMma;
};

// Whether k_mma / k_tiles_mma take a product of type D (one of kHasKqMma): the tensor cores (mma_available) and
// Q4_K's and Q5_K's 16-byte loads aligned (the matrix, its rows and, with sel, each expert's matrix on 16 bytes; a GGUF's
// tensors are at its default alignment of 32). Q6_K reads 16-bit words.
template <class D>
bool kq_mma_fit(const uint8_t* W, size_t row_bytes, size_t ebytes) {
  static_assert(kHasKqMma<D>);
  if (!mma_available()) return false;
  if constexpr (!std::is_same_v<D, Q6_K>) return aligned16(W, row_bytes, ebytes);
  return true;
}
