"""Numerical agreement metrics between a reference tensor (the oracle) and a test tensor (the NPU).

Every metric upcasts its inputs (bf16/fp16 to FP32; FP64 stays FP64) and returns a plain float so
that gates and JSON reports can hold it. A non-finite value (NaN or +-Inf) in either input makes
every metric return NaN, and a NaN never satisfies a gate threshold: a broken run cannot pass by
producing values the arithmetic happens to forgive. Shapes must match exactly.

Definitions (the ones the gates and the docs quote):
- max_rel_err  = max|test - ref| / max|ref|        (normwise; elementwise ratios explode near 0)
- mean_rel_err = mean|test - ref| / mean|ref|      (relative L1 error)
- pearson      = correlation of the flattened tensors
- cosine       = <ref, test> / (|ref| |test|) of the flattened tensors
- per_position_cosine = cosine per row (last dimension = features, all others = positions)
- topk_agreement = mean over rows of |topk(ref) & topk(test)| / k
- kl_divergence  = mean over rows of KL(softmax(ref) || softmax(test)), in nats
- teacher_forced_kl = KL(softmax(ref) || softmax(test)) per row (one row per teacher-forced step), with its
  mean, 90th percentile (linear interpolation, numpy's default) and maximum (IRON's Llama-3.2-1B gate)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from tilepilot.errors import InputError

NAN = float("nan")

# Rows processed at once where a metric needs a [rows, vocab] temporary (KL, top-k).
_ROW_CHUNK = 64


def upcast(x: Any) -> torch.Tensor:
    """``x`` (tensor, array or nested list) as a detached CPU float tensor of at least FP32."""
    if isinstance(x, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, torch.Tensor):
        t = x.detach().cpu()
    else:
        t = torch.as_tensor(x)
    if t.dtype == torch.float64:
        return t
    return t.to(torch.float32)


def _pair(ref: Any, test: Any) -> tuple[torch.Tensor, torch.Tensor]:
    r, t = upcast(ref), upcast(test)
    if r.shape != t.shape:
        raise InputError(
            f"reference has shape {tuple(r.shape)} but test has {tuple(t.shape)}; compare tensors of one shape"
        )
    if r.dtype != t.dtype:
        r, t = r.to(torch.float64), t.to(torch.float64)
    return r, t


def nonfinite_count(x: Any) -> int:
    """Number of NaN or infinite values in ``x``."""
    return int((~torch.isfinite(upcast(x))).sum())


def _all_finite(*xs: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(x).all()) for x in xs)


def max_abs_err(ref: Any, test: Any) -> float:
    r, t = _pair(ref, test)
    if not _all_finite(r, t):
        return NAN
    if r.numel() == 0:
        return 0.0
    return float((t - r).abs().max())


def max_rel_err(ref: Any, test: Any) -> float:
    """max|test - ref| / max|ref|; 0 when both are all zeros, inf when only ref is."""
    r, t = _pair(ref, test)
    if not _all_finite(r, t):
        return NAN
    if r.numel() == 0:
        return 0.0
    diff = float((t - r).abs().max())
    scale = float(r.abs().max())
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def mean_rel_err(ref: Any, test: Any) -> float:
    """mean|test - ref| / mean|ref| (relative L1 error)."""
    r, t = _pair(ref, test)
    if not _all_finite(r, t):
        return NAN
    if r.numel() == 0:
        return 0.0
    diff = _mean64((t - r).abs())
    scale = _mean64(r.abs())
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


# Elements upcast to FP64 at once by the accumulating reductions below.
_ELEM_CHUNK = 1 << 20


def _moments(a: torch.Tensor, b: torch.Tensor, a_shift: float = 0.0, b_shift: float = 0.0) -> tuple[float, ...]:
    """(sum a*b, sum a*a, sum b*b) of the flattened, shifted tensors, accumulated in FP64.

    FP32 dot products over millions of elements (a vocabulary of logits) drift by ~1e-4 relative
    and report cosines above 1; FP64 accumulation over FP64 chunks keeps the error near 1e-12
    without an FP64 copy of the whole tensor.
    """
    a, b = a.reshape(-1), b.reshape(-1)
    ab = aa = bb = 0.0
    for lo in range(0, a.numel(), _ELEM_CHUNK):
        x = a[lo : lo + _ELEM_CHUNK].double() - a_shift
        y = b[lo : lo + _ELEM_CHUNK].double() - b_shift
        ab += float(torch.dot(x, y))
        aa += float(torch.dot(x, x))
        bb += float(torch.dot(y, y))
    return ab, aa, bb


def _mean64(x: torch.Tensor) -> float:
    x = x.reshape(-1)
    if x.numel() == 0:
        return 0.0
    total = sum(float(x[lo : lo + _ELEM_CHUNK].double().sum()) for lo in range(0, x.numel(), _ELEM_CHUNK))
    return total / x.numel()


def _cos_from(ab: float, aa: float, bb: float) -> float:
    if aa == 0.0 or bb == 0.0:
        # Both zero: identical. One zero: no shared direction, so no agreement.
        return 1.0 if aa == bb else 0.0
    return max(-1.0, min(1.0, ab / math.sqrt(aa * bb)))


def cosine(ref: Any, test: Any) -> float:
    """Cosine similarity of the flattened tensors."""
    r, t = _pair(ref, test)
    if not _all_finite(r, t):
        return NAN
    return _cos_from(*_moments(r, t))


def pearson(ref: Any, test: Any) -> float:
    """Pearson correlation of the flattened tensors.

    Undefined when a side is constant; then 1.0 if the tensors are equal and 0.0 otherwise, so a
    kernel that outputs a constant where the reference varies scores 0, not NaN-by-accident.
    """
    r, t = _pair(ref, test)
    if not _all_finite(r, t):
        return NAN
    ab, aa, bb = _moments(r, t, _mean64(r), _mean64(t))
    if aa == 0.0 or bb == 0.0:
        return 1.0 if torch.equal(r, t) else 0.0
    return _cos_from(ab, aa, bb)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(1, -1) if x.dim() <= 1 else x.reshape(-1, x.shape[-1])


def per_position_cosine(ref: Any, test: Any) -> torch.Tensor:
    """Cosine of each row (all leading dims flattened); NaN for rows holding non-finite values."""
    r, t = _pair(ref, test)
    r, t = _rows(r), _rows(t)
    out = torch.empty(r.shape[0], dtype=torch.float64)
    for lo in range(0, r.shape[0], _ROW_CHUNK):
        a, b = r[lo : lo + _ROW_CHUNK].double(), t[lo : lo + _ROW_CHUNK].double()
        dot, aa, bb = (a * b).sum(-1), (a * a).sum(-1), (b * b).sum(-1)
        denom = (aa * bb).sqrt()
        cos = torch.where(denom > 0, dot / torch.where(denom > 0, denom, 1.0), (aa == bb).double())
        out[lo : lo + _ROW_CHUNK] = cos.clamp(-1.0, 1.0)
    bad = ~(torch.isfinite(r).all(-1) & torch.isfinite(t).all(-1))
    return out.masked_fill(bad, NAN)


def min_position_cosine(ref: Any, test: Any) -> float:
    """The worst row of ``per_position_cosine`` (NaN if any row has non-finite values)."""
    cos = per_position_cosine(ref, test)
    if cos.numel() == 0:
        return 1.0
    if bool(torch.isnan(cos).any()):
        return NAN
    return float(cos.min())


def topk_agreement(ref_logits: Any, test_logits: Any, k: int = 5) -> float:
    """Mean over rows of the overlap of the two top-k id sets, as a fraction of k."""
    r, t = _pair(ref_logits, test_logits)
    if not _all_finite(r, t):
        return NAN
    r, t = _rows(r), _rows(t)
    k = min(k, r.shape[-1])
    if r.shape[0] == 0 or k == 0:
        return 1.0
    total = 0
    for lo in range(0, r.shape[0], _ROW_CHUNK):
        ri = r[lo : lo + _ROW_CHUNK].topk(k, dim=-1).indices
        ti = t[lo : lo + _ROW_CHUNK].topk(k, dim=-1).indices
        total += int((ri[:, :, None] == ti[:, None, :]).any(-1).sum())
    return total / (r.shape[0] * k)


def top1_agreement(ref_logits: Any, test_logits: Any) -> float:
    """Fraction of rows whose argmax is the same."""
    r, t = _pair(ref_logits, test_logits)
    if not _all_finite(r, t):
        return NAN
    r, t = _rows(r), _rows(t)
    if r.shape[0] == 0:
        return 1.0
    return float((r.argmax(-1) == t.argmax(-1)).to(torch.float64).mean())


def kl_divergence(ref_logits: Any, test_logits: Any) -> float:
    """Mean over rows of KL(p_ref || p_test) of the softmax distributions, in nats, computed in FP64."""
    r, t = _pair(ref_logits, test_logits)
    if not _all_finite(r, t):
        return NAN
    r, t = _rows(r), _rows(t)
    if r.shape[0] == 0:
        return 0.0
    total = 0.0
    for lo in range(0, r.shape[0], _ROW_CHUNK):
        lp = torch.log_softmax(r[lo : lo + _ROW_CHUNK].double(), dim=-1)
        lq = torch.log_softmax(t[lo : lo + _ROW_CHUNK].double(), dim=-1)
        total += float((lp.exp() * (lp - lq)).sum())
    return max(0.0, total / r.shape[0])


def kl_per_row(ref_logits: Any, test_logits: Any) -> torch.Tensor:
    """KL(p_ref || p_test) of each row's softmax distributions, in nats, FP64; NaN rows where either is non-finite."""
    r, t = _pair(ref_logits, test_logits)
    r, t = _rows(r), _rows(t)
    out = torch.empty(r.shape[0], dtype=torch.float64)
    for lo in range(0, r.shape[0], _ROW_CHUNK):
        lp = torch.log_softmax(r[lo : lo + _ROW_CHUNK].double(), dim=-1)
        lq = torch.log_softmax(t[lo : lo + _ROW_CHUNK].double(), dim=-1)
        out[lo : lo + _ROW_CHUNK] = (lp.exp() * (lp - lq)).sum(-1).clamp(min=0.0)
    bad = ~(torch.isfinite(r).all(-1) & torch.isfinite(t).all(-1))
    return out.masked_fill(bad, NAN)


