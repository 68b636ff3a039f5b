"""The orchestrator behind ``tilepilot deploy``: scope check, scaffold, phases 0-7, repair, resume, summary.

Control flow only. It knows phases by their gates (``gates/<name>.json``), picks debug skills through the
failure-signature classifier, and never looks inside a phase. Resume re-runs from the first phase whose
gate is missing or failed, so a crash or a Ctrl-C costs at most the phase that was running. A failure no
debug skill matches (or one that survives its repair) stops the deployment as ``needs-human-review``
with one paragraph a person can act on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tilepilot.skills import registry
from tilepilot.skills.base import PhaseSkill, SkillResult
from tilepilot.skills.classify import Diagnosis, classify
from tilepilot.skills.context import DeployContext, Failure, Settings
from tilepilot.skills.journal import PhaseRow
from tilepilot.skills.phases.finalize import QUALITY_KEY, FinalizeAndLearn

FINALIZE = FinalizeAndLearn.name

# Repairs tried on one phase before it is handed to a person; each repair must be a different signature
# or make progress, so more attempts would only repeat themselves.
MAX_REPAIRS_PER_PHASE = 3

PASS_VERDICTS = ("PASS", "PASS-with-warnings")


@dataclass
class PhaseOutcome:
    phase: int
    name: str
    status: str  # "passed" | "failed" | "needs-human-review" | "pending" | "resumed"
    seconds: float = 0.0
    attempts: int = 0
    summary: str = ""
    repairs: list[str] = field(default_factory=list)


@dataclass
class DeploySummary:
    verdict: str
    workspace: str
    model: str
    phases: list[PhaseOutcome]
    performance: dict[str, Any] = field(default_factory=dict)
    review: str | None = None
    # quantization error vs the bf16 original (finalize-and-learn's reported measure; empty for bf16 deployments)
    quantization_error: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verdict in PASS_VERDICTS

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "workspace": self.workspace,
            "model": self.model,
            "phases": [asdict(p) for p in self.phases],
            "performance": self.performance,
            "review": self.review,
            "quantization_error": self.quantization_error,
        }


# on_event(kind, phase_outcome, message): kinds "start", "end", "repair", "skip".
EventHook = Callable[[str, PhaseOutcome, str], None]


def _noop(kind: str, outcome: PhaseOutcome, message: str) -> None:
    return None


def _run_guarded(cls: type[PhaseSkill], ctx: DeployContext) -> SkillResult:
    """Run a phase; an exception becomes a failed result (with validator codes when it carries them) so the
    chain classifies it like any failure and stops with a summary instead of a traceback."""
    try:
        return cls().run(ctx)
    except Exception as e:  # noqa: BLE001 - any phase crash is a finding to report, not a reason to die
        codes = list(getattr(e, "codes", []) or [])
        return SkillResult(
            skill=cls.name,
            status="failed",
            summary=f"the phase raised {type(e).__name__}: {e}",
            evidence={"validator_codes": codes, "error": f"{type(e).__name__}: {e}"},
        )


class Orchestrator:
    """Runs the phase chain on one workspace; phases and the hook are injectable for tests."""

    def __init__(
        self,
        ctx: DeployContext,
        phases: Sequence[type[PhaseSkill]] | None = None,
        on_event: EventHook | None = None,
    ):
        self.ctx = ctx
        self.phases = tuple(phases if phases is not None else registry.phases())
        self.on_event = on_event or _noop

    # ---- checklist --------------------------------------------------------------------------
    def _write_todo(self, outcomes: list[PhaseOutcome]) -> None:
        self.ctx.journal.write_todo(
            PhaseRow(o.phase, o.name, "passed" if o.status == "resumed" else o.status, o.seconds or None, o.summary)
            for o in outcomes
        )

    def first_unpassed(self) -> int:
        """Index of the first phase whose gate is missing or failed (len(phases) when all passed)."""
        for i, p in enumerate(self.phases):
            if not self.ctx.journal.gate_passed(p.name):
                return i
        return len(self.phases)

    # ---- one phase with repairs ---------------------------------------------------------------
    def _run_phase(self, cls: type[PhaseSkill], outcome: PhaseOutcome) -> tuple[SkillResult, Diagnosis | None]:
        j = self.ctx.journal
        tried: list[str] = []
        diag: Diagnosis | None = None
        while True:
            outcome.attempts += 1
            self.on_event("start", outcome, f"attempt {outcome.attempts}")
            j.progress(f"phase {cls.phase} `{cls.name}` attempt {outcome.attempts} started")
            t0 = time.perf_counter()
            result = _run_guarded(cls, self.ctx)
            secs = time.perf_counter() - t0
            outcome.seconds += secs
            j.phase_time(cls.phase, cls.name, outcome.attempts, result.status, secs)
            j.progress(f"phase {cls.phase} `{cls.name}` {result.status} in {secs:.2f} s (measured): {result.summary}")
            if result.ok:
                outcome.status = "passed"
                outcome.summary = result.summary
                return result, None
            if not cls.repairable:
                return result, None
            diag = classify(result.evidence)
            if not diag.matched or len(tried) >= MAX_REPAIRS_PER_PHASE or (tried and tried[-1] == diag.signature):
                return result, diag
            dbg_cls = registry.debugger_for(diag.signature)
            if dbg_cls is None:  # pragma: no cover - registry test guarantees one skill per signature
                return result, diag
            self.on_event("repair", outcome, f"{diag.signature}: running {dbg_cls.name}")
            self.ctx.failure = Failure(phase=cls.name, result=result, diagnosis=diag)
            try:
                repair = dbg_cls().run(self.ctx)
            finally:
                self.ctx.failure = None
            tried.append(diag.signature)
            outcome.repairs.append(f"{dbg_cls.name}: {repair.status} ({repair.summary})")
            known = self.ctx.known_repair(diag.signature) if hasattr(self.ctx, "known_repair") else None
            j.debug(
                f"phase {cls.phase} `{cls.name}` failed: signature {diag.signature}",
                [
                    *diag.reasons,
                    *([known] if known else []),
                    f"skill `{dbg_cls.name}`: {repair.status}: {repair.summary}",
                ],
            )
            if repair.status != "repaired":
                return result, diag
            j.lesson(
                f"{diag.signature} in `{cls.name}` ({self.ctx.spec.name or self.ctx.spec.architecture})",
                f"Symptoms: {'; '.join(diag.reasons)}. Repair by `{dbg_cls.name}`: {repair.summary}",
            )
            self.ctx.record_lesson(diag.signature, dbg_cls.name, repair.summary, phase=cls.name)

    def _review_paragraph(
        self, cls: type[PhaseSkill], result: SkillResult, diag: Diagnosis | None, tried: list[str]
    ) -> str:
        failures = (result.gate or {}).get("failures") or [result.summary]
        numbers = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in list(((result.gate or {}).get("measurements") or {}).items())[:8]
        )
        why = (
            "no known failure signature matches the evidence"
            if diag is None or not diag.matched
            else f"the failure looks like '{diag.signature}' ({'; '.join(diag.reasons)}) but the repair did not fix it"
        )
        attempts = "; ".join(tried) if tried else "no debug skill applied"
        return (
            f"Phase {cls.phase} ({cls.name}) failed its gate: {' '.join(failures)} "
            f"Measured: {numbers or 'no numbers recorded'}. Classification: {why}. Tried: {attempts}. "
            f"The workspace journal (debug_log.md, gates/{cls.name}.json) holds the evidence; fix the cause, then "
            f"resume with `tilepilot deploy MODEL_DIR --out {self.ctx.root} --resume`."
        )

    # ---- the chain ----------------------------------------------------------------------------
    def run(self, resume: bool = False) -> DeploySummary:
        j = self.ctx.journal
        outcomes = [PhaseOutcome(p.phase, p.name, "pending") for p in self.phases]
        start = self.first_unpassed() if resume else 0
        verdict, review = "PASS", None
        for cls, o in zip(self.phases[:start], outcomes[:start], strict=True):
            o.status = "resumed"
            self.on_event("skip", o, "gate already passed")
            recorded = (j.read_gate(cls.name) or {}).get("evidence") or {}
            if "verdict" in recorded:  # a resumed, already evaluated deployment keeps its evaluator's verdict
                verdict = str(recorded["verdict"])
        if start:
            j.progress(f"resumed: phases 0..{start - 1} already passed, continuing at phase {start}")
        self._write_todo(outcomes)
        for cls, outcome in zip(self.phases[start:], outcomes[start:], strict=True):
            outcome.status = "running"
            self._write_todo(outcomes)
            result, diag = self._run_phase(cls, outcome)
            self.on_event("end", outcome, result.summary)
            if outcome.status != "passed":
                outcome.status = "needs-human-review"
                outcome.summary = result.summary
                review = self._review_paragraph(cls, result, diag, outcome.repairs)
                verdict = "needs-human-review"
                if result.evidence.get("verdict") == "FAIL":  # the evaluator's verdict is final
                    verdict, outcome.status = "FAIL", "failed"
                j.progress(f"stopped: {verdict}: {review}")
                break
            if "verdict" in result.evidence:  # the evaluator's word is the deployment's verdict
                verdict = str(result.evidence["verdict"])
            self._write_todo(outcomes)
        self._write_todo(outcomes)
        summary = DeploySummary(
            verdict=verdict,
            workspace=str(self.ctx.root),
            model=self.ctx.spec.name or self.ctx.spec.architecture,
            phases=outcomes,
            performance=self.ctx.performance_summary() if verdict in PASS_VERDICTS else {},
            review=review,
            quantization_error=((j.read_gate(FINALIZE) or {}).get("evidence") or {}).get(QUALITY_KEY) or {},
        )
        j.progress(f"deployment finished: {verdict}")
        return summary


def deploy(
    model_dir: str | Path,
    out: str | Path,
    *,
    resume: bool = False,
    settings: Settings | None = None,
    on_event: EventHook | None = None,
) -> DeploySummary:
    """Deploy ``model_dir`` into workspace ``out``; see the module docstring for the control flow."""
    ctx = DeployContext.create(model_dir, out, resume=resume, settings=settings)
    return Orchestrator(ctx, on_event=on_event).run(resume=resume)
