"""What every benchmark row records about the machine it ran on: CPU model, the ISA flags that decide kernel
paths (from /proc/cpuinfo, as lscpu prints them), the load average when the row was measured, the date (UTC),
and strata's kernel path. Shared by the benches (bench_peers.py, bench_contention.py, bench_decode.py,
bench_big.py), with write_json for every bench's --json."""
from __future__ import annotations

import json
import os
import platform
import time

# the flags that choose a kernel path in strata or llama.cpp
KEY_FLAGS = ("avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq",
             "avx512_vnni", "avx512vbmi", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8")


def cpuinfo(key: str) -> str | None:
    """The first /proc/cpuinfo value of key ("flags", "model name"), None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> list[str]:
    return (cpuinfo("flags") or "").split()


def cpu_model() -> str:
    return cpuinfo("model name") or platform.processor() or platform.machine()


def machine_info(isa: str | None = None) -> dict:
    """One row's machine record; isa: the kernel path strata ran (forced or the best)."""
    flags = set(cpu_flags())
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "flags": [f for f in KEY_FLAGS if f in flags],
            "load_avg": [round(x, 2) for x in os.getloadavg()],
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), **({"strata_isa": isa} if isa else {})}


def describe(info: dict) -> str:
    """A one-line summary for a table header."""
    return (f"{info['cpu']}, {info['cpus']} CPUs; flags {' '.join(info['flags'])}; load avg "
            f"{'/'.join(str(x) for x in info['load_avg'])}; {info['date_utc']} UTC")


def write_json(path: str | None, res: dict) -> None:
    """A bench's results as indented JSON at --json PATH (nothing when no path was given)."""
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
