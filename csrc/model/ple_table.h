// The PLE n-gram table (qwen4exp.md 1.7): tens of GB for the released model, so it is never read whole.
// Rows are fetched one by one for the n-gram ids a window needs: from the file's mapping (the kernel pages
// in only what is touched; the range is advised MADV_RANDOM so a row does not pull in read-ahead), or, when
// the table is larger than the mapping budget, by pread of exactly the row's bytes. Thread-safe.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/matmul.h"

namespace strata {

class GgufFile;

class PleTable {
 public:
  // map_budget_bytes < table bytes: pread instead of the mapping.
  PleTable(const GgufFile& f, const MatView& table, uint64_t file_offset, uint64_t map_budget_bytes);
  int64_t rows() const { return t_.rows; }
  int64_t dim() const { return t_.cols; }
  bool uses_pread() const { return pread_; }
  // Row r as float32 [dim]; r < rows() (checked).
  void row(int64_t r, float* out) const;

 private:
  const GgufFile& f_;
  MatView t_;
  uint64_t off_;
  bool pread_;
};

}  // namespace strata
