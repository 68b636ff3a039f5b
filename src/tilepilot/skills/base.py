"""The skill contract: what every phase, optimization and debug skill declares and returns.

A skill is a unit of deployment work that a person, the orchestrator, or a coding agent reading its
``SKILL.md`` can run on its own. The naming rules are the Agent Skills specification's, enforced when a
skill class is defined, so a skill that could not be exported as an Agent Skills folder cannot exist.
Results always carry evidence (numbers, files written) because a claim without numbers cannot be
audited by the independent evaluator.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from tilepilot.skills.context import DeployContext

# Agent Skills specification (agentskills.io/specification, "Frontmatter" table): name <= 64 chars of
# lowercase letters, digits and hyphens, not starting/ending with a hyphen (and, per the reference
# validator, no "--"); description non-empty, <= 1024 chars, says what the skill does and when to use it.
NAME_MAX_CHARS = 64
DESCRIPTION_MAX_CHARS = 1024
NAME_PATTERN = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
# A description must say when to use the skill; we require one of these cues so an agent can pick it.
WHEN_CUES = (
    "use when",
    "use it when",
    "use after",
    "use before",
    "use first",
    "use last",
    "use whenever",
    "use if",
    "run when",
    "run after",
    "run before",
)

KINDS = ("phase", "optimize", "debug")

# Result statuses. Phases pass or fail; optimizations are applied or rejected (with the reason);
# debug skills repair or fail to repair; anything may be "skipped" with a reason (e.g. not applicable).
STATUSES = ("passed", "failed", "applied", "rejected", "repaired", "unrepaired", "skipped")


def name_problems(name: str) -> list[str]:
    """Every way ``name`` breaks the Agent Skills naming rules (empty list when valid)."""
    problems = []
    if not name:
        problems.append("name is empty")
    if len(name) > NAME_MAX_CHARS:
        problems.append(f"name has {len(name)} characters, more than {NAME_MAX_CHARS}")
    if name and not NAME_PATTERN.match(name):
        problems.append(
            f"name {name!r} must be lowercase letters, digits and single hyphens, not starting or ending with a hyphen"
        )
    return problems


def description_problems(description: str) -> list[str]:
    """Every way ``description`` breaks the Agent Skills rules or our 'says when to use it' rule."""
    problems = []
    text = (description or "").strip()
    if not text:
        problems.append("description is empty")
    if len(description or "") > DESCRIPTION_MAX_CHARS:
        problems.append(f"description has {len(description)} characters, more than {DESCRIPTION_MAX_CHARS}")
    if text and not any(cue in text.lower() for cue in WHEN_CUES):
        problems.append("description does not say when to use the skill (e.g. 'Use when ...')")
    return problems


@dataclass(frozen=True)
class SkillInput:
    """One declared input: what the skill reads from the workspace before it can run."""

    name: str
    description: str
    required: bool = True


@dataclass
class SkillResult:
    """What a skill run hands back: a status, one-line summary, evidence numbers and files written."""

    skill: str
    status: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    gate: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown skill status {self.status!r}; expected one of {STATUSES}")

    @property
    def ok(self) -> bool:
        """True when the workflow may continue past this result."""
        return self.status in ("passed", "applied", "rejected", "repaired", "skipped")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Skill:
    """Base of every skill. Subclasses set the class attributes and implement ``run``.

    Class attributes double as the Agent Skills export: ``description`` is the frontmatter, ``purpose``,
    ``commands``, ``gate_text`` and ``failure_modes`` make up the SKILL.md body.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    purpose: ClassVar[str] = ""
    inputs: ClassVar[tuple[SkillInput, ...]] = ()
    commands: ClassVar[tuple[str, ...]] = ()
    gate_text: ClassVar[str] = ""
    failure_modes: ClassVar[tuple[str, ...]] = ()
    abstract: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("abstract", False):
            return
        cls.abstract = False
        problems = name_problems(cls.name) + description_problems(cls.description)
        if cls.kind not in KINDS:
            problems.append(f"kind {cls.kind!r} is not one of {KINDS}")
        if not cls.purpose.strip():
            problems.append("purpose is empty")
        if not cls.commands:
            problems.append("no tilepilot command is declared for the SKILL.md export")
        if problems:
            raise TypeError(f"skill class {cls.__name__} breaks the skill contract: " + "; ".join(problems))

    def run(self, ctx: DeployContext) -> SkillResult:  # pragma: no cover - contract
        raise NotImplementedError

    def result(self, status: str, summary: str, **kw: Any) -> SkillResult:
        """Shorthand so every result is stamped with the skill's own name."""
        return SkillResult(skill=self.name, status=status, summary=summary, **kw)


class PhaseSkill(Skill):
    """A phase of the deployment chain: it measures, judges with a gate and writes ``gates/<name>.json``."""

    abstract = True
    kind = "phase"
    phase: ClassVar[int] = -1
    # Whether a failed gate may be sent to a debug skill (the evaluator's verdict is final, never "repaired").
    repairable: ClassVar[bool] = True


class OptimizeSkill(Skill):
    """A plan change that is kept only if the full-model gate still holds and modeled time strictly drops."""

    abstract = True
    kind = "optimize"
    # Which modeled figure the skill targets: "prefill" (TTFT) and/or "decode" (latency per token).
    stages: ClassVar[tuple[str, ...]] = ("prefill", "decode")


class DebugSkill(Skill):
    """A repair chosen by failure signature: diagnose, change the plan, log; the phase then re-runs."""

    abstract = True
    kind = "debug"
    signature: ClassVar[str] = ""
