"""A deployment workspace: one directory per deployment, anchored by ``deployment.json``.

``deployment.json`` holds the plan, the model directory it deploys and the model's spec, so a
workspace can be run (``generate``, ``bench``) without re-deriving anything. The skill system adds
its journal files beside it; this module stays small and only owns ``deployment.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilepilot.errors import ConfigError, WorkspaceError
from tilepilot.files import write_json_atomic
from tilepilot.model.spec import ModelSpec, load_spec
from tilepilot.plan.builtin import builtin_plan
from tilepilot.plan.plan import DeploymentPlan, check_plan

DEPLOYMENT_FILE = "deployment.json"
WORKSPACE_FORMAT = 1
RUNTIME_KEY = "runtime"  # runner options recorded beside the plan (e.g. buffers treated as static)
RUNNER_OPTIONS = ("static_buffers",)


@dataclass
class Workspace:
    path: Path
    model_dir: Path
    spec: ModelSpec
    plan: DeploymentPlan
    extra: dict[str, Any]

    @property
    def deployment_file(self) -> Path:
        return self.path / DEPLOYMENT_FILE

    @property
    def runner_options(self) -> dict[str, Any]:
        """Keyword options for ``NpuRunner`` that the deployment recorded (only the ones the runner takes)."""
        opts = self.extra.get(RUNTIME_KEY) or {}
        return {k: v for k, v in opts.items() if k in RUNNER_OPTIONS}

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.extra)
        d.update(
            format=WORKSPACE_FORMAT,
            model_dir=str(self.model_dir),
            spec=self.spec.to_dict(),
            plan=self.plan.to_dict(),
        )
        return d

    def save(self) -> Path:
        """Rewrite ``deployment.json`` atomically (temp file + rename)."""
        return write_json_atomic(self.deployment_file, self.to_dict())

    def set_plan(self, plan: DeploymentPlan) -> None:
        check_plan(plan, self.spec)
        self.plan = plan
        self.save()


def is_workspace(path: str | Path) -> bool:
    return (Path(path) / DEPLOYMENT_FILE).is_file()


def make_workspace(
    model_dir: str | Path, plan_name: str = "default", out: str | Path | None = None, overwrite: bool = False
) -> Workspace:
    """Create a workspace for ``model_dir`` with a built-in plan (``default``, ``iron-like``, ``paper-like``)."""
    model_dir = Path(model_dir).resolve()
    spec = load_spec(model_dir)
    plan = builtin_plan(plan_name, spec)
    out = Path(out) if out is not None else model_dir.parent / f"{model_dir.name}-{plan_name}"
    if is_workspace(out) and not overwrite:
        raise WorkspaceError(f"{out} already holds a deployment; choose another directory or pass overwrite")
    if out.exists() and not out.is_dir():
        raise WorkspaceError(f"{out} exists and is not a directory; choose another workspace path")
    ws = Workspace(path=out.resolve(), model_dir=model_dir, spec=spec, plan=plan, extra={})
    ws.save()
    return ws


def load_workspace(path: str | Path) -> Workspace:
    """Read a workspace; every problem is a WorkspaceError naming the file and what to do."""
    path = Path(path)
    if not path.is_dir():
        raise WorkspaceError(f"workspace {path} does not exist; create one with `tilepilot deploy` or make_workspace")
    file = path / DEPLOYMENT_FILE
    if not file.is_file():
        raise WorkspaceError(f"{path} has no {DEPLOYMENT_FILE}; it is not a tilepilot workspace")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise WorkspaceError(f"{file} is not valid JSON ({e.msg} at line {e.lineno}); redeploy the model") from None
    if not isinstance(data, dict) or data.get("format") != WORKSPACE_FORMAT:
        raise WorkspaceError(
            f"{file} has format {data.get('format') if isinstance(data, dict) else None!r}, expected "
            f"{WORKSPACE_FORMAT}; redeploy the model with this version of tilepilot"
        )
    try:
        spec = ModelSpec.from_dict(data["spec"])
        plan = DeploymentPlan.from_dict(data["plan"])
        model_dir = Path(data["model_dir"])
    except (KeyError, TypeError, ConfigError) as e:
        raise WorkspaceError(f"{file} is incomplete or malformed ({e}); redeploy the model") from None
    if not model_dir.is_absolute():
        model_dir = (path / model_dir).resolve()
    try:
        check_plan(plan, spec)
    except ConfigError as e:
        raise WorkspaceError(f"{file}: {e}") from None
    extra = {k: v for k, v in data.items() if k not in ("format", "model_dir", "spec", "plan")}
    return Workspace(path=path.resolve(), model_dir=model_dir, spec=spec, plan=plan, extra=extra)
