"""
strata C++ core: GGUF loading, Qwen3-Next on the CPU, the window transaction, sampling
"""

from collections.abc import Sequence
from typing import Annotated, Final

import numpy
from numpy.typing import NDArray


def gguf_metadata(path: str) -> dict:
    """
    All metadata of a GGUF file as a dict (arrays as lists). Validates the container.
    """

def gguf_tensors(path: str) -> list:
    """The tensor table: (name, ne, type, file offset, bytes) per tensor."""

def best_isa() -> str: ...

def has_avx512vbmi() -> bool: ...

def allow_vbmi(on: bool) -> None:
    """
    Tests: whether the AVX-512 path may use the VBMI kernels (IQ2_XXS, IQ3_XXS); results are the same either way.
    """

def allow_vnni(on: bool) -> None:
    """
    Tests: whether the AVX-512 kernels may use VNNI (and so VBMI); results are the same either way.
    """

def prefer_gathers(on: bool) -> None:
    """
    Tests: whether the AVX2 IQ kernels look up grid rows by vector gathers (else scalar loads); the same results.
    """

def gathers_preferred() -> bool: ...

def active_isa() -> str: ...

def limit_isa(cap: str) -> None:
    """
    Tests: behave as a CPU whose best path is min(this CPU's, cap) (best_isa, the active path, VNNI/VBMI follow).
    """

def force_isa(isa: str) -> None:
    """
    Select the kernel path (tests and benches). Raises if this CPU lacks it.
    """

def type_info(arg: str, /) -> tuple: ...

def dequantize(data: Annotated[NDArray[numpy.uint8], dict(order='C', device='cpu', writable=False)], type: str, n: int) -> Annotated[NDArray[numpy.float32], dict(shape=(None,))]: ...

def quantize_act(x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], isa: str = 'scalar') -> tuple:
    """(q[T][cols], dx[T][nb], bsum[T][nb*8]) as Python lists (tests)."""

def quantize_act32(x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], isa: str = 'scalar') -> tuple:
    """(q[T][cols], dx[T][cols/32]) as Python lists (tests)."""

def rowop(name: str, x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], y: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], isa: str = '') -> list[float]:
    """One rowops.h function (tests)."""

def qsa_select(scores: Sequence[float], kb: int) -> list[int]:
    """QSA's block selection rule (tests): kb best, ties to the lower index."""

def attend(q: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], nh: int, k: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], v: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], n0: int, scale: float, isa: str = '', cells: Sequence[int] = [], one_query: bool = False) -> list[float]:
    """
    Causal attention of T rows x nh heads over shared cells, or one row over a cell list (tests).
    """

def attend_one_query(on: bool) -> None:
    """
    Benches only: the model's attention takes the one-query path (same bits, slower) while on.
    """

def bench_attend(T: int, nh: int, n0: int, hd: int, ldkv: int, isa: str = '', one_query: bool = False, reps: int = 5) -> float:
    """
    Seconds per attention job (benches): T rows x nh heads over n0 + T - 1 cells.
    """

def dn_rows(S: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], k: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], v: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], q: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], gates: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], n_src: int, read: bool = True, ref: bool = False) -> tuple[list[float], list[float], list[float]]:
    """
    The DeltaNet window recurrence of one head (dn_rows or its row-by-row twin), for tests.
    """

def dn_chunked(S: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], k: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], v: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], q: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], gates: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], isa: str = '') -> tuple[list[float], list[float]]:
    """
    The chunked gated delta rule over T rows of one head (state/deltanet_chunked.h), for tests.
    """

def matmul(w: Annotated[NDArray[numpy.uint8], dict(order='C', device='cpu', writable=False)], type: str, rows: int, cols: int, x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], isa: str = '', threads: int = 1, act_type: str = '') -> Annotated[NDArray[numpy.float32], dict(shape=(None, None))]:
    """
    y[T, rows] = x[T, cols] @ W^T on the chosen kernel path; act_type: the rows prepared for that type (of the same activation kind), as an MoE expert's gate and up share them.
    """

def bench_matmul(w: Annotated[NDArray[numpy.uint8], dict(order='C', device='cpu', writable=False)], type: str, rows: int, cols: int, nmat: int, x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], isa: str = '', threads: int = 1, reps: int = 3) -> float: ...

