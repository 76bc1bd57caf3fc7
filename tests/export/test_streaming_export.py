"""The export streams: a 24-layer random model (456 MB in float32, 121 MB as its q8_0 GGUF) exports
with a peak far below its float32 size, bounded by one layer and one chunk of its largest table,
and the printed estimate of the peak holds."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy, torch  # noqa: F401  (the baseline holds what every export imports)
    import edgeflash.export.pipeline  # noqa: F401
    from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes, reset_peak_rss
    from edgeflash.export import export
    from edgeflash.export.peak_memory import expected_peak
    from edgeflash.export.sources import load_source
    src, out = sys.argv[1], sys.argv[2]
    options = dict(calibration_tokens=256, window_tokens=128, predictor_rank=16)
    estimate = expected_peak(load_source(src), options["calibration_tokens"], options["window_tokens"], 0,
                             options["predictor_rank"]).total
    reset_peak_rss()
    before = current_rss_bytes()
    r = export(src, out, quant="q4_0", eval_tokens=0, top_tokens=256, frequency_chars=20000, progress=False,
               **options)
    print(json.dumps({"peak_over_baseline": peak_rss_bytes() - before, "peak": peak_rss_bytes(),
                      "estimate": estimate, "bundle_bytes": r.report["bundle_bytes"]}))
""")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, smollm_path) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf", smollm_path)


def test_streaming_export_peak_stays_near_one_layer(tiny_gguf, tmp_path):
    from edgeflash.export.peak_memory import TABLE_CHUNK_VALUES
    from edgeflash.runtime.sources import open_model

    model = open_model(tiny_gguf)
    spec = model.spec
    layer_f32 = 4 * sum(t.rows * t.cols for n, t in model.tensors.items() if n.startswith("blk.0."))
    model_f32 = 4 * sum(t.rows * t.cols for t in model.tensors.values())
    bound = 4 * layer_f32 + 4 * 4 * TABLE_CHUNK_VALUES + 64 * 2**20
    assert model_f32 > 2 * bound  # loading the model in float32 would not fit under the bound
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_gguf), str(tmp_path / "bundle")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{spec.n_layers} layers: peak over baseline {out['peak_over_baseline'] / 2**20:.0f} MiB, bound "
          f"{bound / 2**20:.0f} MiB, float32 model {model_f32 / 2**20:.0f} MiB")
    assert out["peak_over_baseline"] <= bound
    assert out["peak"] <= out["estimate"]  # the estimate printed before the export is an upper bound

    import edgeflash as ef

    m = ef.load(tmp_path / "bundle")
    assert "blk.0.ffn_arena" in m.source.tensors and "blk.0.ffn_gate.weight" not in m.source.tensors
    assert len(m.generate("Hello", max_tokens=4).tokens) == 4
