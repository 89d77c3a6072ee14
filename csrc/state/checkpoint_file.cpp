#include "state/checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>

#include "strata.h"

namespace strata {

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'C', 'P'};
constexpr uint32_t kVersion = 3;  // 1, 2: the sequential layout before issue 18 (read_legacy)
constexpr uint64_t kHeaderBytes = 48, kRecordBytes = 64, kNameBytes = 32;
constexpr uint32_t kMaxSections = 1 << 16;
constexpr uint64_t kMaxText = 4096;  // bytes of a text section (the model file's path: its last 4096 bytes)
enum Elem : uint32_t { kI32 = 1, kF32 = 2, kI64 = 3 };
template <class T> constexpr Elem elem_of();
template <> constexpr Elem elem_of<int32_t>() { return kI32; }
template <> constexpr Elem elem_of<float>() { return kF32; }
template <> constexpr Elem elem_of<int64_t>() { return kI64; }
uint64_t elem_bytes(uint32_t e) { return e == kI64 ? 8 : 4; }

template <class T>
void layers(std::vector<T>& v, size_t n) { v.resize(n); }
template <class T>
void layers(const std::vector<T>& v, size_t n) {
  if (v.size() != n) fail<std::logic_error>("checkpoint: ", v.size(), " layers of state, the session has ", n);
}

// The sections of a checkpoint file, in file order. To save more state: add its field to Checkpoint
// (strata.h) and one line here with the element count this session expects (its size in CheckpointShape if
// it depends on the model); the writer then writes it and the reader refuses a file in which it is missing,
// of another type or of another size. `layers` sizes a per-layer list on read and checks it on write.
// V: v.array(name, std::vector<T>&, expected count), v.scalar(name, int64_t&) (a section of one i64) and
// v.text(name, std::string&) (i32 values 0..255, at most kMaxText; optional: files before it read as "").
template <class CP, class V>
void for_each_section(CP& cp, const CheckpointShape& sh, V& v) {
  const size_t n_attn = sh.kv_width.size(), n_dn = sh.dn_S.size();
  v.array("tokens", cp.tokens, cp.position);
  layers(cp.k, n_attn);
  layers(cp.v, n_attn);
  for (size_t i = 0; i < n_attn; i++) {
    v.array(cat("attn.", i, ".k"), cp.k[i], cp.position * sh.kv_width[i]);
    v.array(cat("attn.", i, ".v"), cp.v[i], cp.position * sh.kv_width[i]);
  }
  layers(cp.S, n_dn);
  layers(cp.conv, n_dn);
  for (size_t i = 0; i < n_dn; i++) {
    v.array(cat("deltanet.", i, ".S"), cp.S[i], sh.dn_S[i]);
    v.array(cat("deltanet.", i, ".conv"), cp.conv[i], sh.dn_conv[i]);
  }
  layers(cp.idx_raw, n_attn);
  layers(cp.idx_pooled, n_attn);
  for (size_t i = 0; i < n_attn; i++)
    if (sh.qsa_dim[i] > 0) {  // QSA layers only (the lists keep an empty entry for the others)
      v.array(cat("qsa.", i, ".raw"), cp.idx_raw[i], cp.position * sh.qsa_dim[i]);
      v.array(cat("qsa.", i, ".pooled"), cp.idx_pooled[i], cp.position / sh.qsa_ratio[i] * sh.qsa_dim[i]);
    }
  if (sh.ple_conv > 0) v.array("ple.conv", cp.ple_conv, sh.ple_conv);
  v.scalar("steer.origin", cp.steer_origin);
  v.text("model.file", cp.model_file);  // what a refusal names (the fingerprint decides)
}

// 64-bit checksum of a byte range (damage detection, not authentication).
uint64_t checksum(const void* p, size_t n, uint64_t h = 0x9e3779b97f4a7c15ull) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, b + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

struct Record {
  char name[kNameBytes];
  uint32_t elem, zero;
  uint64_t count, offset, sum;
};
static_assert(sizeof(Record) == kRecordBytes, "checkpoint table record layout");

