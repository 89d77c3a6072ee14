"""The GPU kernel launch modes the benches compare (csrc/kernels/cuda/launch.cuh): "on" = programmatic dependent
launch with the dense products' weight prefetch and plain launches for the verify windows of 5..16 rows (the
default), "all" = PDL for those windows too, "no-prefetch" = "on" without the prefetch, "off" = plain launches;
"unfused" = "on" with the norms leaving the activations' quantization to the products
(cuda_prefer_norm_quant(False): one more kernel per product after a norm); "iq2-rows1" / "iq2-rows2" / "iq2-rows4" =
"on" with the IQ2_XXS one-row kernel taking that many weight rows a warp in the dense and the experts' products
(cuda_prefer_iq2_rows; "on": 1 dense, 4 experts, 1 for the experts' fused gate / up); "pieces64" = "on" with prompt
windows in pieces of 64 rows (cuda_prefer_prompt_rows; "on": 512); "nopanel" = "on" with the prompt pieces' dense
IQ2_XXS products decoded per 16 activation rows (cuda_prefer_iq2_panel(False)); "rowgroups" = "on" with
the small float matrices (routers) of prompt pieces in blocks of 16 activation rows, not a block per row
(cuda_prefer_row_groups(True)); "noattntiles" = "on" with the prompt pieces' attention a block per (row, head), not
the tiled kernels (cuda_prefer_attn_tiles(False)); "notileahead" = "on" without the IQ2_XXS expert tiles' L2
prefetch of each block's next tile (cuda_prefer_tile_prefetch(False)); "nofloattiles" = "on" with the float
products (routers) of prompt pieces on k_float, not k_float_tiles (cuda_prefer_float_tiles(False)); "floattiles16" = "on"
with the float products (the routers, the default model's Q8_0 head) taking k_float_tiles from 16 activation rows, not 32
(cuda_prefer_float_tiles(True, 16, 0): a 16-row verify window's head and also its small in-layer products: measured
slower, session 33); "noheadtiles" = "on" with windows under 32 rows on k_float, the default model's 8192-row head too
(cuda_prefer_float_tiles(True, 32, 0); the default takes the tiles from 16 rows over matrices of 4096+ rows); "notilestage" =
"on" with the IQ2_XXS expert tiles' activation rows read from L2 word by word, not staged in shared memory a tile
(cuda_prefer_tile_stage(False)); "nopanelstage" = "on" with the prompt pieces' dense IQ2_XXS panel reading its
activation rows from L2 word by word, 8 a warp, not staged by cp.async, 16 a warp (cuda_prefer_iq2_panel_staged(False));
"iq2-wu4" = "on" with the dense IQ2_XXS windows of 2..4 rows taking 4 blocks of a weight row a step, not 2
(cuda_prefer_iq2_window_u4(True)); "iq2-pair2" / "iq2-pair4" = "on" with the experts' fused gate / up alone taking 2 or 4
weight rows a warp; "nodnconv" = "on" with DeltaNet's conv, gates and conv-state copies of windows of up to 16 rows as the
sequence of copies and kernels, not one kernel (cuda_prefer_dn_conv_fused(False)); "nofloatsplit" = "on" with float
matrices of up to 8 MiB (the default model's head) on the T-row kernels for windows of 2..8 rows, not the 1-row kernel per
activation row (cuda_prefer_float_split(0)); "nob32qsplit" = "on" with the 32-value block types' small matrices (the default
model's in-layer Q8_0 products) on the T-row kernels for windows, not the 1-row kernel per activation row
(cuda_prefer_b32q_split(False)); "nodnduo" = "on" with the DeltaNet heads of 2+ rows on k_dn_heads_split (a warp per 16 columns,
its halves' sums in turn), not the kernel with a column's two halves on two warps, pipelined (cuda_prefer_dn_duo(False));
"nokqlanes" = "on" with Q4_K's and Q6_K's one-row products on the generic int8 kernel k_int, not the dp4a lane kernel
(cuda_prefer_kq_lanes(False)); "nokqwindows" = "on" with small Q4_K / Q5_K / Q6_K matrices over prompt pieces as the
1-row kernel per activation row, not the 16-row kernel (cuda_prefer_kquant_windows(False)); "kqpair" = "on" with the
experts' Q4_K / Q6_K gate / up / SwiGLU over a few slots as one dp4a lane kernel launch, not the two products and silu_mul
(cuda_prefer_kq_pair(True); off by default until measured on a card); "q5klanes" = "on" with Q5_K's one-row products on the
dp4a lane kernel as Q4_K's, not k_int (cuda_prefer_q5k_lanes(True); off by default until run on a card); "kqpair+q5k":
both.
Shared by bench_gpu_forward.py, bench_spec.py and profile_gpu_forward.py. A recorded step keeps the mode
it was recorded in, so a mode applies to the sessions made after it is set."""
from __future__ import annotations

LAUNCH_MODES = ("on", "all", "no-prefetch", "off", "unfused", "iq2-rows1", "iq2-rows2", "iq2-rows4", "pieces64",
                "nopanel", "rowgroups", "noattntiles", "notileahead", "nofloattiles", "floattiles16", "noheadtiles",
                "notilestage", "nopanelstage", "iq2-wu4",
                "iq2-pair2", "iq2-pair4", "nodnconv", "nofloatsplit", "nob32qsplit", "nodnduo", "nokqlanes", "nokqwindows",
                "kqpair", "q5klanes", "kqpair+q5k")


def set_launches(mode: str) -> None:
    """cuda_prefer_pdl for one of LAUNCH_MODES (needs a CUDA build)."""
    from strata_py import _core
    assert mode in LAUNCH_MODES, mode
    _core.cuda_prefer_pdl(mode != "off", mode not in ("no-prefetch", "off"), mode == "all")
    _core.cuda_prefer_norm_quant(mode != "unfused")
    r = int(mode[-1]) if mode.startswith("iq2-rows") else 0
    pair = int(mode[-1]) if mode.startswith("iq2-pair") else 0
    _core.cuda_prefer_iq2_rows(r or 1, r or 4, r or pair or 1)
    _core.cuda_prefer_prompt_rows(64 if mode == "pieces64" else 512)
    _core.cuda_prefer_iq2_panel(mode != "nopanel")
    _core.cuda_prefer_dn_duo(mode != "nodnduo")
    _core.cuda_prefer_row_groups(mode == "rowgroups")
    _core.cuda_prefer_attn_tiles(mode != "noattntiles", 1024)
    _core.cuda_prefer_tile_prefetch(mode != "notileahead")
    min_t, min_w = {"floattiles16": (16, 0), "noheadtiles": (32, 0)}.get(mode, (16, 4096))
    _core.cuda_prefer_float_tiles(mode != "nofloattiles", min_t, min_w)
    _core.cuda_prefer_tile_stage(mode != "notilestage")
    _core.cuda_prefer_iq2_panel_staged(mode != "nopanelstage")
    _core.cuda_prefer_iq2_window_u4(mode == "iq2-wu4")
    _core.cuda_prefer_dn_conv_fused(mode != "nodnconv")
    _core.cuda_prefer_float_split(0 if mode == "nofloatsplit" else 8 << 20)
    _core.cuda_prefer_b32q_split(mode != "nob32qsplit")
    _core.cuda_prefer_kq_lanes(mode != "nokqlanes")
    _core.cuda_prefer_kquant_windows(mode != "nokqwindows")
    _core.cuda_prefer_kq_pair(mode in ("kqpair", "kqpair+q5k"))
    _core.cuda_prefer_q5k_lanes(mode in ("q5klanes", "kqpair+q5k"))
