"""A plan made illegal the way a careless edit would: an up-projection tiling whose buffers overflow L1."""

from __future__ import annotations

from tilepilot.plan.plan import DeploymentPlan

# A tile of 64 x 512 bf16 A and W, double-buffered: 4 x 64 KiB of fifo buffers on one 64 KiB compute tile.
ILLEGAL_UP_PROJ = {"tile_m": 64, "tile_n": 64, "tile_k": 512, "pad": True}


def with_illegal_up_proj(plan: DeploymentPlan) -> DeploymentPlan:
    d = plan.to_dict()

    def walk(x):
        if isinstance(x, dict):
            if x.get("op") == "up_proj" and x.get("family") == "gemm":
                x["config"] = dict(ILLEGAL_UP_PROJ)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(d)
    return DeploymentPlan.from_dict(d)
