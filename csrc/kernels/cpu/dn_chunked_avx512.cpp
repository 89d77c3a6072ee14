// The chunked gated delta rule (state/deltanet_chunked.h) built with AVX512 flags: the same source as the
// baseline build (state/dn_chunked_impl.h), so the same bits.
#include "state/dn_chunked_impl.h"

namespace strata {

void dn_chunked_avx512(float* S, const DnSeq& seq, int T, int64_t dk, int64_t dv) { dn_chunked_impl(S, seq, T, dk, dv); }

}  // namespace strata