def teacher_forced_kl(ref_logits: Any, test_logits: Any) -> dict[str, Any]:
    """IRON's accuracy statistic: per-step KL(fp32 || NPU) of next-token distributions, and its mean/p90/max.

    Row ``i`` of both inputs is the distribution after the same ``i``-token prefix of real text (teacher forcing:
    both sides are fed the text, not their own choices). Any non-finite value makes every statistic NaN.
    """
    kl = kl_per_row(ref_logits, test_logits)
    if kl.numel() == 0:
        return {"mean": NAN, "p90": NAN, "max": NAN, "steps": 0, "per_step": []}
    vals = kl.numpy()
    if not np.isfinite(vals).all():
        return {"mean": NAN, "p90": NAN, "max": NAN, "steps": int(kl.numel()), "per_step": vals.tolist()}
    return {
        "mean": float(vals.mean()),
        "p90": float(np.percentile(vals, 90)),
        "max": float(vals.max()),
        "steps": int(kl.numel()),
        "per_step": vals.tolist(),
    }


@dataclass(frozen=True)
class TokenSetCheck:
    """Outcome of the vLLM-style greedy check; ``divergence_index`` is None when the tokens agree."""

    passed: bool
    identical: bool
    n_compared: int
    divergence_index: int | None
    ref_token: int | None
    test_token: int | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first step where two token sequences differ (over their common length), or None."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if int(x) != int(y)), None)


