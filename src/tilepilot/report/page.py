"""The HTML page: one self-contained file (inline CSS and SVG, no script, no font, no network).

The template lives here as a string so the page cannot lose a file on install. Autoescaping is on; only the
SVG that ``figures`` produced is inserted unescaped.
"""

from __future__ import annotations

import jinja2
from markupsafe import Markup

from tilepilot.report.data import ReportData

CAPTIONS = {
    "phases": (
        "Each bar is one phase attempt, timed on the host's wall clock (measured); colour is the attempt's status, "
        "the label the verdict in gates/PHASE.json."
    ),
    "trajectory": (
        "Modeled TTFT and decode latency of the kept plan after every optimization proposal, in the order tried "
        "(from perf_opt_traj.json). Proposals that were rejected are red crosses at the figure they would have given."
    ),
    "layers": (
        "Modeled time of one transformer layer per kernel group (dispatch), for the deployed plan and the built-in "
        "paper-like and iron-like plans of the same model, all timed now by the same timing model. CPU groups "
        "(hatched) take their modeled host cost (bytes and FLOPs at the calibration's host rates){cpu}. The head "
        "(final norm + LM head) is listed in the table, not drawn."
    ),
    "roofline": (
        "Every distinct kernel instance (launch) of the deployed plan at the modeled prompt length and context, "
        "placed by its MACs, DDR bytes and modeled time against the array's compute peak and DDR bandwidth "
        "(npu/device.py, npu/calibration.py). Instances without MACs (norms, adds, RoPE) are left out: {skipped}."
    ),
    "gates": (
        "Numerics of the functional run (real computation of the modeled kernels' arithmetic) against the FP32 "
        "oracle, as each phase gate recorded them; dashed lines are the gates' bounds."
    ),
    "calibration": (
        "Each point is one published kernel measurement (XDNA2 silicon, measured) against tilepilot's modeled time "
        "of the equivalent design. Source: {source}. {cv}"
    ),
}

_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tilepilot report: {{ d.model }}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1080px;
       padding: 1.2rem 1.6rem 3rem; color: #212529; line-height: 1.45; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.15rem; margin-top: 2.2rem; border-bottom: 1px solid #dee2e6; padding-bottom: 0.2rem; }
