"""The deployment's files: ``deployment.json`` (plan, model directory, recorded facts) and the journal beside it.

Every read goes back to ``deployment.json`` and every plan a skill keeps is written there (``save_plan``), so
what a skill keeps is exactly what a resumed or evaluated deployment will see. The digests here fingerprint
what a gate was measured on: the checkpoint's files and the plan's content.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any

from tilepilot.errors import WorkspaceError
from tilepilot.files import write_text_atomic
from tilepilot.model.zoo import check_not_a_file, check_writable
from tilepilot.plan.plan import DeploymentPlan
from tilepilot.runtime import workspace as ws_mod
from tilepilot.runtime.workspace import RUNTIME_KEY
from tilepilot.skills.journal import Journal


def file_digest(paths: list[Path]) -> str:
    """SHA-256 over the named files' bytes (in the given order), streamed."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The weight files of a checkpoint directory, in a stable order."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise WorkspaceError(f"no *.safetensors files in {model_dir}; point the workspace at a checkpoint directory")
    return files


def check_deploy_out(out: Path, *, resume: bool, import_beside: bool = False) -> None:
    """Refuse, before a GGUF is imported or a phase runs, an --out a deploy cannot use, so a refusal writes nothing:
    a file, a directory holding someone's files but no deployment (with --resume too: resuming it would deploy
    among them), a deployment without --resume, or a place nothing can be created in. ``import_beside``: a GGUF
    input is imported to ``OUT.model`` beside the workspace, so the parent must be writable too. A new or empty
    directory with --resume starts afresh: a deploy interrupted before its first file is resumed that way."""
    out = Path(out)
    check_not_a_file(out)
    holds = (out / ws_mod.DEPLOYMENT_FILE).is_file()
    if holds and not resume:
        raise WorkspaceError(
            f"{out} already holds a deployment; pass --resume to continue it or choose a new --out directory"
        )
    if not holds and out.is_dir() and any(out.iterdir()):
        if resume:
            raise WorkspaceError(
                f"{out} holds no deployment to resume (no {ws_mod.DEPLOYMENT_FILE}, but other files); pass the "
                "workspace of an earlier deploy, or drop --resume and choose a new --out directory"
            )
        raise WorkspaceError(f"{out} exists and is not empty; choose a new --out directory")
    check_writable(out, out)
    if import_beside:
        check_writable(out.parent, out)


def plan_digest(plan: DeploymentPlan) -> str:
    """A short fingerprint of a plan's content (what a gate was measured on)."""
    return hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


class DeployWorkspace:
    """``deployment.json`` and the journal of one workspace directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.journal = Journal(self.root)

    def load(self) -> ws_mod.Workspace:
        """The workspace as recorded now (re-read each time: skills save plans between reads)."""
        return ws_mod.load_workspace(self.root)

    @cached_property
    def model_dir(self) -> Path:
        return Path(self.load().model_dir)

    @property
    def plan(self) -> DeploymentPlan:
        return self.load().plan

    def save_plan(self, plan: DeploymentPlan) -> None:
        """Validate ``plan`` against the block graph and make it the workspace's plan (atomic write)."""
        self.load().set_plan(plan)

    def get_extra(self, key: str, default: Any = None) -> Any:
        return self.load().extra.get(key, default)

    def set_extra(self, key: str, value: Any) -> None:
        """Store a journal-level fact (e.g. the checkpoint digest) beside the plan in deployment.json."""
        ws = self.load()
        ws.extra[key] = value
        ws.save()

    def runtime_options(self) -> dict[str, Any]:
        """Runner options the workspace records beside the plan (e.g. buffers the runtime treats as static)."""
        return dict(self.get_extra(RUNTIME_KEY, {}) or {})

    def write_text(self, name: str, text: str) -> Path:
        p = self.root / name
        write_text_atomic(p, text)
        return p

    def checkpoint_digest(self) -> str:
        return file_digest(checkpoint_files(self.model_dir))
