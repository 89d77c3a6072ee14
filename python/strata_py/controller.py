"""The draft-length controller (engine spec section 4): choose T = 1 + drafts before any work is issued.

With D drafts, a_i the conditional acceptance of draft i and q_i = a_1 * ... * a_i (q_0 = 1), a window keeps
E(T) = sum_{i=0..T-1} q_i rows on average and costs C(T) seconds. A longer window pays only if
dE/dC > E/C at the current operating point, i.e. only if it raises throughput E/C:
    (E + dE) / (C + dC) > E / C   <=>   dE / dC > E / C        (dC > 0)
so the controller picks the T in 1..1+available with the highest E(T)/C(T), comparing each longer T with
the best so far by that marginal rule. Nothing pays -> T = 1 (no drafts).

Estimates, all online:
  a_i   per (match-length bucket, draft position i): Beta counts with strength-`prior_strength` priors.
        Draft 1 of a match of length L: prior mean L / (L + s), the longer the match the likelier its
        continuation (the premise of suffix lookup), with one scale s fitted (maximum likelihood) to every
        first-draft outcome of the request so far, all buckets together, plus one accepted and one rejected
        pseudo-outcome at L = 4 (s = 4 before any data). A bucket seen rarely thus follows the request's
        overall level at its own length. Draft i > 1 is offered only after drafts 1..i-1 were accepted, when
        the context matches its source over L + i - 1 tokens: its prior is draft 1's estimate for a match of
        that length. So a position rarely tried (long windows are chosen only when they pay) follows what
        the first drafts of longer matches show, instead of the few deep outcomes of short matches.
  C(T)  WindowCosts: measured window seconds per T (the decode loop calls record_window(T, seconds); the
        drafter adds its own lookup time; the request's first windows are skipped, since they run on cold
        caches, and so is a window during which the session ran a step cold, Session.cold_steps: on the GPU
        a step's first sight records it, about twice its replayed cost).
        C(T) is a property of the model and the machine, not of the request, so one table per loaded
        model is shared by every request's controller (window_costs(model)). Per T an EMA whose first
        measurement only stands in until the second, and a sample above 1.5x the estimate (the machine
        preempted us) counts as 1.5x. Once two Ts are measured twice, every C(T) is read off the line
        c0 + c1 (T - 1) fitted to them (weighted by samples, up to 8): a few noisy windows at one T must not
        make a longer window look cheaper or dearer than its neighbours. Before that, a measured T is read
        directly and others off the line through the measured Ts (with one, c1 = `slope_prior` * c0), so a T
        gets tried when it looks cheap.
Probing: a bucket whose estimate fell so low that T = 1 wins would never be observed again; after
`probe_every` (8) consecutive such windows the controller offers one draft (T = 2) once to refresh it, and
doubles that gap (up to 32x) while drafting keeps not paying, so a losing drafter costs ever less.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

# Lower edges of the match-length buckets (tokens); the last bucket is open.
BUCKET_EDGES = (1, 4, 6, 8, 12, 16, 32, 64)


def bucket_of(match_len: int) -> int:
    """Index of the match-length bucket holding match_len (>= 1)."""
    return max(0, bisect_right(BUCKET_EDGES, match_len) - 1)


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
class WindowCosts:
    """C(T): measured seconds of a verify window of T rows (see the module docstring)."""
    cost_ema: float = 0.2          # weight of the newest window
    slope_prior: float = 0.15      # C(T) ~ C(1) (1 + slope (T - 1)) until two T's are measured
    spike: float = 1.5             # a sample above spike x the estimate counts as spike x the estimate
    _cost: dict = field(default_factory=dict, repr=False)  # T -> EMA seconds
    _n: dict = field(default_factory=dict, repr=False)     # T -> samples
    _fit: tuple | None = field(default=None, repr=False)   # (direct, c0, slope, mx) until the next record()

    def record(self, T: int, seconds: float) -> None:
        self._fit = None
        n = self._n.get(T, 0)
        if n <= 1:
            self._cost[T] = seconds  # the first sample only stands in until the second
        else:
            seconds = min(seconds, self.spike * self._cost[T])
            self._cost[T] += self.cost_ema * (seconds - self._cost[T])
        self._n[T] = n + 1

    @property
    def samples(self) -> int:
        return sum(self._n.values())

    def __call__(self, T: int) -> float:
        """C(T) in seconds (or relative units before anything is measured)."""
        return self.table(T)[T - 1]

    def table(self, n: int) -> list[float]:
        """[C(1), ..., C(n)], from one fit (kept until the next record())."""
        fit = self._fit
        if fit is None:
            fit = self._fit = self._line()
        direct, c0, slope, mx = fit
        if direct:
            cost = self._cost
            return [cost[T] if T in cost else max(1e-9, c0 + slope * (T - mx)) for T in range(1, n + 1)]
        return [max(1e-9, c0 + slope * (T - mx)) for T in range(1, n + 1)]

    def _line(self) -> tuple:
        # Plain loops, not sum() over generators: the controller runs between every two GPU steps (~0.4 ms), where
        # each microsecond of Python shows. The same additions in the same order (sum() adds left to right from 0).
        items = sorted(self._cost.items())
        pts = []
        for t, c in items:
            n = self._n[t]
            if n >= 2:
                pts.append((t, c, n if n < 8 else 8))
        direct = len(pts) < 2  # measured Ts are read directly until two are measured twice
        if direct:
            pts = [(t, c, 1) for t, c in items]
        if not pts:
            return direct, 1.0, self.slope_prior, 1.0
        if len(pts) == 1:
            t0, c, _ = pts[0]
            c0 = c / (1.0 + self.slope_prior * (t0 - 1))
            return direct, c0, c0 * self.slope_prior, 1.0
        w = swt = swc = 0
        for t, c, wt in pts:
            w += wt
            swt += t * wt
            swc += c * wt
        mx, c0 = swt / w, swc / w
        sxx = sxy = 0
        for t, c, wt in pts:
            sxx += wt * (t - mx) ** 2
            sxy += wt * (t - mx) * (c - c0)
        return direct, c0, max(0.0, sxy / sxx), mx

    def stats(self) -> dict:
        return {str(t): round(c * 1e3, 3) for t, c in sorted(self._cost.items())}


class DraftedCosts:
    """C(T) for a model-based drafter's controller. T = 1 has no drafting: the plain step of the shared
    verify-window table, which every request measures (not a point extrapolated from the drafted windows'
    line). T > 1: the drafted windows' own measured seconds, drafting included (its own WindowCosts over
    T > 1: the draft also slows the window after it, through the caches it takes), and until there are any,
    the shared table's C(T) plus `drafting(T)`."""

    def __init__(self, verify: WindowCosts, drafting, own: WindowCosts | None = None):
        self.verify, self.drafting = verify, drafting
        self.own = own if own is not None else WindowCosts()

    def record(self, T: int, seconds: float) -> None:
        if T > 1:
            self.own.record(T, seconds)

    @property
    def samples(self) -> int:
        return self.own.samples

    def table(self, n: int) -> list[float]:
        if self.own.samples == 0:  # no drafted window measured yet
            base = self.verify.table(n)
            return [base[0]] + [c + self.drafting(T) for T, c in enumerate(base[1:], 2)]
        out = self.own.table(n)
        out[0] = self.verify.table(1)[0]
        return out

    def __call__(self, T: int) -> float:
        return self.table(T)[T - 1]

    def stats(self, n: int = 4) -> dict:
        return {str(T): round(c * 1e3, 3) for T, c in enumerate(self.table(n), 1)}


