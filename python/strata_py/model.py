"""The Python API over the C++ core: Model (immutable after load) and Session (one timeline).

    model = Model.load("model.gguf", threads=2)      # or Model.load() for the shipped default model
    s = model.session()
    logits = s.run(model.tokenizer.encode("def f("))  # [T, n_vocab] raw next-token logits per row
    s.commit(len(...))                                 # make the rows history

A session advances by windows: run(tokens) -> optional sample(...) -> commit(keep). See csrc/strata.h for
the transaction contract and each state type's rollback rule.
"""
from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from . import _core
from .config import GenerationConfig
from .tokenizer import Tokenizer

DEFAULT_MODEL_NAME = "strata-default-q8_0.gguf"


def default_model_path() -> Path:
    """The GGUF shipped inside the package (strata_py/data/)."""
    return Path(str(resources.files("strata_py") / "data" / DEFAULT_MODEL_NAME))


def _expected_sha256(path: Path) -> str | None:
    sums = path.with_name("SHA256SUMS")
    if not sums.exists():
        return None
    for line in sums.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == path.name:
            return parts[0]
    return None


def verify_default_model(path: Path) -> str:
    """SHA-256 of the shipped model, checked against data/SHA256SUMS; raises RuntimeError on mismatch."""
    want = _expected_sha256(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    got = h.hexdigest()
    if want is None:
        raise RuntimeError(f"{path}: no checksum recorded in {path.with_name('SHA256SUMS')}")
    if got != want:
        raise RuntimeError(f"{path}: SHA-256 {got} does not match the recorded {want}; the shipped model is damaged")
    return got


def sampling_params(cfg: GenerationConfig) -> "_core.SamplingParams":
    """The C++ sampler settings for a GenerationConfig."""
    p = _core.SamplingParams()
    p.temperature = cfg.temperature
    p.top_k = cfg.top_k
    p.top_p = cfg.top_p
    p.min_p = cfg.min_p
    p.repetition_penalty = cfg.repetition_penalty
    p.presence_penalty = cfg.presence_penalty
    p.frequency_penalty = cfg.frequency_penalty
    p.penalty_last_n = cfg.penalty_last_n
    p.seed = cfg.seed
    p.validate()
    return p


class Model:
    """A loaded, validated GGUF (qwen3next, qwen35moe or qwen4exp) with its tokenizer. Immutable; sessions share it."""

    def __init__(self, core: "_core.Model", tokenizer: Tokenizer, path: Path):
        self._core = core
        self.tokenizer = tokenizer
        self.path = path
        self._backends = {}  # backend name -> _core.BackendHold: its weights and the last session's recordings stay

    @classmethod
    def load(cls, path: str | Path | None = None, *, threads: int | None = None,
             mtp: str | Path | None = None, cache_mib: int | str | None = None, o_direct: bool = False,
             io_threads: int = 4, prefetch: bool = True, prefetch_root_only: bool = False,
             routing: str = "natural", approx_protect: int | None = None, approx_bonus: float = 0.85,
             approx_draft_protect: int | None = None, approx_draft_bonus: float | None = None,
             ple_map_mib: int = 4096, _dense_attention: bool = False, backend: str = "cpu",
             expert_source: str = "auto") -> "Model":
        """Open a GGUF (default: the shipped model, checksum-verified). threads=None uses the physical cores (at
        most the CPUs this process may run on) and adapts to a busy machine (pool_stats()); an int is used as is.
        mtp: a separate MTP-only GGUF for the model (checked to fit: hidden size, vocabulary, expert shapes).

        Expert streaming (engine spec 6; csrc/experts/expert_stream.h): cache_mib=None or "full" keeps every
        expert resident (mapped, as always); an int streams routed experts from the file through a cache of that
        many MiB (at least one row's experts: a smaller budget is a ValueError naming the minimum), read by
        io_threads reader threads, with O_DIRECT if o_direct (bypassing the page cache). prefetch reads the next
        layer's predicted experts at low priority (prefetch_root_only: only row 0 of a window predicts). Output
        is bit-identical to full residency at every budget. A window whose expert union is larger than the cache
        (a long prompt window at a small budget) runs that layer's experts in groups that fit (degraded: more
        reads, same output); it never deadlocks.

        routing="approximate" (needs a cache) is cache-aware routing (MoCE): the natural top-`approx_protect`
        experts are kept and resident experts get a bonus of exp(approx_bonus) for the other slots (rows > 0:
        approx_draft_*). It CHANGES the model's output (it is not lossless) and makes speculative windows
        differ from serial decoding, because residency differs between the two.

        ple_map_mib (qwen4exp): a PLE n-gram table larger than this many MiB is read row by row with pread instead
        of through the file's mapping (the table is never read whole either way).
        _dense_attention (benches only): qwen4exp's QSA layers attend densely. This changes the model.
        backend: where this model's sessions run by default (Model.session's backend): "cpu" (the native CPU
        forward), "cuda" (the GPU: a RuntimeError here when strata was built without CUDA or no device is usable)
        or "cpu-backend" (the backend forward over the CPU backend, for tests). With backend "cuda" (or
        "cpu-backend"), cache_mib is the budget of the GPU's memory for routed experts (csrc/model/backend_experts.h):
        the missing ones are copied to the card as windows route to them (prefetch: layer+1's predicted experts too),
        with the same counters in expert_stats() ("where": "backend"), from where expert_source says:
        "host" holds every routed expert once in pinned host memory (the fastest copies; RAM for all of them, copied
        at load: a ValueError when they would leave less than 2 GiB of the machine's memory), "file" reads each missing expert from the GGUF
        (io_threads readers, through the page cache) into a small pinned staging ring (RAM for the page cache only),
        "auto" (the default) takes "host" when that copy leaves max(8 GiB, a quarter of the machine's memory) free,
        else "file" (expert_stats()["source"] says which). o_direct does not apply, and sessions of such a model on
        backend "cpu" keep every expert in the mapping. Output is bit-identical to full residency at every budget.

        Raises ValueError naming the file, tensor or key for a malformed or unsupported file.
        """
        if threads is not None and threads < 1:
            raise ValueError(f"bad option threads={threads}: must be >= 1")
        if cache_mib is None or cache_mib == "full":
            mib = -1
        elif isinstance(cache_mib, int) and not isinstance(cache_mib, bool) and cache_mib >= 0:
            mib = cache_mib
        else:
            raise ValueError(f"bad option cache_mib={cache_mib!r}: expected an int >= 0 (MiB) or 'full'")
        if not isinstance(ple_map_mib, int) or isinstance(ple_map_mib, bool) or ple_map_mib < 0:
            raise ValueError(f"bad option ple_map_mib={ple_map_mib!r}: expected an int >= 0 (MiB)")
        if routing not in ("natural", "approximate"):
            raise ValueError(f"bad option routing={routing!r}: expected 'natural' or 'approximate'")
        sources = ("auto", "host", "file")
        if expert_source not in sources:
            raise ValueError(f"bad option expert_source={expert_source!r}: expected 'auto', 'host' or 'file'")
        if backend not in ("cpu", "cuda", "cpu-backend"):
            raise ValueError(f"bad option backend={backend!r}: expected 'cpu', 'cuda' or 'cpu-backend'")
        if backend != "cpu" and mib != -1 and routing == "approximate":
            raise ValueError(f"bad option routing='approximate' with backend={backend!r}: cache-aware routing runs "
                             "only on backend='cpu'")
        if backend == "cuda" and not _core.cuda_available():
            raise RuntimeError(f"bad option backend='cuda' (--backend cuda): {_core.cuda_info()}"
                               + " (strata needs a build with -Cmake.define.STRATA_CUDA=ON and a usable NVIDIA GPU)")
        if path is None:
            path = default_model_path()
            if not path.exists():
                raise FileNotFoundError(f"{path}: the default model is not installed with this package")
            verify_default_model(path)
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such model file")
        if mtp is not None and not Path(mtp).exists():
            raise FileNotFoundError(f"{mtp}: no such MTP file")
        core = _core.Model.load(str(path), threads or 0, str(mtp) if mtp is not None else "", mib, bool(o_direct),
                                int(io_threads), bool(prefetch), bool(prefetch_root_only), routing == "approximate",
                                -1 if approx_protect is None else int(approx_protect), float(approx_bonus),
                                -1 if approx_draft_protect is None else int(approx_draft_protect),
                                -1.0 if approx_draft_bonus is None else float(approx_draft_bonus),
                                int(ple_map_mib), bool(_dense_attention), backend != "cpu",
                                sources.index(expert_source))
        try:  # the vocabulary is bounded by the model's token_embd before the tokenizer is built from it
            tok = Tokenizer.from_metadata(_core.gguf_metadata(str(path)), max_vocab=core.config["n_vocab"])
        except ValueError as e:
            if str(path) in str(e):
                raise
            raise ValueError(f"{path}: {e}") from e
        m = cls(core, tok, path)
        m.backend = backend
        return m

    backend = "cpu"  # where sessions run unless Model.session says otherwise (Model.load's backend)

    @property
    def config(self) -> dict:
        """Hyperparameters read from the GGUF (n_vocab, n_embd, n_layer, ..., recurrent per layer)."""
        return self._core.config

    @property
    def n_vocab(self) -> int:
        return self._core.config["n_vocab"]

    @property
    def n_ctx_train(self) -> int:
        return self._core.config["n_ctx_train"]

    @property
    def threads(self) -> int:
        return self._core.threads

    @property
    def has_mtp(self) -> bool:
        return self._core.has_mtp

    @property
    def streaming(self) -> bool:
        """True when experts are read from the file through a bounded cache (cache_mib given)."""
        return self._core.streaming

    def expert_stats(self) -> dict:
        """Expert streaming counters since load or reset_expert_stats(): bytes read, sync misses, late waits,
        hit rate, evictions, prefetch issued/used/wasted and precision/recall, mean union per layer.
        {"streaming": False} when every expert is resident."""
        return self._core.expert_stats()

    def pool_stats(self) -> dict:
        """The thread pool: adaptive (the default thread count runs each class of parallel region the way that
        has measured faster, on the pool or on the calling thread alone, e.g. while another program holds a
        core; csrc/util/region_modes.h), parallel_regions and serial_regions run, of which tried (in blocks
        of the way that scored slower, to keep its measurement current), kinds of region seen, blocks
        measured."""
        return self._core.pool_stats()

    def reset_expert_stats(self) -> None:
        self._core.reset_expert_stats()

    def _inject_io_fault(self, kind: str, count: int = 1) -> None:
        """Test hook: the next `count` expert reads fail with kind "short" (a short read) or "eio" ("none" clears)."""
        kinds = {"none": 0, "short": 1, "eio": 2}
        if kind not in kinds:
            raise ValueError(f"bad fault kind {kind!r}: expected one of {', '.join(kinds)}")
        self._core._inject_io_fault(kinds[kind], int(count))

    def session(self, *, n_ctx: int | None = None, max_window: int = 8, fold: str = "lazy",
                mtp: bool = False, prefill: str = "serial", backend: str | None = None) -> "Session":
        """A new timeline at position 0. n_ctx defaults to min(4096, the model's context).

        fold: how a verify window's kept DeltaNet rows become history: "lazy" (default, at the next run),
        "eager" (inside commit) or "partial" (row 0 in the step, the rest at the next run).
        mtp: keep the inputs of the model's MTP block so that Session.mtp_draft() can draft.
        prefill: how prompt windows (more than max_window rows) run the DeltaNet recurrence: "serial" (default:
        row by row, the same bits as T = 1 steps; the faster form on the CPUs measured) or "chunked" (the
        chunked gated delta rule: within float rounding of serial steps). Windows equal serial decoding bit for
        bit after either.
        backend: where the forward runs (default: the model's, Model.load's backend): "cpu" (the native CPU forward), "cuda" (weights and state on the
        GPU, csrc/model/backend_forward.h; needs strata built with -Cmake.define.STRATA_CUDA=ON) or "cpu-backend"
        (the same backend forward over the CPU backend, for tests). The GPU session refuses, by name, what it does
        not run (fold="partial", prefill="chunked", qwen4exp). On a backend the model keeps its copy (weights,
        expert cache) from its first session on, and a session takes over the last closed one's buffers and
        recorded steps when n_ctx and max_window match and it has MTP cells where this session drafts with MTP
        (its state zeroed): later requests replay the steps earlier ones recorded.
        """
        if n_ctx is None:
            n_ctx = min(4096, self.n_ctx_train)
        backend = self.backend if backend is None else backend
        core = _core.Session(self._core, n_ctx, max_window, fold, mtp, prefill, backend)
        if backend != "cpu" and backend not in self._backends:
            self._backends[backend] = _core.BackendHold(self._core, backend)
        return Session(self, core)

    def load_session(self, path: str | Path, **kw) -> "Session":
        """A session restored from a file written by Session.save (refused if from another model or damaged)."""
        s = self.session(**kw)
        s._core.load(str(path))
        return s

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, {self._core.summary()}, threads={self.threads})"


