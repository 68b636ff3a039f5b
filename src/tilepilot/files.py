"""Writing a file or a directory so that a reader never sees half of it: the atomic-write helpers of the package.

A temporary file (or directory) beside the target, then ``os.replace``: a crash or a refusal leaves the old file
(or none), never a truncated one. The result gets the permissions a plain ``open``/``mkdir`` would give under the
user's umask, so a teammate can read a shared workspace or model directory (``tempfile.mkstemp``/``mkdtemp`` alone
make 0600 files and 0700 directories, and safetensors' writer makes 0600 files).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, creating its directory; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 & ~_umask())
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | Path, data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON (with a final newline) to ``path`` atomically."""
    return write_text_atomic(path, json.dumps(data, indent=indent) + "\n")


def umask_permissions(root: str | Path) -> None:
    """Give ``root`` and everything under it the modes a plain ``mkdir``/``open`` would have given under the user's
    umask (symlinks untouched)."""
    mask = _umask()
    for path in (Path(root), *Path(root).rglob("*")):
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


@contextmanager
def assembled_dir(out: str | Path, prefix: str = "tmp") -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``out``; when the block ends normally it gets umask modes and is
    renamed to ``out`` (which must be absent or an empty directory), otherwise it is removed. A crash, a refused
    input or Ctrl-C never leaves a directory at ``out`` that looks complete but is not."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{prefix}-", dir=out.parent))
    try:
        yield tmp
        umask_permissions(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
