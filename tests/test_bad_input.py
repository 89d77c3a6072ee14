"""Bad input gets a Python exception naming the file / tensor / key / value, never a crash."""
from __future__ import annotations

import pytest

from corrupt import first_tensor_type_offset, patch, rewrite, u32
from strata_py.model import Model


def test_truncated(tiny_q8_gguf, tmp_path):
    data = tiny_q8_gguf.read_bytes()
    for cut in (10, 200, len(data) // 2, len(data) - 5):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"cut\d+\.gguf: .*truncated"):
            Model.load(p)


def test_bad_magic_and_version(tiny_q8_gguf, tmp_path):
    with pytest.raises(ValueError, match="not a GGUF file"):
        Model.load(patch(tiny_q8_gguf, tmp_path / "magic.gguf", 0, b"GGUX"))
    with pytest.raises(ValueError, match="unsupported GGUF version 7"):
        Model.load(patch(tiny_q8_gguf, tmp_path / "ver.gguf", 4, u32(7)))


def test_unknown_type_id(tiny_q8_gguf, tmp_path):
    off = first_tensor_type_offset(tiny_q8_gguf)
    with pytest.raises(ValueError, match="unknown ggml type id 99"):
        Model.load(patch(tiny_q8_gguf, tmp_path / "type.gguf", off, u32(99)))


def test_known_but_unsupported_type(tmp_path):
    """A tensor of a ggml type the engine does not compute with (TQ2_0: the same block size as IQ2_XXS, so the
    file stays well-formed) is refused at load, naming the file, the tensor and the type."""
    from strata_py import synth
    src = synth.write("tiny", tmp_path / "iq2xxs.gguf", "iq2_xxs", seed=1)
    off = first_tensor_type_offset(src)
    with pytest.raises(ValueError, match=r"tq2\.gguf: tensor 'token_embd\.weight' has type TQ2_0, which this engine does "
                                         r"not support \(supported: .*Q4_0.*IQ1_S.*MXFP4"):
        Model.load(patch(src, tmp_path / "tq2.gguf", off, u32(35)))


def test_missing_tensor(tiny_gguf, tmp_path):
    p = rewrite(tiny_gguf, tmp_path / "missing.gguf", drop="blk.1.ssm_ba.weight")
    with pytest.raises(ValueError, match=r"missing\.gguf: missing tensor 'blk\.1\.ssm_ba\.weight'"):
        Model.load(p)


def test_wrong_shape(tiny_gguf, tmp_path):
    p = rewrite(tiny_gguf, tmp_path / "shape.gguf", reshape=("blk.3.attn_k_norm.weight", (32,)))
    with pytest.raises(ValueError, match=r"'blk\.3\.attn_k_norm\.weight' has shape \[32\], expected \[64\]"):
        Model.load(p)


def test_other_architecture(tiny_gguf, tmp_path):
    p = rewrite(tiny_gguf, tmp_path / "llama.gguf", set_kv=("general.architecture", "llama"))
    with pytest.raises(ValueError, match="architecture 'llama' is not supported"):
        Model.load(p)


def test_missing_key(tiny_gguf, tmp_path):
    p = rewrite(tiny_gguf, tmp_path / "nokey.gguf", drop_kv="qwen3next.ssm.conv_kernel")
    with pytest.raises(ValueError, match="missing metadata key 'qwen3next.ssm.conv_kernel'"):
        Model.load(p)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="notafile.gguf"):
        Model.load(tmp_path / "notafile.gguf")


def test_bad_options(tiny_gguf):
    with pytest.raises(ValueError, match="threads=0"):
        Model.load(tiny_gguf, threads=0)


def test_random_header_corruption_never_crashes(tiny_q8_gguf, tmp_path):
    """Random byte changes anywhere in the header, metadata and tensor table: every file either loads and runs
    or is refused with an exception (a crash would take the test process down). 1300 mutations passed when
    this was written; the test keeps a fixed-seed sample of 120."""
    import random

    import gguf
    data = tiny_q8_gguf.read_bytes()
    header_end = int(gguf.GGUFReader(str(tiny_q8_gguf)).data_offset)
    rng = random.Random(1234)
    refused = 0
    for i in range(120):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(header_end)] = rng.randrange(256)
        p = tmp_path / f"m{i}.gguf"
        p.write_bytes(bytes(b))
        try:
            Model.load(p, threads=2).session(n_ctx=32).run([1, 2, 3])
        except (ValueError, RuntimeError):
            refused += 1
        p.unlink()
    assert refused > 60  # most corruptions are detected


