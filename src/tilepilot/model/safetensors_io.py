"""The safetensors container at byte level: read a header without the data, stream tensors out one by one.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (tensor name -> dtype,
shape, [begin, end) offsets into the data section; padded with spaces to a multiple of 8), then the
data section. Reading only the header lets ``inspect`` check a multi-GB checkpoint in milliseconds;
writing the header first and then each tensor as it is generated lets the zoo write a full-size model
without ever holding it in memory. Both are small enough that we own them rather than go through
``safetensors.torch.save_file`` (which needs every tensor in memory at once).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from tilepilot.errors import CheckpointError

# safetensors dtype code -> (torch dtype, bytes per element). Only these three are model dtypes we load;
# the rest are known so that a header naming them is "unsupported", not "corrupt".
LOADABLE_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "BF16": (torch.bfloat16, 2),
    "F16": (torch.float16, 2),
    "F32": (torch.float32, 4),
}
KNOWN_DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
TORCH_TO_CODE: dict[torch.dtype, str] = {t: code for code, (t, _) in LOADABLE_DTYPES.items()}

# A header larger than this is not a model header but garbage (safetensors itself caps it at 100 MB).
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in a safetensors header; offsets are relative to the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class SafetensorsHeader:
    """Everything a safetensors file says about itself without reading its data."""

    path: Path
    header_bytes: int
    file_size: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]

    @property
    def data_start(self) -> int:
        return 8 + self.header_bytes

    @property
    def data_bytes(self) -> int:
        return max((t.end for t in self.tensors.values()), default=0)


def read_header(path: str | Path) -> SafetensorsHeader:
    """Parse the header of one safetensors file; raise CheckpointError saying 'truncated' or 'corrupt'.

    Checks that a loader would otherwise only discover mid-load: offsets inside the file, contiguous
    non-overlapping data, byte counts equal to shape x dtype size.
    """
    path = Path(path)
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(
                    f"{path.name} is truncated ({file_size} bytes, shorter than a safetensors header)"
                )
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise CheckpointError(f"{path.name} is corrupt: its header claims {n} bytes; re-download or rewrite it")
            if 8 + n > file_size:
                raise CheckpointError(
                    f"{path.name} is truncated: its header needs {8 + n} bytes but the file has {file_size}"
                )
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(
            f"{path.name} is corrupt: its header is not valid JSON; re-download or rewrite it"
        ) from None
    if not isinstance(parsed, dict):
        raise CheckpointError(f"{path.name} is corrupt: its header is not a JSON object")
    metadata = parsed.pop("__metadata__", None) or {}
    tensors = {name: _tensor_info(path, name, entry) for name, entry in parsed.items()}
    header = SafetensorsHeader(path, n, file_size, tensors, dict(metadata) if isinstance(metadata, dict) else {})
    _check_layout(header)
    return header


def _tensor_info(path: Path, name: str, entry: Any) -> TensorInfo:
    try:
        dtype = entry["dtype"]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
    except (TypeError, KeyError, ValueError):
        raise CheckpointError(
            f"{path.name} is corrupt: the header entry of {name} lacks dtype, shape or data_offsets"
        ) from None
    if not isinstance(dtype, str) or any(d < 0 for d in shape) or begin < 0 or end < begin:
        raise CheckpointError(f"{path.name} is corrupt: the header entry of {name} is malformed")
    return TensorInfo(name, dtype, shape, begin, end)


def _check_layout(h: SafetensorsHeader) -> None:
    for t in h.tensors.values():
        size = KNOWN_DTYPE_SIZES.get(t.dtype)
        if size is not None and t.numel * size != t.nbytes:
            raise CheckpointError(
                f"{h.path.name} is corrupt: {t.name} declares shape {list(t.shape)} of {t.dtype} "
                f"({t.numel * size} bytes) but spans {t.nbytes} bytes"
            )
    end_of_data = h.data_start + h.data_bytes
    if end_of_data > h.file_size:
        raise CheckpointError(
            f"{h.path.name} is truncated: its tensors need {end_of_data} bytes but the file has {h.file_size}; "
            "re-download or rewrite it"
        )
    if end_of_data < h.file_size:
        raise CheckpointError(
            f"{h.path.name} is corrupt: {h.file_size - end_of_data} bytes follow the last tensor; "
            "re-download or rewrite it"
        )
    pos = 0
    for t in sorted(h.tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin != pos:
            what = "overlap" if t.begin < pos else "leave a gap"
            raise CheckpointError(f"{h.path.name} is corrupt: tensor data {what} at {t.name}")
        pos = t.end


# ---- writing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor the writer will receive later: enough to lay out the header before any data exists."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = LOADABLE_DTYPES[TORCH_TO_CODE[self.dtype]][1]
        for d in self.shape:
            n *= d
        return n


def encode_header(tensors: Sequence[PlannedTensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The 8-byte length + JSON header (space-padded to 8 bytes) for tensors stored in the given order."""
    entries: dict[str, Any] = {}
    if metadata:
        entries["__metadata__"] = dict(metadata)
    pos = 0
    for t in tensors:
        if t.dtype not in TORCH_TO_CODE:
            raise ValueError(f"cannot write {t.name} as {t.dtype}; tilepilot writes bf16, fp16 or fp32")
        entries[t.name] = {
            "dtype": TORCH_TO_CODE[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [pos, pos + t.nbytes],
        }
        pos += t.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


class StreamingWriter:
    """Write one safetensors file tensor by tensor, in the planned order, so only one tensor is ever in memory.

    The header is written first from the plan; each ``write`` must then deliver the next planned tensor
    with exactly the planned dtype and shape, and ``close`` refuses to finish a file with tensors missing.
    """

    def __init__(self, path: str | Path, plan: Sequence[PlannedTensor], metadata: Mapping[str, str] | None = None):
        self.path = Path(path)
        self._plan = list(plan)
        self._next = 0
        self._f: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - closed in close()/__exit__
        self._f.write(encode_header(self._plan, metadata if metadata is not None else {"format": "pt"}))

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if self._next >= len(self._plan):
            raise ValueError(f"{name} was not planned for {self.path.name}")
        want = self._plan[self._next]
        if name != want.name or tensor.dtype != want.dtype or tuple(tensor.shape) != want.shape:
            raise ValueError(
                f"{self.path.name}: expected {want.name} {want.dtype} {list(want.shape)}, "
                f"got {name} {tensor.dtype} {list(tensor.shape)}"
            )
        # Viewing as bytes writes the tensor's memory directly; no second copy of the data is made.
        self._f.write(tensor.contiguous().view(torch.uint8).reshape(-1).numpy().data)
        self._next += 1

    def close(self) -> None:
        if self._f.closed:
            return
        missing = len(self._plan) - self._next
        # No fsync: the zoo's atomicity is against interruption (write to a temp dir, then rename), and
        # forcing gigabytes to disk would multiply write times on slow disks.
        self._f.close()
        if missing:
            raise ValueError(f"{self.path.name} closed with {missing} planned tensors not written")

    def __enter__(self) -> StreamingWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._f.close()
