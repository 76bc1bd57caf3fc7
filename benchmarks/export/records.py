"""Export measurements as benchmarks/results records (kind `export-scale`): one record per value.

    from records import record_export, record_perplexity
    record_export(run, model, config, {"wall_s": 120.3, "cpu_s": 180.1, "peak_rss_bytes": ...}, command, notes)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "results"))
from record import append_results, new_run_id

KIND = "export-scale"
UNITS = {"wall_s": "s", "cpu_s": "s", "peak_rss_bytes": "bytes", "bundle_bytes": "bytes", "source_bytes": "bytes",
         "cgroup_max_usage_bytes": "bytes", "load_before": "load", "load_after": "load", "decode_tok_s": "tok/s",
         "prefill_tok_s": "tok/s", "perplexity": "ppl", "delta_pct": "%", "ratio": "x"}


def record_values(run: str, model: str, config: str, values: dict[str, float | None], command: str,
                  notes: str | None = None) -> None:
    records = []
    for metric, value in values.items():
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            continue  # not measured (a perplexity whose logits were not finite)
        unit = UNITS.get(metric, UNITS.get(metric.split(":")[0], ""))
        records.append({"run": run, "model": model, "config": config, "metric": metric, "value": value,
                        "unit": unit, "command": command, **({"notes": notes} if notes else {})})
    append_results(KIND, records)


__all__ = ["KIND", "new_run_id", "record_values"]
