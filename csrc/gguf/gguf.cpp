#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "gguf/limits.h"
#include "gguf/map_guard.h"
#include "kernels/types.h"
#include "util/common.h"

namespace strata {

namespace {

namespace L = gguf_limits;
constexpr uint32_t kMagic = 0x46554747;  // "GGUF"

// Bounds-checked little-endian cursor over the mapping; every read names the file on failure.
struct Cursor {
  const uint8_t* p;
  uint64_t size;
  uint64_t off = 0;
  const std::string& path;
  uint64_t left() const { return size - off; }
  void need(uint64_t n, const std::string& what) {
    if (n > left())
      fail<std::invalid_argument>(path, ": truncated GGUF while reading ", what, " at byte ", off, " (needs ", n,
                                  " bytes, the file has ", size, ")");
  }
  template <class T>
  T rd(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + off, sizeof(T));
    off += sizeof(T);
    return v;
  }
  // A length-prefixed string of at most max bytes; the length is checked before anything is allocated.
  std::string str(const std::string& what, uint64_t max) {
    const uint64_t at = off;
    const uint64_t n = rd<uint64_t>(what);
    if (n > max)
      fail<std::invalid_argument>(path, ": ", what, " at byte ", at, " claims ", n, " bytes (at most ", max,
                                  " allowed)");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p + off), n);
    off += n;
    return s;
  }
};

// Bytes one element of a value type occupies in the file at least (strings: their length field).
uint64_t min_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::BOOL: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    default: return 8;  // U64, I64, F64, STRING (length), ARRAY (never an element)
  }
}

struct Parser {
  Cursor& c;
  uint64_t array_elems = 0;  // all arrays so far (limit kMaxArrayElements)

  // w: "metadata key '<key>'", built once per key (not per array element)
  GgufValue value(GgufValueType t, const std::string& w, bool in_array) {
    GgufValue v;
    v.type = t;
    switch (t) {
      case GgufValueType::U8: v.scalar = (uint64_t)c.rd<uint8_t>(w); break;
      case GgufValueType::I8: v.scalar = (int64_t)c.rd<int8_t>(w); break;
      case GgufValueType::U16: v.scalar = (uint64_t)c.rd<uint16_t>(w); break;
      case GgufValueType::I16: v.scalar = (int64_t)c.rd<int16_t>(w); break;
      case GgufValueType::U32: v.scalar = (uint64_t)c.rd<uint32_t>(w); break;
      case GgufValueType::I32: v.scalar = (int64_t)c.rd<int32_t>(w); break;
      case GgufValueType::U64: v.scalar = (uint64_t)c.rd<uint64_t>(w); break;
      case GgufValueType::I64: v.scalar = (int64_t)c.rd<int64_t>(w); break;
      case GgufValueType::F32: v.scalar = (double)c.rd<float>(w); break;
      case GgufValueType::F64: v.scalar = c.rd<double>(w); break;
      case GgufValueType::BOOL: v.scalar = c.rd<uint8_t>(w) != 0; break;
      case GgufValueType::STRING: v.scalar = c.str(w, L::kMaxStringBytes); break;
      case GgufValueType::ARRAY: {
        if (in_array) fail<std::invalid_argument>(c.path, ": ", w, " is an array of arrays (not allowed)");
        const uint32_t et = c.rd<uint32_t>(w + " array type");
        if (et > 12 || et == (uint32_t)GgufValueType::ARRAY)
          fail<std::invalid_argument>(c.path, ": ", w, " has array element type ", et,
                                      et == 9 ? " (nested arrays are not allowed)" : " (unknown; 0..12 except 9 allowed)");
        v.elem_type = (GgufValueType)et;
        const uint64_t at = c.off;
        const uint64_t n = c.rd<uint64_t>(w + " array length");
        // before reserving: the elements must fit in the rest of the file, and all arrays in the limit
        if (n > c.left() / min_bytes(v.elem_type))
          fail<std::invalid_argument>(c.path, ": ", w, " claims ", n, " array elements at byte ", at,
                                      " but only ", c.left(), " bytes follow");
        if (n > L::kMaxArrayElements - array_elems)
          fail<std::invalid_argument>(c.path, ": ", w, " has ", n, " array elements; all arrays of a file may hold ",
                                      L::kMaxArrayElements, " together");
        array_elems += n;
        v.array.reserve(n);
        for (uint64_t i = 0; i < n; i++) v.array.push_back(value(v.elem_type, w, true));
        break;
      }
      default:
        fail<std::invalid_argument>(c.path, ": ", w, " has unknown value type ", (uint32_t)t, " (0..12 allowed)");
    }
    return v;
  }
};