class SamplingParams:
    """
    Logit processors and token choice (engine spec section 5). temperature 0 = greedy.
    """

    def __init__(self, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0, penalty_last_n: int = 64, seed: int = 0) -> None: ...

    @property
    def temperature(self) -> float: ...

    @temperature.setter
    def temperature(self, arg: float, /) -> None: ...

    @property
    def top_k(self) -> int: ...

    @top_k.setter
    def top_k(self, arg: int, /) -> None: ...

    @property
    def top_p(self) -> float: ...

    @top_p.setter
    def top_p(self, arg: float, /) -> None: ...

    @property
    def min_p(self) -> float: ...

    @min_p.setter
    def min_p(self, arg: float, /) -> None: ...

    @property
    def repetition_penalty(self) -> float: ...

    @repetition_penalty.setter
    def repetition_penalty(self, arg: float, /) -> None: ...

    @property
    def presence_penalty(self) -> float: ...

    @presence_penalty.setter
    def presence_penalty(self, arg: float, /) -> None: ...

    @property
    def frequency_penalty(self) -> float: ...

    @frequency_penalty.setter
    def frequency_penalty(self, arg: float, /) -> None: ...

    @property
    def penalty_last_n(self) -> int: ...

    @penalty_last_n.setter
    def penalty_last_n(self, arg: int, /) -> None: ...

    @property
    def seed(self) -> int: ...

    @seed.setter
    def seed(self, arg: int, /) -> None: ...

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""

    def penalties_active(self) -> bool: ...

    def __repr__(self) -> str: ...

def uniform_at(seed: int, pos: int) -> float:
    """
    The uniform in [0, 1) that sampling uses at absolute position pos: a pure function of (seed, pos).
    """

def apply_penalties(logits: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], params: SamplingParams, hist: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> Annotated[NDArray[numpy.float32], dict(shape=(None,))]:
    """
    Penalised copy of logits [V] from the history's last penalty_last_n tokens (the input is not modified).
    """

def pick_token(logits: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], params: SamplingParams, pos: int) -> int:
    """
    Token for absolute position pos from processed logits [V] (the input is not modified).
    """

def pick_traced(logits: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], params: SamplingParams, pos: int, cap: int, allowed: object | None = None) -> tuple:
    """
    pick_token with its trace (sampler.h PickTrace): (token, kind, candidate ids, repick or None). kind: 0 =
    more than cap candidates, 1 = check (stands if all allowed), 2 = complete; allowed (bytes, one per
    candidate): the repick under a mask allowing exactly those.
    """

def sample_rows(logits: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], params: SamplingParams, committed: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], inputs: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], pos0: int) -> Annotated[NDArray[numpy.int32], dict(shape=(None,))]:
    """
    Window finish: int32 [T]; row i predicts position pos0+i+1 with penalty history committed ++ inputs[:i+1]. logits [T, V] float32 is not modified.
    """

def backend_expert_staging_cap(slots: int) -> None:
    """
    Tests: the staging ring of backend expert streams from the file made later has at most this many slots (0: the
    default), so that small models wrap it within one window.
    """

def expert_cache_stress(slots: int, keys: int, threads: int, iters: int, max_n: int, fail_every: int = 0, seed: int = 1) -> dict:
    """
    Test: many threads acquire/load/verify/release on an ExpertCache; throws on a broken invariant.
    """

