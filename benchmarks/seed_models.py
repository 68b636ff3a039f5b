"""The nine seed models deployed end to end at full size: modeled performance, eta_scale, host cost, goals.

For each model this writes (or reuses) its zoo checkpoint (exact published config, random weights), runs
``tilepilot deploy --json`` and then ``tilepilot evaluate --json`` in subprocesses, measuring each
subprocess's wall-clock and peak resident memory (``os.wait4``, which reports the child's own peak and
that of anything it waited for), and keeps one record per model in ``WORKDIR/records/``. The results
table is rebuilt from every record on disk, so models can be run one at a time and a model never run is
listed as "not run", never guessed.

What is modeled and what is measured:
- TTFT at 2048 tokens and decode latency are the deployed plan's figures from ``plan.timing`` (modeled
  NPU and sync time; CPU groups inside them are measured CPU time, shown separately in the JSON).
- Deployment wall-clock and peak RSS are measured on this machine (2 cores, shared: the load average
  at start and end of each deploy is recorded).
- The paper's TTFT / tok/s were measured on real XDNA2 silicon (``published.json``).
- eta_scale (``tilepilot.runtime.eta``) is computed from the modeled figures against this run's own
  Llama-3.2-1B deployment; the paper's column applies the same definition to its published figures.

    python benchmarks/seed_models.py [--models qwen2.5-0.5b llama-3.2-1b] [--workdir DIR] [--reuse] [--layers N]
    python benchmarks/seed_models.py --report-only     # rebuild the tables from the records on disk
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tilepilot.model.zoo import get_zoo_model, write_zoo_model, zoo_names
from tilepilot.plan.plan import dispatch_rate
from tilepilot.runtime.eta import ETA_GOAL, PREFILL_TOKENS, REFERENCE_MODEL, eta_scale, sustained
from tilepilot.runtime.timing import MODEL_ERROR_BASIS, same_model_claims

# issue 7 "Deliver 1": each deployment within 15 minutes of wall-clock on a 2-core machine, peak RSS < 16 GiB.
WALL_LIMIT_S = 15 * 60
RSS_LIMIT_BYTES = 16 * 1024**3
REPO = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = REPO / "benchmarks" / "results"
DEFAULT_WORKDIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tilepilot" / "seed_models"
GiB = 1024**3


# ----------------------------------------------------------------------------------------------------
# running
# ----------------------------------------------------------------------------------------------------
@dataclass
class ChildRun:
    """One measured subprocess: exit code, wall-clock seconds, peak RSS, stdout text, load averages."""

    returncode: int
    wall_s: float
    peak_rss_bytes: int
    stdout: str
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    timed_out: bool = False
    killed_low_memory: bool = False


def mem_available_bytes() -> int | None:
    """The kernel's estimate of memory available to new work (``MemAvailable``), or None if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run_measured(
    cmd: list[str],
    log: Path,
    timeout_s: float | None,
    env: dict[str, str] | None = None,
    min_free_bytes: int = 0,
) -> ChildRun:
    """Run ``cmd``, stderr to ``log``; wall-clock and peak RSS of that child (and its waited-for children).

    The child is killed when the machine's available memory drops below ``min_free_bytes``: on a machine
    shared with other work an out-of-memory kill could otherwise hit someone else's process.
    """
    load0 = os.getloadavg()
    with tempfile.TemporaryFile("w+") as out, open(log, "w") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO, env=env)
        timed_out = low_mem = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            timed_out = bool(timeout_s and time.perf_counter() - t0 > timeout_s)
            avail = mem_available_bytes()
            low_mem = bool(min_free_bytes and avail is not None and avail < min_free_bytes)
            if timed_out or low_mem:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    return ChildRun(proc.returncode, wall, usage.ru_maxrss * 1024, text, load0, os.getloadavg(), timed_out, low_mem)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tilepilot", *args]


