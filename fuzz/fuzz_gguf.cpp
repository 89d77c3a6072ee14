// libFuzzer harness: the GGUF reader and model load (gguf/gguf.cpp, model/hparams.cpp, model/weights.cpp,
// the MTP-only file path and the expert stream of Model::load), then a short session on whatever loads:
// a 3-row verify window, a partial commit, a step, and MTP drafts when the file has the block. Any
// exception is a refusal (fine); a crash, a sanitizer report, a leak, a timeout or an allocation above
// -malloc_limit_mb is a bug. Build and run: tools/fuzz.sh (docs/FUZZING.md).
#include <cstdint>
#include <exception>

#include "fuzz_util.h"
#include "strata.h"

using namespace strata;

static void session_on(const std::shared_ptr<Model>& m, bool mtp) {
  SessionOptions so;
  so.n_ctx = std::min<int64_t>(16, m->hp().n_ctx_train);
  so.max_window = 4;
  so.mtp = mtp;
  if (Session::state_bytes(m->hp(), so) > kSessionBudget || so.n_ctx < 4) return;
  Session s(m, so);
  const int32_t V = (int32_t)m->hp().n_vocab;
  const int32_t toks[3] = {0, 1 % V, 2 % V};
  s.run(toks, 3);
  s.commit(2);
  s.run(toks + 2, 1);
  s.commit(1);
  if (mtp) s.mtp_draft(toks[0], 2);
  s.checkpoint();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemFile file(data, size);
  try {
    ModelOptions o;
    o.threads = 1;
    o.experts.io_threads = 1;
    o.experts.prefetch = (size & 2) != 0;
    if (size & 1) o.experts.cache_mib = 1;  // streamed experts for half the inputs
    std::shared_ptr<Model> m;
    try {
      m = Model::load(file.path, o);
    } catch (const std::invalid_argument&) {
      o.experts.cache_mib = -1;  // a 1 MiB cache may be too small for this geometry: load it resident
      m = Model::load(file.path, o);
    }
    session_on(m, false);
    if (m->weights().mtp.present) {
      session_on(m, true);
      o.mtp_path = file.path;  // the same file as a separate MTP-only GGUF
      o.experts.cache_mib = -1;
      session_on(Model::load(file.path, o), true);
    }
  } catch (const std::exception&) {
  }
  return 0;
}
