"""FP32 CPU reference of the decoder (prefill, decode with KV cache, named captures).

``ops`` holds the pure reference operations the NPU kernels are validated against.
"""

from tilepilot.oracle.capture import CAPTURE_POINTS, LAYER_POINTS, MODEL_POINTS, all_capture_names, capture_name
from tilepilot.oracle.model import GreedyResult, Oracle, OracleStep

__all__ = [
    "CAPTURE_POINTS",
    "LAYER_POINTS",
    "MODEL_POINTS",
    "GreedyResult",
    "Oracle",
    "OracleStep",
    "all_capture_names",
    "capture_name",
]
