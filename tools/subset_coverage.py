"""Which C++ files the sanitizer subset runs (tests/test_sanitizers.py SUBSET): builds a gcov copy of the
extension (build/gcov-*), runs the subset under it as the sanitizer test does, and prints the line coverage of
every file under csrc/. Slow (a -O0 build and run); a one-off check, recorded in docs/FUZZING.md.

    python tools/subset_coverage.py
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import test_sanitizers as ts  # noqa: E402


def main() -> int:
    build = ROOT / "build" / f"gcov-{sys.implementation.cache_tag}-{sysconfig.get_platform()}"
    module = ts.build_extension(build, flags="--coverage", opt="-O0")
    ts.stage(build / "pkg", module)
    for gcda in build.rglob("*.gcda"):
        gcda.unlink()
    env = dict(os.environ, PYTHONPATH=str(build / "pkg"))
    # real_file_size_limit: its RLIMIT_FSIZE would also cut the process's own .gcda write (and spoil the merge)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                        ts.DESELECT + " and not real_file_size_limit", *ts.SUBSET], cwd=ROOT, env=env)
    rows = []
    for src in sorted((ROOT / "csrc").rglob("*.cpp")):
        rel = src.relative_to(ROOT)
        obj = next(iter(build.glob(f"CMakeFiles/*/{rel}.gcda")), None)
        if obj is None:
            rows.append((rel, 0.0, 0))
            continue
        out = subprocess.run(["gcov", "-n", str(obj.with_suffix(".gcno"))], capture_output=True, text=True,
                             cwd=build).stdout
        m = re.search(rf"File '[^']*{re.escape(str(rel))}'\nLines executed:([\d.]+)% of (\d+)", out)
        rows.append((rel, float(m.group(1)) if m else 0.0, int(m.group(2)) if m else 0))
    for path, pct, n in rows:
        print(f"{pct:6.1f}% of {n:5d} lines  {path}")
    unrun = [str(p) for p, pct, _ in rows if pct == 0.0]
    print("files with no line run:", ", ".join(unrun) or "none")
    return r.returncode or (1 if unrun else 0)


if __name__ == "__main__":
    sys.exit(main())