# ---------------------------------------------------------------------------------------------------------
# One hand-made malformed file per case of llama.cpp's tests/test-gguf.cpp and per GGUF CVE class (issue 18),
# each refused with its message checked: the file and the field are named, nothing is allocated before the
# check (every case passes under RLIMIT_AS in test_hand_made_files_allocate_nothing_big).

from corrupt import ARRAY, GGML_F32, GGML_I8, GGML_Q8_0, I32, STRING, U8, U32, Handmade, gstr, u64  # noqa: E402


def _ok():
    """A valid container: one key, one F32 tensor of 8 values with its 32 data bytes."""
    h = Handmade().kv_str("general.architecture", "test").tensor("t", [8], GGML_F32, 0)
    h.data = bytes(32)
    return h


def _with_tensors(*records, data=64):
    h = Handmade().kv_str("general.architecture", "test")
    for r in records:
        h.tensor(*r[:4], **(r[4] if len(r) > 4 else {}))
    h.data = bytes(data)
    return h


HAND_MADE = {
    # header
    "bad_magic": (lambda: Handmade(magic=b"GGUX").build(), r"not a GGUF file \(bad magic 0x58554747\)"),
    "version_0": (lambda: Handmade(version=0).build(), r"unsupported GGUF version 0 "),
    "version_1": (lambda: Handmade(version=1).build(), r"unsupported GGUF version 1 "),
    "version_future": (lambda: Handmade(version=4).build(), r"unsupported GGUF version 4 "),
    "big_endian": (lambda: Handmade(version=0x03000000).build(), r"big-endian GGUF"),
    "n_tensors_minus_1": (lambda: Handmade().build(n_tensors=-1),
                          r"tensor_count = 18446744073709551615 exceeds the limit of 65536"),
    "n_kv_minus_1": (lambda: Handmade().build(n_kv=-1), r"metadata_kv_count = 18446744073709551615 exceeds the limit"),
    "counts_past_end": (lambda: Handmade().build(n_kv=60000, n_tensors=1),
                        r"60000 keys and 1 tensors cannot fit in the 8 bytes after the header"),
    "empty_file": (lambda: b"", r"truncated GGUF: 0 bytes is smaller than the header"),
    "header_only": (lambda: Handmade().build(), r"missing metadata key 'general\.architecture'"),
    # metadata
    "key_size_minus_1": (lambda: Handmade().kv("k", U32, u32(1), key_len=-1).build(),
                         r"metadata key #0 at byte 24 claims 18446744073709551615 bytes \(at most 65535 allowed\)"),
    "key_past_end": (lambda: Handmade().kv("k", U32, u32(1), key_len=1000).build(),
                     r"truncated GGUF while reading metadata key #0 at byte 32"),
    "empty_key": (lambda: Handmade().kv("", U32, u32(1)).build(), r"metadata key #0 is empty"),
    # bytes that are not UTF-8 reach the message as escapes (not as a UnicodeDecodeError naming nothing)
    "key_not_utf8": (lambda: Handmade().kv(b"k\xff", 13, b"\0" * 8).build(),
                     r"metadata key 'k\\xff' has unknown value type 13"),
    "bad_value_type": (lambda: Handmade().kv("k", 13, b"\0" * 8).build(), r"metadata key 'k' has unknown value type 13"),
    "duplicate_key": (lambda: Handmade().kv_u32("k", 1).kv_u32("k", 2).build(), r"duplicate metadata key 'k'"),
    "alignment_13": (lambda: _ok().kv_u32("general.alignment", 13).build(),
                     r"general\.alignment = 13 is not a power of two in 1\.\.65536"),
    "alignment_0": (lambda: _ok().kv_u32("general.alignment", 0).build(), r"general\.alignment = 0 is not a power"),
    "alignment_huge": (lambda: _ok().kv_u32("general.alignment", 1 << 20).build(),
                       r"general\.alignment = 1048576 is not a power of two in 1\.\.65536"),
    "alignment_wrong_type": (lambda: _ok().kv("general.alignment", I32, u32(32)).build(),
                             r"general\.alignment has value type 5 \(must be UINT32, 4\)"),
    "string_len_huge": (lambda: Handmade().kv("k", STRING, u64(2**63) + b"abc").build(),
                        r"metadata key 'k' at byte 37 claims 9223372036854775808 bytes \(at most 67108864 allowed\)"),
    "string_past_end": (lambda: Handmade().kv("k", STRING, u64(1000) + b"abc").build(),
                        r"truncated GGUF while reading metadata key 'k' at byte 45 \(needs 1000 bytes"),
    # gguf-py's reader hung on a 43-byte file with an array of 2^63 elements; this one has 64 bytes
    "array_len_2p63": (lambda: Handmade().kv_array("k", U8, 2**63, b"").build(),
                       r"metadata key 'k' claims 9223372036854775808 array elements at byte 41 but only 15 bytes follow"),
    "array_of_arrays": (lambda: Handmade().kv_array("k", ARRAY, 1, u32(U8) + u64(1) + b"\1").build(),
                        r"metadata key 'k' has array element type 9 \(nested arrays are not allowed\)"),
    "array_bad_element_type": (lambda: Handmade().kv_array("k", 13, 1, b"\0" * 8).build(),
                               r"metadata key 'k' has array element type 13 \(unknown"),
    "array_strings_past_end": (lambda: Handmade().kv_array("k", STRING, 3, gstr("a") + gstr("b") + u64(99)).build(),
                               r"truncated GGUF while reading metadata key 'k' at byte \d+ \(needs 99 bytes"),
    "arrays_over_budget": (lambda: Handmade().kv_array("a", U8, 3_000_000, bytes(3_000_000))
                           .kv_array("b", U8, 3_000_000, bytes(3_000_000)).build(),
                           r"metadata key 'b' has 3000000 array elements; all arrays of a file may hold 4194304 together"),
    # tensor table
    "name_too_long": (lambda: _with_tensors(("t" * 65, [8], GGML_F32, 0)).build(),
                      r"name of tensor #0 at byte \d+ claims 65 bytes \(at most 64 allowed\)"),
    "name_size_minus_1": (lambda: _with_tensors(("t", [8], GGML_F32, 0, {"name_len": -1})).build(),
                          r"name of tensor #0 at byte \d+ claims 18446744073709551615 bytes"),
    "empty_name": (lambda: _with_tensors(("", [8], GGML_F32, 0)).build(), r"tensor #0 has an empty name"),
    "n_dims_5": (lambda: _with_tensors(("t", [8, 1, 1, 1, 1], GGML_F32, 0)).build(),
                 r"tensor 't' has n_dims = 5 \(1\.\.4 allowed\)"),
    "n_dims_0": (lambda: _with_tensors(("t", [], GGML_F32, 0)).build(), r"tensor 't' has n_dims = 0"),
    "dim_minus_1": (lambda: _with_tensors(("t", [-1], GGML_F32, 0)).build(),
                    r"tensor 't' has dimension 0 = -1 \(must be >= 1\)"),
    "zero_dim": (lambda: _with_tensors(("t", [8, 0], GGML_F32, 0)).build(), r"tensor 't' has dimension 1 = 0"),
    "ne_too_big": (lambda: _with_tensors(("t", [4 * (2**31 - 1)] * 4, GGML_F32, 0)).build(),
                   r"tensor 't' has 4 dimensions whose product overflows 63 bits \(dimension 1 = 8589934588\)"),
    "nbytes_too_big": (lambda: _with_tensors(("t", [2**31, 2**31], GGML_F32, 0)).build(),
                       r"tensor 't' of type F32 and shape \[2147483648, 2147483648\] needs more bytes than the file has"),
    # CVE-2026-33298: ggml_nbytes overflow from a dimension of 2^42+1 (x 2^20 rows x 4 bytes wraps to 4 MiB)
    "nbytes_wraps_2p42": (lambda: _with_tensors(("t", [2**42 + 1, 2**20], GGML_F32, 0)).build(),
                          r"tensor 't' of type F32 and shape \[4398046511105, 1048576\] needs more bytes"),
    # CVE-2025-53630 and its bypass CVE-2026-27940: sizes that overflow when added up (with padding). strata
    # never adds sizes: each tensor must fit the data section by itself, and tensors may not overlap
    "sizes_sum_overflow": (lambda: _with_tensors(("a", [0x7FFFFFFFFFFFFFC0], GGML_I8, 0),
                                                 ("b", [0x7FFFFFFFFFFFFFC0], GGML_I8, 0x7FFFFFFFFFFFFFC0)).build(),
                           r"tensor 'a' of type I8 and shape \[9223372036854775744\] needs more bytes"),
    "sizes_sum_overflow_padded": (lambda: _with_tensors(("a", [32], GGML_I8, 0),
                                                        ("b", [2**63 - 33], GGML_I8, 32)).build(),
                                  r"tensor 'b' of type I8 and shape \[9223372036854775775\] needs more bytes"),
    "bad_type": (lambda: _with_tensors(("t", [8], 40, 0)).build(), r"tensor 't' has unknown ggml type id 40"),
    "row_not_whole_blocks": (lambda: _with_tensors(("t", [33], GGML_Q8_0, 0)).build(),
                             r"tensor 't' of type Q8_0 has row length 33, not a multiple of the block size 32"),
    "offset_minus_1": (lambda: _with_tensors(("t", [8], GGML_F32, 2**64 - 1)).build(),
                       r"tensor 't' offset 18446744073709551615 is not aligned to 32"),
    "offset_out_of_range": (lambda: _with_tensors(("t", [8], GGML_F32, 2**64 - 32)).build(),
                            r"truncated GGUF: tensor 't' needs data bytes \[18446744073709551584, "
                            r"18446744073709551584 \+ 32\) but the data section has 64 bytes"),
    "duplicate_name": (lambda: _with_tensors(("t", [8], GGML_F32, 0), ("t", [8], GGML_F32, 32)).build(),
                       r"duplicate tensor 't'"),
    "inconsistent_alignment": (lambda: _with_tensors(("t", [8], GGML_F32, 1)).build(),
                               r"tensor 't' offset 1 is not aligned to 32"),
    # Ollama CVE-2026-7482: offset + size past the end of the file (a read of whatever follows)
    "data_past_end": (lambda: _with_tensors(("t", [16], GGML_F32, 32), data=64).build(),
                      r"truncated GGUF: tensor 't' needs data bytes \[32, 32 \+ 64\) but the data section has 64"),
    "not_enough_data": (lambda: _with_tensors(("t", [8], GGML_F32, 0), data=31).build(),
                        r"tensor 't' needs data bytes \[0, 0 \+ 32\) but the data section has 31 bytes"),
    "overlap": (lambda: _with_tensors(("a", [16], GGML_F32, 0), ("b", [8], GGML_F32, 32)).build(),
                r"tensors 'a' \(bytes \[0, 64\)\) and 'b' \(from byte 32\) overlap"),
}


