"""The streaming safetensors writer and the header reader, against the safetensors library itself."""

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from tilepilot.errors import CheckpointError
from tilepilot.model.safetensors_io import PlannedTensor, StreamingWriter, encode_header, read_header

TENSORS = {
    "a": torch.arange(15, dtype=torch.float32).reshape(3, 5).to(torch.bfloat16),
    "b": torch.linspace(-1, 1, 7),
    "c": torch.arange(12, dtype=torch.float16).reshape(2, 2, 3),
}
PLAN = [PlannedTensor(n, t.dtype, tuple(t.shape)) for n, t in TENSORS.items()]


def _write(path):
    with StreamingWriter(path, PLAN) as w:
        for p in PLAN:
            w.write(p.name, TENSORS[p.name])
    return path


def test_streamed_file_is_read_back_exactly_by_safetensors(tmp_path):
    path = _write(tmp_path / "m.safetensors")
    back = load_file(str(path))
    assert set(back) == set(TENSORS)
    for name, t in TENSORS.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t)
    h = read_header(path)
    assert h.metadata == {"format": "pt"}
    assert (h.tensors["a"].dtype, h.tensors["a"].shape, h.tensors["a"].nbytes) == ("BF16", (3, 5), 30)
    assert h.data_start % 8 == 0 and h.data_start + h.data_bytes == path.stat().st_size


def test_reader_agrees_with_files_written_by_safetensors(tmp_path):
    save_file(TENSORS, str(tmp_path / "ref.safetensors"))
    h = read_header(tmp_path / "ref.safetensors")
    assert {n: (i.dtype, i.shape) for n, i in h.tensors.items()} == {
        "a": ("BF16", (3, 5)),
        "b": ("F32", (7,)),
        "c": ("F16", (2, 2, 3)),
    }


def test_writer_refuses_unplanned_or_misshapen_tensors_and_incomplete_files(tmp_path):
    w = StreamingWriter(tmp_path / "x.safetensors", PLAN)
    with pytest.raises(ValueError, match="expected a"):
        w.write("b", TENSORS["b"])
    with pytest.raises(ValueError, match="expected a"):
        w.write("a", TENSORS["a"].float())
    w.write("a", TENSORS["a"])
    with pytest.raises(ValueError, match="2 planned tensors not written"):
        w.close()


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d[:5], "truncated"),  # shorter than the length prefix
        (lambda d: d[:-3], "truncated"),  # last tensor cut
        (lambda d: d + b"\0" * 8, "follow the last tensor"),
        (lambda d: struct.pack("<Q", 10**12) + d[8:], "corrupt"),  # absurd header length
        (lambda d: struct.pack("<Q", len(d)) + d[8:], "truncated"),  # header longer than the file
        (lambda d: d[:8] + b"[" + d[9:], "not valid JSON"),
    ],
)
def test_damaged_files_are_named_truncated_or_corrupt(tmp_path, mutate, needle):
    path = _write(tmp_path / "m.safetensors")
    path.write_bytes(mutate(path.read_bytes()))
    with pytest.raises(CheckpointError, match=needle):
        read_header(path)


def test_inconsistent_offsets_are_corrupt(tmp_path):
    # a header whose byte ranges overlap, and one whose byte count disagrees with shape x dtype
    for offsets, needle in (([[0, 30], [20, 48]], "overlap"), ([[0, 30], [30, 50]], "spans 20 bytes")):
        header = {
            "a": {"dtype": "BF16", "shape": [3, 5], "data_offsets": offsets[0]},
            "b": {"dtype": "F32", "shape": [7], "data_offsets": offsets[1]},
        }
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        end = max(o[1] for o in offsets)
        path = tmp_path / "bad.safetensors"
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * end)
        with pytest.raises(CheckpointError, match=needle):
            read_header(path)


def test_header_is_padded_to_eight_bytes():
    raw = encode_header(PLAN)
    (n,) = struct.unpack("<Q", raw[:8])
    assert n == len(raw) - 8 and n % 8 == 0
