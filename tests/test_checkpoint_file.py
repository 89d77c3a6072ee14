"""Checkpoint files (csrc/state/checkpoint_file.h): hand-made malformed checkpoints, each refused with its
message and without touching the session; writes that fail mid-way (injected ENOSPC / EIO, a real full
filesystem, a real file-size limit) leave no file under the final name, the old file intact and the session
usable."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from strata_py import _core

HEADER, RECORD = 48, 64


def _table(b: bytes) -> list[dict]:
    n = struct.unpack_from("<I", b, 12)[0]
    out = []
    for i in range(n):
        o = HEADER + i * RECORD
        name = b[o:o + 32].rstrip(b"\0").decode()
        elem, _, count, off, _ = struct.unpack_from("<IIQQQ", b, o + 32)
        out.append(dict(name=name, at=o, elem=elem, count=count, offset=off))
    return out


@pytest.fixture(scope="module")
def saved(tiny_model, tmp_path_factory):
    """A session at position 12 (tokens, KV cells and DeltaNet state), its file, and the logits that follow."""
    s = tiny_model.session(n_ctx=64)
    s.run(list(range(1, 13)))
    s.commit(12)
    path = tmp_path_factory.mktemp("cp") / "s.cp"
    s.save(path)
    return path, s.run([5]).copy()


def _reseal(b: bytes | bytearray) -> bytes:
    return _core._checkpoint_reseal(bytes(b))


def _patched(b: bytes, at: int, fmt: str, *v) -> bytes:
    out = bytearray(b)
    struct.pack_into(fmt, out, at, *v)
    return _reseal(out)


def _cases(b: bytes) -> dict:
    t = _table(b)
    k0 = next(r for r in t if r["name"] == "attn.0.k")
    s0 = next(r for r in t if r["name"] == "deltanet.0.S")
    tok = next(r for r in t if r["name"] == "tokens")
    n = len(t)
    flip = bytearray(b)
    flip[s0["offset"] + 5] ^= 0x40
    return {
        "bad magic": (b"STRATAXX" + b[8:], r"not a strata checkpoint \(bad magic\)"),
        "tiny file": (b[:10], r"not a strata checkpoint \(10 bytes\)"),
        "future version": (_patched(b, 8, "<I", 9), r"checkpoint format version 9; this strata reads version 3 "
                                                    r"\(and versions 1, 2\)"),
        "header cut": (b[:40], r"damaged checkpoint: the file has 40 bytes, less than the 48-byte header"),
        "n_sections huge": (_patched(b, 12, "<I", 0xFFFFFFFF), r"damaged checkpoint: n_sections = 4294967295 does not fit in the file"),
        "header checksum": (bytes(b[:20]) + bytes([b[20] ^ 1]) + b[21:], r"damaged checkpoint: header checksum mismatch"),
        "data checksum": (bytes(flip), r"damaged checkpoint: section 'deltanet\.0\.S' checksum mismatch"),
        "other model": (_patched(b, 16, "<Q", 12345), r"checkpoint was saved from a different model"),
        "position past context": (_patched(_patched(b, 32, "<q", 100), 24, "<q", 100),
                                  r"checkpoint position 100 exceeds this session's context of 64 tokens"),
        "negative position": (_patched(b, 32, "<q", -1), r"damaged checkpoint: position -1 with n_ctx 64"),
        "position vs sizes": (_patched(b, 32, "<q", 11),
                              r"checkpoint section 'tokens' holds 12 values; this session expects 11 \(position 11\)"),
        "count huge": (_patched(b, k0["at"] + 40, "<Q", 2**62),
                       r"damaged checkpoint: section 'attn\.0\.k' \(4611686018427387904 values at byte \d+\) does not fit in order"),
        "count overflow": (_patched(b, k0["at"] + 40, "<Q", 2**63),
                           r"damaged checkpoint: section 'attn\.0\.k' \(9223372036854775808 values"),
        "offset past end": (_patched(b, k0["at"] + 48, "<Q", 2**64 - 8), r"damaged checkpoint: section 'attn\.0\.k' .* does not fit in order"),
        "offset unaligned": (_patched(b, k0["at"] + 48, "<Q", k0["offset"] + 4), r"damaged checkpoint: section 'attn\.0\.k' .* does not fit"),
        "overlap": (_patched(b, k0["at"] + 48, "<Q", tok["offset"]), r"damaged checkpoint: section 'attn\.0\.k' .* does not fit in order"),
        "bad element type": (_patched(b, k0["at"] + 32, "<I", 7), r"damaged checkpoint: section 'attn\.0\.k' has element type 7"),
        "wrong element type": (_patched(b, tok["at"] + 32, "<I", 2), r"damaged checkpoint: section 'tokens' has element type 2, expected 1"),
        "duplicate section": (_reseal(b[:k0["at"]] + b[tok["at"]:tok["at"] + 32] + b[k0["at"] + 32:]),
                              r"damaged checkpoint: section 'tokens' appears twice"),
        "unnamed section": (_reseal(b[:k0["at"]] + bytes(32) + b[k0["at"] + 32:]), r"damaged checkpoint: section #\d+ has no valid name"),
        "renamed section": (_reseal(b[:k0["at"]] + b"qsa.0.keys".ljust(32, b"\0") + b[k0["at"] + 32:]),
                            r"damaged checkpoint: section 'attn\.0\.k' is missing"),
        "trailing bytes": (b + bytes(8), r"damaged checkpoint: the file has \d+ bytes but its sections end at byte \d+"),
        "truncated": (b[:-8], r"damaged checkpoint: section 'model\.file' .* does not fit in order"),
        "no sections": (_patched(b[:HEADER], 12, "<I", 0), r"damaged checkpoint: section 'tokens' is missing"),
        "fewer sections": (_patched(b, 12, "<I", n - 1), r"damaged checkpoint: the file has \d+ bytes but its sections end"),
    }


def test_hand_made_malformed_checkpoints(saved, tiny_model, tmp_path):
    path, after = saved
    b = path.read_bytes()
    s = tiny_model.session(n_ctx=64)
    s.run([7, 7, 7])
    s.commit(3)
    want = s.run([5]).copy()
    s.commit(1)
    import re
    wrong = []
    for name, (data, msg) in _cases(b).items():
        p = tmp_path / (name.replace(" ", "_") + ".cp")
        p.write_bytes(data)
        with pytest.raises(ValueError) as ei:
            s._core.load(str(p))
        if not re.match(re.escape(str(p)) + ": " + msg, str(ei.value)):
            wrong.append(f"{name}: {ei.value}")
        assert s.position == 4, name  # a refused load restores nothing
    assert not wrong, "\n".join(wrong)
    # every mutation above was resealed where needed: the untouched image still loads
    t = tiny_model.session(n_ctx=64)
    t._core.load(str(path))
    np.testing.assert_array_equal(t.run([5]), after)
    s2 = tiny_model.session(n_ctx=64)
    s2.run([7, 7, 7])
    s2.commit(3)
    np.testing.assert_array_equal(s2.run([5]), want)


def test_unknown_section_is_refused(saved, tiny_model, tmp_path):
    """A section this version does not know (say, state a newer strata writes) is refused: restoring without
    it would not be exact. The file gets one more table record (every offset moves by a record) whose data,
    a copy of the tokens, is appended at the end."""
    b = saved[0].read_bytes()
    t = _table(b)
    n, tok = len(t), t[0]
    rec = bytearray(b[tok["at"]:tok["at"] + RECORD])
    rec[:32] = b"logitproc.state".ljust(32, b"\0")
    body = bytearray(b[:HEADER + n * RECORD]) + rec + b[HEADER + n * RECORD:]
    struct.pack_into("<I", body, 12, n + 1)
    for i in range(n):
        at = HEADER + i * RECORD + 48
        struct.pack_into("<Q", body, at, struct.unpack_from("<Q", body, at)[0] + RECORD)
    struct.pack_into("<Q", body, HEADER + n * RECORD + 48, len(body))
    data = b[tok["offset"]:tok["offset"] + tok["count"] * 4]
    body += data + bytes(-len(data) % 8)
    p = tmp_path / "newer.cp"
    p.write_bytes(_reseal(body))
    with pytest.raises(ValueError, match=r"newer\.cp: checkpoint section 'logitproc\.state' is unknown to this version "
                                         r"of strata"):
        tiny_model.load_session(p, n_ctx=64)


def _legacy(b: bytes, version: int) -> bytes:
    """The same state in the sequential layout of versions 1 and 2 (before issue 18)."""
    t = {r["name"]: r for r in _table(b)}

    def arr(name):
        r = t[name]
        return struct.pack("<Q", r["count"]) + b[r["offset"]:r["offset"] + 4 * r["count"]]

    n_attn = sum(1 for k in t if k.endswith(".k"))
    n_dn = sum(1 for k in t if k.endswith(".S"))
    out = b"STRATACP" + struct.pack("<I", version) + b[16:40] + arr("tokens")
    out += struct.pack("<Q", n_attn) + b"".join(arr(f"attn.{i}.k") + arr(f"attn.{i}.v") for i in range(n_attn))
    out += struct.pack("<Q", n_dn) + b"".join(arr(f"deltanet.{i}.S") + arr(f"deltanet.{i}.conv") for i in range(n_dn))
    if version == 2:  # qwen3next: no QSA keys (empty per attention layer), no PLE history
        out += struct.pack("<Q", n_attn) + bytes(16 * n_attn) + struct.pack("<Q", 0) + struct.pack("<q", 0)
    h = 1469598103934665603
    for x in out:
        h = ((h ^ x) * 1099511628211) % 2**64
    return out + struct.pack("<Q", h)


@pytest.mark.parametrize("version", [1, 2])
def test_versions_1_and_2_still_read(saved, tiny_model, tmp_path, version):
    """Files of the sequential layout before issue 18 restore exactly, bounded the same way: their size must be
    what the position and this model give before they are read."""
    path, after = saved
    legacy = _legacy(path.read_bytes(), version)
    p = tmp_path / f"v{version}.cp"
    p.write_bytes(legacy)
    t = tiny_model.load_session(p, n_ctx=64)
    assert t.position == 12
    np.testing.assert_array_equal(t.run([5]), after)
    p.write_bytes(legacy[:-12] + legacy[-8:])
    with pytest.raises(ValueError, match=rf"v{version}\.cp: damaged checkpoint: a version-{version} checkpoint at "
                                         r"position 12 of this model has \d+ bytes, the file \d+"):
        tiny_model.load_session(p, n_ctx=64)
    bad = bytearray(legacy)
    bad[100] ^= 1
    p.write_bytes(bytes(bad))
    with pytest.raises(ValueError, match=r"damaged checkpoint: checksum mismatch"):
        tiny_model.load_session(p, n_ctx=64)


# --- faults while writing ---------------------------------------------------------------------------------

def _session(tiny_model):
    s = tiny_model.session(n_ctx=64)
    s.run(list(range(1, 13)))
    s.commit(12)
    s.run([4, 5, 6])  # a verify window with a pending lazy fold after the commit: save() flushes it
    s.commit(2)
    return s


def _continue(s):
    out = s.run([9, 8])
    s.commit(2)
    return out


@pytest.mark.parametrize("err,op,after", [("ENOSPC", 0, 0), ("ENOSPC", 0, 1000), ("EIO", 0, 3000), ("EIO", 1, 0)])
def test_failed_write_leaves_no_file_and_the_session_usable(tiny_model, tmp_path, err, op, after):
    import errno
    ref = _continue(_session(tiny_model))
    s = _session(tiny_model)
    path = tmp_path / "s.cp"
    _core._inject_checkpoint_fault(getattr(errno, err), after, op)
    try:
        with pytest.raises(RuntimeError, match=str(path).replace(".", r"\.") + ": cannot save the checkpoint: "
                           + ("fsync failed: " if op else f"write failed after {after} bytes: ") + os.strerror(getattr(errno, err))):
            s.save(path)
    finally:
        _core._inject_checkpoint_fault(0, 0, 0)
    assert sorted(os.listdir(tmp_path)) == []  # neither the final name nor the temporary file
    np.testing.assert_array_equal(_continue(s), ref)
    # an existing checkpoint survives a failed overwrite byte for byte
    s = _session(tiny_model)
    s.save(path)
    old = path.read_bytes()
    s.run([1])
    s.commit(1)
    _core._inject_checkpoint_fault(getattr(errno, err), after, op)
    try:
        with pytest.raises(RuntimeError, match="cannot save the checkpoint"):
            s.save(path)
    finally:
        _core._inject_checkpoint_fault(0, 0, 0)
    assert path.read_bytes() == old and sorted(os.listdir(tmp_path)) == ["s.cp"]
    t = tiny_model.load_session(path, n_ctx=64)
    np.testing.assert_array_equal(_continue(t), ref)


_SAVE_SCRIPT = textwrap.dedent("""
    import os, sys, numpy as np
    from strata_py.model import Model
    model, out, fsize = sys.argv[1], sys.argv[2], int(sys.argv[3])
    m = Model.load(model, threads=2)
    s = m.session(n_ctx=64)
    s.run(list(range(1, 13))); s.commit(12)
    if fsize:  # a real limit on file size, set after the imports (an editable install may rebuild on import)
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    try:
        s.save(out)
    except RuntimeError as e:
        print("REFUSED", e)
    print("LEFT", sorted(os.listdir(os.path.dirname(out))))
    a = s.run([9, 8]); s.commit(2)
    t = m.session(n_ctx=64); t.run(list(range(1, 13))); t.commit(12)
    print("USABLE", bool((a == t.run([9, 8])).all()))