struct Fault {
  std::atomic<int> err{0}, op{0};
  std::atomic<uint64_t> after{0};
};
Fault g_fault;

// One open output file; every failure throws naming the target (the caller removes the new file).
struct Out {
  const std::string& target;
  int fd;
  uint64_t written = 0;
  void write(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    while (n > 0) {
      size_t chunk = n;
      int fault = 0;
      if (g_fault.err.load() && g_fault.op.load() == 0) {
        const uint64_t after = g_fault.after.load();
        if (written >= after) fault = g_fault.err.exchange(0);
        else chunk = (size_t)std::min<uint64_t>(chunk, after - written);
      }
      const ssize_t r = fault ? (errno = fault, -1) : ::write(fd, b, chunk);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) fail<std::runtime_error>(target, ": cannot save the checkpoint: write failed after ", written,
                                           " bytes: ", std::strerror(r < 0 ? errno : EIO));
      b += r;
      n -= (size_t)r;
      written += (uint64_t)r;
    }
  }
  void sync() {
    int fault = g_fault.op.load() == 1 ? g_fault.err.exchange(0) : 0;
    if (fault || fsync(fd) != 0)
      fail<std::runtime_error>(target, ": cannot save the checkpoint: fsync failed: ", std::strerror(fault ? fault : errno));
  }
};

// The writer's visitor: the table of sections (place and checksum) from memory.
struct Tabler {
  std::vector<Record> table;
  std::vector<const void*> src;
  template <class T>
  void array(const std::string& name, const std::vector<T>& vec, int64_t want) {
    if ((int64_t)vec.size() != want)
      fail<std::logic_error>("checkpoint section '", name, "' holds ", vec.size(), " values, expected ", want);
    add(name, elem_of<T>(), vec.data(), vec.size());
  }
  void scalar(const std::string& name, const int64_t& x) { add(name, kI64, &x, 1); }
  std::deque<std::vector<int32_t>> texts;  // the text sections' values (a deque: pointers into it stay valid)
  void text(const std::string& name, const std::string& s) {
    const std::string t = s.size() > kMaxText ? s.substr(s.size() - kMaxText) : s;
    texts.emplace_back(t.begin(), t.end());
    for (auto& c : texts.back()) c &= 0xFF;
    add(name, kI32, texts.back().data(), texts.back().size());
  }
  void add(const std::string& name, Elem e, const void* data, uint64_t count) {
    Record r{};
    std::memcpy(r.name, name.data(), std::min<size_t>(name.size(), kNameBytes - 1));
    r.elem = e;
    r.count = count;
    r.sum = checksum(data, count * elem_bytes(e));
    table.push_back(r);
    src.push_back(data);
  }
};

// The reader's visitor: each expected section found, its type and count checked, read and its checksum checked.
struct Sections {
  const std::vector<Record>& table;
  const std::map<std::string, size_t>& index;
  std::vector<char> seen;
  const std::function<void(const Record&, void*, const std::string&)>& read;
  const std::string& path;
  int64_t position;
  const Record& find(const std::string& name, uint32_t elem) {
    auto it = index.find(name);
    if (it == index.end()) fail<std::invalid_argument>(path, ": damaged checkpoint: section '", name, "' is missing");
    const Record& r = table[it->second];
    if (r.elem != elem)
      fail<std::invalid_argument>(path, ": damaged checkpoint: section '", name, "' has element type ", r.elem,
                                  ", expected ", elem);
    seen[it->second] = 1;
    return r;
  }
  template <class T>
  void array(const std::string& name, std::vector<T>& vec, int64_t want) {
    const Record& r = find(name, elem_of<T>());
    if (r.count != (uint64_t)want)
      fail<std::invalid_argument>(path, ": checkpoint section '", name, "' holds ", r.count,
                                  " values; this session expects ", want, " (position ", position, ")");
    vec.resize(r.count);
    read(r, vec.data(), name);
  }
  void scalar(const std::string& name, int64_t& x) {
    const Record& r = find(name, kI64);
    if (r.count != 1) fail<std::invalid_argument>(path, ": damaged checkpoint: section '", name, "' holds ", r.count, " values, expected 1");
    read(r, &x, name);
  }
  void text(const std::string& name, std::string& s) {
    if (!index.count(name)) return;  // written before the section existed
    const Record& r = find(name, kI32);
    if (r.count > kMaxText)
      fail<std::invalid_argument>(path, ": damaged checkpoint: section '", name, "' holds ", r.count, " values, at most ",
                                  kMaxText);
    std::vector<int32_t> v(r.count);
    read(r, v.data(), name);
    s.clear();
    for (int32_t c : v) {
      if (c < 0 || c > 255) fail<std::invalid_argument>(path, ": damaged checkpoint: section '", name, "' holds ", c);
      s.push_back((char)c);
    }
  }
};