.sub { color: #495057; margin-top: 0; }
.verdict { display: inline-block; padding: 0.1rem 0.55rem; border-radius: 0.3rem; color: white; font-weight: 600; }
.PASS { background: #2b8a3e; } .FAIL { background: #c92a2a; } .other { background: #e67700; }
.clock { font-size: 0.75rem; font-weight: 600; color: #495057; background: #f1f3f5; border-radius: 0.25rem;
         padding: 0.05rem 0.4rem; margin-left: 0.4rem; vertical-align: middle; }
figure { margin: 0.6rem 0; }
figure svg { max-width: 100%; height: auto; display: block; }
figcaption { font-size: 0.85rem; color: #495057; margin-top: 0.3rem; }
.missing { background: #fff9db; border-left: 4px solid #fab005; padding: 0.5rem 0.8rem; }
table { border-collapse: collapse; font-size: 0.82rem; margin: 0.6rem 0; }
th, td { border-bottom: 1px solid #e9ecef; padding: 0.2rem 0.6rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
nav a { margin-right: 0.8rem; font-size: 0.9rem; }
</style>
</head>
<body>
<h1>{{ d.model }} on a modeled XDNA2 NPU</h1>
<p class="sub">Workspace <code>{{ d.workspace }}</code> · plan <code>{{ d.plan }}</code> ·
{{ d.headline.n_layers }} layers ({{ d.headline.family }}) · report written {{ d.generated_at }}</p>
<p>Evaluation:
{% if d.verdict %}
<span class="verdict {{ d.verdict if d.verdict in ('PASS', 'FAIL') else 'other' }}">{{ d.verdict }}</span>
{% else %}<span class="verdict other">not evaluated yet</span>{% endif %}
NPU times on this page are <strong>modeled</strong> by tilepilot's calibrated timing model (there is no NPU on
this machine); host times and gate numerics are <strong>measured</strong>.</p>
{% if head %}
<table>
<tr><th>plan (modeled)</th><th>TTFT @ {{ d.headline.prompt_len }} tokens</th>
<th>decode @ context {{ d.headline.prompt_len }}</th><th>decode throughput</th></tr>
{% for label, h in head %}<tr><td>{{ label }}</td><td>{{ "%.1f"|format(h.ttft_s * 1e3) }} ms</td>
<td>{{ "%.2f"|format(h.decode_s_per_token * 1e3) }} ms/token</td>
<td>{{ "%.1f"|format(1 / h.decode_s_per_token) }} tok/s</td></tr>
{% endfor %}</table>
{% endif %}
<nav>{% for s in d.sections %}<a href="#{{ s.key }}">{{ s.title }}</a>{% endfor %}</nav>
{% for s in d.sections %}
<section id="{{ s.key }}">
<h2>{{ s.title }}<span class="clock">{{ clocks[s.key] }}</span></h2>
{% if s.ok %}
<figure class="figure" data-figure="{{ s.key }}">
{{ svgs[s.key] }}
<figcaption>{{ captions[s.key] }}</figcaption>
</figure>
{% if s.key == 'layers' %}
<details><summary>Every kernel group, per plan and stage (modeled ms per layer)</summary>
<table>
<tr><th>plan</th><th>stage</th><th>kernel group</th><th>where</th><th>ms / layer (modeled)</th><th>dispatch</th>
<th>syncs</th><th>cpu (modeled)</th><th>cpu measured</th></tr>
{% for p in s.data.plans if p.stages %}{% for stage, st in p.stages.items() %}{% for g in st.block %}
<tr><td>{{ p.label }}</td><td>{{ stage }}</td><td>{{ g.name }}</td><td>{{ g.where }}</td>
<td>{{ "%.3f"|format(g.per_layer_ms) }}</td><td>{{ "%.3f"|format(g.dispatch_ms) }}</td>
<td>{{ "%.3f"|format(g.sync_ms) }}</td><td>{{ "%.3f"|format(g.cpu_ms) }}</td>
<td>{{ "%.3f"|format(g.cpu_measured_ms) if g.cpu_measured_ms is not none else "" }}</td></tr>
{% endfor %}<tr><td>{{ p.label }}</td><td>{{ stage }}</td><td>head + host io (whole pass)</td><td></td>
<td>{{ "%.3f"|format(st.head_ms) }}</td><td></td><td></td><td></td><td></td></tr>
{% if st.one_dispatch_ms is not none %}<tr><td>{{ p.label }}</td><td>{{ stage }}</td>
<td>one dispatch per pass (every layer + head, ms per pass)</td><td>npu</td>
<td>{{ "%.3f"|format(st.one_dispatch_ms) }}</td><td>{{ "%.3f"|format(st.one_dispatch_ms) }}</td>
<td></td><td></td><td></td></tr>{% endif %}{% endfor %}{% endfor %}
</table>
</details>
{% endif %}
{% else %}
<p class="missing">{{ s.missing }}</p>
{% endif %}
</section>
{% endfor %}
</body>
</html>
"""

CLOCKS = {
    "phases": "measured",
    "trajectory": "modeled",
    "layers": "modeled",
    "roofline": "modeled",
    "gates": "measured numerics",
    "calibration": "modeled vs measured",
}


def captions(d: ReportData) -> dict[str, str]:
    out = dict(CAPTIONS)
    if d.section("layers").ok:
        plans = d.section("layers").data["plans"]
        measured = any(
            g.get("cpu_measured_ms") is not None
            for p in plans
            for st in (p.get("stages") or {}).values()
            for g in st["block"]
        )
        out["layers"] = out["layers"].format(
            cpu="; their wall clock measured on this machine at those shapes is in the table's 'cpu measured' "
            "column, beside the modeled time, never in it"
            if measured
            else ""
        )
    if d.section("roofline").ok:
        pts = d.section("roofline").data["points"]
        skipped = sum(1 for p in pts if p["macs"] <= 0 or p["bytes"] <= 0)
        out["roofline"] = out["roofline"].format(skipped=f"{skipped} of {len(pts)} instances")
    if d.section("calibration").ok:
        c = d.section("calibration").data
        cv = (
            "Hollow diamonds are cross-validated predictions (each row predicted by constants fitted without it)."
            if c["has_cv"]
            else "In-sample only: the calibration report carries no cross-validated predictions yet."
        )
        out["calibration"] = out["calibration"].format(source=c["source"], cv=cv)
    return out


def render_page(d: ReportData, svgs: dict[str, str]) -> str:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    head = [(k, d.headline[k]) for k in ("deployed", "paper-like", "iron-like") if isinstance(d.headline.get(k), dict)]
    return env.from_string(_TEMPLATE).render(
        d=d,
        head=head,
        svgs={k: Markup(v) for k, v in svgs.items()},
        captions=captions(d),
        clocks=CLOCKS,
    )