bool mul_ok(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

}  // namespace

std::string GgufTensor::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); i++) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) fail<std::invalid_argument>(path, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (fstat(f->fd_, &st) != 0) fail<std::invalid_argument>(path, ": cannot stat: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail<std::invalid_argument>(path, ": not a regular file");
  f->size_ = (uint64_t)st.st_size;
  f->mtime_ns_ = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  if (f->size_ < 24) fail<std::invalid_argument>(path, ": truncated GGUF: ", f->size_, " bytes is smaller than the header");
  void* m = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, f->fd_, 0);
  if (m == MAP_FAILED) fail<std::invalid_argument>(path, ": mmap failed: ", std::strerror(errno));
  f->map_ = static_cast<uint8_t*>(m);
  f->guard_ = map_guard_register(f->map_, f->size_);

  Cursor c{f->map_, f->size_, 0, f->path_};
  const uint32_t magic = c.rd<uint32_t>("magic");
  if (magic != kMagic) fail<std::invalid_argument>(path, ": not a GGUF file (bad magic 0x", std::hex, magic, ")");
  f->version_ = c.rd<uint32_t>("version");
  if (f->version_ == 0x03000000 || f->version_ == 0x02000000)
    fail<std::invalid_argument>(path, ": big-endian GGUF (version bytes ", std::hex, f->version_,
                                ") is not supported; convert it to little-endian");
  if (f->version_ != 3 && f->version_ != 2)
    fail<std::invalid_argument>(path, ": unsupported GGUF version ", f->version_, " (expected 3; 2 is read too)");
  const uint64_t n_tensors = c.rd<uint64_t>("tensor_count");
  const uint64_t n_kv = c.rd<uint64_t>("metadata_kv_count");
  if (n_tensors > L::kMaxTensors)
    fail<std::invalid_argument>(path, ": tensor_count = ", n_tensors, " exceeds the limit of ", L::kMaxTensors);
  if (n_kv > L::kMaxKeys)
    fail<std::invalid_argument>(path, ": metadata_kv_count = ", n_kv, " exceeds the limit of ", L::kMaxKeys);
  // a key is at least 8 (length) + 1 + 4 (type) + 1 bytes, a tensor record 8 + 1 + 4 + 8 + 4 + 8
  if (n_kv * 14 + n_tensors * 33 > c.left())
    fail<std::invalid_argument>(path, ": truncated GGUF: ", n_kv, " keys and ", n_tensors,
                                " tensors cannot fit in the ", c.left(), " bytes after the header");

  Parser P{c};
  for (uint64_t i = 0; i < n_kv; i++) {
    const std::string key = c.str(cat("metadata key #", i), L::kMaxKeyBytes);
    if (key.empty()) fail<std::invalid_argument>(path, ": metadata key #", i, " is empty");
    const uint32_t t = c.rd<uint32_t>(cat("type of metadata key '", key, "'"));
    if (t > 12) fail<std::invalid_argument>(path, ": metadata key '", key, "' has unknown value type ", t, " (0..12 allowed)");
    if (f->kv_.count(key)) fail<std::invalid_argument>(path, ": duplicate metadata key '", key, "'");
    f->kv_.emplace(key, P.value((GgufValueType)t, cat("metadata key '", key, "'"), false));
  }
  if (f->has_key("general.alignment")) {
    const GgufValue& a = f->get("general.alignment");
    const auto* u = std::get_if<uint64_t>(&a.scalar);
    if (a.type != GgufValueType::U32 || !u)
      fail<std::invalid_argument>(path, ": general.alignment has value type ", (uint32_t)a.type, " (must be UINT32, 4)");
    if (*u == 0 || (*u & (*u - 1)) != 0 || *u > L::kMaxAlignment)
      fail<std::invalid_argument>(path, ": general.alignment = ", *u, " is not a power of two in 1..", L::kMaxAlignment);
    f->alignment_ = (uint32_t)*u;
  }
  for (uint64_t i = 0; i < n_tensors; i++) {
    GgufTensor t;
    t.name = c.str(cat("name of tensor #", i), L::kMaxTensorNameBytes);
    if (t.name.empty()) fail<std::invalid_argument>(path, ": tensor #", i, " has an empty name");
    const std::string tn = cat("tensor '", t.name, "'");
    const uint32_t nd = c.rd<uint32_t>(tn + " n_dims");
    if (nd == 0 || nd > L::kMaxDims)
      fail<std::invalid_argument>(path, ": ", tn, " has n_dims = ", nd, " (1..", L::kMaxDims, " allowed)");
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < nd; d++) {
      const int64_t v = c.rd<int64_t>(tn + " dimension");
      if (v <= 0) fail<std::invalid_argument>(path, ": ", tn, " has dimension ", d, " = ", v, " (must be >= 1)");
      if (!mul_ok(n_el, (uint64_t)v, &n_el) || n_el > (uint64_t)INT64_MAX)
        fail<std::invalid_argument>(path, ": ", tn, " has ", nd, " dimensions whose product overflows 63 bits (dimension ",
                                    d, " = ", v, ")");
      t.ne.push_back(v);
    }
    t.type = c.rd<uint32_t>(tn + " type");
    t.offset = c.rd<uint64_t>(tn + " offset");
    const TypeTraits* tt = type_traits(t.type);
    if (!tt) fail<std::invalid_argument>(path, ": ", tn, " has unknown ggml type id ", t.type);
    if (t.ne[0] % tt->block_size != 0)
      fail<std::invalid_argument>(path, ": ", tn, " of type ", tt->name, " has row length ", t.ne[0],
                                  ", not a multiple of the block size ", tt->block_size);
    // bytes = blocks * type_size, overflow-checked, and at most the file (the data check below is exact)
    if (!mul_ok(n_el / (uint64_t)tt->block_size, (uint64_t)tt->type_size, &t.nbytes) || t.nbytes > f->size_)
      fail<std::invalid_argument>(path, ": ", tn, " of type ", tt->name, " and shape ", t.shape_str(),
                                  " needs more bytes than the file has (", f->size_, ")");
    if (f->index_.count(t.name)) fail<std::invalid_argument>(path, ": duplicate tensor '", t.name, "'");
    f->index_[t.name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t));
  }
  f->data_offset_ = (c.off + f->alignment_ - 1) / f->alignment_ * f->alignment_;
  if (f->data_offset_ > f->size_ && !f->tensors_.empty())
    fail<std::invalid_argument>(path, ": truncated GGUF: the data section starts at byte ", f->data_offset_,
                                " but the file has ", f->size_, " bytes");
  const uint64_t data_bytes = f->size_ > f->data_offset_ ? f->size_ - f->data_offset_ : 0;
  for (auto& t : f->tensors_) {
    if (t.offset % f->alignment_ != 0)
      fail<std::invalid_argument>(path, ": tensor '", t.name, "' offset ", t.offset, " is not aligned to ", f->alignment_);
    if (t.offset > data_bytes || t.nbytes > data_bytes - t.offset)
      fail<std::invalid_argument>(path, ": truncated GGUF: tensor '", t.name, "' needs data bytes [", t.offset, ", ",
                                  t.offset, " + ", t.nbytes, ") but the data section has ", data_bytes, " bytes");
    t.data = f->map_ + f->data_offset_ + t.offset;
  }
  // tensors may not share bytes: so the data of all tensors together is at most the file (and every
  // byte a loader copies or dequantizes is counted once)
  std::vector<const GgufTensor*> by_off;
  for (const auto& t : f->tensors_) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(), [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_off.size(); i++)
    if (by_off[i]->offset < by_off[i - 1]->offset + by_off[i - 1]->nbytes)
      fail<std::invalid_argument>(path, ": tensors '", by_off[i - 1]->name, "' (bytes [", by_off[i - 1]->offset, ", ",
                                  by_off[i - 1]->offset + by_off[i - 1]->nbytes, ")) and '", by_off[i]->name,
                                  "' (from byte ", by_off[i]->offset, ") overlap");
  return f;
}

