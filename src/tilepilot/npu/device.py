"""The XDNA2 ("npu2") array as tilepilot models it: a grid of tiles and the numbers that bound a design.

Every figure here is a hardware fact copied from ``/work/shared/reference/xdna2.md`` (which names the
primary source) or an assumption that says so. Nothing here is fitted: fitted constants (usable DDR
bandwidth, kernel efficiency, launch overhead) belong to ``npu/calibration.py``. The validator reads
the per-tile resource budgets, the timing model reads clock, stream width and MAC rates.

Geometry follows mlir-aie's NPU2TargetModel: row 0 holds shim tiles (the DDR interface), row 1 memory
tiles, rows 2.. compute tiles; columns are numbered from 0. A partition of ``k`` columns is a device
of its own (mlir-aie names them ``npu2_1col`` .. ``npu2_7col``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tilepilot.errors import ConfigError

# --- hardware figures, each with its source (reference/xdna2.md names the primary documents) -------------------------
NPU2_COLUMNS = 8  # mlir-aie AIETargetModel.h NPU2TargetModel: 8 columns
NPU2_ROWS = 6  # same: row 0 shim, row 1 mem, rows 2-5 compute
COMPUTE_MEMORY_BYTES = 64 * 1024  # mlir-aie getLocalMemorySize() = 0x10000; AMD AM027 (8 banks)
COMPUTE_PROGRAM_BYTES = 16 * 1024  # AMD AM027
COMPUTE_LOCKS = 16  # mlir-aie target model
COMPUTE_BDS = 16  # mlir-aie target model
COMPUTE_S2MM = 2  # mlir-aie AIETargetModel.cpp: 2 stream-to-memory (in) channels
COMPUTE_MM2S = 2  # same: 2 memory-to-stream (out) channels
MEM_TILE_BYTES = 512 * 1024  # mlir-aie getMemTileSize() = 0x80000; AM027, UG1603
MEM_TILE_S2MM = 6  # AM027 / UG1603
MEM_TILE_MM2S = 6  # AM027 / UG1603
MEM_TILE_LOCKS = 64  # AM027 / UG1603
MEM_TILE_BDS = 48  # AM027 / UG1603
SHIM_S2MM = 2  # ASSUMPTION: AIE-ML (AM020) value, the AIE-ML v2 figure was not found
SHIM_MM2S = 2  # ASSUMPTION: same
SHIM_LOCKS = 16  # mlir-aie target model (shim NOC tiles have 16 locks)
SHIM_BDS = 16  # mlir-aie target model (shim NOC tiles have 16 BDs)
STREAM_BYTES_PER_CYCLE = 8  # UG1603: 64-bit stream switch ports on AIE-ML v2
CLOCK_HZ = 1.8e9  # amd/xdna-driver npu4_regs.c top DPM level hclk 1800 MHz
BF16_MACS_PER_CYCLE = 256  # 4x8x8 native bf16 MMUL, mlir-aie python/iron/kernels/linalg.py _MM_MAC_DIMS["aie2p"]
BFP16_MACS_PER_CYCLE = 512  # 8x8x8 block-FP16 (bf16 emulated through bfp16), same source
INT8_MACS_PER_CYCLE = 512  # AM027; Linux aie2_smu.c 4096 ops/cycle/column
# ASSUMPTION: LPDDR5X-7500 on a 128-bit bus = 7500e6 * 16 B = 120 GB/s theoretical (bus width assumed). This is
# the physical ceiling only; the bandwidth the NPU actually gets is a calibration constant (npu/calibration.py).
DDR_BYTES_PER_S_THEORETICAL = 120e9
# Memory tile DMA channels 0-3 can reach the east/west neighbour memory tiles (AM027); kept for reference.
MEM_TILE_NEIGHBOUR_CHANNELS = 4

SHIM_ROW = 0
MEM_ROW = 1
FIRST_COMPUTE_ROW = 2


@dataclass(frozen=True, order=True)
class Tile:
    """A tile coordinate (col, row); what sits there depends on the device's row layout."""

    col: int
    row: int

    def __str__(self) -> str:
        return f"({self.col},{self.row})"


@dataclass(frozen=True)
class TileResources:
    """The per-tile budgets the validator checks against: memory, DMA channels per direction, locks, BDs."""

    memory_bytes: int
    s2mm_channels: int  # stream -> memory: data arriving at the tile
    mm2s_channels: int  # memory -> stream: data leaving the tile
    locks: int
    bds: int