class Model:
    @staticmethod
    def load(path: str, threads: int = 0, mtp_path: str = '', cache_mib: int = -1, o_direct: bool = False, io_threads: int = 4, prefetch: bool = True, prefetch_root_only: bool = False, approximate: bool = False, protect: int = -1, bonus: float = 0.8500000238418579, draft_protect: int = -1, draft_bonus: float = -1.0, ple_map_mib: int = 4096, dense_attention: bool = False, device_experts: bool = False, expert_source: int = 0) -> Model:
        """
        Open, validate and map a qwen3next / qwen35moe / qwen4exp GGUF (and optionally a separate MTP-only GGUF). cache_mib >= 0
        streams experts through a cache of that size (-1: all resident); see csrc/experts/expert_stream.h. device_experts:
        cache_mib is the budget of backend sessions' memory instead (csrc/model/backend_experts.h); expert_source: where
        their missing experts are copied from: 0 auto, 1 pinned host memory, 2 the file.
        """

    @property
    def config(self) -> dict: ...

    @property
    def threads(self) -> int: ...

    @property
    def pool_sleeps(self) -> int:
        """
        Times a worker of the thread pool went to sleep (benches: wake-ups between regions).
        """

    def pool_stats(self) -> dict:
        """
        The thread pool's adaptive mode (util/region_modes.h): regions run in parallel and on the caller alone,
        of which in blocks run the way that scored slower (to keep its score current), kinds of region seen, blocks
        measured, and each size class's scores (parallel, serial; lower is faster, -1 before measured).
        """

    @property
    def fingerprint(self) -> int: ...

    @property
    def path(self) -> str: ...

    @property
    def has_mtp(self) -> bool: ...

    @property
    def dn_layout(self) -> str: ...

    def summary(self) -> str: ...

    @property
    def ple_pread(self) -> bool:
        """
        True when the PLE table is read by pread (larger than ple_map_mib) rather than the mapping.
        """

    def expert_stats(self) -> dict:
        """Expert streaming counters since load or the last reset."""

    def reset_expert_stats(self) -> None: ...

    @property
    def streaming(self) -> bool: ...

def session_state_bytes(model: Model, n_ctx: int, max_window: int = 8, mtp: bool = False) -> int:
    """
    Bytes of state a session with these options allocates (checked against RAM before it does).
    """

class Checkpoint:
    @property
    def position(self) -> int: ...

    @property
    def steer_origin(self) -> int: ...

    @property
    def nbytes(self) -> int:
        """Bytes of state held (what a prefix cache budgets)."""

class BackendHold:
    """Keeps a model's copy on a backend ('cuda', 'cpu-backend') alive between sessions: weights, expert cache, the last closed session's buffers and recorded steps (backend_forward.h)."""

    def __init__(self, model: Model, backend: str) -> None: ...

def adopted_backend_sessions() -> int:
    """How many backend sessions took over a closed session's buffers and recorded steps."""

