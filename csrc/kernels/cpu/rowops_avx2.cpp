// rowops.h built with AVX2 flags: the same source as the baseline build (rowops_impl.h).
#include "kernels/rowops_impl.h"

namespace strata {

const RowOps& rowops_avx2() { return kRowOps; }

}  // namespace strata