def greedy_token_set_check(
    ref_tokens: Sequence[int],
    test_tokens: Sequence[int],
    ref_topk: Sequence[Sequence[int]],
    test_topk: Sequence[Sequence[int]],
    k: int = 5,
) -> TokenSetCheck:
    """Greedy continuations agree if identical, or if at the first divergence each side's token is
    in the other side's top-``k`` (vLLM ``check_logprobs_close``). After a divergence the contexts
    differ, so later steps are not compared. A length mismatch without a divergence fails: one side
    stopped or ran on where the other did not.
    """
    ref_tokens, test_tokens = [int(x) for x in ref_tokens], [int(x) for x in test_tokens]
    n = min(len(ref_tokens), len(test_tokens))
    i = first_divergence(ref_tokens, test_tokens)
    if i is not None:
        rt, tt = ref_tokens[i], test_tokens[i]
        if i >= len(ref_topk) or i >= len(test_topk):
            raise InputError(f"top-{k} ids are missing for step {i}; record the top-{k} ids of every greedy step")
        in_ref = tt in [int(x) for x in ref_topk[i][:k]]
        in_test = rt in [int(x) for x in test_topk[i][:k]]
        ok = in_ref and in_test
        if ok:
            msg = f"tokens diverge at step {i} ({rt} vs {tt}) but each is in the other's top-{k}"
        else:
            where = [s for s, bad in (("reference", not in_ref), ("test", not in_test)) if bad]
            msg = (
                f"tokens diverge at step {i} (reference {rt}, test {tt}) and the other side's token is not in "
                f"the {' or '.join(where)} top-{k}"
            )
        return TokenSetCheck(ok, False, i + 1, i, rt, tt, msg)
    if len(ref_tokens) != len(test_tokens):
        msg = (
            f"the first {n} tokens agree but the reference has {len(ref_tokens)} tokens and the test {len(test_tokens)}"
        )
        return TokenSetCheck(False, False, n, None, None, None, msg)
    return TokenSetCheck(True, True, n, None, None, None, f"all {n} greedy tokens are identical")