class Session:
    """One inference timeline: run(tokens) -> [sample(cfg)] -> commit(keep), one commit per run."""

    def __init__(self, model: Model, core: "_core.Session"):
        self.model = model
        self._core = core

    @property
    def position(self) -> int:
        """Committed tokens so far (the position the next run starts at)."""
        return self._core.position

    @property
    def n_ctx(self) -> int:
        return self._core.n_ctx

    @property
    def max_window(self) -> int:
        return self._core.max_window

    @property
    def tokens(self) -> list[int]:
        """The committed token ids."""
        return self._core.tokens

    @property
    def steer_origin(self) -> int:
        """Where the current generation's output began (steering, issue 15): decode(..., origin=this) continues it."""
        return self._core.steer_origin

    def run(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Process `tokens` as rows at the current position; float32 logits [T, n_vocab] (raw, before any
        logit processor), or [1, n_vocab] for the last row with last_only. T <= max_window is a verify
        window (any keep may be committed); longer runs are prompt windows that must commit all rows."""
        arr = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64))
        if arr.ndim != 1:
            raise ValueError(f"run(): tokens must be a 1-D sequence of ids, got shape {arr.shape}")
        if arr.size and (arr.min() < 0 or arr.max() >= 2**31):
            raise ValueError(f"run(): token ids out of range: min {arr.min()}, max {arr.max()}")
        # A failed streamed expert read raises RuntimeError; the C++ session then refuses further runs if the
        # failed window had updated committed state in place (see Session::run in csrc/state/session.cpp).
        return self._core.run(arr.astype(np.int32), last_only)

    def sample(self, cfg: GenerationConfig | "_core.SamplingParams" | None = None) -> np.ndarray:
        """Finish the last window: logit processors + choice per row (int32 [T]); row i at position pos0+i+1."""
        if cfg is None:
            cfg = GenerationConfig()
        params = sampling_params(cfg) if isinstance(cfg, GenerationConfig) else cfg
        return self._core.sample(params)

    def commit(self, keep: int) -> None:
        """Make the first `keep` rows of the last run history; the position advances by keep."""
        self._core.commit(int(keep))

    def mtp_draft(self, root: int, k: int, max_backlog: int = -1) -> list[int]:
        """After commit: k greedy drafts from the model's MTP block for the positions after `root`.

        max_backlog >= 1: if more committed rows than that wait to be fed to the block, only the last
        max_backlog are (the older ones become empty history for the block: drafts only, never output)."""
        return self._core.mtp_draft(int(root), int(k), int(max_backlog))

    def mtp_prefill(self) -> None:
        """At prefill: feed the MTP block every committed row whose next token is known (no drafts)."""
        self._core.mtp_prefill()

    def hidden(self) -> np.ndarray:
        """Post-final-norm hidden states of the last run's output rows [rows, n_embd]."""
        return self._core.hidden()

    def logprobs(self, tokens: Sequence[int], top_n: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """After a window (valid until the next run): log-probability of tokens[i] under row i's raw logits
        (before any logit processor), and the top_n most likely ids per row with theirs: (lp [n], ids [n, top_n],
        lps [n, top_n])."""
        return self._core.logprobs(np.asarray(tokens, dtype=np.int32), int(top_n))

    def checkpoint(self):
        """In-memory snapshot of the committed state (a pending lazy fold is applied first)."""
        return self._core.checkpoint()

    def restore(self, cp) -> None:
        """Return to a checkpoint of this model; continuing is bit-identical to never having left it."""
        self._core.restore(cp)

    def save(self, path: str | Path) -> None:
        """Write the committed state to a file (atomically); Model.load_session reads it back."""
        self._core.save(str(path))

    def load(self, path: str | Path) -> None:
        """Replace this session's state with a file written by save (refused if from another model or damaged)."""
        self._core.load(str(path))

    def export_state(self) -> dict[str, np.ndarray]:
        """Debug export: per layer `layer.N.k`/`.v` (KV cells below the position) or `.S`/`.conv`."""
        return self._core.export_state()

    def reset(self) -> None:
        self._core.reset()

    def record_qsa(self, on: bool = True) -> None:
        """Tests: record the blocks each QSA layer selects in every later run (qsa_selected())."""
        self._core.record_qsa(bool(on))

    def qsa_selected(self) -> dict[int, list[list[int]]]:
        """After record_qsa: {layer: [per row of the last run: its selected block ids, ascending; [] = dense]}."""
        return self._core.qsa_selected()
