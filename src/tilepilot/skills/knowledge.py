"""What deployments share through the knowledge directory: the kernel registry and the lessons learned.

A workspace records its own repairs in ``lessons.json``; finalize-and-learn publishes them (and the tuned
registry rows) to the knowledge directory, and a new workspace starts its LESSONS.md from what is there.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from tilepilot.kernels.registry import Registry
from tilepilot.model.spec import ModelSpec
from tilepilot.skills.journal import Journal, atomic_write_json

KNOWLEDGE_REGISTRY = "registry.json"
KNOWLEDGE_LESSONS = "lessons.json"
KNOWLEDGE_LESSONS_MD = "LESSONS.md"
WORKSPACE_LESSONS = "lessons.json"  # the workspace's own repairs, published by finalize-and-learn


class Knowledge:
    """The shared registry and lessons (``knowledge_dir``; None: nothing shared) and this workspace's lessons."""

    def __init__(self, knowledge_dir: Path | None, journal: Journal):
        self.dir = None if knowledge_dir is None else Path(knowledge_dir)
        self.journal = journal

    def path(self, name: str) -> Path | None:
        return None if self.dir is None else self.dir / name

    @cached_property
    def kernel_registry(self) -> Registry:
        """The shared kernel registry loaded once; tuning adds rows, finalize-and-learn saves."""
        p = self.path(KNOWLEDGE_REGISTRY)
        if p is None:
            return Registry()
        try:
            return Registry.load(p)
        except Exception as e:  # a damaged shared registry must not stop a deployment: start empty, say so
            self.journal.progress(f"shared registry {p} unreadable ({e}); starting with an empty one")
            return Registry()

    def load_lessons(self) -> list[dict[str, Any]]:
        p = self.path(KNOWLEDGE_LESSONS)
        if p is None or not p.exists():
            return []
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return []
        return list(data.get("lessons", [])) if isinstance(data, dict) else []

    def inherit_lessons(self, spec: ModelSpec) -> None:
        """Start a new workspace's LESSONS.md with what earlier deployments learned (same family first)."""
        lessons = self.load_lessons()
        if not lessons:
            return
        mine = [x for x in lessons if x.get("family") == spec.family] or lessons
        repairs = [x for x in mine if x.get("signature")]
        opts = [x for x in mine if x.get("kind") == "optimization"]
        lines = [
            f"- `{x['signature']}` in {x.get('model')}: repaired by `{x['skill']}` ({x['remedy']})" for x in repairs
        ]
        lines += [
            f"- {x.get('model', 'an earlier model')}: `{x.get('skill')}` ({x.get('stage')}) {x.get('change')}: "
            f"{x.get('decision')}"
            for x in opts[-30:]
        ]
        if lines:
            self.journal.lesson("From earlier deployments (knowledge directory)", "\n".join(lines))

    def known_repair(self, signature: str) -> str | None:
        """How an earlier deployment repaired this signature, if one did (for the debug log)."""
        for x in reversed(self.load_lessons()):
            if x.get("signature") == signature:
                return f"seen before in {x.get('model')}: `{x.get('skill')}` {x.get('remedy')}"
        return None

    def record_lesson(self, signature: str, skill: str, remedy: str, phase: str, spec: ModelSpec) -> None:
        """Remember a repaired failure in this workspace; finalize-and-learn publishes it to the knowledge dir."""
        p = self.journal.root / WORKSPACE_LESSONS
        data = json.loads(p.read_text(encoding="utf-8")) if p.exists() else {"lessons": []}
        data["lessons"].append(
            {
                "signature": signature,
                "skill": skill,
                "remedy": remedy,
                "phase": phase,
                "model": spec.name or spec.architecture,
                "family": spec.family,
            }
        )
        atomic_write_json(p, data)
