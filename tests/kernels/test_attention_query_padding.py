"""A prompt's queries are padded to whole query tiles (``kernels.bind._attn_q_len``): to the smallest granule, or for a
long prompt to whole largest tiles when the timing model says the default design is faster there. Padding to 4
alone left a length with a large odd factor only tiny query tiles (6001 rows -> 6004 = 4 x 1501)."""

from __future__ import annotations

import torch

from tilepilot.kernels.bind import ATTN_Q_TILE_MAX, _attn_q_len, _default_attention_s
from tilepilot.kernels.registry import family

DIMS = (9, 3, 64)  # SmolLM2-135M's heads, KV heads, head dim


def _q_len(rows: int, config: dict | None = None) -> int:
    return _attn_q_len(rows, config or {}, lambda q: _default_attention_s(q, q, *DIMS))


def test_a_long_prompt_with_an_odd_factor_pads_to_whole_large_tiles_where_that_is_faster():
    assert _q_len(6001) == 6016
    assert _default_attention_s(6016, 6016, *DIMS) * 2 < _default_attention_s(6004, 6004, *DIMS)  # modeled


def test_lengths_that_tile_keep_their_shape_and_short_prompts_and_configs_are_untouched():
    for rows in (2048, 1024, 8192):  # whole largest tiles already
        assert _q_len(rows) == rows
    for rows in (1, 2, 3, 24, 37, ATTN_Q_TILE_MAX):  # a decode step, the gate prompts: the smallest granule, as before
        assert _q_len(rows) == (rows if rows <= 2 else -(-rows // 4) * 4)
    assert _q_len(6001, {"tile_q": 8}) == 6008  # a config's own query tile decides
    assert _attn_q_len(6001, {}) == 6004  # nothing to time with: the smallest granule


def test_the_padded_queries_change_no_real_query_output():
    """Padded queries sit after every real one: causality hides them from the real queries (fast path, both
    paddings of one 70-query prompt over a 6-row cached prefix)."""
    mod = family("attention")
    g = torch.Generator().manual_seed(0)
    rows, prefix, (h, kvh, d) = 70, 6, (4, 2, 64)
    q = torch.randn(rows, h * d, generator=g).bfloat16()
    kv = torch.randn(prefix + 256, 2 * kvh * d, generator=g).bfloat16()  # [rows, K | V]; rows past the prompt's unseen
    outs = []
    for q_len in (72, 128):
        shape = mod.Shape(q_len=q_len, kv_len=prefix + q_len, n_heads=h, n_kv_heads=kvh, head_dim=d)
        design = mod.make_design(shape, mod.Config(cols=4, heads_per_col=2, tile_q=8, tile_k=64))  # same key blocks
        qp = torch.cat((q, torch.zeros(q_len - rows, q.shape[1], dtype=q.dtype)))
        outs.append(design.fast({"q": qp, "kv": kv[: design.meta["kv_rows"]]})["o"][:rows])
    assert torch.equal(outs[0], outs[1])
