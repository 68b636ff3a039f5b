"""bf16 rounding, block-FP16 quantization and the matmul numerics both executor paths share."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tilepilot.errors import ConfigError
from tilepilot.npu import numerics as nx


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16)


def test_round_bf16_is_round_to_nearest_even_on_ties():
    # bf16 keeps the top 16 bits of fp32; 0x8000 in the low half is an exact tie.
    cases = {
        0x3F80_8000: 0x3F80,  # 1 + half ulp, even (…80) stays -> round down
        0x3F81_8000: 0x3F82,  # odd (…81) + half ulp -> round up to even
        0x3F80_8001: 0x3F81,  # just above the tie -> up
        0x3F80_7FFF: 0x3F80,  # just below the tie -> down
        0xBF81_8000: 0xBF82,  # negative odd tie -> away to even
    }
    for src, want in cases.items():
        x = torch.tensor([src], dtype=torch.int64).to(torch.int32).view(torch.float32)
        got = _bits(nx.round_bf16(x)).to(torch.int32) & 0xFFFF
        assert int(got) == want, hex(src)


def test_round_bf16_keeps_bf16_and_handles_fp64():
    x = torch.randn(100).bfloat16()
    assert nx.round_bf16(x) is x
    assert nx.round_bf16(torch.tensor([1.0], dtype=torch.float64)).dtype == torch.bfloat16


def test_bfp16_blocks_share_one_exponent_and_seven_bit_mantissas():
    torch.manual_seed(0)
    x = (torch.randn(4, 64) * torch.logspace(-3, 3, 64)).bfloat16()
    q = nx.quantize_bfp16(x, axis=-1).float()
    blocks_x = x.float().reshape(4, 8, 8)
    blocks_q = q.reshape(4, 8, 8)
    _, e = torch.frexp(blocks_x.abs().amax(-1, keepdim=True))
    quantum = torch.ldexp(torch.ones_like(blocks_q), e - 7)
    mant = blocks_q / quantum
    assert torch.equal(mant, mant.round())  # every value is an integer multiple of the block quantum
    assert mant.abs().max() <= 127
    # error at most half a quantum (plus saturation of the block max, at most one quantum)
    assert ((blocks_q - blocks_x).abs() <= quantum).all()
    # bfp16 loses precision on small members of a block: it must not be the identity
    assert not torch.equal(q, x.float())


def test_bfp16_axis_and_errors():
    x = torch.randn(16, 8).bfloat16()
    assert torch.equal(nx.quantize_bfp16(x, axis=0), nx.quantize_bfp16(x.T, axis=-1).T)
    assert torch.equal(nx.quantize_bfp16(torch.zeros(8).bfloat16()), torch.zeros(8).bfloat16())
    with pytest.raises(ConfigError):
        nx.quantize_bfp16(torch.randn(12).bfloat16())


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), chunk=st.sampled_from([8, 16, 32]))
def test_exact_matmul_does_not_depend_on_blocking(seed, chunk):
    """Chunk partials are exact, so computing a sub-block gives the same bits as the whole (the tile == fast basis)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(12, 64, generator=g).bfloat16()
    w = torch.randn(20, 64, generator=g).bfloat16()
    full = nx.matmul(x, w, acc="fp32", k_chunk=chunk)
    part = nx.matmul(x[3:7], w[5:13], acc="fp32", k_chunk=chunk)
    assert torch.equal(full[3:7, 5:13], part)


def test_bf16_accumulation_differs_measurably_from_fp32():
    torch.manual_seed(1)
    x = torch.randn(64, 1024).bfloat16()
    w = torch.randn(64, 1024).bfloat16()
    ref = x.float() @ w.float().T
    e32 = (nx.matmul(x, w, acc="fp32", k_chunk=32).float() - ref).abs().mean()
    e16 = (nx.matmul(x, w, acc="bf16", k_chunk=32).float() - ref).abs().mean()
    assert e16 > 3 * e32  # rounding 32 partial sums costs far more than one final rounding


def test_production_path_within_one_ulp_of_exact():
    """Stated bound: production (F.linear, host summation order) vs exact differ on < 1% of elements, by at most one
    bf16 ulp of the result plus the fp32 summation error bound 2*K*2**-24*sum|x_k w_k| (which only matters where
    cancellation leaves the result far smaller than its terms); fewer than 0.1% of elements differ by > 1 ulp."""
    torch.manual_seed(2)
    x = torch.randn(128, 2048).bfloat16()
    w = torch.randn(256, 2048).bfloat16()
    exact = nx.matmul(x, w, acc="fp32", k_chunk=64, exact=True).float()
    prod = nx.matmul(x, w, acc="fp32", k_chunk=64, exact=False).float()
    diff = (exact - prod).abs()
    assert 0 < (diff > 0).float().mean() < 0.01
    ulp = torch.ldexp(torch.ones_like(exact), torch.frexp(torch.maximum(exact.abs(), prod.abs()))[1] - 8)
    gamma = 2 * 2048 * 2.0**-24 * (x.float().abs() @ w.float().abs().T)
    assert (diff <= ulp + gamma).all()
    assert (diff > ulp).float().mean() < 0.001


def test_matmul_input_checks():
    x = torch.randn(4, 16).bfloat16()
    with pytest.raises(ConfigError):
        nx.matmul(x.float(), x)
    with pytest.raises(ConfigError):
        nx.matmul(x, torch.randn(4, 8).bfloat16())
    with pytest.raises(ConfigError):
        nx.matmul(x, x, k_chunk=5)
    with pytest.raises(ConfigError):
        nx.Numerics(accumulate="fp16")


def test_apply_fp32_rounds_once():
    a = torch.tensor([1.0, 3.0]).bfloat16()
    b = torch.tensor([2.0**-9, 2.0**-7]).bfloat16()
    out = nx.apply_fp32(torch.add, a, b)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (a.float() + b.float()).bfloat16())


@pytest.mark.parametrize("acc", ["fp32", "bf16"])
def test_row_invariant_path_gives_a_row_the_same_bits_whatever_shares_the_call(acc):
    """GEMM's fast path: a prompt's last row computed alone (a prefix-cached prompt's one new token, run on one
    thread by ``runtime.threads``) has the bits it has inside the whole prompt's call, and stays within the
    production bound of the exact path. K 4864 (a down projection): where the host's kernel splits K across threads
    and blocks it by M (AMX), so a plain host GEMM fails this."""
    torch.manual_seed(3)
    x = torch.randn(197, 4864).bfloat16()
    w = torch.randn(896, 4864).bfloat16()
    whole = nx.matmul(x, w, acc=acc, k_chunk=64, exact=False, row_invariant=True)
    before = torch.get_num_threads()
    for rows in (slice(196, 197), slice(0, 1), slice(40, 73), slice(3, 19)):
        for threads in {1, before}:
            torch.set_num_threads(threads)
            try:
                alone = nx.matmul(x[rows], w, acc=acc, k_chunk=64, exact=False, row_invariant=True)
            finally:
                torch.set_num_threads(before)
            assert torch.equal(alone, whole[rows]), (rows, threads)
    exact = nx.matmul(x, w, acc=acc, k_chunk=64, exact=True)
    if acc == "bf16":
        assert torch.equal(whole, exact)  # the same chunk partials, rounded in the same order
    else:
        differs = (whole.float() != exact.float()).float().mean()
        assert differs < 0.01