class Session:
    def __init__(self, model: Model, n_ctx: int = 4096, max_window: int = 8, fold: str = 'lazy', mtp: bool = False, prefill: str = 'serial', backend: str = 'cpu') -> None: ...

    @property
    def backend(self) -> str: ...

    @property
    def backend_name(self) -> str: ...

    @property
    def position(self) -> int: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def max_window(self) -> int: ...

    @property
    def fold(self) -> str: ...

    @property
    def prefill(self) -> str: ...

    @property
    def tokens(self) -> list[int]: ...

    @property
    def pending_commit(self) -> bool: ...

    @property
    def pending_fold(self) -> int: ...

    @property
    def last_fold_seconds(self) -> float: ...

    def run(self, tokens: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], last_only: bool = False) -> NDArray[numpy.float32]: ...

    def hidden(self) -> NDArray[numpy.float32]: ...

    def mtp_draft(self, root: int, k: int, max_backlog: int = -1) -> list[int]:
        """After commit: k greedy drafts from the MTP block (see strata.h)."""

    def mtp_prefill(self) -> None:
        """
        At prefill: feed the MTP block the committed rows whose next token is known (see strata.h).
        """

    @property
    def mtp_position(self) -> int: ...

    @property
    def cold_steps(self) -> int:
        """
        Steps that ran cold (unrecorded first sight, or recording) on a backend that records them.
        """

    def mtp_logits(self) -> NDArray[numpy.float32]:
        """
        Logits of each draft step of the last mtp_draft [k, n_vocab] (for tests).
        """

    @property
    def mtp(self) -> bool: ...

    def sample(self, params: SamplingParams, masks: object | None = None, verified_prefix: bool = False) -> NDArray[numpy.int32]:
        """
        Finish the last run: int32 [rows]. masks: uint32 [rows, ceil(n_vocab / 32)] token masks (1 = allowed) or None.
        verified_prefix: only the rows up to the first whose token is not the next input (run_sample's).
        """

    def run_sample(self, tokens: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], params: SamplingParams, masks: object | None = None, linger_us: float = 0.0, verified_prefix: bool = False) -> NDArray[numpy.int32]:
        """
        run(tokens) then sample(params, masks); returns the chosen token per row. masks: None, uint32
        [T, ceil(n_vocab / 32)], or a callable returning them (computed while the forward runs).
        linger_us: the caller's next window comes within about this many microseconds of the forward's end
        (ThreadPool::linger: the workers keep polling until then rather than sleep); only timing changes.
        verified_prefix: only the rows up to the first whose token is not the next input (the rows a
        speculative window keeps; the same tokens as when every row is finished).
        """

    def run_sample_traced(self, tokens: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], params: SamplingParams, cap: int, linger_us: float = 0.0) -> tuple:
        """
        run(tokens), then finish every row without masks: (out, cands, complete), lists per row. cands[i]:
        the row's candidates in the sampler's order (cands[i][0] its best token), or None when there are more
        than cap; complete[i]: any mask allowing cands[i][0] gives repick(i, its bits of cands[i]); otherwise
        the row's choice stands under a mask allowing all of cands[i], and needs its full mask if not.
        linger_us: as in run_sample.
        """

    def sample_traced(self, params: SamplingParams, cap: int) -> tuple:
        """The finish of run_sample_traced, for the last run."""

    def repick(self, row: int, allowed: bytes) -> int:
        """
        Row `row` of the last traced finish under a mask allowing cands[row][j] where allowed[j] != 0 (bytes;
        complete rows, allowed[0] set): the token sample() gives with such a mask.
        """

    def sample_row(self, params: SamplingParams, row: int, mask: object) -> int:
        """
        Row `row` of the last run finished again with this token mask (uint32 [ceil(n_vocab / 32)]).
        """

    def set_steering(self, steering: Steering | None, origin: int) -> None:
        """
        The processors of the generation whose first output token is at `origin` (None: none); the state is
        rebuilt from the committed tokens [origin, position) (csrc/sampling/processor.h).
        """

    @property
    def steer_origin(self) -> int: ...

    @property
    def steer_state(self) -> tuple[int, int]: ...

    def logprobs(self, tokens: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], top_n: int = 0) -> tuple:
        """
        Log-probabilities of tokens[i] under row i of the last run's raw logits, and the top_n most likely
        ids per row with theirs (csrc/sampling/logprobs.h). Valid after commit until the next run.
        """

    def commit(self, keep: int) -> None: ...

    def flush(self) -> None: ...

    def reset(self) -> None: ...

    def checkpoint(self) -> Checkpoint: ...

    def restore(self, checkpoint: Checkpoint) -> None: ...

    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...

    def record_qsa(self, on: bool) -> None:
        """
        Tests: record the selected QSA blocks of every later run (qsa_selected()).
        """

    def qsa_selected(self) -> dict[int, list[list[int]]]:
        """
        {layer: [row: sorted selected block ids, empty for a dense row]} of the last run (after record_qsa).
        """

    def export_state(self) -> dict: ...

class SuffixMatch:
    """Result of a suffix lookup: drafts, match length, frequency."""

    @property
    def drafts(self) -> list[int]:
        """continuation of the chosen earlier occurrence"""

    @property
    def match_length(self) -> int:
        """matched suffix tokens (0 = no match)"""

    @property
    def frequency(self) -> int:
        """equally long matches followed by the same next token"""

    @property
    def position(self) -> int:
        """where the matched occurrence ends (-1 = no match)"""

    @property
    def work(self) -> int:
        """occurrences visited + tokens compared (the lookup's cost)"""

    def __bool__(self) -> bool: ...

    def __repr__(self) -> str: ...

class SuffixIndex:
    """
    One request's tokens, indexed incrementally (amortised O(1) per token) for suffix lookup.
    """

    def __init__(self, *, min_match: int = 4, max_match: int = 64, max_candidates: int = 64) -> None: ...

    def append(self, tok: int) -> None: ...

    def extend(self, tokens: Sequence[int]) -> None: ...

    def lookup(self, max_drafts: int) -> SuffixMatch:
        """
        Continuation (<= max_drafts) of the longest earlier occurrence of the current suffix; ties by frequency, then recency.
        """

    def clear(self) -> None: ...

    def __len__(self) -> int: ...

    @property
    def tokens(self) -> list[int]: ...

    @property
    def min_match(self) -> int: ...

    @property
    def max_match(self) -> int: ...

    @property
    def max_candidates(self) -> int: ...

