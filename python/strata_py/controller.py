"""The draft-length controller (engine spec section 4): choose T = 1 + drafts before any work is issued.

With D drafts, a_i the conditional acceptance of draft i and q_i = a_1 * ... * a_i (q_0 = 1), a window keeps
E(T) = sum_{i=0..T-1} q_i rows on average and costs C(T) seconds. A longer window pays only if
dE/dC > E/C at the current operating point, i.e. only if it raises throughput E/C:
    (E + dE) / (C + dC) > E / C   <=>   dE / dC > E / C        (dC > 0)
so the controller picks the T in 1..1+available with the highest E(T)/C(T), comparing each longer T with
the best so far by that marginal rule. Nothing pays -> T = 1 (no drafts).

Estimates, all online:
  a_i   per (match-length bucket, draft position i): Beta counts; the prior of a cell is the pooled
        acceptance at that position over all buckets, whose own prior is the pooled acceptance at the
        previous position (0.5 before draft 1), each with strength `prior_strength`: a bucket seen rarely
        borrows from the others, a position never tried yet from the one before it.
  C(T)  EMA of measured window seconds per T (the decode loop calls record_window(T, seconds); the drafter
        adds its own lookup time; the request's first windows are skipped and the first measurement of each T
        only stands in until the second, since the first windows run on cold caches). A T not measured twice
        is read off a line c0 + c1 (T - 1) fitted to the Ts that were (to every measured T while fewer than two
        were; with one measured T, c1 = `slope_prior` * c0), so it gets tried when it looks cheap.
Probing: a bucket whose estimate fell so low that T = 1 wins would never be observed again; after
`probe_every` (8) consecutive such windows the controller offers one draft (T = 2) once to refresh it, and
doubles that gap (up to 32x) while drafting keeps not paying, so a losing drafter costs ever less.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Lower edges of the match-length buckets (tokens); the last bucket is open.
BUCKET_EDGES = (1, 4, 6, 8, 12, 16, 32, 64)


def bucket_of(match_len: int) -> int:
    """Index of the match-length bucket holding match_len (>= 1)."""
    b = 0
    for i, lo in enumerate(BUCKET_EDGES):
        if match_len >= lo:
            b = i
    return b


def bucket_label(b: int) -> str:
    lo = BUCKET_EDGES[b]
    return f"{lo}+" if b + 1 == len(BUCKET_EDGES) else f"{lo}-{BUCKET_EDGES[b + 1] - 1}"


def expected_keep(a: list[float]) -> list[float]:
    """E(T) for T = 1..len(a)+1 from conditional acceptances a_1..a_D: E(T) = sum_{i<T} q_i."""
    out, q, e = [], 1.0, 0.0
    for i in range(len(a) + 1):
        e += q
        out.append(e)
        if i < len(a):
            q *= a[i]
    return out


@dataclass
class LengthController:
    max_window: int = 8
    fixed_t: int = 0               # > 0: always this T (bounded by what the loop allows); experiments
    prior_strength: float = 2.0
    cost_ema: float = 0.2          # weight of the newest window in C(T)
    slope_prior: float = 0.15      # C(T) ~ C(1) (1 + slope (T - 1)) until two T's are measured
    probe_every: int = 8
    warmup_windows: int = 4        # cost samples of a request's first windows are ignored (cold caches)
    _acc: list = field(default_factory=list, repr=False)   # [bucket][pos] accepted counts
    _rej: list = field(default_factory=list, repr=False)   # [bucket][pos] rejected counts
    _cost: dict = field(default_factory=dict, repr=False)  # T -> EMA seconds
    _cost_n: dict = field(default_factory=dict, repr=False)
    _chosen: dict = field(default_factory=dict, repr=False)
    _idle: int = 0
    _probe_gap: int = 0            # T = 1 windows before the next probe (0: probe_every; doubles while idle)
    _seen: int = 0                 # windows recorded so far (warm-up ones included)
    probes: int = 0

    def __post_init__(self):
        if self.max_window < 1:
            raise ValueError(f"bad option max_window={self.max_window}: must be >= 1")
        if self.fixed_t < 0:
            raise ValueError(f"bad option fixed_t={self.fixed_t}: must be >= 0")
        P = self.max_window - 1
        self._acc = [[0.0] * P for _ in BUCKET_EDGES]
        self._rej = [[0.0] * P for _ in BUCKET_EDGES]

    # ------------------------------------------------------------------ estimates
    def acceptance(self, match_len: int, n: int | None = None) -> list[float]:
        """Posterior-mean a_1..a_n for a match of this length."""
        b = bucket_of(max(1, match_len))
        n = self.max_window - 1 if n is None else min(n, self.max_window - 1)
        out, k, prev = [], self.prior_strength, 0.5
        for i in range(n):
            acc_all = sum(row[i] for row in self._acc)
            rej_all = sum(row[i] for row in self._rej)
            pooled = (acc_all + k * prev) / (acc_all + rej_all + k)
            out.append((self._acc[b][i] + k * pooled) / (self._acc[b][i] + self._rej[b][i] + k))
            prev = pooled
        return out

    def cost(self, T: int) -> float:
        """C(T) in seconds (or relative units before anything is measured).

        A T measured twice or more is read directly. Otherwise C(T) comes from the line through the Ts measured
        at least twice (when there are two), else through every measured T (a single measurement of T counts
        as that only if nothing better exists: one slow window must not set C(T) for a T rarely tried again).
        """
        if self._cost_n.get(T, 0) >= 2:
            return self._cost[T]
        pts = sorted((t, c) for t, c in self._cost.items() if self._cost_n.get(t, 0) >= 2)
        if len(pts) < 2:
            if T in self._cost:
                return self._cost[T]
            pts = sorted(self._cost.items())
        if not pts:
            return 1.0 + self.slope_prior * (T - 1)
        if len(pts) == 1:
            t0, c = pts[0]
            c0 = c / (1.0 + self.slope_prior * (t0 - 1))
            return c0 * (1.0 + self.slope_prior * (T - 1))
        n = len(pts)
        mx = sum(t for t, _ in pts) / n
        my = sum(c for _, c in pts) / n
        sxx = sum((t - mx) ** 2 for t, _ in pts)
        slope = max(0.0, sum((t - mx) * (c - my) for t, c in pts) / sxx)
        return max(1e-9, my + slope * (T - mx))

    # ------------------------------------------------------------------ decisions
    def choose(self, available: int, match_len: int) -> int:
        """How many of `available` drafts (from a match of match_len tokens) to put in the window."""
        available = max(0, min(available, self.max_window - 1))
        if self.fixed_t:
            d = min(self.fixed_t - 1, available)
        elif available == 0:
            d = 0
        else:
            E = expected_keep(self.acceptance(match_len, available))
            best = 1
            for T in range(2, available + 2):
                # marginal rule between the best shorter window and T: E(T)/C(T) > E(best)/C(best)
                if E[T - 1] * self.cost(best) > E[best - 1] * self.cost(T):
                    best = T
            d = best - 1
            if d == 0:
                self._idle += 1
                if self._idle >= (self._probe_gap or self.probe_every):
                    # probe once; if drafting still does not pay afterwards, wait twice as long next time
                    # (up to 32x probe_every), so a drafter that loses costs ever less
                    self._idle, d = 0, 1
                    self.probes += 1
                    self._probe_gap = min(2 * (self._probe_gap or self.probe_every), 32 * self.probe_every)
            else:
                self._idle = 0
                self._probe_gap = 0
        self._chosen[d + 1] = self._chosen.get(d + 1, 0) + 1
        return d

    def observe(self, match_len: int, offered: int, accepted: int) -> None:
        """Outcome of a window: drafts 1..accepted were kept, draft accepted+1 (if offered) was not."""
        if offered <= 0:
            return
        b = bucket_of(max(1, match_len))
        for i in range(min(accepted, offered, self.max_window - 1)):
            self._acc[b][i] += 1
        if accepted < offered and accepted < self.max_window - 1:
            self._rej[b][accepted] += 1

    def record_window(self, T: int, seconds: float) -> None:
        """Measured cost of a window of T rows (run + sample + commit + drafting).

        The first `warmup_windows` windows of a request are not measurements of C(T): right after prefill
        the weights are partly out of cache and a step costs up to 2.5x its steady value, and one such sample
        for a T that is then rarely chosen would skew the fitted line for the whole request. Past that, the
        first measurement of a T is provisional: the second replaces it rather than averaging with it."""
        self._seen += 1
        if self._seen <= self.warmup_windows:
            return
        n = self._cost_n.get(T, 0)
        if n <= 1:
            self._cost[T] = seconds
        else:
            self._cost[T] += self.cost_ema * (seconds - self._cost[T])
        self._cost_n[T] = n + 1

    def observations(self, match_len: int) -> float:
        """Windows observed for this match length's bucket (outcomes of their first draft)."""
        b = bucket_of(max(1, match_len))
        return self._acc[b][0] + self._rej[b][0] if self.max_window > 1 else 0.0

    def stats(self) -> dict:
        seen = [b for b in range(len(BUCKET_EDGES)) if sum(self._acc[b]) + sum(self._rej[b]) > 0]
        return {
            "mode": f"fixed T={self.fixed_t}" if self.fixed_t else "marginal E/C",
            "chosen_t_hist": {str(k): v for k, v in sorted(self._chosen.items())},
            "probes": self.probes,
            "cost_ms": {str(t): round(c * 1e3, 3) for t, c in sorted(self._cost.items())},
            "acceptance_by_bucket": {bucket_label(b): [round(x, 3) for x in self.acceptance(BUCKET_EDGES[b], 4)]
                                     for b in seen},
        }
