"""AIR's Q4NX Llama-3.2-1B figures beside the ``air-q4`` plan's modeled ones: predictions, not fit targets.

Published (reference/xdna2.md, "AIR's own 4-bit deployments": Xilinx/mlir-air ``llama32_1b_q4nx`` and
``fused_decode`` READMEs, Strix, 2026-08): TTFT 0.93 s at 2048 prompt tokens; decode in one dispatch per token at
46.2 tok/s with one shim MM2S channel feeding weights per column, 52.3 tok/s with both, and 53.0 -> 58.6 tok/s when
the KV readback is sized to a window of the context instead of the padded 2048 positions.

Each figure is timed on the matching variant of ``plan.air_q4.air_q4_plan`` (one or two weight channels, padded or
windowed readback) with the frozen constants. None of them informs the fit (``Figure.checked`` False, labelled
prediction): they are the only measurements of a fused decode and of 4-bit kernels, one model with no per-kernel or
per-launch breakdown, so a fit could move any of the dispatch, design-switch, shim and DDR constants to match them
and learn nothing it could check; held out, they test what the constants fitted elsewhere predict.

Each decode figure is modeled at the context it was measured at (``fused_decode/README.md``): the channel pair with
``make profile N_TOKENS=64`` on the example's default prompt ("What is the capital of France?", chat-templated),
so at the paper's short-prompt context (``PROFILE_CONTEXT``, the same assumption as the paper's deployments); the
staircase pair (53.0 -> 58.6) "over 300 greedy tokens from an empty cache", so at their mean position
(``STAIRCASE_CONTEXT``). A padded readback moves 2048 rows whatever the context; the windowed one the window's.
"""

from __future__ import annotations

from tilepilot.calibrate.harness import E2E_MODEL, E2E_PROMPT, Figure
from tilepilot.model.zoo import get_zoo_model
from tilepilot.npu.calibration import CALIBRATION, Calibration
from tilepilot.plan.air_q4 import air_q4_plan
from tilepilot.plan.builtin import paper_like_plan
from tilepilot.plan.paper_deployments import PAPER_DECODE_CONTEXT
from tilepilot.runtime.dispatcher import KernelLibrary
from tilepilot.runtime.timing import time_plan

PROFILE_CONTEXT = PAPER_DECODE_CONTEXT  # `make profile N_TOKENS=64` on the default prompt (see the module docstring)
STAIRCASE_CONTEXT = 150  # the mean position of "300 greedy tokens from an empty cache"
# (key, label, weight channels, windowed readback, published value: seconds for TTFT, tok/s for decode; decode context)
AIR_Q4NX = (
    ("air_q4/prefill", f"AIR Q4NX TTFT @{E2E_PROMPT}", 2, True, 0.93, None),
    ("air_q4/decode_1ch", "AIR Q4NX decode per token, 1 weight channel", 1, False, 46.2, PROFILE_CONTEXT),
    ("air_q4/decode_2ch", "AIR Q4NX decode per token, 2 weight channels", 2, False, 52.3, PROFILE_CONTEXT),
    ("air_q4/decode_2ch_padded", "AIR Q4NX decode per token, 2 channels, KV padded to 2048", 2, False, 53.0,
     STAIRCASE_CONTEXT),
    ("air_q4/decode_2ch_windowed", "AIR Q4NX decode per token, 2 channels, windowed KV", 2, True, 58.6,
     STAIRCASE_CONTEXT),
)  # fmt: skip
NOTE = "prediction (not in the fit): air-q4 plan"


def air_q4_figures(cal: Calibration = CALIBRATION, cpu: str = "modeled") -> list[Figure]:
    """AIR's Q4NX figures against the air-q4 plan variants (modeled, unchecked: predictions)."""
    spec = get_zoo_model(E2E_MODEL).spec()
    base = paper_like_plan(spec)
    library = KernelLibrary(cal=cal)
    out = []
    for key, label, channels, windowed, published, context in AIR_Q4NX:
        plan = air_q4_plan(base, weight_channels=channels, windowed=windowed)
        if context is None:
            t = time_plan(plan, spec, E2E_PROMPT, cal=cal, cpu=cpu, library=library)
            modeled, pub, where = t.ttft_s, published, f"TTFT at {E2E_PROMPT}"
        else:
            t = time_plan(plan, spec, E2E_PROMPT, context, cal=cal, cpu=cpu, library=library)
            modeled, pub, where = t.decode_s_per_token, 1.0 / published, f"decode at context {context}"
        feed = f"{channels} channel(s), KV {'windowed' if windowed else 'padded'}"
        note = f"{NOTE} ({feed}; {where})"
        out.append(Figure(key, "end_to_end", f"{label} (prediction)", pub, modeled, note, checked=False))
    return out
