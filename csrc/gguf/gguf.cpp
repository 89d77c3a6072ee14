#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "kernels/types.h"
#include "util/common.h"

namespace strata {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"

// Bounds-checked little-endian cursor over the mapping; every read names the file on failure.
struct Cursor {
  const uint8_t* p;
  uint64_t size;
  uint64_t off = 0;
  const std::string& path;
  void need(uint64_t n, const char* what) {
    if (n > size || off > size - n)
      fail<std::invalid_argument>(path, ": truncated GGUF while reading ", what, " at byte ", off,
                                  " (file has ", size, " bytes)");
  }
  template <class T>
  T rd(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + off, sizeof(T));
    off += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    uint64_t n = rd<uint64_t>(what);
    if (n > (1ull << 30)) fail<std::invalid_argument>(path, ": implausible string length ", n, " in ", what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p + off), n);
    off += n;
    return s;
  }
};

GgufValue read_value(Cursor& c, GgufValueType t, const std::string& key, int depth) {
  GgufValue v;
  v.type = t;
  const char* w = key.c_str();
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
    case GgufValueType::BOOL: v.scalar = (bool)(c.rd<uint8_t>(w) != 0); break;
    case GgufValueType::STRING: v.scalar = c.str(w); break;
    case GgufValueType::ARRAY: {
      if (depth > 0) fail<std::invalid_argument>(c.path, ": nested array in metadata key '", key, "'");
      uint32_t et = c.rd<uint32_t>(w);
      if (et > 12) fail<std::invalid_argument>(c.path, ": metadata key '", key, "' has unknown array element type ", et);
      uint64_t n = c.rd<uint64_t>(w);
      if (n > c.size) fail<std::invalid_argument>(c.path, ": metadata key '", key, "' claims ", n, " elements");
      v.elem_type = (GgufValueType)et;
      v.array.reserve(n);
      for (uint64_t i = 0; i < n; i++) v.array.push_back(read_value(c, v.elem_type, key, depth + 1));
      break;
    }
    default:
      fail<std::invalid_argument>(c.path, ": metadata key '", key, "' has unknown value type ", (uint32_t)t);
  }
  return v;
}

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
  if (f->size_ < 24) fail<std::invalid_argument>(path, ": truncated GGUF: ", f->size_, " bytes is smaller than the header");
  void* m = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, f->fd_, 0);
  if (m == MAP_FAILED) fail<std::invalid_argument>(path, ": mmap failed: ", std::strerror(errno));
  f->map_ = static_cast<uint8_t*>(m);

  Cursor c{f->map_, f->size_, 0, f->path_};
  uint32_t magic = c.rd<uint32_t>("magic");
  if (magic != kMagic) fail<std::invalid_argument>(path, ": not a GGUF file (bad magic 0x", std::hex, magic, ")");
  f->version_ = c.rd<uint32_t>("version");
  if (f->version_ != 3 && f->version_ != 2)
    fail<std::invalid_argument>(path, ": unsupported GGUF version ", f->version_, " (expected 3)");
  uint64_t n_tensors = c.rd<uint64_t>("tensor_count");
  uint64_t n_kv = c.rd<uint64_t>("metadata_kv_count");
  if (n_tensors > f->size_ || n_kv > f->size_)
    fail<std::invalid_argument>(path, ": implausible header counts (", n_tensors, " tensors, ", n_kv, " keys)");
  for (uint64_t i = 0; i < n_kv; i++) {
    std::string key = c.str("metadata key");
    uint32_t t = c.rd<uint32_t>(key.c_str());
    if (t > 12) fail<std::invalid_argument>(path, ": metadata key '", key, "' has unknown value type ", t);
    f->kv_[key] = read_value(c, (GgufValueType)t, key, 0);
  }
  if (f->has_key("general.alignment")) {
    int64_t a = f->get_int("general.alignment");
    if (a <= 0 || (a & (a - 1)) != 0) fail<std::invalid_argument>(path, ": general.alignment = ", a, " is not a power of two");
    f->alignment_ = (uint32_t)a;
  }
  for (uint64_t i = 0; i < n_tensors; i++) {
    GgufTensor t;
    t.name = c.str("tensor name");
    uint32_t nd = c.rd<uint32_t>(t.name.c_str());
    if (nd == 0 || nd > 4) fail<std::invalid_argument>(path, ": tensor '", t.name, "' has ", nd, " dimensions (1..4 allowed)");
    for (uint32_t d = 0; d < nd; d++) {
      int64_t v = c.rd<int64_t>(t.name.c_str());
      if (v <= 0) fail<std::invalid_argument>(path, ": tensor '", t.name, "' has dimension ", d, " = ", v);
      t.ne.push_back(v);
    }
    t.type = c.rd<uint32_t>(t.name.c_str());
    t.offset = c.rd<uint64_t>(t.name.c_str());
    const TypeTraits* tt = type_traits(t.type);
    if (!tt) fail<std::invalid_argument>(path, ": tensor '", t.name, "' has unknown ggml type id ", t.type);
    if (t.ne[0] % tt->block_size != 0)
      fail<std::invalid_argument>(path, ": tensor '", t.name, "' of type ", tt->name, " has row length ", t.ne[0],
                                  ", not a multiple of the block size ", tt->block_size);
    uint64_t rows = 1;
    for (size_t d = 1; d < t.ne.size(); d++) rows *= (uint64_t)t.ne[d];
    t.nbytes = (uint64_t)(t.ne[0] / tt->block_size) * tt->type_size * rows;
    if (f->index_.count(t.name)) fail<std::invalid_argument>(path, ": duplicate tensor '", t.name, "'");
    f->index_[t.name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t));
  }
  f->data_offset_ = (c.off + f->alignment_ - 1) / f->alignment_ * f->alignment_;
  for (auto& t : f->tensors_) {
    if (t.offset % f->alignment_ != 0)
      fail<std::invalid_argument>(path, ": tensor '", t.name, "' offset ", t.offset, " is not aligned to ", f->alignment_);
    uint64_t end = f->data_offset_ + t.offset + t.nbytes;
    if (end > f->size_ || end < t.offset)
      fail<std::invalid_argument>(path, ": truncated GGUF: tensor '", t.name, "' ends at byte ", end,
                                  " but the file has ", f->size_, " bytes");
    t.data = f->map_ + f->data_offset_ + t.offset;
  }
  return f;
}

GgufFile::~GgufFile() {
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
  if (auto p = std::get_if<uint64_t>(&v.scalar); p && v.type != GgufValueType::ARRAY) return (int64_t)*p;
  if (auto p = std::get_if<bool>(&v.scalar); p && v.type == GgufValueType::BOOL) return *p;
  fail<std::invalid_argument>(path_, ": metadata key '", key, "' is not an integer");
}
int64_t GgufFile::get_int(const std::string& key, int64_t dflt) const { return has_key(key) ? get_int(key) : dflt; }

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