""")


def _run_save(cmd_prefix, model, out, fsize=0):
    r = subprocess.run([*cmd_prefix, sys.executable, "-c", _SAVE_SCRIPT, str(model), str(out), str(fsize)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_real_file_size_limit(tiny_gguf, tmp_path):
    """A real mid-write failure from the kernel: RLIMIT_FSIZE below the checkpoint's size (EFBIG)."""
    out = _run_save([], tiny_gguf, tmp_path / "s.cp", fsize=8192)
    assert f"REFUSED {tmp_path / 's.cp'}: cannot save the checkpoint: write failed after 8192 bytes: File too large" in out
    assert "LEFT []" in out and "USABLE True" in out


def test_real_full_filesystem(tiny_gguf, tmp_path):
    """A real ENOSPC: a 64 KiB tmpfs, mounted in a private user + mount namespace (skipped where the kernel
    does not allow unprivileged namespaces)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k none {mnt}"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")
    script = f'mount -t tmpfs -o size=64k none {mnt} && exec "$@"'
    out = _run_save(["unshare", "-rm", "sh", "-c", script, "sh"], tiny_gguf, mnt / "s.cp")
    assert f"REFUSED {mnt / 's.cp'}: cannot save the checkpoint: write failed after" in out
    assert "No space left on device" in out and "LEFT []" in out and "USABLE True" in out
