// A guard for read-only file mappings against truncation while mapped.
//
// When a mapped file shrinks, reading a page past its new end raises SIGBUS, which kills the process. A
// registered mapping instead gets zero pages there: a SIGBUS handler that finds the faulting address
// inside a registered range maps anonymous zero pages over the rest of the range, records the fault and
// returns, so the read completes (with zeros) and the owner's next check (GgufFile::check_intact) raises
// a clear error naming the file. The window that read zeros is discarded by that error.
// Faults outside registered ranges go to the handler that was installed before (Python's faulthandler,
// or the default action), so other crashes still crash as they would have.
//
// Async-signal safety: the handler only reads a fixed table of atomics and calls mmap.
#pragma once
#include <cstddef>

namespace strata {

// Registers [base, base + len); returns a slot, or -1 when the table (64 mappings) is full (the mapping
// is then unguarded: a truncation kills the process, as without the guard).
int map_guard_register(const void* base, size_t len);
void map_guard_unregister(int slot);
// True once a read in the slot's range hit a page past the end of its file.
bool map_guard_faulted(int slot);

}  // namespace strata