std::string GgufFile::changed() const {
  if (map_guard_faulted(guard_)) return "it was truncated while mapped: a read past its new end returned zeros";
  struct stat st;
  if (fstat(fd_, &st) != 0) return cat("cannot stat it: ", std::strerror(errno));
  if ((uint64_t)st.st_size != size_) return cat("its size changed from ", size_, " to ", st.st_size, " bytes");
  if ((int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec != mtime_ns_) return "it was modified";
  return "";
}

void GgufFile::check_intact() const {
  const std::string c = changed();
  if (!c.empty())
    fail<std::runtime_error>(path_, ": the model file changed since it was loaded (", c,
                             "); its weights can no longer be trusted. Reload the model.");
}

GgufFile::~GgufFile() {
  map_guard_unregister(guard_);
  if (map_) munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
}

const GgufTensor* GgufFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue& GgufFile::get(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) fail<std::invalid_argument>(path_, ": missing metadata key '", key, "'");
  return it->second;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = get(key);
  if (auto p = std::get_if<int64_t>(&v.scalar); p && v.type != GgufValueType::ARRAY) return *p;
  if (auto p = std::get_if<uint64_t>(&v.scalar); p && v.type != GgufValueType::ARRAY) {
    if (*p > (uint64_t)INT64_MAX) fail<std::invalid_argument>(path_, ": metadata key '", key, "' = ", *p, " does not fit in 63 bits");
    return (int64_t)*p;
  }
  if (auto p = std::get_if<bool>(&v.scalar); p && v.type == GgufValueType::BOOL) return *p;
  fail<std::invalid_argument>(path_, ": metadata key '", key, "' is not an integer");
}
int64_t GgufFile::get_int(const std::string& key, int64_t dflt) const { return has_key(key) ? get_int(key) : dflt; }

