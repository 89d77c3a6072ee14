// Q4_K, Q5_K and Q6_K products of one activation row (decode steps, the experts' slots, the row split of small matrices)
// with each lane's integer sums on dp4a. Included by matmul.cu after reduce16, prefetch_rows and k_int (whose T = 1
// path it replaces for these types when on). No namespace of its own: it is included inside matmul.cu's (anonymous,
// in strata::cuda). On by default (g_kq_lanes): on an H100 (session 35) the Q4_K_M 80B's decode 6.88 -> 5.51 ms a step.
//
// Why this is exact. k_int<D, 1>'s lane k (16 lanes a weight row) holds the 16 values v of a block with v mod 32 in
// {2k, 2k + 1}: per sub-block s the pair (2k, 2k + 1) with codes q and activations x. It forms the integer
//   P = sum over s, i of w_{s,i} x_{s,i}   (Q4_K: w = sc_s q, q 4 bits; Q6_K: w = sc_{2s + k / 8} (q - 32), q 6 bits)
//   M = sum over s, i of m_s x_{s,i}, summed over the 16 lanes (Q4_K's mins; Q6_K has none)
// then L = fma(d dx, (float)P, L), Lm = fma(dmin dx, (float)M, Lm) per block in order, y = reduce16(L) - Lm. P and M
// are integers, so any exact way of forming them gives the same P, M and the same float operations after them. Here
// each sub-block's pair sum is one dp4a of its two codes (as bytes, the other two zero) against the lane's
// activation word holding that pair (k_quantize's lane-major layout: value 32 s + 2 k + i at 16 k + 2 s + i, so
// word c of the lane's 16 bytes holds sub-blocks 2c and 2c + 1), then times its scale:
//   - Q4_K: sub-blocks 2c and 2c + 1's codes are the low and high nibbles of the same two bytes (16 + 32 c + 2 k, + 1);
//     the mins by one dp4a a word against (m_2c, m_2c, m_2c+1, m_2c+1); the 8 scales and mins from the 12 scale bytes
//     as 32-bit words (decode.cuh Q4_K::scale_min's bits);
//   - Q6_K: sub-block s = 4 h + j's low 4 bits are nibble j / 2 of the two bytes at 64 h + 32 (j % 2) + 2 k, its high 2
//     bits bits 2 j of the two bytes at 128 + 32 h + 2 k; q - 32 bytewise (__vsub4); scale byte 192 + 2 s + k / 8.
// |P| and |M| as k_int's (int32). The integer steps were checked against k_int's decode on random and extreme blocks
// (a numpy emulation, session 34); on the card, tests/test_cuda_matmul.py compares both ways of this switch with the
// CPU's scalar kernel bit for bit.
#pragma once

// prefer_kq_lanes: Q4_K's and Q6_K's one-row products on k_kq_lanes (the default), else k_int<D, 1> (tests, launch
// mode "nokqlanes"). Same bits either way (tests/test_cuda_matmul.py, on an H100 in session 35)
bool g_kq_lanes = true;

// prefer_q5k_lanes: Q5_K's one-row products on k_kq_lanes too (with prefer_kq_lanes), else k_int<Q5_K, 1>: off until
// it has run on a card (launch mode "q5klanes")
bool g_q5k_lanes = false;