def snapshot_source(workdir: Path, rev: str = "HEAD") -> tuple[Path, str]:
    """Export the committed ``src/`` of ``rev`` to ``WORKDIR/src-<commit>`` and return (path, commit).

    The package is installed editable, so a deploy that runs for many minutes would otherwise import
    whatever the working tree holds at each moment: a phase-7 evaluator subprocess started 20 minutes in
    re-times the plan with code (calibration, timing) that changed under the deployment, and its claims
    check fails for reasons that have nothing to do with the deployment. Children run on this frozen copy.
    """
    commit = _commit(rev)
    dest = workdir / f"src-{commit[:12]}"
    if not (dest / "tilepilot" / "__init__.py").is_file():
        tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=workdir))
        archive = subprocess.run(["git", "archive", commit, "src"], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        os.replace(tmp / "src", dest)
        shutil.rmtree(tmp, ignore_errors=True)
    return dest, commit


def _parse_json(text: str) -> dict[str, Any] | None:
    try:
        return json.loads(text[text.index("{") :]) if "{" in text else None
    except json.JSONDecodeError:
        return None


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-600:]


def model_key(name: str, layers: int | None) -> str:
    return name if layers is None else f"{name}-L{layers}"


def ensure_checkpoint(name: str, workdir: Path, layers: int | None, seed: int) -> tuple[Path, float | None]:
    """The zoo checkpoint of ``name`` (reused when a complete one exists); seconds spent writing it, if written."""
    out = workdir / "models" / model_key(name, layers)
    stamp = out / ".zoo-seed"
    if (out / "config.json").is_file() and stamp.is_file() and stamp.read_text().strip() == str(seed):
        return out, None
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    write_zoo_model(name, out, layers=layers, seed=seed)
    stamp.write_text(f"{seed}\n")
    return out, time.perf_counter() - t0


def _save_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename) so an interrupted run never leaves half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)


