"""A checkpoint directory's quantized blocks as its GGUF stored them (``gguf_blocks.safetensors``).

The GGUF importer writes the bf16 values of every tensor (exactly the dequantized blocks) as the checkpoint and,
beside them, the Q4_0 / Q4_1 / Q8_0 blocks themselves, byte for byte, so a quantized deployment of the file's own
format streams the file's bytes and never re-quantizes (no dequantize-requantize round trip). Keys carry a prefix
so no tool that maps tensor names over every ``*.safetensors`` of a directory mistakes a packed tensor for a weight;
the format, shape and block size of each tensor are in the file's metadata. Tensors are read on demand.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tilepilot.errors import CheckpointError
from tilepilot.model.quant import QuantTensor

BLOCKS_FILE = "gguf_blocks.safetensors"
KEY_PREFIX = "packed."
META_KEY = "tilepilot.blocks"  # JSON: HF name -> [format, n, k, block]


def write_stored_blocks(path: str | Path, tensors: Mapping[str, QuantTensor]) -> Path:
    """Write packed tensors (HF name -> QuantTensor) to ``path`` with their formats in the metadata."""
    path = Path(path)
    meta = {name: [qt.fmt, qt.n, qt.k, qt.block] for name, qt in tensors.items()}
    data = {KEY_PREFIX + name: qt.data.contiguous() for name, qt in tensors.items()}
    save_file(data, str(path), metadata={"format": "pt", META_KEY: json.dumps(meta)})
    return path


class StoredBlocks(Mapping[str, QuantTensor]):
    """The packed tensors of ``model_dir/gguf_blocks.safetensors`` by HF name (empty when there is no file)."""

    def __init__(self, model_dir: str | Path):
        self.path = Path(model_dir) / BLOCKS_FILE
        self._meta: dict[str, list] = {}
        if self.path.is_file():
            try:
                with safe_open(str(self.path), framework="pt") as f:
                    self._meta = json.loads((f.metadata() or {})[META_KEY])
            except Exception as e:  # noqa: BLE001 - a missing key, bad JSON or a damaged file alike
                raise CheckpointError(f"{self.path} is not a readable block file ({e}); re-import the GGUF") from None

    def __getitem__(self, name: str) -> QuantTensor:
        fmt, n, k, block = self._meta[name]
        with safe_open(str(self.path), framework="pt") as f:
            data = f.get_tensor(KEY_PREFIX + name)
        return QuantTensor(fmt, int(n), int(k), int(block), data.to(torch.uint8))

    def __iter__(self) -> Iterator[str]:
        return iter(self._meta)

    def __len__(self) -> int:
        return len(self._meta)

    def formats(self) -> dict[str, int]:
        """How many stored tensors each format has (e.g. {"q4_1": 210, "q8_0": 1})."""
        out: dict[str, int] = {}
        for fmt, *_ in self._meta.values():
            out[fmt] = out.get(fmt, 0) + 1
        return out
