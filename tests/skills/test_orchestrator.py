"""Orchestrator control flow on fake phases: order, repair by signature, human review, resume, verdicts."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tilepilot.skills import orchestrator as O
from tilepilot.skills import registry
from tilepilot.skills.base import DebugSkill, PhaseSkill
from tilepilot.skills.classify import STALE_AFTER_FIRST_CALL
from tilepilot.skills.journal import Journal


@dataclass
class FakeSpec:
    name: str = "fake-model"
    architecture: str = "LlamaForCausalLM"
    family: str = "llama"


@dataclass
class FakeCtx:
    root: object
    journal: Journal = None
    spec: FakeSpec = field(default_factory=FakeSpec)
    failure: object = None
    broken: bool = False  # the injected fault a fake debug skill repairs
    runs: list = field(default_factory=list)
    lessons: list = field(default_factory=list)

    def __post_init__(self):
        self.journal = Journal(self.root)
        self.journal.scaffold("fake")

    def record_lesson(self, *args, **kw):
        self.lessons.append(args)

    def performance_summary(self):
        return {"prompt_len": 2048, "clock": "modeled"}


def _phase(n: int, name: str, *, fails_when_broken=False, evidence=None, verdict=None, repairable=True):
    def run(self, ctx):
        ctx.runs.append(name)
        ok = not (fails_when_broken and ctx.broken)
        ev = dict(evidence or {}) if not ok else {}
        if verdict:
            ev["verdict"] = verdict
            ok = verdict != "FAIL"
        ctx.journal.write_gate(name, {"passed": ok})
        gate = {"failures": [] if ok else ["logits.cosine = 0.5 violates logits.cosine >= 0.99"], "measurements": {}}
        return self.result("passed" if ok else "failed", "ok" if ok else "bad", evidence=ev, gate=gate)

    return type(
        f"P{n}",
        (PhaseSkill,),
        {
            "name": name,
            "phase": n,
            "repairable": repairable,
            "description": "Fake phase. Use when testing.",
            "purpose": "test",
            "commands": ("tilepilot deploy M --out W",),
            "run": run,
        },
    )


class FakeStaleFix(DebugSkill):
    name = "fake-stale-fix"
    signature = STALE_AFTER_FIRST_CALL
    description = "Fake repair. Use when testing."
    purpose = "test"
    commands = ("tilepilot deploy M --out W --resume",)

    def run(self, ctx):
        assert ctx.failure is not None and ctx.failure.diagnosis.signature == STALE_AFTER_FIRST_CALL
        ctx.broken = False
        return self.result("repaired", "buffer re-marked dynamic")


@pytest.fixture
def fake_debuggers(monkeypatch):
    monkeypatch.setattr(registry, "debugger_for", lambda sig: FakeStaleFix if sig == STALE_AFTER_FIRST_CALL else None)


STALE = {"call_cosine": [0.9999, 0.3]}


def test_runs_phases_in_order_and_passes(tmp_path, fake_debuggers):
    ctx = FakeCtx(tmp_path)
    phases = [_phase(0, "p-zero"), _phase(1, "p-one"), _phase(2, "p-eval", verdict="PASS-with-warnings")]
    events = []
    s = O.Orchestrator(ctx, phases, on_event=lambda k, o, m: events.append((k, o.name))).run()
    assert s.verdict == "PASS-with-warnings" and s.ok
    assert ctx.runs == ["p-zero", "p-one", "p-eval"]
    assert [o.status for o in s.phases] == ["passed"] * 3
    assert ("start", "p-zero") in events and ("end", "p-eval") in events
    todo = (tmp_path / "TODO.md").read_text()
    assert todo.count("[x]") == 3
    assert "p-one" in (tmp_path / "phase_timing.md").read_text()


def test_failure_is_classified_repaired_and_rerun(tmp_path, fake_debuggers):
    ctx = FakeCtx(tmp_path, broken=True)
    phases = [_phase(0, "p-zero"), _phase(1, "p-one", fails_when_broken=True, evidence=STALE)]
    s = O.Orchestrator(ctx, phases).run()
    assert s.verdict == "PASS"
    assert ctx.runs == ["p-zero", "p-one", "p-one"]
    assert s.phases[1].attempts == 2 and "fake-stale-fix: repaired" in s.phases[1].repairs[0]
    assert "stale-after-first-call" in (tmp_path / "debug_log.md").read_text()
    assert "fake-stale-fix" in (tmp_path / "LESSONS.md").read_text() and ctx.lessons


def test_unmatched_failure_needs_human_review(tmp_path, fake_debuggers):
    ctx = FakeCtx(tmp_path, broken=True)
    phases = [_phase(0, "p-zero", fails_when_broken=True, evidence={"layer_cosine": [0.5, 0.5]}), _phase(1, "p-one")]
    s = O.Orchestrator(ctx, phases).run()
    assert s.verdict == "needs-human-review" and not s.ok
    assert ctx.runs == ["p-zero"]  # stops
    assert "no known failure signature" in s.review and "logits.cosine = 0.5" in s.review and "--resume" in s.review
    assert s.phases[1].status == "pending"


def test_repair_that_does_not_fix_stops(tmp_path, monkeypatch):
    class Useless(FakeStaleFix):
        name = "useless-fix"

        def run(self, ctx):
            return self.result("repaired", "did nothing")

    monkeypatch.setattr(registry, "debugger_for", lambda sig: Useless)
    ctx = FakeCtx(tmp_path, broken=True)
    s = O.Orchestrator(ctx, [_phase(0, "p-zero", fails_when_broken=True, evidence=STALE)]).run()
    assert s.verdict == "needs-human-review"
    assert ctx.runs == ["p-zero", "p-zero"]  # one repair, same signature again: stop instead of looping
    assert "useless-fix" in s.review


def test_resume_starts_at_first_unpassed_phase(tmp_path, fake_debuggers):
    ctx = FakeCtx(tmp_path, broken=True)
    phases = [_phase(0, "p-zero"), _phase(1, "p-one", fails_when_broken=True, evidence={"layer_cosine": [0.1]})]
    assert O.Orchestrator(ctx, phases).run().verdict == "needs-human-review"
    ctx2 = FakeCtx(tmp_path)  # the cause was fixed by hand
    s = O.Orchestrator(ctx2, phases).run(resume=True)
    assert ctx2.runs == ["p-one"] and s.verdict == "PASS"
    assert [o.status for o in s.phases] == ["resumed", "passed"]
    assert "resumed" in (tmp_path / "progress.md").read_text()


def test_evaluator_fail_is_final(tmp_path, fake_debuggers):
    ctx = FakeCtx(tmp_path)
    phases = [_phase(0, "p-zero"), _phase(1, "p-eval", verdict="FAIL", evidence=STALE, repairable=False)]
    s = O.Orchestrator(ctx, phases).run()
    assert s.verdict == "FAIL" and ctx.runs == ["p-zero", "p-eval"] and s.phases[1].status == "failed"


def test_a_crashing_phase_is_reported_not_raised(tmp_path, fake_debuggers):
    def run(self, ctx):
        raise ValueError("kernel family exploded")

    crash = type(
        "Crash",
        (PhaseSkill,),
        {"name": "p-crash", "phase": 0, "description": "Crashes. Use when testing.", "purpose": "t",
         "commands": ("tilepilot deploy M --out W",), "run": run},
    )  # fmt: skip
    s = O.Orchestrator(FakeCtx(tmp_path), [crash]).run()
    assert s.verdict == "needs-human-review" and "raised ValueError: kernel family exploded" in s.review
