"""Stop sequences over streamed text.

A stop string can arrive split across tokens ("\\n\\n" as two "\\n" tokens), so text is released only
once it can no longer be the start of a stop string: the longest suffix that is a prefix of some stop
is held back until the next piece decides it. The stop string itself is never emitted (OpenAI
semantics), and the streamed pieces concatenate to exactly the non-streamed text.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed text pieces with ``push``; it returns what is safe to emit and whether a stop was hit."""

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.hit = False

    def push(self, piece: str) -> tuple[str, bool]:
        """Add ``piece``; return ``(text safe to emit, stopped)``. After a stop, everything is dropped."""
        if self.hit:
            return "", True
        buf = self._held + piece
        if not self.stops:
            self._held = ""
            return buf, False
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            self._held = ""
            return buf[: min(found)], True
        hold = self._partial_len(buf)
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        """At the end of generation the held-back text was not a stop after all: release it."""
        out, self._held = ("" if self.hit else self._held), ""
        return out

    def _partial_len(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:k]):
                    best = k
                    break
        return best
