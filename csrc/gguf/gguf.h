// GGUF v3 container: header, metadata, tensor table, memory-mapped data. File format only;
// nothing here knows about any model architecture.
//
// Hostile files (docs/SECURITY.md): open() checks every count, length, dimension, product, byte size and
// offset against the file size, against overflow and against gguf/limits.h before it allocates or reads,
// and throws std::invalid_argument naming the file and the field. The mapping is guarded
// (gguf/map_guard.h): if the file is truncated while mapped, reads past its new end see zeros instead of
// killing the process with SIGBUS, and check_intact() turns that (or any change of size or mtime) into a
// std::runtime_error naming the file.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace strata {

enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12,
};

// One metadata value. Scalars are widened: integers to int64 / uint64, floats to double.
struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  GgufValueType elem_type = GgufValueType::U8;  // for ARRAY
  std::variant<int64_t, uint64_t, double, bool, std::string> scalar;
  std::vector<GgufValue> array;  // for ARRAY
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;  // ne[0] is the contiguous (fastest) dimension
  uint32_t type = 0;        // ggml type id
  uint64_t offset = 0;      // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
  int64_t nelements() const {
    int64_t n = 1;
    for (auto v : ne) n *= v;
    return n;
  }
  std::string shape_str() const;
};

class GgufFile {
 public:
  // Opens and parses the file; throws std::invalid_argument naming the file and what is wrong.
  static std::shared_ptr<GgufFile> open(const std::string& path);
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }
  uint32_t alignment() const { return alignment_; }
  int fd() const { return fd_; }

  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find(const std::string& name) const;
  bool has_key(const std::string& key) const { return kv_.count(key) != 0; }

  // Typed accessors: throw naming the file and key when the key is missing or has the wrong type.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t dflt) const;
  // An integer in [lo, hi] (architecture limits: layer, head, expert counts); throws naming the file,
  // the key, the value and the range.
  int64_t get_int_in(const std::string& key, int64_t lo, int64_t hi) const;
  int64_t get_int_in(const std::string& key, int64_t lo, int64_t hi, int64_t dflt) const;
  // An array of integers or bools (bools as 0/1); throws naming the element that is neither.
  std::vector<int64_t> get_int_array(const std::string& key) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double dflt) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;
  const GgufValue& get(const std::string& key) const;

  // "" while the file is as it was opened; else what changed (size, mtime, a read past a truncated end).
  std::string changed() const;
  // Throws std::runtime_error naming the file when changed() is not "" (call before and after reading
  // weights from the mapping: a damaged read is then never used).
  void check_intact() const;

 private:
  GgufFile() = default;
  std::string path_;
  int fd_ = -1;
  uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
  int guard_ = -1;  // map_guard slot (-1: unguarded)
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace strata