// One Q4_K (kBits 4) or Q5_K (5) block's share of lane k: the header (d, dmin, the 12 scale bytes), the lane's 4 code
// words (Q5_K: and its word of the 32 high-bit bytes), its 16 activation bytes and the block's activation scale.
// Q5_K (decode.cuh Q5_K::lane): code bytes at 48, value l of sub-block s has bit s of high-bit byte 16 + l as its bit 4,
// so the lane's word hb = bytes 16 + 2 k, + 1 gives sub-block s's pair its high bits as bits 0 and 8 of hb >> s (the
// integer steps checked against Q5_K::lane in a numpy emulation of dp4a / byte_perm: 3000 random and extreme blocks x
// 16 lanes, 0 mismatches in P and M, session 36).
template <int kBits>
struct Q45kPart {
  static_assert(kBits == 4 || kBits == 5);
  static constexpr int kBytes = kBits == 4 ? 144 : 176;
  static constexpr int kCodes = kBits == 4 ? 16 : 48;  // the code bytes' offset
  static constexpr bool kMins = true;
  uint4 h;
  uint32_t c[4];
  uint32_t hb;  // (Q5_K) the lane's high-bit bytes 2 k, 2 k + 1
  int4 x;
  float dx;
  __device__ __forceinline__ void load(const uint8_t* blk, const int8_t* q, const float* dxp, int k) {
    h = __ldg(reinterpret_cast<const uint4*>(blk));  // 144 / 176-byte blocks of a 16-byte aligned matrix (kq_lanes_fit)
    const uint16_t* codes = reinterpret_cast<const uint16_t*>(blk + kCodes) + k;
#pragma unroll
    for (int i = 0; i < 4; i++) c[i] = __ldg(codes + 16 * i);
    if constexpr (kBits == 5) hb = __ldg(reinterpret_cast<const uint16_t*>(blk + 16) + k);
    x = __ldg(reinterpret_cast<const int4*>(q + 16 * k));
    dx = __ldg(dxp);
  }
  // the lane's P and its share of M (summed over the 16 lanes by the caller)
  __device__ __forceinline__ void sums(int& P, int& M) const {
    const uint32_t sc_lo = k4_word(h, 0, false), m_lo = k4_word(h, 0, true);  // sub-blocks 0..3
    const uint32_t sc_hi = k4_word(h, 1, false), m_hi = k4_word(h, 1, true);  // 4..7
    const int xw[4] = {x.x, x.y, x.z, x.w};
    P = 0;
    M = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {  // sub-blocks 2i, 2i + 1
      const uint32_t scw = i < 2 ? sc_lo : sc_hi, mw = i < 2 ? m_lo : m_hi;
      const int sh = 16 * (i & 1);  // their scales' bytes in scw / mw: 2 (i & 1), + 1
      const int sa = (int)((scw >> sh) & 0xffu), sb = (int)((scw >> (sh + 8)) & 0xffu);
      uint32_t lw = c[i] & 0x0f0fu, hw = (c[i] << 12) & 0x0f0f0000u;  // sub-block 2i's pair (bytes 0, 1), 2i + 1's (2, 3)
      if constexpr (kBits == 5) {
        lw |= ((hb >> (2 * i)) & 0x0101u) << 4;
        hw |= ((hb >> (2 * i + 1)) & 0x0101u) << 20;
      }
      const int lo = __dp4a((int)lw, xw[i], 0);
      const int hi = __dp4a((int)hw, xw[i], 0);
      P += sa * lo + sb * hi;
      M = __dp4a((int)__byte_perm(mw, 0, (i & 1) ? 0x3322u : 0x1100u), xw[i], M);
    }
  }
  __device__ __forceinline__ float d() const { return k4_d(h); }
  __device__ __forceinline__ float dmin() const { return k4_dmin(h); }
};
using Q4kPart = Q45kPart<4>;
using Q5kPart = Q45kPart<5>;

// One Q6_K block's share of lane k: its 4 low-bit words (h, j), 2 high-bit words (h), its 8 scales (sub-block s:
// byte 2 s + k / 8 of the 16), d, its 16 activation bytes and the block's activation scale. 210-byte blocks: 16-bit
// loads.
struct Q6kPart {
  static constexpr int kBytes = 210;
  static constexpr bool kMins = false;
  uint32_t ql[4], qh[2];
  int sc[8];
  uint16_t dh;
  int4 x;
  float dx;
  __device__ __forceinline__ void load(const uint8_t* blk, const int8_t* q, const float* dxp, int k) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(blk);
#pragma unroll
    for (int i = 0; i < 4; i++) ql[i] = __ldg(w + 32 * (i >> 1) + 16 * (i & 1) + k);  // bytes 64 h + 32 j + 2 k
#pragma unroll
    for (int i = 0; i < 2; i++) qh[i] = __ldg(w + 64 + 16 * i + k);  // bytes 128 + 32 h + 2 k
    const int8_t* s = reinterpret_cast<const int8_t*>(blk + 192) + (k >> 3);
#pragma unroll
    for (int i = 0; i < 8; i++) sc[i] = __ldg(s + 2 * i);
    dh = __ldg(w + 104);
    x = __ldg(reinterpret_cast<const int4*>(q + 16 * k));
    dx = __ldg(dxp);
  }
  __device__ __forceinline__ void sums(int& P, int& M) const {
    const int xw[4] = {x.x, x.y, x.z, x.w};
    P = 0;
    M = 0;
#pragma unroll
    for (int s = 0; s < 8; s++) {
      const int h = s >> 2, j = s & 3;  // sub-block s = 4 h + j
      const uint32_t lo = (ql[2 * h + (j & 1)] >> (4 * (j >> 1))) & 0x0f0fu;
      const uint32_t hb = ((qh[h] >> (2 * j)) & 0x0303u) << 4;
      const uint32_t w2 = __vsub4(lo | hb, 0x2020u);  // bytes 0, 1: q - 32 (signed); bytes 2, 3: 0
      P += sc[s] * __dp4a((int)((s & 1) ? w2 << 16 : w2), xw[s >> 1], 0);
    }
  }
  __device__ __forceinline__ float d() const { return __half2float(__ushort_as_half(dh)); }
};

