// The chunked gated delta rule (deltanet_chunked.h) on baseline x86-64, and the dispatch to the active ISA's
// build of the same source (dn_chunked_impl.h).
#include "state/deltanet_chunked.h"

#include "kernels/matmul.h"
#include "state/dn_chunked_impl.h"
#include "util/common.h"

namespace strata {

void dn_chunked_on(int isa, float* S, const DnSeq& seq, int T, int64_t dk, int64_t dv) {
  STRATA_CHECK(T >= 1 && dk >= 1 && dv >= 1, "dn_chunked: T = ", T, ", dk = ", dk, ", dv = ", dv);
  switch ((Isa)isa) {
    case Isa::AVX512: return dn_chunked_avx512(S, seq, T, dk, dv);
    case Isa::AVX2: return dn_chunked_avx2(S, seq, T, dk, dv);
    default: return dn_chunked_impl(S, seq, T, dk, dv);
  }
}

void dn_chunked(float* S, const DnSeq& seq, int T, int64_t dk, int64_t dv) {
  dn_chunked_on((int)active_isa(), S, seq, T, dk, dv);
}

}  // namespace strata