class GlobalSuffixIndex:
    """
    Earlier requests' outputs in a bounded token budget, oldest evicted first.
    """

    def __init__(self, capacity_tokens: int, *, min_match: int = 4, max_match: int = 64, max_candidates: int = 64) -> None: ...

    def add(self, tokens: Sequence[int]) -> None:
        """
        Add one finished sequence, evicting the oldest sequences beyond the budget.
        """

    def lookup(self, query: Sequence[int], max_drafts: int) -> SuffixMatch:
        """Best earlier occurrence of the query's suffix and its continuation."""

    def clear(self) -> None: ...

    def sequences(self) -> list[list[int]]: ...

    @property
    def size_tokens(self) -> int: ...

    @property
    def n_sequences(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    @property
    def min_match(self) -> int: ...

    @property
    def max_match(self) -> int: ...

class PhraseAutomaton:
    """
    Aho-Corasick automaton over token ids for anti-slop phrase penalties (csrc/sampling/phrase_automaton.h).
    """

    def __init__(self, patterns: Sequence[Sequence[int]], strengths: Sequence[float], flags: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None:
        """
        patterns: token-id sequences; strengths (> 0, inf = ban); flags: uint8 [n_vocab] PhraseTokenFlag bits.
        """

    def step(self, state: tuple[int, int], token: int) -> tuple[int, int]:
        """The state (node, boundary) after `token`."""

    def penalties(self, state: tuple[int, int]) -> tuple[Annotated[NDArray[numpy.int32], dict(shape=(None,))], Annotated[NDArray[numpy.float32], dict(shape=(None,))]]:
        """
        (ids, penalties) of the row whose state is (node, boundary); inf = banned.
        """

    @property
    def n_nodes(self) -> int: ...

    @property
    def n_patterns(self) -> int: ...

    @property
    def n_vocab(self) -> int: ...

    @property
    def dense(self) -> bool:
        """
        Whether the static part of the penalties is applied densely (many single-token phrases).
        """

    BAN_RAMP: Final[float] = ...
    """(arg: object, /) -> float"""

class DryPenalty:
    """The DRY sequence-repetition penalty (csrc/sampling/dry.h)."""

    def __init__(self, multiplier: float, base: float, allowed_length: int, penalty_last_n: int, heads: Sequence[int], tails: Sequence[Sequence[int]], n_vocab: int) -> None:
        """
        Breakers as llama.cpp processes them: heads[i] is a breaker's first token, tails[i] the tokens after it.
        """

    def penalties(self, history: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> tuple[Annotated[NDArray[numpy.int32], dict(shape=(None,))], Annotated[NDArray[numpy.float32], dict(shape=(None,))]]:
        """
        (ids ascending, amounts subtracted) for a row whose history is `history` (int32 [n]).
        """

    @property
    def active(self) -> bool: ...

class Steering:
    """One generation's C++ logit processors (csrc/sampling/processor.h)."""

    def __init__(self, n_vocab: int, bias_ids: Sequence[int], bias_values: Sequence[float], phrases: PhraseAutomaton | None = None, dry: DryPenalty | None = None) -> None: ...

    @property
    def n_vocab(self) -> int: ...

    @property
    def has_phrases(self) -> bool: ...

    @property
    def has_dry(self) -> bool: ...

def apply_token_mask(logits: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], mask: Annotated[NDArray[numpy.uint32], dict(shape=(None,), order='C', device='cpu', writable=False)], ref: bool = False) -> Annotated[NDArray[numpy.float32], dict(shape=(None,))]:
    """Masked copy of logits [V] (-inf where the bit is 0); ref: scalar twin."""

def masked_argmax(logits: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], mask: Annotated[NDArray[numpy.uint32], dict(shape=(None,), order='C', device='cpu', writable=False)], ref: bool = False) -> int:
    """
    Lowest id among the largest allowed non-NaN logits (-1: none); ref: twin.
    """

def masked_argmax_sub(logits: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], sub: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], mask: Annotated[NDArray[numpy.uint32], dict(shape=(None,), order='C', device='cpu', writable=False)], ref: bool = False) -> int:
    """masked_argmax of logits - sub (not written); ref: twin."""

def backend_layer_op(backend: str, op: str, f: Sequence[Sequence[float]], i: Sequence[Sequence[int]], n: Sequence[int], d: Sequence[float]) -> tuple[list[list[float]], list[list[int]]]:
    """
    Tests: one layer operation of backend.h on a backend (arrays in, the same arrays back).
    """