def deploy_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Checkpoint, deploy, evaluate one model; the record that goes into the results (never raises on failure)."""
    key = model_key(name, args.layers)
    wd: Path = args.workdir
    ws = wd / "workspaces" / key
    logs = wd / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {
        "model": name,
        "layers": args.layers,
        "key": key,
        "started": time.strftime("%F %T"),
        "code": args.code,
    }
    ckpt, write_s = ensure_checkpoint(name, wd, args.layers, args.seed)
    rec["checkpoint"] = {"path": str(ckpt), "write_s": write_s, "reused": write_s is None}
    if ws.exists():
        shutil.rmtree(ws)
    print(f"[{key}] deploying (log {logs / (key + '.deploy.log')}) ...", flush=True)
    dep = run_measured(
        _cli("deploy", str(ckpt), "--out", str(ws), "--json", "--knowledge", str(wd / "knowledge")),
        logs / f"{key}.deploy.log",
        args.timeout,
        args.child_env,
        int(args.min_free_gib * GiB),
    )
    summary = _parse_json(dep.stdout)
    rec["deploy"] = {
        "returncode": dep.returncode,
        "timed_out": dep.timed_out,
        "killed_low_memory": dep.killed_low_memory,
        "wall_s": dep.wall_s,
        "peak_rss_bytes": dep.peak_rss_bytes,
        "load_avg_before": dep.load_before,
        "load_avg_after": dep.load_after,
        "verdict": (summary or {}).get("verdict"),
        "phases": [
            {k: p.get(k) for k in ("phase", "name", "status", "seconds", "attempts", "repairs")}
            for p in (summary or {}).get("phases", [])
        ],
        "performance": (summary or {}).get("performance") or {},
        "review": (summary or {}).get("review"),
        "log_tail": None if summary else _tail(logs / f"{key}.deploy.log"),
    }
    print(
        f"[{key}] deploy {rec['deploy']['verdict'] or 'no summary'} in {dep.wall_s:.0f} s (measured), peak RSS "
        f"{dep.peak_rss_bytes / GiB:.2f} GiB",
        flush=True,
    )
    if summary and summary.get("verdict") in ("PASS", "PASS-with-warnings"):
        ev = run_measured(
            _cli("evaluate", str(ws), "--json", "--seed", str(args.seed + 1)),
            logs / f"{key}.evaluate.log",
            args.timeout,
            args.child_env,
            int(args.min_free_gib * GiB),
        )
        evj = _parse_json(ev.stdout) or {}
        timing = (evj.get("measured") or {}).get("timing") or {}
        rec["evaluate"] = {
            "returncode": ev.returncode,
            "wall_s": ev.wall_s,
            "peak_rss_bytes": ev.peak_rss_bytes,
            "verdict": evj.get("verdict"),
            "reasons": evj.get("reasons"),
            "warnings": evj.get("warnings"),
            "retimed": {k: timing.get(k) for k in ("ttft_s", "decode_ms_per_token", "dispatches_per_layer")},
            "log_tail": None if evj else _tail(logs / f"{key}.evaluate.log"),
        }
        print(f"[{key}] evaluate {evj.get('verdict') or 'no verdict'} in {ev.wall_s:.0f} s (measured)", flush=True)
    else:
        rec["evaluate"] = None
    rec["finished"] = time.strftime("%F %T")
    return rec


# ----------------------------------------------------------------------------------------------------
# reporting (pure: records in, tables out)
# ----------------------------------------------------------------------------------------------------
def load_published() -> dict[str, Any]:
    return json.loads(resources.files("tilepilot.data").joinpath("published.json").read_text())


def _after(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    if not rec or not rec.get("deploy"):
        return None
    return (rec["deploy"].get("performance") or {}).get("after")


def evaluated_ok(rec: dict[str, Any] | None) -> bool:
    ev = (rec or {}).get("evaluate") or {}
    return ev.get("verdict") in ("PASS", "PASS-with-warnings")


def build_rows(
    records: dict[str, dict[str, Any]], names: list[str], layers: int | None, notes: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One row per model, eta_scale against this run's own Llama-3.2-1B (at the same layer count)."""
    pub = load_published()
    paper = pub["paper_autonomous_deployments_2048"]
    ref_name = REFERENCE_MODEL
    ref_rec = records.get(model_key(ref_name, layers))
    ref_perf = _after(ref_rec)
    ref_spec = get_zoo_model(ref_name).spec(layers)
    ref_tp = sustained(ref_spec, ref_perf["ttft_s"], ref_perf["decode_ms_per_token"] / 1e3) if ref_perf else None
    p_ref = paper[ref_name]
    # the paper's published figures through the same definition (full-size specs: the paper ran full size)
    paper_ref_tp = sustained(get_zoo_model(ref_name).spec(), p_ref["ttft_s"], 1 / p_ref["decode_tok_s"])
    rows = []
    for name in names:
        rec = records.get(model_key(name, layers))
        spec = get_zoo_model(name).spec(layers)
        p = paper.get(name)
        row: dict[str, Any] = {
            "model": name,
            "layers": spec.n_layers,
            "full_size": layers is None,
            "record": rec is not None,
        }
        if p:
            ptp = sustained(get_zoo_model(name).spec(), p["ttft_s"], 1 / p["decode_tok_s"])
            row["paper"] = {
                "ttft_s": p["ttft_s"],
                "decode_tok_s": p["decode_tok_s"],
                "clock": "measured on XDNA2 silicon",
                "eta_scale_our_definition": eta_scale(ptp, paper_ref_tp).to_dict(),
            }
        if rec is None:
            row["status"] = "not run"
            row["reason"] = (notes or {}).get(name) or "no record in the workdir for this configuration"
            rows.append(row)
            continue
        dep = rec["deploy"]
        keys = ("verdict", "wall_s", "peak_rss_bytes", "timed_out", "killed_low_memory", "returncode")
        row["deploy"] = {k: dep.get(k) for k in keys}
        row["deploy"]["load_avg_before"] = dep.get("load_avg_before")
        row["deploy"]["load_avg_after"] = dep.get("load_avg_after")
        row["phases"] = dep.get("phases")
        row["evaluate"] = rec.get("evaluate")
        row["code"] = rec.get("code")
        perf = _after(rec)
        if perf is None:
            row["status"] = "deploy failed"
            if dep.get("killed_low_memory"):
                row["reason"] = "killed by the benchmark: available memory ran low (peak RSS so far shown)"
            elif dep.get("timed_out"):
                row["reason"] = "killed by the benchmark: --timeout reached"
            else:
                row["reason"] = dep.get("review") or dep.get("log_tail") or f"exit code {dep.get('returncode')}"
            rows.append(row)
            continue
        row["status"] = "deployed"
        row["modeled"] = {
            "plan": perf["plan"],
            "ttft_s": perf["ttft_s"],
            "decode_ms_per_token": perf["decode_ms_per_token"],
            "decode_tok_s": perf["decode_tok_s"],
            "ttft_cpu_measured_s": perf.get("ttft_cpu_measured_s"),
            "decode_cpu_measured_ms": perf.get("decode_cpu_measured_ms"),
            "dispatches_per_layer": perf["dispatches_per_layer"],
            "before": dep["performance"].get("before"),
            "paper_like": dep["performance"].get("paper_like"),
            "iron_like": dep["performance"].get("iron_like"),
            "paper_like_as_measured": dep["performance"].get("paper_like_as_measured"),
            "clock": "modeled (CPU groups modeled; their measured wall clock beside)",
        }
        if ref_tp is not None:
            tp = sustained(spec, perf["ttft_s"], perf["decode_ms_per_token"] / 1e3)
            row["eta_scale"] = eta_scale(tp, ref_tp).to_dict()
            row["throughput"] = tp.to_dict()
        else:
            row["eta_scale"] = None
            row["eta_reason"] = f"the reference {ref_name} has no deployment in this configuration"
        rows.append(row)
    return rows


