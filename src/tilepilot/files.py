"""Writing a file so that a reader never sees half of it: the one atomic-write helper of the package.

A temporary file beside the target, then ``os.replace``: a crash or a refusal leaves the old file (or none),
never a truncated one. The file gets the permissions a plain ``open`` would give under the user's umask, so a
teammate can read a shared workspace (``tempfile.mkstemp`` alone makes every file 0600).
"""

from __future__ import annotations

import json
import os
import secrets
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
