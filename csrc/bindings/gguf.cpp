// GGUF metadata and tensor table for Python (the tokenizer is built from the file's own vocabulary).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "gguf/gguf.h"
#include "kernels/types.h"
#include "util/common.h"

namespace nb = nanobind;
using namespace strata;

// GGUF strings are UTF-8 by the spec; one that is not is refused naming the file and key (Python's own
// UnicodeDecodeError would name neither).
static nb::object to_py(const GgufValue& v, const GgufFile& f, const std::string& key) {
  if (v.type == GgufValueType::ARRAY) {
    nb::list l;
    for (const auto& e : v.array) l.append(to_py(e, f, key));
    return l;
  }
  if (auto p = std::get_if<int64_t>(&v.scalar)) return nb::int_(*p);
  if (auto p = std::get_if<uint64_t>(&v.scalar)) return nb::int_(*p);
  if (auto p = std::get_if<double>(&v.scalar)) return nb::float_(*p);
  if (auto p = std::get_if<bool>(&v.scalar)) return nb::bool_(*p);
  const std::string& s = std::get<std::string>(v.scalar);
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), (Py_ssize_t)s.size(), "strict");
  if (!o) {
    PyErr_Clear();
    fail<std::invalid_argument>(f.path(), ": metadata key '", key, "' holds a string that is not valid UTF-8");
  }
  return nb::steal(o);
}

void init_gguf(nb::module_& m) {
  m.def(
      "gguf_metadata",
      [](const std::string& path) {
        auto f = GgufFile::open(path);
        nb::dict d;
        for (const auto& [k, v] : f->metadata()) {
          nb::object key = to_py(GgufValue{GgufValueType::STRING, GgufValueType::U8, k, {}}, *f, "(a key name)");
          d[key] = to_py(v, *f, k);
        }
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
