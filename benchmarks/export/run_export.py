"""One `edgeflash export` with default options, measured from outside, optionally in a memory cgroup.

    python benchmarks/export/run_export.py MODEL.gguf --out OUT [--cgroup-limit 6G] [--then-generate 1GB]

Runs `/usr/bin/time -v edgeflash export MODEL -o OUT --force --json` (inside a new cgroup v1 memory
controller group with the given limit, page cache counted, when --cgroup-limit is set), and with
--then-generate runs `edgeflash generate -m OUT --memory-budget BUDGET --json` in the same group.
Appends one JSON record (wall, CPU, peak RSS, bundle and source bytes, the export's own report and
timings, the generation's statistics, the load average) to --results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from edgeflash.base.sizes import parse_size


def cgroup_dir(name: str, limit: int) -> Path:
    line = next(x for x in Path("/proc/self/cgroup").read_text().splitlines() if ":memory:" in x)
    root = Path("/sys/fs/cgroup/memory") / line.split(":", 2)[2].lstrip("/") / name
    root.mkdir(exist_ok=True)
    (root / "memory.limit_in_bytes").write_text(str(limit))
    try:
        (root / "memory.swappiness").write_text("0")
    except OSError:
        pass
    return root


def run(cmd: list[str], cgroup: Path | None) -> subprocess.CompletedProcess:
    if cgroup is not None:  # the shell joins the group, then becomes the measured command
        cmd = ["bash", "-c", f'echo $$ > {cgroup}/cgroup.procs; exec "$@"', "bash", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def time_v(stderr: str) -> dict:
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", stderr).group(1)
    seconds = sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall.split(":"))))
    cpu = sum(float(re.search(rf"{k} time \(seconds\): (\S+)", stderr).group(1)) for k in ("User", "System"))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr).group(1)) * 1024
    return {"wall_s": round(seconds, 1), "cpu_s": round(cpu, 1), "peak_rss_bytes": rss}


def to_results(record: dict, command: str) -> None:
    """The run as benchmarks/results records (export-scale), one per value."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from records import new_run_id, record_values

    report = record.get("report") or {}
    ppl = report.get("perplexity") or {}
    values = {"wall_s": record["export"]["wall_s"], "cpu_s": record["export"]["cpu_s"],
              "peak_rss_bytes": record["export"]["peak_rss_bytes"], "bundle_bytes": record.get("bundle_bytes"),
              "source_bytes": record.get("source_bytes"), "load_before": round(record["load_before"], 2),
              "load_after": round(record["load_after"], 2), "perplexity:source": ppl.get("source"),
              "perplexity:exported": ppl.get("exported"), "delta_pct": ppl.get("delta_pct"),
              "cgroup_max_usage_bytes": record.get("cgroup_max_usage_bytes")}
    gen = record.get("generate") or {}
    if gen.get("stats"):
        values["generate:decode_tok_s"] = gen["stats"].get("decode_tok_s")
        values["generate:peak_rss_bytes"] = gen["peak_rss_bytes"]
    config = "defaults" + (f", memory cgroup {record['cgroup_limit']}" if record.get("cgroup_limit") else "") + (
        f", then generate --memory-budget {gen['budget']}" if gen else "")
    when = datetime.datetime.fromtimestamp(record["time"], datetime.timezone.utc)
    record_values(new_run_id(when), Path(record["model"]).stem, config, values, command,
                  notes=(report.get("eval") or {}).get("text"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cgroup-limit", default=None, help="e.g. 6G: run inside a memory cgroup of this limit")
    p.add_argument("--then-generate", default=None, metavar="BUDGET", help="then generate under this memory budget")
    p.add_argument("--results", type=Path, default=Path("bench-out/exports.jsonl"))
    args, export_args = p.parse_known_args()  # anything else is passed to `edgeflash export`
    edgeflash = str(Path(sys.executable).parent / "edgeflash")
    cgroup = cgroup_dir(f"export{os.getpid()}", parse_size(args.cgroup_limit)) if args.cgroup_limit else None
    record: dict = {"model": args.model, "machine": platform.node(), "time": time.time(),
                    "cgroup_limit": args.cgroup_limit, "load_before": os.getloadavg()[0],
                    "source_bytes": Path(args.model).stat().st_size if Path(args.model).exists() else None}
    proc = run(["/usr/bin/time", "-v", edgeflash, "export", args.model, "-o", str(args.out), "--force", "--quiet",
                "--json", *[a for a in export_args if a != "--"]], cgroup)
    record["exit_status"] = proc.returncode
    record["export"] = time_v(proc.stderr)
    if proc.returncode == 0:
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        record["bundle_bytes"] = summary["weights_bytes"]
        record["report"] = {k: summary["report"].get(k) for k in ("eval", "perplexity", "timings_s", "total_s",
                                                                    "peak_rss_bytes", "size_by_role")}
    else:
        record["stderr"] = proc.stderr[-3000:]
    if args.then_generate and proc.returncode == 0:
        gen = run(["/usr/bin/time", "-v", edgeflash, "generate", "-m", str(args.out), "-p",
                   "def fibonacci(n):", "-n", "32", "--memory-budget", args.then_generate, "--json"], cgroup)
        record["generate"] = {"budget": args.then_generate, "exit_status": gen.returncode, **time_v(gen.stderr)}
        if gen.returncode == 0:
            record["generate"]["stats"] = json.loads(gen.stdout.strip().splitlines()[-1])
        else:
            record["generate"]["stderr"] = gen.stderr[-3000:]
    if cgroup is not None:
        record["cgroup_max_usage_bytes"] = int((cgroup / "memory.max_usage_in_bytes").read_text())
        record["cgroup_failcnt"] = int((cgroup / "memory.failcnt").read_text())
    record["load_after"] = os.getloadavg()[0]
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("a") as f:
        f.write(json.dumps(record) + "\n")
    to_results(record, " ".join(sys.argv))
    print(json.dumps(record, indent=1))
    if cgroup is not None:
        cgroup.rmdir()


if __name__ == "__main__":
    main()
