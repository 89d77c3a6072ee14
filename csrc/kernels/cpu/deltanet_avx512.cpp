// dn_rows compiled with AVX-512 flags (see state/dn_rows_impl.h): the same source, 16-lane vectors.
#include "state/dn_rows_impl.h"

namespace strata {

void dn_rows_avx512(float* S, float* S_work, const DnRow* rows, int T, int n_src, int64_t dk, int64_t dv) {
  dn_rows_impl(S, S_work, rows, T, n_src, dk, dv);
}

}  // namespace strata
