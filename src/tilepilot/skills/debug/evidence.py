"""What a failed model gate adds to its evidence for the classifier, measured only once the gate has failed.

The model gate's per-layer cosine is taken over the whole [tokens, hidden] output, so on a trained model it is
dominated by the few massive activations (SmolLM2-135M: channel 507 at the first token, |x| ~ 650 against ~40
elsewhere): a fault that spoils every other token leaves it near 1. Two views the classifier needs are not
dominated by them:

- ``layer_position_cosine``: per layer, the lowest per-token cosine of the runner's output against the oracle's
  (phase 2's ``min_position_cosine``, layer by layer), which shows error growing with depth on every model;
- ``massive_row_cosine``: each prefill call of the plan run alone on the oracle's captured inputs
  (``activations.py``), the lowest per-row cosine on the rows whose input carries a massive activation and on the
  others, for every call that meets such rows: a kernel that mishandles one massive channel is wrong there only.
"""

from __future__ import annotations

from typing import Any

from tilepilot.gates import metrics as M
from tilepilot.harness.model_gate import gate_prompts
from tilepilot.skills.debug.activations import capture_gate_prompt, probe_activations


def layer_position_cosine(ctx, plan) -> list[float]:
    """Per layer, the minimum over the gate prompt's tokens of the runner's output cosine against the oracle's."""
    a, b = gate_prompts(ctx)
    ref = ctx.reference(a, b)
    layers = ctx.make_runner(plan).prefill(list(a), capture_layers=True).layer_outputs or []
    return [float(M.per_position_cosine(r, t).min()) for r, t in zip(ref.layers, layers, strict=False)]


def massive_row_cosine(ctx, plan) -> list[dict[str, Any]]:
    """For every prefill call whose inputs carry massive rows on some layer: its lowest per-row cosine on those rows
    and on the others, each call alone on the oracle's captured inputs."""
    out = []
    for ap in probe_activations(ctx, capture_gate_prompt(ctx), plan, stages=("prefill",)):
        if not ap.massive or len(ap.row_cosine) <= len(ap.massive) or ap.error:
            continue
        massive = [c for i, c in enumerate(ap.row_cosine) if i in ap.massive]
        others = [c for i, c in enumerate(ap.row_cosine) if i not in ap.massive]
        out.append({"call": ap.label(), "rows": ap.massive, "massive_min": min(massive), "others_min": min(others)})
    return out


def failure_evidence(ctx, plan) -> dict[str, Any]:
    """The evidence above, for a model gate that failed with no validator error."""
    return {
        "layer_position_cosine": layer_position_cosine(ctx, plan),
        "massive_row_cosine": massive_row_cosine(ctx, plan),
    }
