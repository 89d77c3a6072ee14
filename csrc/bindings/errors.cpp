// C++ exceptions as Python exceptions (ValueError, RuntimeError, ... as nanobind maps them), with messages that
// may hold bytes from a file (a key or tensor name, a path) that are not UTF-8: nanobind's default translation
// would then raise a UnicodeDecodeError that names neither the file nor the field. Here such bytes are kept as
// \xNN escapes.
#include <nanobind/nanobind.h>

#include <cstring>
#include <new>
#include <stdexcept>

namespace nb = nanobind;

static void set_error(PyObject* type, const char* what) {
  PyObject* msg = PyUnicode_DecodeUTF8(what, (Py_ssize_t)std::strlen(what), "backslashreplace");
  if (!msg) {
    PyErr_Clear();
    msg = PyUnicode_FromString("(an error message that could not be decoded)");
  }
  PyErr_SetObject(type, msg);
  Py_DECREF(msg);
}

void init_errors(nb::module_&) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const nb::builtin_exception&) {
      throw;  // nanobind's own (value_error, ...): its default translation
    } catch (const nb::python_error&) {
      throw;
    } catch (const std::bad_alloc& e) {
      set_error(PyExc_MemoryError, e.what());
    } catch (const std::invalid_argument& e) {
      set_error(PyExc_ValueError, e.what());
    } catch (const std::domain_error& e) {
      set_error(PyExc_ValueError, e.what());
    } catch (const std::length_error& e) {
      set_error(PyExc_ValueError, e.what());
    } catch (const std::range_error& e) {
      set_error(PyExc_ValueError, e.what());
    } catch (const std::out_of_range& e) {
      set_error(PyExc_IndexError, e.what());
    } catch (const std::overflow_error& e) {
      set_error(PyExc_OverflowError, e.what());
    } catch (const std::exception& e) {
      set_error(PyExc_RuntimeError, e.what());
    }
  });
}