GOAL_KEYS = ("evaluator_pass", "eta_scale", "faster_than_paper_like", "wall", "rss")


def _faster(m: dict[str, Any], base: dict[str, Any]) -> bool:
    """Deployed plan at least as fast as the same model's paper-like plan on TTFT and decode, one of them faster."""
    ttft, dec = base["ttft_s"] / m["ttft_s"], m["decode_tok_s"] / base["decode_tok_s"]
    return ttft >= 1 and dec >= 1 and (ttft > 1 or dec > 1)


def claims(row: dict[str, Any]) -> dict[str, Any] | None:
    """Same-model speed-ups and the model's error against silicon for one row (runtime.timing.same_model_claims)."""
    m = row.get("modeled")
    if not m:
        return None
    p = row.get("paper") if row.get("full_size") else None
    return same_model_claims(m, m.get("paper_like"), m.get("iron_like"), p, m.get("paper_like_as_measured"))


def goals(row: dict[str, Any]) -> dict[str, bool | None]:
    """issue 7 goals per model: True met, False not met, None unknown (not run / no reference)."""
    if row.get("status") == "not run":
        return dict.fromkeys(GOAL_KEYS)
    dep = row["deploy"]
    m = row.get("modeled")
    eta = row.get("eta_scale")
    return {
        "evaluator_pass": evaluated_ok({"evaluate": row.get("evaluate")}),
        "eta_scale": None if not eta else eta["combined"] >= ETA_GOAL,
        # issue 11 item 8: no "beats the paper" goal; a speed-up is against the same model's paper-like plan
        "faster_than_paper_like": None if not (m and m.get("paper_like")) else _faster(m, m["paper_like"]),
        "wall": None if dep.get("timed_out") else dep["wall_s"] < WALL_LIMIT_S,
        "rss": dep["peak_rss_bytes"] < RSS_LIMIT_BYTES,
    }


