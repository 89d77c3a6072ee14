// GGUF metadata and tensor table for Python (the tokenizer is built from the file's own vocabulary).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "gguf/gguf.h"
#include "kernels/types.h"

namespace nb = nanobind;
using namespace strata;

static nb::object to_py(const GgufValue& v) {
  if (v.type == GgufValueType::ARRAY) {
    nb::list l;
    for (const auto& e : v.array) l.append(to_py(e));
    return l;
  }
  if (auto p = std::get_if<int64_t>(&v.scalar)) return nb::int_(*p);
  if (auto p = std::get_if<uint64_t>(&v.scalar)) return nb::int_(*p);
  if (auto p = std::get_if<double>(&v.scalar)) return nb::float_(*p);
  if (auto p = std::get_if<bool>(&v.scalar)) return nb::bool_(*p);
  const std::string& s = std::get<std::string>(v.scalar);
  return nb::str(s.data(), s.size());
}

void init_gguf(nb::module_& m) {
  m.def(
      "gguf_metadata",
      [](const std::string& path) {
        auto f = GgufFile::open(path);
        nb::dict d;
        for (const auto& [k, v] : f->metadata()) d[nb::str(k.data(), k.size())] = to_py(v);
        return d;
      },
      nb::arg("path"), "All metadata of a GGUF file as a dict (arrays as lists). Validates the container.");
  m.def(
      "gguf_tensors",
      [](const std::string& path) {
        auto f = GgufFile::open(path);
        nb::list l;
        for (const auto& t : f->tensors()) {
          nb::list ne;
          for (auto v : t.ne) ne.append(v);
          l.append(nb::make_tuple(t.name, ne, type_name(t.type), f->data_offset() + t.offset, t.nbytes));
        }
        return l;
      },
      nb::arg("path"), "The tensor table: (name, ne, type, file offset, bytes) per tensor.");
}
