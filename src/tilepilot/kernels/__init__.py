"""Kernel families: each module turns (shape, config) into a validated-able NPU design.

The family contract. A module ``kernels/<family>.py`` provides:

- ``FAMILY: str`` -- its name as plans and the registry spell it (e.g. "gemm").
- ``Shape`` -- frozen dataclass: the problem size, in the op's own terms (GEMM: m, n, k).
- ``Config`` -- frozen dataclass: everything a tuner may change (tiles used, tile sizes, fifo depth,
  kernel variant "vector" | "scalar" | "bfp16", accumulator, padding). Plain values only, so
  ``dataclasses.asdict`` is its JSON form.
- ``default_config(shape, device=None) -> Config`` -- a legal, reasonable starting point.
- ``candidate_configs(shape, device=None) -> list[Config]`` -- what the tuner searches, best guesses
  first. Candidates are pre-filtered by cheap arithmetic (divisibility, tile memory); the tuner still
  validates and times each one.
- ``make_design(shape, config, device=None) -> Design`` -- the dataflow as an IRON-style design with
  declared ``Numerics``; ``design.fast(inputs, *, exact=False)`` is the tensor-level path
  (exact=True: bit-identical to the tile path; exact=False: the production path, whose deviation from
  the exact one the family documents and tests). ``design.meta`` holds family, shape, config, macs,
  ddr_read_bytes, ddr_write_bytes (and logical/padded shapes when padded). Shapes that do not tile
  raise ``DesignError`` with code SHAPE_NOT_TILING unless the config asks for padding.
- ``reference(inputs, shape=None) -> outputs`` -- the FP32 op the kernel must match (the gates'
  target), on the same tensor names as the design, computed from the bf16 inputs in fp32 without
  intermediate rounding (``shape`` for families whose op depends on it, e.g. eltwise add vs mul).

Tensor names are the design's DDR arguments; a padded design declares padded shapes and the family
offers ``prepare_inputs`` / ``crop_outputs`` helpers so callers never pad by hand.
"""