def _f(v: Any, fmt: str, missing: str = "—") -> str:
    return missing if v is None else format(v, fmt)


def _mark(v: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "unknown"}[v]


def _x(v: float | None) -> str:
    """A same-model speed-up (``1.234x``), or why there is none."""
    return "not recorded" if v is None else f"{v:.3f}x"


def render_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    size = "full size" if meta["layers"] is None else f"{meta['layers']} layers per model (smoke run, not full size)"
    L = [
        "# Seed models: modeled XDNA2 performance, eta_scale and deployment cost",
        "",
        f"Written by `benchmarks/seed_models.py` on {meta['written']} ({size}). Deployments ran on "
        f"{', '.join(meta['code_used']) or 'no code yet'}; modeled figures depend on the calibration of that code.",
        "",
        "- **modeled**: TTFT at 2048 tokens and decode latency are the deployed plan's figures from tilepilot's "
        "calibrated XDNA2 timing model (no NPU was used; records written before issue 11 item 6 hold CPU groups "
        "at measured CPU time, later ones at their modeled host cost).",
        "- **speed-up**: the deployed plan against the same model's paper-like plan (and iron-like where recorded), "
        "both timed by the same model in the same deployment run (> 1 = deployed faster). This is the only speed "
        "claim the table makes.",
        "- **model error**: the modeled paper-like plan over the paper's published silicon figure for the same "
        "model (TTFT ratio; decode tok/s ratio). It measures the timing model, not the deployment: a modeled "
        "figure beside a measured one is never a speed-up.",
        "- **measured**: deployment wall-clock and peak resident memory of the `tilepilot deploy` subprocess on "
        f"this machine ({meta['host']['cpus']} CPUs, {meta['host']['mem_gib']:.0f} GiB, shared with other jobs; "
        "load averages per deploy are in the JSON).",
        "- **paper**: TTFT and tok/s the paper published for its autonomous deployments, measured on XDNA2 "
        "silicon (`published.json`).",
        f"- **eta_scale**: tilepilot's definition (`tilepilot.runtime.eta`, DESIGN.md section 6), against this "
        f"run's own "
        f"{REFERENCE_MODEL} deployment; goal >= {ETA_GOAL}. The paper column applies the same definition to "
        "the paper's published figures (its own eta_scale formula is not public).",
        "",
        "## Results",
        "",
        "| model | status | TTFT@2048 s (modeled) | decode tok/s (modeled) | speed-up vs paper-like TTFT / decode "
        "| speed-up vs iron-like TTFT / decode | dispatches prefill / decode | eta prefill | eta decode "
        "| eta_scale | paper eta (our def.) | deploy wall (measured) | peak RSS (measured) | evaluator |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        p = r.get("paper") or {}
        peta = (p.get("eta_scale_our_definition") or {}).get("combined")
        if r["status"] == "not run":
            L.append(f"| {r['model']} | not run | — | — | — | — | — | — | — | — | {_f(peta, '.2f')} | — | — | — |")
            continue
        m = r.get("modeled") or {}
        e = r.get("eta_scale") or {}
        d = m.get("dispatches_per_layer") or {}
        dep = r["deploy"]
        ev = r.get("evaluate") or {}
        wall = f"{dep['wall_s'] / 60:.1f} min" + (" (timed out)" if dep.get("timed_out") else "")
        c = claims(r) or {}
        sp, si = c.get("speedup_over_paper_like") or {}, c.get("speedup_over_iron_like") or {}
        L.append(
            f"| {r['model']} | {r['status']} ({dep.get('verdict') or 'no verdict'}) | {_f(m.get('ttft_s'), '.3f')} "
            f"| {_f(m.get('decode_tok_s'), '.2f')} | {_f(sp.get('ttft'), '.3f')}x / {_f(sp.get('decode'), '.3f')}x "
            f"| {_x(si.get('ttft'))} / {_x(si.get('decode'))} "
            f"| {_rate(d, 'prefill')} / {_rate(d, 'decode')} | {_f(e.get('prefill'), '.2f')} "
            f"| {_f(e.get('decode'), '.2f')} | {_f(e.get('combined'), '.2f')} | {_f(peta, '.2f')} | {wall} "
            f"| {dep['peak_rss_bytes'] / GiB:.2f} GiB | {ev.get('verdict') or 'not run'} |"
        )
    L += [
        "",
        "## The timing model against the paper's silicon (model error, not a speed-up)",
        "",
        "Each modeled figure is the one the ratio is taken on (`runtime.timing.same_model_claims`): the paper-like "
        "plan with its decode at the paper's short prompt, or, in a record written before that figure existed, at "
        "the deployment's own context (the basis column says which).",
        "",
        "| model | paper-like TTFT s (modeled) | paper TTFT s (measured) | modeled / measured | paper-like tok/s "
        "(modeled) | paper tok/s (measured) | modeled / measured | basis |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        p = (r.get("paper") or {}) if r.get("full_size") else {}
        e = (claims(r) or {}).get("model_error_vs_silicon") or {}
        pl = e.get("modeled") or (r.get("modeled") or {}).get("paper_like") or {}
        basis = "short prompt" if e.get("basis") == MODEL_ERROR_BASIS["as_measured"] else "own context" if e else "—"
        L.append(
            f"| {r['model']} | {_f(pl.get('ttft_s'), '.3f')} | {_f(p.get('ttft_s'), '.2f')} "
            f"| {_f(e.get('ttft_modeled_over_published'), '.2f')} | {_f(pl.get('decode_tok_s'), '.2f')} "
            f"| {_f(p.get('decode_tok_s'), '.1f')} | {_f(e.get('decode_tok_s_modeled_over_published'), '.2f')} "
            f"| {basis} |"
        )
    L += [
        "",
        "## Goals (issue 7)",
        "",
        f"Per model: evaluator PASS; eta_scale >= {ETA_GOAL}; the deployed plan at least as fast as the same model's "
        f"paper-like plan (same run) on TTFT and decode; deployment under {WALL_LIMIT_S // 60} min wall-clock; "
        "peak RSS under "
        f"{RSS_LIMIT_BYTES // GiB} GiB."
        + ("" if meta["layers"] is None else " Smoke run: comparisons with the paper's full-size figures are unknown."),
        "",
        "| model | evaluator PASS | eta_scale >= 0.94 | faster than paper-like (same model) | < 15 min | < 16 GiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        g = goals(r)
        L.append(f"| {r['model']} | " + " | ".join(_mark(g[k]) for k in GOAL_KEYS) + " |")
    all_goals = [goals(r) for r in rows]
    n_run = sum(r["status"] != "not run" for r in rows)
    n_all = sum(all(v is True for v in g.values()) for g in all_goals)
    L += ["", f"{n_run} of {len(rows)} models were run; {n_all} met every goal."]
    notes = [r for r in rows if r["status"] != "deployed"]
    if notes:
        L += ["", "## Not run or not deployed", ""]
        for r in notes:
            L.append(f"- **{r['model']}**: {r['status']}: {r.get('reason', '')}")
    L += ["", "## Where deployment time goes (measured, seconds per phase)", ""]
    phase_names: list[str] = []
    for r in rows:
        for ph in r.get("phases") or []:
            if ph["name"] not in phase_names:
                phase_names.append(ph["name"])
    if phase_names:
        L.append("| model | " + " | ".join(phase_names) + " | total | load avg start/end |")
        L.append("|---|" + "---:|" * (len(phase_names) + 2))
        for r in rows:
            phs = {ph["name"]: ph for ph in r.get("phases") or []}
            if not phs:
                continue
            cells = [_f(phs.get(n, {}).get("seconds"), ".0f") if n in phs else "—" for n in phase_names]
            dep = r["deploy"]
            load = f"{(dep.get('load_avg_before') or [0])[0]:.1f} / {(dep.get('load_avg_after') or [0])[0]:.1f}"
            L.append(f"| {r['model']} | " + " | ".join(cells) + f" | {dep['wall_s']:.0f} | {load} |")
    L += [
        "",
        "Totals are the deploy subprocess's wall-clock (measured), including process start and checkpoint loading. "
        "The load average is the machine's 1-minute load when the deploy started and ended (2 cores: a load of 6 "
        "means each runnable process got about a third of a core).",
        "",
    ]
    return "\n".join(L)


def _commit(rev: str = "HEAD") -> str:
    cmd = ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"]
    try:
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _host() -> dict[str, Any]:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpus": os.cpu_count(), "mem_gib": mem / GiB, "python": platform.python_version()}


def load_records(workdir: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted((workdir / "records").glob("*.json")):
        rec = json.loads(p.read_text())
        out[rec["key"]] = rec
    return out


def records_from_results(path: Path, workdir: Path) -> list[str]:
    """Write a record for every model a results JSON this script wrote holds (deployed or failed), unless the
    workdir already has one: the table of a new workdir then keeps models run in an earlier one (a workdir does not
    outlive its machine; the JSON is committed). Each recovered record names its source; returns the keys written."""
    data = json.loads(Path(path).read_text())
    layers = data["meta"].get("layers")
    have = load_records(workdir)
    written = []
    for row in data["models"]:
        key = model_key(row["model"], layers)
        if row.get("status") == "not run" or key in have:
            continue
        dep = dict(row["deploy"])
        dep["phases"] = row.get("phases")
        modeled = row.get("modeled") or {}
        after_keys = ("plan", "ttft_s", "decode_ms_per_token", "decode_tok_s", "ttft_cpu_measured_s",
                      "decode_cpu_measured_ms", "dispatches_per_layer")  # fmt: skip
        dep["performance"] = (
            {
                "after": {k: modeled.get(k) for k in after_keys},
                **{k: modeled.get(k) for k in ("before", "paper_like", "iron_like", "paper_like_as_measured")},
            }
            if modeled
            else {}
        )
        rec = {
            "model": row["model"],
            "layers": layers,
            "key": key,
            "code": row.get("code"),
            "deploy": dep,
            "evaluate": row.get("evaluate"),
            "recovered_from": f"{Path(path).name} written {data['meta'].get('written')}",
        }
        _save_json(workdir / "records" / f"{key}.json", rec)
        written.append(key)
    return written


def load_notes(workdir: Path) -> dict[str, str]:
    p = workdir / "notes.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def rerender(path: Path) -> int:
    """The markdown beside a results JSON, rebuilt from the JSON's rows and meta only (goals re-derived)."""
    data = json.loads(Path(path).read_text())
    rows, meta = data["models"], data["meta"]
    for r in rows:
        r["goals"] = goals(r)
    md = Path(path).with_suffix(".md")
    md.write_text(render_markdown(rows, meta))
    print(md)
    return 0


def write_results(workdir: Path, results_dir: Path, layers: int | None) -> Path:
    rows = build_rows(load_records(workdir), zoo_names(), layers, load_notes(workdir))
    used = sorted({(r.get("code") or {}).get("source", "unrecorded code") for r in rows if r["status"] != "not run"})
    meta = {
        "written": time.strftime("%F %T"),
        "layers": layers,
        "report_commit": _commit(),
        "code_used": used,
        "host": _host(),
        "reference": REFERENCE_MODEL,
        "prompt_len": PREFILL_TOKENS,
        "eta_goal": ETA_GOAL,
        "wall_limit_s": WALL_LIMIT_S,
        "rss_limit_bytes": RSS_LIMIT_BYTES,
    }
    stem = "seed_models" if layers is None else f"seed_models_layers{layers}"
    for r in rows:
        r["goals"] = goals(r)
    _save_json(results_dir / f"{stem}.json", {"meta": meta, "models": rows})
    md = results_dir / f"{stem}.md"
    fd, tmp = tempfile.mkstemp(prefix=md.name + ".", dir=results_dir)
    with os.fdopen(fd, "w") as f:
        f.write(render_markdown(rows, meta))
    os.replace(tmp, md)
    return md


def _rate(per_layer: dict[str, int], stage: str) -> str:
    """A stage's dispatches for the table (``1/layer``, ``1/token`` for a one-dispatch decode), or a dash."""
    return "—" if stage not in per_layer else dispatch_rate(per_layer[stage], stage)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=None, help="zoo names (default: all nine)")
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="checkpoints, workspaces, records, logs")
    ap.add_argument("--reuse", action="store_true", help="skip models that already have a record in the workdir")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers per model, for a quick smoke run")
    ap.add_argument("--seed", type=int, default=0, help="zoo weight seed (evaluation uses seed + 1)")
    ap.add_argument("--timeout", type=float, default=None, help="kill a deploy/evaluate after this many seconds")
    ap.add_argument(
        "--min-free-gib",
        type=float,
        default=1.5,
        help="kill a deploy/evaluate when the machine's available memory falls below this (0: never)",
    )
    ap.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS)
    ap.add_argument("--report-only", action="store_true", help="only rebuild the tables from existing records")
    ap.add_argument(
        "--from-json",
        type=Path,
        default=None,
        metavar="FILE",
        help="re-render the markdown of a results JSON this script wrote (no record, no new number)",
    )
    ap.add_argument(
        "--note",
        action="append",
        default=[],
        metavar="MODEL=TEXT",
        help="why MODEL was not run (kept in WORKDIR/notes.json, shown in the table)",
    )
    ap.add_argument(
        "--records-from",
        type=Path,
        default=None,
        metavar="FILE",
        help="first write a record for every model a results JSON of this script holds that the workdir lacks "
        "(e.g. benchmarks/results/seed_models.json, to add models to the committed table from a new workdir)",
    )
    ap.add_argument(
        "--snapshot",
        nargs="?",
        const="HEAD",
        default=None,
        metavar="REV",
        help="run deploy/evaluate on a frozen export of REV's committed src/ (default HEAD), immune to edits made "
        "while they run; use the same REV for every model of one table",
    )
    args = ap.parse_args(argv)
    names = [get_zoo_model(n).name for n in args.models] if args.models else zoo_names()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.note:
        notes = load_notes(args.workdir)
        for item in args.note:
            model, sep, text = item.partition("=")
            if not sep or not text.strip():
                ap.error(f"--note needs MODEL=TEXT, got {item!r}")
            notes[get_zoo_model(model).name] = text.strip()
        _save_json(args.workdir / "notes.json", notes)
    if args.from_json is not None:
        return rerender(args.from_json)
    if args.records_from is not None:
        got = records_from_results(args.records_from, args.workdir)
        print(f"recovered {len(got)} record(s) from {args.records_from}: {', '.join(got) or 'none'}", flush=True)
    args.child_env = None
    args.code = {"source": "working tree", "commit": _commit()}
    if args.snapshot and not args.report_only:
        src, commit = snapshot_source(args.workdir, args.snapshot)
        args.child_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])),
        }
        args.code = {"source": f"snapshot of committed src/ at {commit[:12]}", "commit": commit}
        print(f"children run on {src}", flush=True)
    if not args.report_only:
        done = load_records(args.workdir)
        for name in names:
            key = model_key(name, args.layers)
            if args.reuse and key in done:
                print(f"[{key}] reusing the record from {done[key].get('finished')}", flush=True)
                continue
            rec = deploy_one(name, args)
            _save_json(args.workdir / "records" / f"{key}.json", rec)
            write_results(args.workdir, args.results_dir, args.layers)
    md = write_results(args.workdir, args.results_dir, args.layers)
    print(f"wrote {md} and {md.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