int64_t GgufFile::get_int_in(const std::string& key, int64_t lo, int64_t hi) const {
  const int64_t x = get_int(key);
  if (x < lo || x > hi) fail<std::invalid_argument>(path_, ": metadata key '", key, "' = ", x, " is outside ", lo, "..", hi);
  return x;
}
int64_t GgufFile::get_int_in(const std::string& key, int64_t lo, int64_t hi, int64_t dflt) const {
  return has_key(key) ? get_int_in(key, lo, hi) : dflt;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufValueType::ARRAY) fail<std::invalid_argument>(path_, ": metadata key '", key, "' is not an array");
  std::vector<int64_t> out;
  out.reserve(v.array.size());
  for (size_t i = 0; i < v.array.size(); i++) {
    const auto& s = v.array[i].scalar;
    if (auto b = std::get_if<bool>(&s)) out.push_back(*b);
    else if (auto p = std::get_if<int64_t>(&s)) out.push_back(*p);
    else if (auto u = std::get_if<uint64_t>(&s); u && *u <= (uint64_t)INT64_MAX) out.push_back((int64_t)*u);
    else fail<std::invalid_argument>(path_, ": metadata key '", key, "' element ", i, " is not an integer or bool");
  }
  return out;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type == GgufValueType::ARRAY) fail<std::invalid_argument>(path_, ": metadata key '", key, "' is an array, expected a number");
  if (auto p = std::get_if<double>(&v.scalar)) return *p;
  if (auto p = std::get_if<int64_t>(&v.scalar)) return (double)*p;
  if (auto p = std::get_if<uint64_t>(&v.scalar)) return (double)*p;
  fail<std::invalid_argument>(path_, ": metadata key '", key, "' is not a number");
}
double GgufFile::get_float(const std::string& key, double dflt) const { return has_key(key) ? get_float(key) : dflt; }

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = get(key);
  if (auto p = std::get_if<std::string>(&v.scalar); p && v.type == GgufValueType::STRING) return *p;
  fail<std::invalid_argument>(path_, ": metadata key '", key, "' is not a string");
}
std::string GgufFile::get_string(const std::string& key, const std::string& dflt) const {
  return has_key(key) ? get_string(key) : dflt;
}

}  // namespace strata