std::string dir_of(const std::string& path) {
  const size_t s = path.rfind('/');
  return s == std::string::npos ? "." : s == 0 ? "/" : path.substr(0, s);
}

// Versions 1 and 2 (before issue 18): magic, u32 version, u64 fingerprint, i64 n_ctx, i64 position, then
// length-prefixed arrays (u64 count + data): tokens; u64 n + n x (k, v); u64 n + n x (S, conv); version 2 also
// u64 n + n x (QSA raw, pooled) over every attention layer, the PLE history and an i64 steering origin; last a
// byte-wise FNV-1a of everything before it. Bounded the same way: the file must be exactly as long as this
// session's shape says for its position before it is read, and each length must match.
Checkpoint read_legacy(const std::string& path, uint64_t size, uint32_t version, const uint8_t* head,
                       const std::function<void(void*, uint64_t, uint64_t, const std::string&)>& read_at,
                       const CheckpointShape& sh) {
  constexpr uint64_t kLegacyHeader = 36;
  auto bad = [&](const auto&... a) { fail<std::invalid_argument>(path, ": damaged checkpoint: ", a...); };
  if (size < kLegacyHeader + 8) bad("the file has ", size, " bytes, less than a version-", version, " header");
  Checkpoint cp;
  std::memcpy(&cp.fingerprint, head + 12, 8);
  std::memcpy(&cp.n_ctx, head + 20, 8);
  std::memcpy(&cp.position, head + 28, 8);
  if (cp.fingerprint != sh.fingerprint)
    fail<std::invalid_argument>(path, ": checkpoint was saved from a different model (fingerprint ", std::hex,
                                cp.fingerprint, "); this session's model is ", sh.model_file, " (fingerprint ",
                                sh.fingerprint, ")");
  if (cp.position < 0 || cp.position > sh.n_ctx)
    fail<std::invalid_argument>(path, ": checkpoint position ", cp.position, " outside this session's context of ",
                                sh.n_ctx, " tokens");
  const uint64_t P = (uint64_t)cp.position, n_attn = sh.kv_width.size(), n_dn = sh.dn_S.size();
  // the exact size of the file this session's shape gives
  uint64_t want = kLegacyHeader + 8 + 4 * P + 8 + 8 + 8;  // header, tokens, two list counts, checksum
  for (uint64_t i = 0; i < n_attn; i++) want += 2 * (8 + 4 * P * sh.kv_width[i]);
  for (uint64_t i = 0; i < n_dn; i++) want += 8 + 4 * sh.dn_S[i] + 8 + 4 * sh.dn_conv[i];
  if (version >= 2) {
    want += 8 + 8 + 4 * sh.ple_conv + 8;
    for (uint64_t i = 0; i < n_attn; i++)
      want += 16 + 4 * (sh.qsa_dim[i] > 0 ? P * sh.qsa_dim[i] + P / sh.qsa_ratio[i] * sh.qsa_dim[i] : 0);
  }
  if (size != want)
    bad("a version-", version, " checkpoint at position ", P, " of this model has ", want, " bytes, the file ", size);
  std::vector<uint8_t> buf(size);
  read_at(buf.data(), size, 0, "data");
  uint64_t h = 1469598103934665603ull, sum;
  for (uint64_t i = 0; i + 8 < size; i++) h = (h ^ buf[i]) * 1099511628211ull;
  std::memcpy(&sum, buf.data() + size - 8, 8);
  if (h != sum) bad("checksum mismatch");
  uint64_t off = kLegacyHeader;
  auto u64 = [&]() {
    uint64_t v;
    std::memcpy(&v, buf.data() + off, 8);
    off += 8;
    return v;
  };
  auto vec = [&](auto& out, uint64_t count, const char* what, uint64_t layer) {
    if (u64() != count) bad("the ", what, " of layer ", layer, " do not hold ", count, " values");
    out.resize(count);
    if (count) std::memcpy(out.data(), buf.data() + off, count * 4);
    off += count * 4;
  };
  vec(cp.tokens, P, "tokens", 0);
  if (u64() != n_attn) bad("attention layer count");
  cp.k.resize(n_attn);
  cp.v.resize(n_attn);
  for (uint64_t i = 0; i < n_attn; i++) {
    vec(cp.k[i], P * sh.kv_width[i], "keys", i);
    vec(cp.v[i], P * sh.kv_width[i], "values", i);
  }
  if (u64() != n_dn) bad("DeltaNet layer count");
  cp.S.resize(n_dn);
  cp.conv.resize(n_dn);
  for (uint64_t i = 0; i < n_dn; i++) {
    vec(cp.S[i], sh.dn_S[i], "DeltaNet state", i);
    vec(cp.conv[i], sh.dn_conv[i], "conv history", i);
  }
  cp.idx_raw.resize(n_attn);
  cp.idx_pooled.resize(n_attn);
  cp.ple_conv.assign(sh.ple_conv, 0.f);
  if (version >= 2) {
    if (u64() != n_attn) bad("QSA layer count");
    for (uint64_t i = 0; i < n_attn; i++) {
      const bool q = sh.qsa_dim[i] > 0;
      vec(cp.idx_raw[i], q ? P * sh.qsa_dim[i] : 0, "QSA keys", i);
      vec(cp.idx_pooled[i], q ? P / sh.qsa_ratio[i] * sh.qsa_dim[i] : 0, "QSA pooled keys", i);
    }
    vec(cp.ple_conv, sh.ple_conv, "PLE history", 0);
    std::memcpy(&cp.steer_origin, buf.data() + off, 8);
  }
  return cp;
}

}  // namespace

