// The `_core` extension: the only place that includes nanobind. One init_* per area.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

void init_errors(nb::module_& m);
void init_gguf(nb::module_& m);
void init_kernels(nb::module_& m);
void init_model(nb::module_& m);
void init_sampling(nb::module_& m);
void init_drafting(nb::module_& m);
void init_steering(nb::module_& m);

NB_MODULE(_core, m) {
  m.doc() = "strata C++ core: GGUF loading, Qwen3-Next on the CPU, the window transaction, sampling";
  init_errors(m);
  init_gguf(m);
  init_kernels(m);
  init_sampling(m);
  init_model(m);
  init_drafting(m);
  init_steering(m);
}
