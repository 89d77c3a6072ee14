// rowops.h built with AVX-512 flags: the same source as the baseline build (rowops_impl.h).
#include "kernels/rowops_impl.h"

namespace strata {

const RowOps& rowops_avx512() { return kRowOps; }

}  // namespace strata
