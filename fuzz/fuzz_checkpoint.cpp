// libFuzzer harness: the checkpoint reader (state/checkpoint_file.cpp) behind Session::load, for small
// models given after -ignore_remaining_args=1 as `-model=PATH` (one or more: tools/fuzz.sh passes the
// qwen3next and qwen4exp micro models of tests/fuzz_corpus/, so QSA keys and the PLE history are fuzzed too).
// The model is the one whose fingerprint the input's header names (else the first). A checkpoint that loads
// is run on (one step) and saved again, so the restored state is used, not only parsed.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "strata.h"

using namespace strata;

static std::vector<std::shared_ptr<Model>> g_models;
static std::string g_out;

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  ModelOptions o;
  o.threads = 1;
  for (int i = 1; i < *argc; i++)
    if (std::strncmp((*argv)[i], "-model=", 7) == 0) g_models.push_back(Model::load((*argv)[i] + 7, o));
  if (g_models.empty()) {
    std::fprintf(stderr, "fuzz_checkpoint: pass -ignore_remaining_args=1 -model=PATH ... (small GGUFs)\n");
    std::exit(2);
  }
  char tmpl[] = "/dev/shm/strata-fuzz-cp-XXXXXX";  // tmpfs: the save's fsync is cheap
  if (!mkdtemp(tmpl)) std::abort();
  g_out = std::string(tmpl) + "/out.cp";
  return 0;
}

// Most mutations are resealed (checksums recomputed) so they reach the table and size checks behind the
// checksums; one in four is left as mutated, for the checksum checks themselves.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  size = LLVMFuzzerMutate(data, size, max_size);
  if (seed % 4 != 0) checkpoint_reseal(data, size);
  return size;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemFile file(data, size);
  std::shared_ptr<Model> model = g_models[0];
  uint64_t fp = 0;
  if (size >= 24) std::memcpy(&fp, data + 16, 8);
  for (const auto& m : g_models)
    if (m->fingerprint() == fp) model = m;
  SessionOptions so;
  so.n_ctx = 64;
  so.max_window = 4;
  Session s(model, so);
  try {
    s.load(file.path);
    const int32_t tok = 1;
    if (s.position() < s.n_ctx()) {
      s.run(&tok, 1);
      s.commit(1);
    }
    s.save(g_out);
  } catch (const std::exception&) {
  }
  return 0;
}