@dataclass(frozen=True)
class Device:
    """One NPU (or a column partition of it): geometry plus every hardware number a design is bounded by."""

    name: str
    columns: int
    rows: int = NPU2_ROWS
    compute: TileResources = TileResources(COMPUTE_MEMORY_BYTES, COMPUTE_S2MM, COMPUTE_MM2S, COMPUTE_LOCKS, COMPUTE_BDS)
    mem: TileResources = TileResources(MEM_TILE_BYTES, MEM_TILE_S2MM, MEM_TILE_MM2S, MEM_TILE_LOCKS, MEM_TILE_BDS)
    shim: TileResources = TileResources(0, SHIM_S2MM, SHIM_MM2S, SHIM_LOCKS, SHIM_BDS)
    compute_program_bytes: int = COMPUTE_PROGRAM_BYTES
    stream_bytes_per_cycle: int = STREAM_BYTES_PER_CYCLE
    clock_hz: float = CLOCK_HZ
    bf16_macs_per_cycle: int = BF16_MACS_PER_CYCLE
    bfp16_macs_per_cycle: int = BFP16_MACS_PER_CYCLE
    int8_macs_per_cycle: int = INT8_MACS_PER_CYCLE
    ddr_bytes_per_s_theoretical: float = DDR_BYTES_PER_S_THEORETICAL

    # --- geometry -------------------------------------------------------------------------------------------------
    @property
    def compute_rows(self) -> int:
        return self.rows - FIRST_COMPUTE_ROW

    @property
    def n_compute_tiles(self) -> int:
        return self.columns * self.compute_rows

    def on_device(self, tile: Tile) -> bool:
        return 0 <= tile.col < self.columns and 0 <= tile.row < self.rows

    def is_shim(self, tile: Tile) -> bool:
        return self.on_device(tile) and tile.row == SHIM_ROW

    def is_mem(self, tile: Tile) -> bool:
        return self.on_device(tile) and tile.row == MEM_ROW

    def is_compute(self, tile: Tile) -> bool:
        return self.on_device(tile) and tile.row >= FIRST_COMPUTE_ROW

    def kind(self, tile: Tile) -> str:
        """'shim', 'mem', 'compute' or 'off' (outside the device)."""
        if not self.on_device(tile):
            return "off"
        return "shim" if tile.row == SHIM_ROW else "mem" if tile.row == MEM_ROW else "compute"

    def resources(self, tile: Tile) -> TileResources:
        kind = self.kind(tile)
        if kind == "off":
            raise ConfigError(f"Tile {tile} is outside device {self.name}; use a tile within {self.columns} columns.")
        return {"shim": self.shim, "mem": self.mem, "compute": self.compute}[kind]

    def compute_tiles(self) -> list[Tile]:
        """Compute tiles column-major (col 0 rows 2..5, then col 1, ...), the order IRON's placer fills."""
        return [Tile(c, r) for c in range(self.columns) for r in range(FIRST_COMPUTE_ROW, self.rows)]

    def mem_tiles(self) -> list[Tile]:
        return [Tile(c, MEM_ROW) for c in range(self.columns)]

    def shim_tiles(self) -> list[Tile]:
        return [Tile(c, SHIM_ROW) for c in range(self.columns)]

    # --- rates ----------------------------------------------------------------------------------------------------
    def macs_per_cycle(self, operand_dtype: str = "bf16") -> int:
        """Peak MACs per cycle per compute tile for an operand format ('bf16', 'bfp16', 'int8')."""
        table = {"bf16": self.bf16_macs_per_cycle, "bfp16": self.bfp16_macs_per_cycle, "int8": self.int8_macs_per_cycle}
        if operand_dtype not in table:
            raise ConfigError(f"Unknown operand format {operand_dtype!r}; use one of {sorted(table)}.")
        return table[operand_dtype]

    def peak_flops(self, operand_dtype: str = "bf16") -> float:
        """Whole-device peak (2 flops per MAC), e.g. ~29.5 TFLOP/s bf16 on 32 tiles at 1.8 GHz."""
        return 2.0 * self.macs_per_cycle(operand_dtype) * self.n_compute_tiles * self.clock_hz

    @property
    def stream_bytes_per_s(self) -> float:
        """One DMA channel / stream port: 8 B/cycle at the clock."""
        return self.stream_bytes_per_cycle * self.clock_hz

    def partition(self, columns: int) -> Device:
        return partition(columns, self)


def npu2() -> Device:
    """The full XDNA2 array of Ryzen AI 300 (Strix / Krackan): 8 columns x 6 rows, 32 compute tiles."""
    return Device(name="npu2", columns=NPU2_COLUMNS)


def partition(columns: int, base: Device | None = None) -> Device:
    """A column partition of ``base`` (npu2 by default): the first ``columns`` columns, named like mlir-aie's."""
    base = base or npu2()
    if not isinstance(columns, int) or not 1 <= columns <= base.columns:
        raise ConfigError(
            f"A partition needs 1..{base.columns} columns, got {columns!r}; pick a column count in range."
        )
    if columns == base.columns:
        return base
    root = base.name.split("_")[0]
    return replace(base, name=f"{root}_{columns}col", columns=columns)