@pytest.mark.parametrize("case", sorted(HAND_MADE))
def test_hand_made_malformed_gguf(case, tmp_path):
    make, msg = HAND_MADE[case]
    p = tmp_path / f"{case}.gguf"
    p.write_bytes(make())
    with pytest.raises(ValueError, match=str(p).replace(".", r"\.") + ": .*" + msg):
        Model.load(p)


def test_hand_made_valid_containers(tmp_path):
    """The success cases of test-gguf.cpp: a custom alignment (1) with tensors at odd offsets, and a bool or
    string array, read back exactly by strata's reader."""
    from strata_py import _core
    h = _with_tensors(("a", [3], GGML_I8, 0), ("b", [5], GGML_I8, 3), data=8)
    h.kv_u32("general.alignment", 1).kv_array("flags", 7, 3, b"\x01\x00\x01").kv_array("s", STRING, 2, gstr("x") + gstr("yz"))
    p = h.write(tmp_path / "ok.gguf", alignment=1)
    assert [(n, ne, ty, nb) for n, ne, ty, _, nb in _core.gguf_tensors(str(p))] == [("a", [3], "I8", 3), ("b", [5], "I8", 5)]
    md = _core.gguf_metadata(str(p))
    assert md["general.alignment"] == 1 and md["flags"] == [True, False, True] and md["s"] == ["x", "yz"]