void checkpoint_reseal(uint8_t* data, size_t size) {
  if (size < kHeaderBytes) return;
  uint32_t n;
  std::memcpy(&n, data + 12, 4);
  if (n > kMaxSections || kHeaderBytes + (uint64_t)n * kRecordBytes > size) return;
  for (uint32_t i = 0; i < n; i++) {
    Record r;
    uint8_t* rp = data + kHeaderBytes + (uint64_t)i * kRecordBytes;
    std::memcpy(&r, rp, sizeof r);
    uint64_t bytes;
    if (r.elem >= kI32 && r.elem <= kI64 && !__builtin_mul_overflow(r.count, elem_bytes(r.elem), &bytes) &&
        r.offset <= size && bytes <= size - r.offset) {
      r.sum = checksum(data + r.offset, bytes);
      std::memcpy(rp, &r, sizeof r);
    }
  }
  const uint64_t hsum = checksum(data + kHeaderBytes, (uint64_t)n * kRecordBytes, checksum(data, 40));
  std::memcpy(data + 40, &hsum, 8);
}

void checkpoint_inject_fault(int err, uint64_t after_bytes, int op) {
  g_fault.after = after_bytes;
  g_fault.op = op;
  g_fault.err = err;
}

void write_checkpoint_file(const std::string& path, const Checkpoint& cp, const CheckpointShape& sh) {
  // 1. the table: every section's place and checksum, from memory
  Tabler tb;
  for_each_section(cp, sh, tb);
  std::vector<Record>& table = tb.table;
  uint64_t off = kHeaderBytes + table.size() * kRecordBytes;
  for (auto& r : table) {
    r.offset = off;
    off += (r.count * elem_bytes(r.elem) + 7) / 8 * 8;
  }
  uint8_t head[kHeaderBytes] = {};
  std::memcpy(head, kMagic, 8);
  const uint32_t n = (uint32_t)table.size();
  std::memcpy(head + 8, &kVersion, 4);
  std::memcpy(head + 12, &n, 4);
  std::memcpy(head + 16, &cp.fingerprint, 8);
  std::memcpy(head + 24, &cp.n_ctx, 8);
  std::memcpy(head + 32, &cp.position, 8);
  const uint64_t hsum = checksum(table.data(), table.size() * kRecordBytes, checksum(head, 40));
  std::memcpy(head + 40, &hsum, 8);

  // 2. a new file next to the target, never an existing one
  std::string tmp;
  int fd = -1;
  for (int i = 0; i < 100 && fd < 0; i++) {
    tmp = cat(path, ".tmp.", getpid(), ".", i);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) fail<std::runtime_error>(path, ": cannot save the checkpoint: cannot create ", tmp, ": ", std::strerror(errno));
  try {
    Out out{path, fd};
    out.write(head, sizeof head);
    out.write(table.data(), table.size() * kRecordBytes);
    static const uint8_t pad[8] = {};
    for (size_t i = 0; i < table.size(); i++) {
      const uint64_t bytes = table[i].count * elem_bytes(table[i].elem);
      out.write(tb.src[i], bytes);
      out.write(pad, (8 - bytes % 8) % 8);
    }
    out.sync();
    const int c = ::close(fd);
    fd = -1;
    if (c != 0) fail<std::runtime_error>(path, ": cannot save the checkpoint: close failed: ", std::strerror(errno));
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      fail<std::runtime_error>(path, ": cannot save the checkpoint: cannot rename ", tmp, ": ", std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // 3. the rename itself made durable (some filesystems cannot fsync a directory: EINVAL is fine)
  const int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    const int r = fsync(dfd);
    const int e = errno;
    ::close(dfd);
    if (r != 0 && e != EINVAL && e != EROFS)
      fail<std::runtime_error>(path, ": the checkpoint was written but its directory could not be synced: ",
                               std::strerror(e));
  }
}

Checkpoint read_checkpoint_file(const std::string& path, const CheckpointShape& sh) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail<std::invalid_argument>(path, ": cannot open checkpoint: ", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) fail<std::invalid_argument>(path, ": cannot stat checkpoint: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail<std::invalid_argument>(path, ": not a regular file");
  const uint64_t size = (uint64_t)st.st_size;
  auto bad = [&](const auto&... a) { fail<std::invalid_argument>(path, ": damaged checkpoint: ", a...); };
  const std::function<void(void*, uint64_t, uint64_t, const std::string&)> read_at =
      [&](void* dst, uint64_t n, uint64_t at, const std::string& what) {
    uint8_t* d = static_cast<uint8_t*>(dst);
    while (n > 0) {
      const ssize_t r = pread(fd, d, n, (off_t)at);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) fail<std::invalid_argument>(path, ": cannot read checkpoint ", what, ": ",
                                              r < 0 ? std::strerror(errno) : "unexpected end of file");
      d += r;
      n -= (uint64_t)r;
      at += (uint64_t)r;
    }
  };

  // 1. header
  uint8_t head[kHeaderBytes];
  if (size < 12) fail<std::invalid_argument>(path, ": not a strata checkpoint (", size, " bytes)");
  read_at(head, std::min<uint64_t>(size, kHeaderBytes), 0, "header");
  if (std::memcmp(head, kMagic, 8) != 0) fail<std::invalid_argument>(path, ": not a strata checkpoint (bad magic)");
  uint32_t version, n;
  std::memcpy(&version, head + 8, 4);
  if (version == 1 || version == 2) return read_legacy(path, size, version, head, read_at, sh);
  if (version != kVersion)
    fail<std::invalid_argument>(path, ": checkpoint format version ", version, "; this strata reads version ", kVersion,
                                " (and versions 1, 2)");
  if (size < kHeaderBytes) bad("the file has ", size, " bytes, less than the ", kHeaderBytes, "-byte header");
  Checkpoint cp;
  std::memcpy(&n, head + 12, 4);
  std::memcpy(&cp.fingerprint, head + 16, 8);
  std::memcpy(&cp.n_ctx, head + 24, 8);
  std::memcpy(&cp.position, head + 32, 8);
  if (n > kMaxSections || kHeaderBytes + (uint64_t)n * kRecordBytes > size)
    bad("n_sections = ", n, " does not fit in the file's ", size, " bytes");
  std::vector<Record> table(n);
  read_at(table.data(), (uint64_t)n * kRecordBytes, kHeaderBytes, "section table");
  uint64_t hsum;
  std::memcpy(&hsum, head + 40, 8);
  if (checksum(table.data(), (uint64_t)n * kRecordBytes, checksum(head, 40)) != hsum)
    bad("header checksum mismatch");
  if (cp.fingerprint != sh.fingerprint) {
    // name the model it was saved with, if the file records it (a bounded, checksummed read; else "not recorded")
    std::string saved = "(not recorded)";
    for (const Record& r : table) {
      uint64_t nb = 0;
      if (std::string(r.name, strnlen(r.name, kNameBytes)) != "model.file" || r.elem != kI32 || r.count > kMaxText ||
          __builtin_mul_overflow(r.count, 4, &nb) || r.offset > size || nb > size - r.offset)
        continue;
      std::vector<int32_t> v(r.count);
      read_at(v.data(), nb, r.offset, "section 'model.file'");
      if (checksum(v.data(), nb) != r.sum) break;
      saved.clear();
      for (int32_t c : v) saved.push_back((char)(c & 0xFF));
      break;
    }
    fail<std::invalid_argument>(path, ": checkpoint was saved from a different model: ", saved, " (fingerprint ",
                                std::hex, cp.fingerprint, "); this session's model is ", sh.model_file,
                                " (fingerprint ", sh.fingerprint, ")");
  }
  if (cp.position < 0 || cp.n_ctx < cp.position) bad("position ", cp.position, " with n_ctx ", cp.n_ctx);
  if (cp.position > sh.n_ctx)
    fail<std::invalid_argument>(path, ": checkpoint position ", cp.position, " exceeds this session's context of ",
                                sh.n_ctx, " tokens");

  // 2. the table against the file: names, types, sizes, places
  std::map<std::string, size_t> index;
  uint64_t end = kHeaderBytes + (uint64_t)n * kRecordBytes;
  for (size_t i = 0; i < n; i++) {
    const Record& r = table[i];
    if (r.name[kNameBytes - 1] != 0 || r.name[0] == 0) bad("section #", i, " has no valid name");
    const std::string name(r.name);
    if (!index.emplace(name, i).second) bad("section '", name, "' appears twice");
    if (r.elem != kI32 && r.elem != kF32 && r.elem != kI64) bad("section '", name, "' has element type ", r.elem);
    uint64_t bytes;
    if (__builtin_mul_overflow(r.count, elem_bytes(r.elem), &bytes) || r.offset % 8 != 0 || r.offset < end ||
        r.offset > size || bytes > size - r.offset)
      bad("section '", name, "' (", r.count, " values at byte ", r.offset, ") does not fit in order in the file's ",
          size, " bytes");
    end = r.offset + (bytes + 7) / 8 * 8;
  }
  if (end != size) bad("the file has ", size, " bytes but its sections end at byte ", end);

  // 3. every section this session expects, each read into a buffer of exactly its size
  const std::function<void(const Record&, void*, const std::string&)> read_section =
      [&](const Record& r, void* dst, const std::string& name) {
        const uint64_t bytes = r.count * elem_bytes(r.elem);
        read_at(dst, bytes, r.offset, cat("section '", name, "'"));
        if (checksum(dst, bytes) != r.sum) bad("section '", name, "' checksum mismatch");
      };
  Sections sec{table, index, std::vector<char>(n, 0), read_section, path, cp.position};
  for_each_section(cp, sh, sec);
  std::vector<char>& seen = sec.seen;
  for (size_t i = 0; i < n; i++)
    if (!seen[i])
      fail<std::invalid_argument>(path, ": checkpoint section '", table[i].name,
                                  "' is unknown to this version of strata (restoring without it would not be exact)");
  return cp;
}

}  // namespace strata