def per_model(model, attr: str, make):
    """State kept on a loaded model and shared by its requests (created by make() on first use); a fresh
    one without a model."""
    if model is None:
        return make()
    state = getattr(model, attr, None)
    if state is None:
        state = make()
        setattr(model, attr, state)
    return state


def window_costs(model) -> WindowCosts:
    """The C(T) table shared by every request on this loaded model (created on first use)."""
    return per_model(model, "_window_costs", WindowCosts)


@dataclass
class LengthController:
    max_window: int = 8
    fixed_t: int = 0               # > 0: always this T (bounded by what the loop allows); experiments
    prior_strength: float = 2.0
    probe_every: int = 8
    deep_probe_every: int = 0      # > 0: after this many windows shorter than available, one draft more (0: never)
    warmup_windows: int = 4        # cost samples of a request's first windows are ignored (cold caches)
    costs: WindowCosts = field(default_factory=WindowCosts)  # C(T); pass window_costs(model) to share it
    _acc: list = field(default_factory=list, repr=False)   # [bucket][pos] accepted counts
    _rej: list = field(default_factory=list, repr=False)   # [bucket][pos] rejected counts
    _chosen: dict = field(default_factory=dict, repr=False)
    _scale: float | None = field(default=None, repr=False)  # length_scale() until the next observe()
    _scale_last: float = field(default=4.0, repr=False)  # the last length_scale(): the next fit starts there
    _acc_memo: dict = field(default_factory=dict, repr=False)  # acceptance() until the next observe()
    _idle: int = 0
    _probe_gap: int = 0            # T = 1 windows before the next probe (0: probe_every; doubles while idle)
    _seen: int = 0                 # windows recorded so far (warm-up ones included)
    _shallow: int = 0              # drafting windows in a row that offered fewer drafts than were available
    probes: int = 0
    deep_probes: int = 0

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
        """Posterior-mean a_1..a_n for a match of this length (kept until the next observe())."""
        key = (match_len, n)
        if key not in self._acc_memo:
            self._acc_memo[key] = self._acceptance(match_len, n)
        return self._acc_memo[key]

    def _acceptance(self, match_len: int, n: int | None) -> list[float]:
        L = max(1, match_len)
        b = bucket_of(L)
        n = self.max_window - 1 if n is None else min(n, self.max_window - 1)
        k, s = self.prior_strength, self.length_scale()

        def first(Lq: int) -> float:  # draft 1 of a match of Lq tokens
            bb = bucket_of(Lq)
            return (self._acc[bb][0] + k * Lq / (Lq + s)) / (self._acc[bb][0] + self._rej[bb][0] + k)

        out = [first(L)]
        for i in range(1, n):
            out.append((self._acc[b][i] + k * first(L + i)) / (self._acc[b][i] + self._rej[b][i] + k))
        return out

    def length_scale(self) -> float:
        """s of the draft-1 prior L / (L + s): the maximum-likelihood fit to the first-draft outcomes (each
        bucket at its lower edge) plus one accepted and one rejected pseudo-outcome at L = 4. The log-likelihood's
        derivative vanishes at the root of phi(s) = rej - sum(n s / (L + s)) (n: a bucket's outcomes; rej: all
        rejections). phi falls, convex, from rej > 0 at s = 0 to below zero (the pseudo-outcomes make at least one
        acceptance), so the root is unique and Newton's steps from its left approach it monotonically (a step from
        its right lands left of it, or past zero: then s halves). Each fit starts from the last one's s, which one
        window moves little: a few steps between windows."""
        if self._scale is not None:
            return self._scale
        obs = [(4.0, 2.0)]  # (L, outcomes)
        rej = 1.0
        for b, lo in enumerate(BUCKET_EDGES):
            a, r = self._acc[b][0], self._rej[b][0]
            if a + r > 0:
                obs.append((float(lo), a + r))
                rej += r
        s = self._scale_last
        for _ in range(64):
            phi, slope = rej, 0.0
            for L, n in obs:
                d = L + s
                phi -= n * s / d
                slope -= n * L / (d * d)
            nxt = s - phi / slope
            nxt = nxt if nxt > 0 else 0.5 * s
            done = abs(nxt - s) <= 1e-12 * s
            s = nxt
            if done:
                break
        self._scale = self._scale_last = s
        return s

    def cost(self, T: int) -> float:
        """C(T) in seconds (WindowCosts)."""
        return self.costs(T)

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
            C = self.costs.table(available + 1)
            best = 1
            for T in range(2, available + 2):
                # marginal rule between the best shorter window and T: E(T)/C(T) > E(best)/C(best)
                if E[T - 1] * C[best - 1] > E[best - 1] * C[T - 1]:
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
                if self.deep_probe_every and d < available:
                    # a draft's outcome is seen only where it was offered: after a few early rejections at depth
                    # d + 1 the estimate there would stay low for the whole request; offer it now and then
                    self._shallow += 1
                    if self._shallow >= self.deep_probe_every:
                        self._shallow, d = 0, d + 1
                        self.deep_probes += 1
                else:
                    self._shallow = 0
        self._chosen[d + 1] = self._chosen.get(d + 1, 0) + 1
        return d

    def seed(self, match_len: int, kept: list[float], rejected: list[float]) -> None:
        """Outcomes known before the request (per draft position, for matches of match_len): counted as observed."""
        b = bucket_of(max(1, match_len))
        for i in range(min(len(kept), self.max_window - 1)):
            self._acc[b][i] += kept[i]
            self._rej[b][i] += rejected[i]
        self._scale = None
        self._acc_memo.clear()

    def observe(self, match_len: int, offered: int, accepted: int) -> None:
        """Outcome of a window: drafts 1..accepted were kept, draft accepted+1 (if offered) was not."""
        if offered <= 0:
            return
        b = bucket_of(max(1, match_len))
        self._scale = None
        self._acc_memo.clear()
        for i in range(min(accepted, offered, self.max_window - 1)):
            self._acc[b][i] += 1
        if accepted < offered and accepted < self.max_window - 1:
            self._rej[b][accepted] += 1

    def record_window(self, T: int, seconds: float) -> None:
        """Measured cost of a window of T rows (run + sample + commit + drafting).

        The first `warmup_windows` windows of a request are not measurements of C(T): right after prefill
        the weights are partly out of cache and a step costs up to 2.5x its steady value, and one such sample
        for a T that is then rarely chosen would skew the fitted line for the whole request. The others go to
        the cost table (WindowCosts.record)."""
        self._seen += 1
        if self._seen > self.warmup_windows:
            self.costs.record(T, seconds)

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
            "deep_probes": self.deep_probes,
            "cost_ms": self.costs.stats(),
            "acceptance_by_bucket": {bucket_label(b): [round(x, 3) for x in self.acceptance(BUCKET_EDGES[b], 4)]
                                     for b in seen},
        }
