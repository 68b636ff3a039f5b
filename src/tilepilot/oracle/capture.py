"""Names of the intermediates the oracle can capture, and the selection of which ones to keep.

Gates compare the NPU run with the oracle tensor by tensor, so both sides must agree on one fixed
vocabulary of names. It lives here, once; the runner and the debug skills import it rather than
spelling names themselves.
"""

from __future__ import annotations

from collections.abc import Iterable

from tilepilot.errors import InputError

# Per-layer capture points, in the order the layer computes them. Shapes are [T, width] for the T
# tokens of the current call: q/k/v and their rotated forms are heads*head_dim wide, attn is q_dim,
# gate/up/act are intermediate, everything else is hidden.
LAYER_POINTS: tuple[str, ...] = (
    "attn_norm",  # RMSNorm(x) feeding the attention
    "q",  # q projection after bias and per-head Q norm, before RoPE
    "k",  # same for k
    "v",  # v projection after bias
    "q_rope",  # q after rotary embedding
    "k_rope",  # k after rotary embedding (what the KV cache holds)
    "attn",  # attention output before o_proj, [T, q_dim]
    "o_proj",  # o projection (+ bias)
    "resid1",  # x + o_proj
    "ffn_norm",  # RMSNorm(resid1) feeding the FFN
    "gate",  # gate projection
    "up",  # up projection
    "act",  # silu(gate) * up
    "down",  # down projection
    "out",  # layer output: resid1 + down
)

# Whole-model capture points after the last layer.
MODEL_POINTS: tuple[str, ...] = ("final_norm", "logits")

# Everything a capture name can end with, for validation and documentation.
CAPTURE_POINTS: tuple[str, ...] = LAYER_POINTS + MODEL_POINTS


def capture_name(layer: int, point: str) -> str:
    """The capture name of ``point`` in decoder layer ``layer`` (e.g. ``layer3.q_rope``)."""
    if point not in LAYER_POINTS:
        raise InputError(f"unknown per-layer capture point {point!r}; use one of {', '.join(LAYER_POINTS)}")
    return f"layer{layer}.{point}"


def all_capture_names(n_layers: int, points: Iterable[str] | None = None) -> list[str]:
    """Every capture name of an ``n_layers`` model (optionally only the given per-layer points)."""
    chosen = LAYER_POINTS if points is None else tuple(points)
    names = [capture_name(i, p) for i in range(n_layers) for p in chosen]
    if points is None:
        names += list(MODEL_POINTS)
    return names


def _is_valid(name: str, n_layers: int) -> bool:
    if name in MODEL_POINTS:
        return True
    head, _, point = name.partition(".")
    if not head.startswith("layer") or point not in LAYER_POINTS:
        return False
    idx = head[len("layer") :]
    return idx.isdigit() and int(idx) < n_layers and str(int(idx)) == idx


class CaptureSet:
    """Which names one oracle call keeps: all of them, none, or a named subset (validated up front).

    Validating before the forward pass means a misspelt name fails in a millisecond instead of
    silently producing an empty capture after a long run.
    """

    def __init__(self, capture: bool | Iterable[str], n_layers: int):
        if isinstance(capture, bool):
            self._all = capture
            self._names: frozenset[str] = frozenset()
        elif isinstance(capture, str):
            raise InputError(f"capture must be True/False or a list of names, got the string {capture!r}")
        else:
            names = frozenset(capture)
            bad = sorted(n for n in names if not _is_valid(n, n_layers))
            if bad:
                raise InputError(
                    f"unknown capture name(s) {', '.join(bad)} for a {n_layers}-layer model; "
                    f"use layer<i>.<point> with point in {', '.join(LAYER_POINTS)}, or final_norm/logits"
                )
            self._all = False
            self._names = names

    def wants(self, name: str) -> bool:
        return self._all or name in self._names

    def wants_layer(self, layer: int) -> bool:
        """Whether any point of ``layer`` is requested (lets the layer skip building names)."""
        if self._all:
            return True
        prefix = f"layer{layer}."
        return any(n.startswith(prefix) for n in self._names)

    @property
    def empty(self) -> bool:
        return not self._all and not self._names
