"""Render the current results tables of a doc from the machine-written records in this folder.

  python benchmarks/results/render.py memory-budget               # every table of docs/memory-budget.md
  python benchmarks/results/render.py memory-budget --table compare
  python benchmarks/results/render.py --list                      # docs and their tables
  python benchmarks/results/render.py --check                     # do the docs show what this prints?
  python benchmarks/results/render.py --write                     # replace the docs' tables with it

"Current" means the latest run (the last in the file) that measured what the table shows; older runs
stay in the .jsonl files. In a doc, a rendered table sits between two markers:

  <!-- results: memory-budget/compare -->
  ...
  <!-- /results -->

Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from record import read_results

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


# ---- helpers ---------------------------------------------------------------------------------------

def runs_in_order(records: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for r in records:
        seen.setdefault(r["run"], None)
    return list(seen)


def latest_run(records: list[dict], accept) -> str | None:
    """The last run (in file order) for which accept(that run's records) is true."""
    for run in reversed(runs_in_order(records)):
        if accept([r for r in records if r["run"] == run]):
            return run
    return None


def pick(records: list[dict], **where) -> list[dict]:
    return [r for r in records if all(r.get(k) == v for k, v in where.items())]


def one(records: list[dict], **where) -> dict | None:
    found = pick(records, **where)
    return found[-1] if found else None


def unique(values) -> list:
    out: dict = {}
    for v in values:
        out.setdefault(v, None)
    return list(out)


def fmt(value, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    return f"{value:.{digits}f}{suffix}"


def fmt_range(r: dict | None, digits: int = 2, suffix: str = "x") -> str:
    if r is None:
        return "-"
    text = fmt(r["value"], digits, suffix) if r["value"] is not None else ""
    if r.get("low") is not None and r.get("high") is not None:
        rng = f"{r['low']:.{digits}f}-{r['high']:.{digits}f}"
        text = f"{text} ({rng})" if text else rng + suffix
    return text or "-"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def run_line(records: list[dict], run: str) -> str:
    """'2026-11-24, 8 rounds: `command`'"""
    rs = pick(records, run=run)
    date = unique(r.get("date") for r in rs if r.get("date"))
    rounds = unique(r.get("rounds") for r in rs if r.get("rounds"))
    commands = unique(r.get("command") for r in rs if r.get("command"))
    parts = [", ".join(date)] if date else []
    if len(rounds) == 1:
        parts.append(f"{rounds[0]} rounds")
    head = ", ".join(parts)
    cmd = "; ".join(f"`{c}`" for c in commands)
    return f"{head}: {cmd}" if head and cmd else head or cmd


# ---- docs/memory-budget.md --------------------------------------------------------------------------

def memory_compare() -> list[str]:
    recs = read_results("memory-compare")
    run = latest_run(recs, lambda rs: any(r["metric"] == "decode_tok_s" for r in rs))
    if run is None:
        return ["(no memory-compare run with decode tok/s recorded)"]
    rs = pick(recs, run=run)
    keys = unique((r["model"], r["budget"], r.get("budget_mb"), r["config"]) for r in rs
                  if r["metric"] == "decode_tok_s")
    rows = []
    for model, budget, budget_mb, config in keys:
        q = dict(model=model, budget=budget, config=config)
        mb = one(rs, metric="flash_mb_per_token", **q)
        vn = "1.00x" if config == "naive" else fmt_range(one(rs, metric="vs_naive", **q))
        vh = "1.00x" if config == "hybrid" else fmt_range(one(rs, metric="vs_hybrid", **q))
        ceiling, share = one(rs, metric="ceiling_vs_hybrid", **q), one(rs, metric="ceiling_share", **q)
        if ceiling is None and config.startswith("flash") and mb and mb["value"] == 0:
            ceiling_cell, share_cell = "reads no weights", "-"
        else:
            ceiling_cell, share_cell = fmt_range(ceiling), fmt(share and share["value"], 0, "%")
        peak = one(rs, metric="peak_rss_mb", **q)
        rows.append([model, f"{budget} ({budget_mb:g} MB)" if budget_mb else budget, config,
                     fmt(one(rs, metric="decode_tok_s", **q)["value"]), fmt(mb and mb["value"]), vn, vh,
                     ceiling_cell, share_cell, fmt(peak and peak["value"], 0)])
    out = md_table(["model", "budget", "config", "tok/s", "MB read/token", "vs naive", "vs hybrid",
                    "read ceiling vs hybrid", "share of ceiling", "peak RSS MB"], rows)
    out.append("")
    cond = one(rs, metric="conditions")
    out.append(f"Run of {run_line(recs, run)}" + (f" ({cond['value']})." if cond else "."))
    storage = []
    for model, budget in unique((k[0], k[1]) for k in keys):
        single = one(rs, model=model, budget=budget, metric="storage_single_mb_s")
        parallel = one(rs, model=model, budget=budget, metric="storage_parallel_mb_s")
        if single and parallel:
            storage.append(f"{model} {budget} {single['value']:.0f} / {parallel['value']:.0f}")
    if storage:
        out.append("Storage in the same rounds, one read at a time / several in flight (MB/s, median): "
                   + "; ".join(storage) + ".")
    equal = one(rs, metric="exact_outputs_equal")
    peaks = [(r, r.get("budget_mb")) for r in pick(rs, metric="peak_rss_max_mb")]
    checks = []
    if equal is not None:
        checks.append("every exact greedy output equal across strategies and rounds: " + fmt(equal["value"]))
    if peaks:
        checks.append("largest peak RSS over the baseline: " + ", ".join(
            f"{r['value']:g} of {mb:g}" if mb else f"{r['value']:g}" for r, mb in peaks) + " MB")
    if checks:
        out.append(checks[0][0].upper() + "; ".join(checks)[1:] + ".")
    return out


def memory_agreement() -> list[str]:
    recs = read_results("memory-agreement")
    run = latest_run(recs, lambda rs: True)
    rs = pick(recs, run=run)
    configs = unique(r["config"] for r in rs)
    rows = [[m] + [fmt(one(rs, model=m, config=c)["value"], 1, "%") for c in configs]
            for m in unique(r["model"] for r in rs)]
    return md_table(["model"] + configs, rows) + ["", f"Run of {run_line(recs, run)}."]


# ---- docs/benchmarks.md -----------------------------------------------------------------------------

PEER_NAMES = {"edgeflash": "edgeflash (q8x2)", "edgeflash-q8": "edgeflash (q8)", "llamacpp": "llama.cpp",
              "executorch": "ExecuTorch", "transformers": "transformers",
              "edgeflash-q4-bundle": "edgeflash q4_0 bundle"}


def peers_side_by_side() -> list[str]:
    recs = read_results("peers")
    run = latest_run(recs, lambda rs: any(r["metric"] == "decode_tok_s"
                                          and str(r.get("config")).startswith("edgeflash") for r in rs))
    if run is None:
        return ["(no side-by-side run recorded)"]
    rs = pick(recs, run=run)
    rows = []
    for model in unique(r["model"] for r in rs if r.get("model")):
        peers = unique(r["config"] for r in rs if r.get("model") == model and r["metric"] == "decode_tok_s")
        base = next(p for p in peers if p.startswith("edgeflash"))
        b_pre = one(rs, model=model, config=base, metric="prefill_tok_s")["value"]
        b_dec = one(rs, model=model, config=base, metric="decode_tok_s")["value"]
        for peer in peers:
            pre = one(rs, model=model, config=peer, metric="prefill_tok_s")["value"]
            dec = one(rs, model=model, config=peer, metric="decode_tok_s")["value"]
            rss = one(rs, model=model, config=peer, metric="peak_rss_mb")
            ratio = "-" if peer == base else f"{b_pre / pre:.2f}x / {b_dec / dec:.2f}x"
            rows.append([model, PEER_NAMES.get(peer, peer), fmt(pre), fmt(dec), fmt(rss and rss["value"], 0),
                         ratio])
    base_names = unique(PEER_NAMES.get(p, p) for p in (r["config"] for r in rs if r.get("config"))
                        if p.startswith("edgeflash"))
    out = md_table(["model", "peer", "prefill tok/s", "decode tok/s", "peak RSS MB",
                    f"{base_names[0]} prefill / decode ratio"], rows)
    cond = one(rs, metric="conditions")
    out += ["", f"Run of {run_line(recs, run)}" + (f" ({cond['value']})." if cond else ".")]
    return out


def peers_perplexity() -> list[str]:
    recs = [r for r in read_results("peers") if r["metric"] == "perplexity"]
    columns = ["transformers", "edgeflash", "edgeflash-q8", "llamacpp", "executorch", "edgeflash-q4-bundle"]
    names = {"transformers": "transformers fp32", "edgeflash": "edgeflash q8x2",
             "edgeflash-q8": "edgeflash q8", "llamacpp": "llama.cpp (GGUF as is)",
             "executorch": "ExecuTorch 8da4w", "edgeflash-q4-bundle": "edgeflash q4_0 bundle (q8)"}
    columns = [c for c in columns if any(r["config"] == c for r in recs)]
    rows = [[m] + [fmt((one(recs, model=m, config=c) or {}).get("value"), 2) for c in columns]
            for m in unique(r["model"] for r in recs)]
    model_arg = re.compile(r"--model [\w.-]+")
    commands = unique("`" + model_arg.sub("--model M", r["command"]) + "`" for r in recs if r.get("command"))
    table = md_table(["model"] + [names[c] for c in columns], rows)
    return table + ["", "Commands: " + "; ".join(commands) + "."]


def decode_profile() -> list[str]:
    recs = read_results("decode-profile")
    run = latest_run(recs, lambda rs: any(r["metric"] == "forward_ms" for r in rs))
    rs = pick(recs, run=run)
    rows = []
    for m in unique(r["model"] for r in rs):
        v = {r["metric"]: r["value"] for r in pick(rs, model=m)}
        rows.append([m, fmt(v["weights_mb"]), fmt(v["roofline_ms"], 2),
                     f"{v['generate_ms']:.2f} ({v['generate_tok_s']:g})", fmt(v["forward_ms"], 2),
                     fmt(v["gemv_ms"], 2), fmt(v["other_ops_ms"], 2), fmt(v["python_ms"], 2),
                     fmt(v["forward_share_of_roofline"], 0, "%"), fmt(v["loadavg_1m"])])
    header = ["model", "weights MB", "roofline ms/token", "generate ms/token (tok/s)", "C++ forward ms",
              "GEMV only ms", "other ops ms", "Python ms", "forward at % of roofline", "load"]
    return md_table(header, rows) + ["", f"Run of {run_line(recs, run)}."]


# ---- docs/kernels.md --------------------------------------------------------------------------------

def kernels_gemv() -> list[str]:
    recs = read_results("kernels-gemv")
    bench_runs = [run for run in runs_in_order(recs) if pick(recs, run=run, metric="read_bandwidth_gb_s")]
    rows, shapes_of_run = [], {}
    for shape in unique(r["model"] for r in recs if r.get("model")):
        run = next((run for run in reversed(bench_runs)
                    if pick(recs, run=run, model=shape, metric="gemv_gb_s")), None)
        if run is None:
            continue
        shapes_of_run.setdefault(run, []).append(shape.split(" ")[0])
        rs = pick(recs, run=run)
        for impl in unique(r["config"].rsplit(", ", 1)[0] for r in pick(rs, model=shape) if r.get("config")):
            # the weight size is a property of the shape and format, not of the run
            weight = one(recs, model=shape, config=impl, metric="weight_mb")
            na = one(rs, model=shape, config=impl, metric="gemv_gb_s")
            if na is not None and na["value"] is None:
                rows.append([shape, impl, "n/a", na.get("notes", ""), ""])
                continue
            cells = []
            for thr in ("1 thread", "2 threads"):
                g = one(rs, model=shape, config=f"{impl}, {thr}", metric="gemv_gb_s")
                s = one(rs, model=shape, config=f"{impl}, {thr}", metric="share_of_read_bandwidth")
                cells.append(fmt(g and g["value"]) + (f" ({s['value']:.0f}%)" if s else ""))
            rows.append([shape, impl, fmt(weight and weight["value"])] + cells)
    out = md_table(["matrix", "implementation", "weight MB", "1 thread GB/s (% of read bandwidth)",
                    "2 threads GB/s (%)"], rows)
    notes = []
    for run, shapes in shapes_of_run.items():
        rs = pick(recs, run=run)
        bw = [one(rs, config=c, metric="read_bandwidth_gb_s")["value"] for c in ("1 thread", "2 threads")]
        cond = one(rs, metric="conditions")
        tail = f"; {cond['value']}." if cond else "."
        notes.append(f"- {', '.join(shapes)}: run of {run_line(recs, run)}; read bandwidth "
                     f"{bw[0]:g} / {bw[1]:g} GB/s at 1 / 2 threads{tail}")
    return out + [""] + notes


def kernels_ops() -> list[str]:
    recs = read_results("kernels-ops")
    run = latest_run(recs, lambda rs: any(r["metric"] == "us_per_call" and r["value"] is not None
                                          for r in rs))
    rs = pick(recs, run=run)
    rows = []
    for op in unique(r["model"] for r in rs if r.get("model")):
        for cfg in unique(r["config"] for r in pick(rs, model=op)):
            us = one(rs, model=op, config=cfg, metric="us_per_call")
            gf = one(rs, model=op, config=cfg, metric="gflop_s")
            rows.append([op, cfg, fmt(us["value"], 2 if us["value"] < 1 else 1), fmt(gf and gf["value"])])
    cond = one(rs, metric="conditions")
    return md_table(["operation", "shape / setting", "us per call", "GFLOP/s"], rows) + [
        "", f"Run of {run_line(recs, run)}" + (f" ({cond['value']})." if cond else ".")]


# ---- docs/speculative.md ----------------------------------------------------------------------------

def kernel_level(record: dict) -> str:
    """The kernel level a record's notes name ("avx2 kernels"); runs before the notes named it were
    made on AVX-512 VNNI machines."""
    found = re.search(r"\b(\w+) kernels\b", record.get("notes", ""))
    return found.group(1) if found else "avx512"


def speculative() -> list[str]:
    """One row per (budget, kernel level, model, prompt set): the latest run that measured it. A
    command may measure several budgets; a later command supersedes an earlier one's rows it
    measured again."""
    recs = read_results("speculative")

    def order(budget: str) -> tuple:
        fraction = re.match(r"(\d+)%", budget)
        return (budget != "none", -int(fraction.group(1)) if fraction else 0, budget)

    latest: dict[tuple[str, str, str, str], tuple[str, str, list[str]]] = {}  # key -> (run, command, row)
    measured = unique((r["command"], r["budget"], kernel_level(r)) for r in recs
                      if r["metric"] == "speedup" and r.get("budget"))
    for command, budget, level in measured:
        run = latest_run(recs, lambda rs: any(r["metric"] == "speedup" and r["command"] == command
                                              and r.get("budget") == budget and "," in r["config"]
                                              and kernel_level(r) == level for r in rs))
        if run is None:
            continue
        rs = [r for r in pick(recs, run=run) if r["command"] == command and r.get("budget") == budget]
        for model in unique(r["model"] for r in rs):
            for prompts in unique(r["config"].split(", ")[0] for r in pick(rs, model=model)
                                  if "," in r["config"]):
                speed, acc = [], []
                for drafter in ("lookup", "self", "draft", "auto"):
                    q = dict(model=model, config=f"{prompts}, {drafter}")
                    sp, a = one(rs, metric="speedup", **q), one(rs, metric="mean_accepted_per_pass", **q)
                    cell = fmt(sp and sp["value"], 2, "x")
                    if sp and sp.get("low") is not None:  # runs that record the worst prompt
                        cell += f" (worst {sp['low']:.2f}x)"
                    speed.append(cell)
                    acc.append(fmt(a and a["value"], 2))
                key = (budget, level, model, prompts.split(" x")[0])
                if key not in latest or run > latest[key][0]:
                    latest[key] = (run, command, [budget, level, model, prompts] + speed + [" / ".join(acc)])
    kept = sorted(latest.values(), key=lambda v: (order(v[2][0]), v[0]))
    rows = [row for _, _, row in kept]
    commands = []
    for run, command, row in kept:
        date = next(r.get("date", "") for r in recs if r["run"] == run)
        line = f"- {row[0]}: `{command}` ({date})"
        if line not in commands:
            commands.append(line)
    out = md_table(["budget", "kernels", "model", "prompts", "lookup", "self", "draft", "auto",
                    "mean accepted per pass (lookup / self / draft / auto)"], rows)
    return out + ["", "Commands (date measured):"] + commands


def speculative_ceiling() -> list[str]:
    """The latest run of ceiling.py: per budget and prompt set, the most its draft model can give."""
    recs = read_results("speculative")
    run = latest_run(recs, lambda rs: any(r["metric"] == "speedup_ceiling" for r in rs))
    if run is None:
        return ["No ceiling run is recorded."]
    rs = pick(recs, run=run, metric="speedup_ceiling")
    kinds = ("best single policy", "each answer's best", "with catch-up")
    rows, notes = [], []
    for budget in unique(r["budget"] for r in rs):
        for prompts in unique(r["config"].split(", ")[0] for r in pick(rs, budget=budget)):
            cells = []
            for kind in kinds:
                r = one(rs, budget=budget, config=f"{prompts}, {kind}")
                cells.append(f"{r['value']:.2f}x (worst {r['low']:.2f}x)" if r else "-")
            rows.append([budget, rs[0]["model"], prompts] + cells)
            first = one(rs, budget=budget, config=f"{prompts}, {kinds[0]}")
            notes.append(f"- {budget}, {prompts}: {first['notes']}")
    out = md_table(["budget", "model", "prompts"] + list(kinds), rows)
    return out + ["", f"Run: {run_line(recs, run)}"] + notes


# ---- docs/export.md ---------------------------------------------------------------------------------

def export_matrix() -> list[str]:
    recs = read_results("export-matrix")
    run = latest_run(recs, lambda rs: True)
    rs = pick(recs, run=run)
    rows = []
    for model in unique(r["model"] for r in rs):
        for scheme in unique(r["config"] for r in pick(rs, model=model)):
            v = {r["metric"]: r for r in pick(rs, model=model, config=scheme)}
            rtn = "-"
            if "rtn_ppl" in v:
                of = f"{v['rtn_ppl']['notes'].split()[-1]}, " if v["rtn_ppl"].get("notes") else ""
                rtn = f"{v['rtn_ppl']['value']:.3f} ({of}{v['rtn_ppl_delta_pct']['value']:+.1f}%)"
            sp = "/".join(f"{v[f'sparsity_{lv}_ppl_delta_pct']['value']:+.0f}" for lv in (30, 50, 70)) + "%"
            fb = v["fallbacks"]
            delta = v["ppl_delta_pct"]["value"]
            delta_cell = f"{delta:+.2f}%" if abs(delta) < 1 else f"{delta:+.1f}%"
            rows.append([model, scheme, fmt(v["bundle_mib"]["value"]), f"{v['ppl_source']['value']:.3f}",
                         f"{v['ppl_exported']['value']:.3f}", delta_cell.replace("+0.00", "0.00"), rtn, sp,
                         f"{fb['value']:g}" + (f" → {fb['notes'].split()[-1]}" if fb.get("notes") else "")])
    return md_table(["model", "scheme", "bundle MiB", "ppl source", "ppl exported", "Δ",
                     "round-to-nearest, same size (Δ)", "sparsity 30/50/70% Δ", "fallbacks"], rows) + [
        "", f"Run of {run_line(recs, run)}."]


def export_time() -> list[str]:
    recs = read_results("export-time")
    whole = [r for r in recs if r.get("config") == "q4_0, defaults"]
    run = latest_run(whole, lambda rs: any(r["metric"] == "wall_s" for r in rs))
    rs = pick(whole, run=run)
    wall, cpu, load = (one(rs, metric=m) for m in ("wall_s", "cpu_s", "loadavg_1m"))
    note = one(rs, metric="wall_s").get("notes", "")
    name = f"{rs[0]['model']} {rs[0]['config']}" + (f", {note}" if note else "")
    out = md_table(["export", "wall s", "CPU s (both threads)", "load average (2 cores, shared)"],
                   [[name, fmt(wall["value"]), fmt(cpu and cpu["value"]),
                     fmt_range(load, 2, "").replace(" (", "; ").rstrip(")")]])
    out += ["", f"Run of {run_line(recs, run)}."]
    stage_run = latest_run(recs, lambda rs: any("stage" in str(r.get("config")) for r in rs))
    if stage_run:
        srs = pick(recs, run=stage_run)
        top = one(srs, config="q4_0, defaults", metric="wall_s")
        tload = one(srs, config="q4_0, defaults", metric="loadavg_1m")
        peak = one(srs, config="q4_0, defaults", metric="peak_rss_gb")
        rows = []
        for cfg in unique(r["config"] for r in srs if "stage" in str(r.get("config"))):
            rows.append([cfg.split("stage ")[1], fmt(one(srs, config=cfg, metric="wall_s")["value"]),
                         fmt(one(srs, config=cfg, metric="cpu_s")["value"])])
        peak_text = f", peak RSS {peak['value']:g} GB" if peak else ""
        out += ["", f"Stages, from the latest run that recorded them ({stage_run}: wall {top['value']:g} s, "
                    f"load {fmt_range(tload, 1, '')}{peak_text}):", ""]
        out += md_table(["stage", "wall s", "CPU s"], rows)
    return out


# ---- docs/backends.md -------------------------------------------------------------------------------

def backends() -> list[str]:
    recs = read_results("backends")
    run = latest_run(recs, lambda rs: any(r["metric"] == "size_mib"
                                          and r.get("config") in ("onnx", "executorch") for r in rs))
    rs = pick(recs, run=run)
    rows = []
    for model in unique(r["model"] for r in rs if r.get("model")):
        for target in unique(r["config"] for r in pick(rs, model=model)):
            v = {r["metric"]: r for r in pick(rs, model=model, config=target)}

            def cell(metric, digits=None):
                r = v.get(metric)
                if r is None or r["value"] is None:
                    return "—"
                return f"{r['value']:.{digits}f}" if digits is not None else str(r["value"])

            same = v.get("same_greedy_continuations")
            same_cell = f"{same['value']}/{same['notes'].split()[1]}" if same else "—"
            rows.append([model, target, cell("chunks"), cell("size_mib", 1), cell("export_s", 2),
                         cell("logit_max_abs_err"), cell("prefill_logit_max_abs_err"),
                         cell("top1_agreement_min"), same_cell, cell("mean_common_prefix_tokens"),
                         cell("prefill_tok_s", 1), cell("decode_tok_s", 1)])
    cond = one(rs, metric="conditions")
    return md_table(["model", "target", "chunks", "size MiB", "export s", "logit max abs err", "prefill err",
                     "top-1 agree (min)", "same 32-token greedy", "mean common prefix", "prefill tok/s",
                     "decode tok/s"], rows) + [
        "", f"Run of {run_line(recs, run)}" + (f" ({cond['value']})." if cond else ".")]


def kernels_side_by_side() -> list[str]:
    """The latest side_by_side.py run of each model (one run per model: each is its own locked job)."""
    recs = read_results("side-by-side")
    models = unique(r["model"] for r in recs if r.get("model"))
    latest = {m: latest_run(recs, lambda rs, m=m: any(r.get("model") == m for r in rs)) for m in models}
    if not latest:
        return ["(no side-by-side run recorded)"]
    rows, runs = [], []
    for m, run in latest.items():
        rs = pick(recs, run=run, model=m)
        runs.append(run)
        for c in unique(r["config"] for r in rs):
            v = {r["metric"]: r for r in pick(rs, config=c)}
            rows.append([m, c, fmt_range(v.get("decode_tok_s"), 1, ""),
                         fmt_range(v.get("decode_vs_llamacpp")), fmt_range(v.get("decode_vs_peer")),
                         fmt(v["prefill_tok_s"]["value"]), fmt_range(v.get("prefill_vs_llamacpp")),
                         fmt_range(v.get("prefill_vs_peer")),
                         fmt((v.get("perplexity") or {}).get("value"), 3), fmt(v["peak_rss_mb"]["value"], 0),
                         fmt(v["loadavg_1m"]["value"])])
    cond = one(recs, run=runs[-1], metric="conditions")
    # "faster peer": the faster of the llama.cpp and ExecuTorch runs of each round (runs with executorch)
    out = md_table(["model", "config", "decode tok/s (rounds' range)", "decode vs faster llama.cpp",
                    "decode vs faster peer", "prefill tok/s", "prefill vs faster llama.cpp",
                    "prefill vs faster peer", "perplexity", "peak RSS MiB", "load (1 min)"], rows)
    return out + ["", "Runs (one per model): " + "; ".join(run_line(recs, r) for r in unique(runs))
                  + (f" ({cond['value']})." if cond else ".")]


TABLES = {
    "memory-budget": {"compare": memory_compare, "agreement": memory_agreement},
    "benchmarks": {"peers": peers_side_by_side, "perplexity": peers_perplexity,
                   "decode-profile": decode_profile},
    "kernels": {"gemv": kernels_gemv, "ops": kernels_ops, "side-by-side": kernels_side_by_side},
    "speculative": {"speedup": speculative, "ceiling": speculative_ceiling},
    "export": {"matrix": export_matrix, "time": export_time},
    "backends": {"targets": backends},
}

BLOCK = re.compile(r"(<!-- results: ([\w-]+)/([\w-]+) -->\n)(.*?)(<!-- /results -->)", re.S)


def render(doc: str, name: str) -> str:
    return "\n".join(TABLES[doc][name]()) + "\n"


def sync(write: bool) -> int:
    """Compare (or replace) every marked block in docs/*.md with what render() prints."""
    stale = 0
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text(encoding="utf-8")

        def replace(m: re.Match) -> str:
            nonlocal stale
            doc, name = m.group(2), m.group(3)
            if doc not in TABLES or name not in TABLES[doc]:
                raise SystemExit(f"{path.name}: unknown results block {doc}/{name}")
            fresh = render(doc, name)
            if m.group(4) != fresh:
                stale += 1
                print(f"{path.relative_to(REPO)}: {doc}/{name} differs from the renderer", file=sys.stderr)
            return m.group(1) + fresh + m.group(5)

        new = BLOCK.sub(replace, text)
        if write and new != text:
            path.write_text(new, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("doc", nargs="?", choices=sorted(TABLES), help="doc name (docs/<doc>.md)")
    p.add_argument("--table", help="one table of the doc (default: all)")
    p.add_argument("--list", action="store_true", help="list docs and their tables")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a doc's marked table differs from this output")
    p.add_argument("--write", action="store_true", help="rewrite the marked tables in docs/*.md")
    args = p.parse_args(argv)
    if args.list:
        for doc, tables in TABLES.items():
            print(f"{doc}: {', '.join(tables)}")
        return 0
    if args.check or args.write:
        stale = sync(write=args.write)
        if args.write:
            print(f"{stale} block(s) rewritten", file=sys.stderr)
            return 0
        return 1 if stale else 0
    if not args.doc:
        p.error("name a doc, or use --list / --check / --write")
    names = [args.table] if args.table else list(TABLES[args.doc])
    for name in names:
        if name not in TABLES[args.doc]:
            p.error(f"{args.doc} has no table {name!r}; it has: {', '.join(TABLES[args.doc])}")
    for i, name in enumerate(names):
        if len(names) > 1:
            print(("\n" if i else "") + f"<!-- results: {args.doc}/{name} -->")
        print(render(args.doc, name), end="")
        if len(names) > 1:
            print("<!-- /results -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