def layer_cosine_profile(cosines: Sequence[float]) -> dict[str, float]:
    """Worst per-layer cosine and the largest drop between adjacent layers (a 'cliff').

    ``max_drop`` is max(cos[i-1] - cos[i]); negative drops (recovery) do not count. NaN in, NaN out.
    """
    vals = [float(c) for c in cosines]
    if not vals:
        return {"min_cosine": NAN, "max_drop": NAN}
    if any(math.isnan(v) for v in vals):
        return {"min_cosine": NAN, "max_drop": NAN}
    drops = [a - b for a, b in zip(vals, vals[1:], strict=False)]
    return {"min_cosine": min(vals), "max_drop": max([0.0, *drops])}


def compare(ref: Any, test: Any, *, logits: bool = False, k: int = 5) -> dict[str, float]:
    """The standard measurement set of one tensor pair (plus top-1/top-k/KL when they are logits)."""
    r, t = _pair(ref, test)
    out = {
        "max_abs_err": max_abs_err(r, t),
        "max_rel_err": max_rel_err(r, t),
        "mean_rel_err": mean_rel_err(r, t),
        "pearson": pearson(r, t),
        "cosine": cosine(r, t),
        "min_position_cosine": min_position_cosine(r, t),
        "nonfinite": float(nonfinite_count(r) + nonfinite_count(t)),
    }
    if logits:
        out["top1_agreement"] = top1_agreement(r, t)
        out[f"top{k}_agreement"] = topk_agreement(r, t, k)
        out["kl_divergence"] = kl_divergence(r, t)
    return out


def prefixed(prefix: str, measurements: Mapping[str, float]) -> dict[str, float]:
    """``{"cosine": x}`` -> ``{"<prefix>.cosine": x}``, the naming gates use for grouped measurements."""
    return {f"{prefix}.{name}": value for name, value in measurements.items()}