// One weight row's running sums over its blocks (lane k's L, and the row's Lm for types with mins): the blocks of a
// step's parts p[0..kU) in order, as k_int<D, 1>.
template <class Part, int kU>
struct KqRowSums {
  float L = 0.f, Lm = 0.f;
  int P[kU], M[kU];
  float dd[kU], dm[kU];
  // this step's integer sums and scales (before the next step's loads are issued)
  __device__ __forceinline__ void sums(const Part (&p)[kU]) {
#pragma unroll
    for (int u = 0; u < kU; u++) {
      p[u].sums(P[u], M[u]);
      dd[u] = __fmul_rn(p[u].d(), p[u].dx);
      if constexpr (Part::kMins) dm[u] = __fmul_rn(p[u].dmin(), p[u].dx);
    }
  }
  // then the block's mins summed over the row's 16 lanes (k_int's shuffles: integers) and the fma chains
  __device__ __forceinline__ void accumulate(int64_t b0, int64_t nb) {
#pragma unroll
    for (int u = 0; u < kU; u++) {
      if constexpr (Part::kMins) {
        M[u] += __shfl_xor_sync(0xffffffffu, M[u], 8, 16);
        M[u] += __shfl_xor_sync(0xffffffffu, M[u], 4, 16);
        M[u] += __shfl_xor_sync(0xffffffffu, M[u], 2, 16);
        M[u] += __shfl_xor_sync(0xffffffffu, M[u], 1, 16);
      }
      if (b0 + u < nb) {
        L = fmaf(dd[u], (float)P[u], L);
        if constexpr (Part::kMins) Lm = fmaf(dm[u], (float)M[u], Lm);
      }
    }
  }
  // the row's value on lane 0 of the 16 (Q6_K: Lm = 0, k_int's y = s - 0)
  __device__ __forceinline__ float value() const { return __fsub_rn(reduce16(L), Lm); }
};

// k_int<D, 1>'s grid and its values: 16 lanes a weight row, blockDim.x / 16 rows a block, grid-stride over the row
// groups; with sel, grid row y is slot y (its expert's matrix, activation row y / xdiv, output row y); without,
// activation row y (the row split). kU blocks of a row in flight.
// kPair (matmul_sel_swiglu, with sel): the 16 lanes also take row r of W2 (the up matrix, same shape; expert e's at
// W2 + e * ebytes2) over the same activations, write it to y2 and silu(y) * y2 to y: layers.cu's silu_mul, the same
// operations, so the same bits as the two products and silu_mul.
template <class Part, int kU, bool kPair = false>
__global__ void __launch_bounds__(256) k_kq_lanes(const uint8_t* __restrict__ W, size_t row_bytes, int64_t rows,
                                                  int64_t nb, const int8_t* __restrict__ q, const float* __restrict__ dx,
                                                  float* __restrict__ y, int64_t ldy, const int32_t* __restrict__ sel,
                                                  size_t ebytes, int xdiv, const uint8_t* __restrict__ W2,
                                                  size_t ebytes2, float* __restrict__ y2) {
  if (!sel) prefetch_rows(W, row_bytes, rows, (int64_t)blockIdx.x * (blockDim.x >> 4), blockDim.x >> 4);
  pdl_wait();
  {
    const int slot = blockIdx.y;
    if (sel) W += (size_t)sel[slot] * ebytes;
    if constexpr (kPair) W2 += (size_t)sel[slot] * ebytes2, y2 += (int64_t)slot * ldy;
    const int64_t xr = sel ? slot / xdiv : slot;
    q += xr * nb * QK_K;
    dx += xr * nb;
    y += (int64_t)slot * ldy;
  }
  const int k = threadIdx.x & 15, rpb = blockDim.x >> 4;
  const int64_t groups = (rows + rpb - 1) / rpb;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t r = g * rpb + (threadIdx.x >> 4), rc = r < rows ? r : rows - 1;
    const uint8_t* row = W + rc * row_bytes;
    const uint8_t* row2 = kPair ? W2 + rc * row_bytes : nullptr;
    Part p[kU], p2[kPair ? kU : 1];
    auto load = [&](int64_t b0) {
#pragma unroll
      for (int u = 0; u < kU; u++) {
        const int64_t b = b0 + u < nb ? b0 + u : nb - 1;
        p[u].load(row + b * Part::kBytes, q + b * QK_K, dx + b, k);
        if constexpr (kPair) p2[u].load(row2 + b * Part::kBytes, q + b * QK_K, dx + b, k);
      }
    };
    load(0);
    KqRowSums<Part, kU> a;
    [[maybe_unused]] KqRowSums<Part, kU> a2;
    for (int64_t b0 = 0; b0 < nb; b0 += kU) {
      a.sums(p);
      if constexpr (kPair) a2.sums(p2);
      if (b0 + kU < nb) load(b0 + kU);  // in flight while this step's sums finish
      a.accumulate(b0, nb);
      if constexpr (kPair) a2.accumulate(b0, nb);
    }
    const float v = a.value();
    if constexpr (kPair) {
      const float up = a2.value();
      if (k == 0 && r < rows) {
        y2[r] = up;
        y[r] = __fmul_rn(silu_of(v), up);
      }
    } else {
      if (k == 0 && r < rows) y[r] = v;
    }
  }
}