def cuda_available() -> bool:
    """Whether this build has CUDA and a usable device (never raises)."""

def cuda_info() -> str:
    """The CUDA runtime, driver and devices, or why none is usable."""

def backend_name(backend: str) -> str: ...

def recorded_step_replays() -> int: ...

def backend_matmul(backend: str, w: Annotated[NDArray[numpy.uint8], dict(order='C', device='cpu', writable=False)], type: str, rows: int, cols: int, x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)]) -> Annotated[NDArray[numpy.float32], dict(shape=(None, None))]: ...

def backend_rmsnorm(backend: str, x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], w: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', device='cpu', writable=False)], eps: float) -> Annotated[NDArray[numpy.float32], dict(shape=(None, None))]: ...

def cuda_bench_matmul(w: Annotated[NDArray[numpy.uint8], dict(order='C', device='cpu', writable=False)], type: str, rows: int, cols: int, nmat: int, x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], Ts: Sequence[int], reps: int = 10) -> list[tuple[float, float]]: ...

def cuda_prefer_mma(on: bool, min_rows: int = 5) -> None:
    """
    Tests and benches: whether the IQ2_XXS products of min_rows+ rows and the expert tiles take the int8 tensor cores (default on where the card has them) or the dp4a kernels; the same bits either way.
    """

def cuda_mma_used() -> bool:
    """Whether those products take the tensor cores now (False without CUDA)."""

def cuda_prefer_pdl(on: bool, prefetch: bool = True, windows: bool = False) -> None:
    """
    Tests and benches: whether kernels launch with programmatic dependent launch (default on where the card has it: sm_90+), with it whether the dense products prefetch their weights toward L2 first, and whether the verify windows of 5..16 rows take it too (default: plain launches there); the same bits every way.
    """

def cuda_prefer_norm_quant(on: bool) -> None:
    """
    Tests and benches: whether the norms quantize their rows for the int8-activation products after them, in the norm's kernel (default on), or the products do; the same bits either way.
    """

def cuda_prefer_iq2_rows(dense: int, sel: int, pair: int) -> None:
    """
    Tests and benches: the weight rows (1, 2 or 4) a warp of the IQ2_XXS one-row kernel takes in the dense products, in the experts' products and in the experts' fused gate / up (defaults 1, 4, 2); the same bits every way.
    """

def cuda_pdl_used() -> bool:
    """
    Whether launches carry programmatic dependent launch now (False without CUDA).
    """

def cuda_prefer_iq2_panel(on: bool) -> None:
    """
    Tests and benches: whether the dense IQ2_XXS products of 32+ rows (prompt pieces) decode a block's 16 weight rows once into shared memory (default on) or per 16 activation rows; the same bits either way.
    """

def cuda_prefer_iq2_panel_staged(on: bool) -> None:
    """
    Tests and benches: whether that panel's activation rows are staged in shared memory by cp.async, 16 rows a warp (default on), or read from L2 word by word, 8 rows a warp; the same bits either way.
    """

def cuda_prefer_dn_duo(on: bool) -> None:
    """
    Tests and benches: whether DeltaNet heads (dk = 128) over 2+ rows take the kernel with a column's two halves on two warps, a row's o sum interleaved with the next row's m (default on) or k_dn_heads_split; the same bits either way.
    """

def cuda_prefer_b32q_split(on: bool) -> None:
    """
    Tests and benches: whether the int8-activation 32-value block types' (Q4_0, Q4_1, Q5_*, IQ4_NL, MXFP4) small matrices take windows as the 1-row kernel per activation row (default on) or the T-row kernels; the same bits either way.
    """

def cuda_prefer_q5k_lanes(on: bool) -> None:
    """
    Tests and benches: whether Q5_K's one-row products take the dp4a lane kernel as Q4_K's do (with cuda_prefer_kq_lanes) or (default) the generic int8 kernel; the same bits either way.
    """

def cuda_prefer_kq_pair(on: bool) -> None:
    """
    Tests and benches: whether the experts' Q4_K / Q5_K / Q6_K gate / up / SwiGLU over a few slots (fewer than the tiles') is one dp4a lane kernel launch or (default) the two products and silu_mul; the same bits either way.
    """

