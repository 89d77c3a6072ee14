"""Fresh random inputs that can be replayed: every kernel test draws new inputs each run (STYLE: never only the
same fixed sample), and every draw is seeded, so a failure can be reproduced exactly.

`fresh_rng()` picks a new seed from the OS (or the one given with `pytest --rng-seed N`), remembers it, and
returns numpy's generator for it; conftest.py prints the seeds of a failed test with the command to replay it.
"""
from __future__ import annotations

import secrets

import numpy as np

FIXED: int | None = None       # --rng-seed: every fresh_rng() of the run uses this seed
used: list[int] = []           # the seeds drawn by the running test (conftest.py resets and reports them)


def fresh_rng() -> np.random.Generator:
    seed = FIXED if FIXED is not None else secrets.randbits(63)
    used.append(seed)
    return np.random.default_rng(seed)