// The types k_kq_lanes has (the callers' launches are compiled for these alone).
template <class D>
constexpr bool kHasKqLanes = std::is_same_v<D, Q4_K> || std::is_same_v<D, Q5_K> || std::is_same_v<D, Q6_K>;

// A matrix, its rows and (with sel) each expert's matrix on 16 bytes: the 16-byte loads of the Q4_K / Q5_K kernels
// (here and kq_mma.cuh).
inline bool aligned16(const uint8_t* W, size_t row_bytes, size_t ebytes) {
  return reinterpret_cast<uintptr_t>(W) % 16 == 0 && row_bytes % 16 == 0 && ebytes % 16 == 0;
}

// Whether k_kq_lanes takes a product of type D (one of kHasKqLanes): on (prefer_kq_lanes), and Q4_K's 16-byte header
// loads aligned (the matrix, its rows and, with sel, each expert's matrix on 16 bytes; a GGUF's tensors are at its
// default alignment of 32; else k_int<Q4_K, 1>, which reads 16-bit words). Q6_K reads 16-bit words and bytes.
template <class D>
bool kq_lanes_fit(const uint8_t* W, size_t row_bytes, size_t ebytes) {
  static_assert(kHasKqLanes<D>);
  if constexpr (std::is_same_v<D, Q4_K>) return g_kq_lanes && aligned16(W, row_bytes, ebytes);
  if constexpr (std::is_same_v<D, Q5_K>) return g_kq_lanes && g_q5k_lanes && aligned16(W, row_bytes, ebytes);
  return g_kq_lanes;
}

// k_kq_lanes for type D over n grid rows (slots with sel, else activation rows) in k_int<D, 1>'s grid: gx blocks of
// `threads` (16 lanes a weight row). Rows of at most 2 blocks (the experts' down products of 512 columns) 2 blocks a
// step, else 4. With W2 (and sel): the gate / up pair (k_kq_lanes' kPair; y2 the up rows), 2 blocks a step (twice the
// parts in registers).
template <class D>
void launch_kq_lanes(const MatView& W, size_t ebytes, const int32_t* sel, int n, int xdiv, const int8_t* q,
                     const float* dx, float* y, int64_t ldy, int threads, int64_t gx, cudaStream_t st,
                     const uint8_t* W2 = nullptr, size_t ebytes2 = 0, float* y2 = nullptr) {
  static_assert(kHasKqLanes<D>);
  using Part = std::conditional_t<std::is_same_v<D, Q4_K>, Q4kPart, std::conditional_t<std::is_same_v<D, Q5_K>, Q5kPart, Q6kPart>>;
  STRATA_CHECK(!W2 || (sel && y2), "cuda launch_kq_lanes: the gate / up pair needs a selection and the up rows");
  const int64_t nb = W.cols / QK_K;
  auto go = [&](auto kern) {
    launch(kern, dim3((unsigned)gx, (unsigned)n), threads, 0, st, W.data, W.row_bytes, W.rows, nb, q, dx, y, ldy, sel,
           ebytes, xdiv, W2, ebytes2, y2);
  };
  if (W2) go(k_kq_lanes<Part, 2, true>);
  else if (nb <= 2) go(k_kq_lanes<Part, 2>);
  else go(k_kq_lanes<Part, 4>);
}

// Tests and benches (prefer_kq_pair): the experts' Q4_K / Q5_K / Q6_K gate / up / SwiGLU of a few slots (not tiles) as one
// k_kq_lanes pair launch, or (the default until it has run on a card) the two products and silu_mul. Same bits.
bool g_kq_pair = false;