def cuda_prefer_kq_lanes(on: bool) -> None:
    """
    Tests and benches: whether Q4_K's and Q6_K's one-row products (decode steps, the experts' slots, small matrices' row split) take the dp4a lane kernel (default) or the generic int8 kernel; the same bits either way.
    """

def cuda_prefer_kquant_windows(on: bool) -> None:
    """
    Tests and benches: whether small Q4_K / Q5_K / Q6_K matrices over a prompt piece (more than 16 rows) take the 16-row kernel in 256-thread blocks (default) or the 1-row kernel per activation row; the same bits either way.
    """

def cuda_prefer_float_split(bytes: int) -> None:
    """
    Tests and benches: float matrices of at most `bytes` (default 8 MiB; 0: none) take windows of 2..8 rows as the 1-row kernel per activation row, not the T-row kernels; the same bits either way.
    """

def cuda_prefer_row_groups(on: bool) -> None:
    """
    Tests and benches: whether small float matrices (the routers) over 17+ rows take blocks of 16 activation rows or a block per row (the default); the same bits either way.
    """

def cuda_prefer_attn_tiles(on: bool, min_queries: int = 1024) -> None:
    """
    Tests and benches: whether attention over min_queries+ queries (rows x heads of a KV head) takes the tiled kernels (default on from 1024: prompt pieces) or a block per (row, head); the same bits either way.
    """

def cuda_prefer_tile_prefetch(on: bool) -> None:
    """
    Tests and benches: whether the IQ2_XXS expert tiles on the tensor cores prefetch each block's next tile's weights into L2 (default on); a hint, the same bits either way.
    """

def cuda_prefer_float_tiles(on: bool, min_rows: int = 16, min_weight_rows: int = 4096) -> None:
    """
    Tests and benches: whether float products (F32 / F16 / BF16 / Q8_0: the routers, the default model's head) of min_rows+ activation rows (default 16, at least 2) take blocks of 32 rows x 32 weight rows staged in shared memory (default on) or k_float; windows under 32 rows only for matrices of min_weight_rows+ rows (default 4096: the default model's head); the same bits either way.
    """

def cuda_prefer_tile_stage(on: bool) -> None:
    """
    Tests and benches: whether the IQ2_XXS expert tiles on the tensor cores copy each tile's activation rows into shared memory first (default on); the same bits either way.
    """

def cuda_prefer_prompt_rows(rows: int) -> None:
    """
    Tests and benches: the rows of a prompt piece on the card (1..4096, default 512), for the sessions made after the call; the same bits for any value.
    """

def cuda_prompt_rows() -> int:
    """The rows of a prompt piece on the card now."""

def cuda_bench_launch(reps: int = 10) -> tuple[float, float]:
    """(median, min) seconds per launch of an empty kernel, back to back."""

def cuda_bench_copy(bytes: int, reps: int = 10) -> tuple[float, float]:
    """(median, min) seconds per device-to-device copy of `bytes`."""

def backend_dn_rows(backend: str, S: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], k: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], v: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], q: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], gates: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], n_src: int, read: bool = True) -> tuple[list[float], list[float], list[float]]: ...

def backend_attend(backend: str, q: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], nh: int, k: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], v: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], n0: int, scale: float, cells: Sequence[int] = []) -> list[float]: ...

def backend_moe_route(backend: str, logits: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], k: int) -> tuple[list[int], list[float]]: ...

def backend_argmax_rows(backend: str, logits: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], none: int = 0) -> list[int]: ...

def backend_embed_rows(backend: str, type: str, table: Annotated[NDArray[numpy.uint8], dict(order='C', device='cpu', writable=False)], cols: int, ids: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> list[float]: ...

def backend_sample_rows(backend: str, logits: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], params: SamplingParams, committed: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], inputs: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], pos0: int) -> list[int]: ...

def cuda_bench_dn_rows(dk: int, dv: int, heads: int, Ts: Sequence[int], n_src_mode: int = 0, reps: int = 10) -> list[tuple[float, float]]: ...

def cuda_bench_attend(n: int, nh: int, hd: int, kv_heads: int, Ts: Sequence[int], reps: int = 10) -> list[tuple[float, float]]: ...

def cuda_bench_route(logits: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], k: int, reps: int = 10) -> tuple[float, float]: ...

def cuda_bench_sample(logits: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], params: SamplingParams, reps: int = 10) -> tuple[float, float]: ...