def test_hand_made_files_allocate_nothing_big(tmp_path):
    """Every hand-made malformed file is refused in a process whose address space is capped at its size at
    start plus 1 GiB (RLIMIT_AS), so no check comes after a large allocation, and whose CPU time per file is
    capped at 5 s (RLIMIT_CPU: the issue's hang bar as a bound on work, which another program's load on a shared
    machine does not move; an overrun kills the process with SIGXCPU, the file named on stderr)."""
    import subprocess
    import sys
    paths = []
    for case, (make, _) in sorted(HAND_MADE.items()):
        p = tmp_path / f"{case}.gguf"
        p.write_bytes(make())
        paths.append(str(p))
    code = ("import resource, sys\n"
            "from strata_py import _core\n"
            "vm = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
            "resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))\n"
            "for p in sys.argv[1:]:\n"
            "    print(p, file=sys.stderr, flush=True)\n"
            "    used = resource.getrusage(resource.RUSAGE_SELF)\n"
            "    cpu = int(used.ru_utime + used.ru_stime) + 1\n"
            "    resource.setrlimit(resource.RLIMIT_CPU, (cpu + 5, resource.RLIM_INFINITY))\n"
            "    try:\n"
            "        _core.gguf_metadata(p); _core.Model.load(p, 1)\n"
            "    except ValueError:\n"
            "        continue\n"
            "    sys.exit('accepted: ' + p)\n")
    r = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_hand_made_narrower_element_type(tmp_path, tiny_gguf):
    """An array whose elements are not of the type its reader expects is refused naming the key and element,
    never reinterpreted: recurrent-layer flags as floats (C++), token types as strings and tokens as ints
    (the Python tokenizer rebuild)."""
    p = rewrite(tiny_gguf, tmp_path / "rec.gguf", set_kv=("qwen3next.attention.recurrent_layers", [1.0, 1.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match=r"rec\.gguf: metadata key 'qwen3next\.attention\.recurrent_layers' element 0 "
                                         r"is not an integer or bool"):
        Model.load(p)
    p = rewrite(tiny_gguf, tmp_path / "types.gguf", set_kv=("tokenizer.ggml.token_type", ["1"] * 320))
    with pytest.raises(ValueError, match=r"types\.gguf: GGUF metadata tokenizer\.ggml\.token_type has the wrong type "
                                         r"\(expected a list of int\)"):
        Model.load(p)


def test_layer_expert_and_value_limits(tiny_gguf, tmp_path):
    """block_count above the layer limit (llama.cpp's out-of-bounds write class), expert counts, a NaN epsilon,
    a 64-bit value that does not fit: each refused naming the file, the key, the value and the range."""
    cases = [("qwen3next.block_count", 5000, r"'qwen3next\.block_count' = 5000 is outside 1\.\.1024"),
             ("qwen3next.expert_count", 100000, r"'qwen3next\.expert_count' = 100000 is outside 1\.\.16384"),
             ("qwen3next.expert_used_count", 0, r"'qwen3next\.expert_used_count' = 0 is outside 1\.\.1024"),
             ("qwen3next.context_length", 2**63 + 5, r"'qwen3next\.context_length' = 9223372036854775813 does not fit"),
             ("qwen3next.attention.layer_norm_rms_epsilon", float("nan"), r"layer_norm_rms_epsilon = nan")]
    for key, value, msg in cases:
        p = rewrite(tiny_gguf, tmp_path / "lim.gguf", set_kv=(key, value))
        with pytest.raises(ValueError, match=r"lim\.gguf: .*" + msg):
            Model.load(p)


def test_vocabulary_bounded_before_the_tokenizer_is_built(tiny_gguf, tmp_path):
    from strata_py import _core
    md = _core.gguf_metadata(str(tiny_gguf))
    toks = md["tokenizer.ggml.tokens"] + [f"<extra{i}>" for i in range(10)]
    p = rewrite(tiny_gguf, tmp_path / "vocab.gguf", set_kv=("tokenizer.ggml.tokens", toks))
    with pytest.raises(ValueError, match=r"vocab\.gguf: tokenizer\.ggml\.tokens has 330 entries but the model has 320 "
                                         r"token embeddings"):
        Model.load(p)


def test_invalid_utf8_string(tiny_gguf, tmp_path):
    p = rewrite(tiny_gguf, tmp_path / "utf8.gguf", set_kv=("general.name", b"bad \xff\xfe name"))
    with pytest.raises(ValueError, match=r"utf8\.gguf: metadata key 'general\.name' holds a string that is not valid UTF-8"):
        Model.load(p)
