// Checkpoint files: the in-memory Checkpoint (strata.h) as named, typed, size-checked sections.
// Session::save / Session::load are the only callers; the Checkpoint struct stays the interface.
//
// Layout (little-endian), version 3:
//   header  48 bytes: "STRATACP", u32 version, u32 n_sections, u64 fingerprint, i64 n_ctx, i64 position,
//           u64 checksum of the header's first 40 bytes and the table
//   table   n_sections x 64 bytes: char name[32] (NUL-padded), u32 element type (1 i32, 2 f32, 3 i64),
//           u32 0, u64 count, u64 offset, u64 checksum of the section's bytes (sections: for_each_section in
//           checkpoint_file.cpp; scalars are sections of one i64)
//   data    the sections at their offsets: 8-aligned, ascending, no overlap; the file ends with the last
//
// Reading validates before anything is allocated or restored: the header, the table against the file size
// (offsets, count x element size without overflow, order, names unique and known), the fingerprint,
// position <= the session's context, and every section's element type and count against what this session
// expects (CheckpointShape); then each section is read into a buffer of exactly that size and its checksum
// checked. Every refusal is a std::invalid_argument naming the file and the section or field.
//
// Versions 1 and 2 (one checksummed sequence of length-prefixed arrays, before issue 18) are still read: the
// file's size must be exactly what its position and this session's shape give before it is read, and every
// length must match before anything is copied.
//
// Writing is write-then-rename: a new file next to the target (O_EXCL), written, fsync'ed and closed, then
// renamed over the target and the directory fsync'ed. Any failure before the rename (ENOSPC, EIO, EFBIG)
// removes the new file and throws std::runtime_error naming the target and the error: the target keeps
// its old content (or stays absent), and the session is untouched.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

struct Checkpoint;

// What a session expects of a checkpoint: the model, its context and the size of each piece of state.
struct CheckpointShape {
  uint64_t fingerprint = 0;
  std::string model_file;             // this session's model (refusals name it)
  int64_t n_ctx = 0;                  // position must be <= this
  std::vector<int64_t> kv_width;      // per attention layer: floats per cell of K (and of V)
  std::vector<int64_t> qsa_dim, qsa_ratio;  // per attention layer: QSA index key size and block (0: no QSA)
  std::vector<int64_t> dn_S, dn_conv; // per DeltaNet layer: floats of S and of the conv history
  int64_t ple_conv = 0;               // floats of the PLE conv history
};

void write_checkpoint_file(const std::string& path, const Checkpoint& cp, const CheckpointShape& shape);
Checkpoint read_checkpoint_file(const std::string& path, const CheckpointShape& shape);

// For the fuzzer (fuzz/fuzz_checkpoint.cpp): recomputes the header and section checksums of a checkpoint
// image in place wherever its table can be followed, so mutations reach the validation behind them.
void checkpoint_reseal(uint8_t* data, size_t size);

// Test hook (fault injection): the next checkpoint write fails with errno `err` once `after_bytes` bytes
// of the new file are written (op 0), or at its fsync (op 1). err = 0 clears. Never set by the engine.
void checkpoint_inject_fault(int err, uint64_t after_bytes, int op);

}  // namespace strata
