"""How much memory an export will take at its peak, and how much this machine can give it.

The streaming export holds one layer's float32 weights, the calibration activations and the
statistics computed from them, a row chunk of the largest table, and at the end one model on the
native engine for evaluation (its weights memory-mapped, so they count once they are read).
`expected_peak` adds these up from the model's shape; the export prints it before it starts and
refuses, in one line, when the machine has less available (MemAvailable, or the memory cgroup's
limit less what the cgroup already holds, whichever is lower).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edgeflash.runtime.source import ModelSource

BASE_BYTES = 420 * 2**20  # interpreter, numpy, torch and the kernels, imported (measured: 380-410 MiB)
TABLE_CHUNK_VALUES = 1 << 22  # values of a large table (embedding, head) quantized at a time


@dataclass
class PeakEstimate:
    total: int
    parts: dict[str, int]

    def describe(self) -> str:
        mib = {k: f"{v / 2**20:.0f}" for k, v in self.parts.items() if v}
        return f"{self.total / 2**30:.2f} GiB (" + ", ".join(f"{k} {v} MiB" for k, v in mib.items()) + ")"


def expected_peak(source: ModelSource, calibration_tokens: int, window_tokens: int, eval_bytes: int,
                  predictor_rank: int, tokenizer_bytes: int = 0) -> PeakEstimate:
    """`eval_bytes`: the larger of the two models evaluated on the engine (0 = no evaluation)."""
    spec = source.spec
    d, f, t = spec.d_model, spec.d_ff, calibration_tokens
    layer_values = 0
    for name, tensor in source.tensors.items():
        if name.startswith("blk.0."):
            layer_values += tensor.rows * tensor.cols if len(tensor.shape) > 1 else tensor.cols
    if "blk.0.ffn_arena" in source.tensors:
        layer_values += 3 * d * f
    hidden = t * d * 4
    # per layer: float weights (plus a copy while quantizing), gate pre-activations (f16) and
    # the statistics over them (|act| f32, the activity mask, a partition copy), FFN inputs (f16)
    stats = t * f * (2 + 4 + 1 + 4) + (t * d * 2 if predictor_rank else 0)
    window = min(window_tokens, t) * (f * 4 * 4 + d * 4 * 8)  # one window's temporaries per worker
    calibration = layer_values * 4 * 2 + hidden + stats + 2 * window
    table = TABLE_CHUNK_VALUES * 4 * 3
    engine = eval_bytes + (64 * spec.vocab_size * 4 * 3 + 64 * 8 * d * 4) if eval_bytes else 0
    parts = {"runtime": BASE_BYTES, "tokenizer": tokenizer_bytes,
             "calibration": calibration if calibration >= engine else 0,
             "evaluation": engine if engine > calibration else 0, "table chunk": table}
    return PeakEstimate(sum(parts.values()), parts)


def available_memory() -> tuple[int, str]:
    """(bytes this process can still use, where that limit comes from)."""
    avail, where = _meminfo_available(), "MemAvailable"
    cgroup = _cgroup_available()
    if cgroup is not None and cgroup[0] < avail:
        return cgroup
    return avail, where


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _cgroup_available() -> tuple[int, str] | None:
    """Limit minus what the cgroup holds that it cannot drop (page cache can be reclaimed)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            root = Path("/sys/fs/cgroup") / path.lstrip("/")
            got = _read_v2(root)
        elif "memory" in controllers.split(","):
            root = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            got = _read_v1(root)
        else:
            continue
        if got is not None:
            return got
    return None


def _read_v1(root: Path) -> tuple[int, str] | None:
    try:
        limit = int((root / "memory.limit_in_bytes").read_text())
        usage = int((root / "memory.usage_in_bytes").read_text())
        stat = _stat(root / "memory.stat")
    except (OSError, ValueError):
        return None
    if limit >= 1 << 60:
        return None
    cache = stat.get("total_cache", stat.get("cache", 0))
    return max(0, limit - usage + cache), f"memory cgroup {root} (limit {limit / 2**30:.2f} GiB)"


def _read_v2(root: Path) -> tuple[int, str] | None:
    try:
        text = (root / "memory.max").read_text().strip()
        if text == "max":
            return None
        limit = int(text)
        usage = int((root / "memory.current").read_text())
        stat = _stat(root / "memory.stat")
    except (OSError, ValueError):
        return None
    return max(0, limit - usage + stat.get("file", 0)), f"memory cgroup {root} (limit {limit / 2**30:.2f} GiB)"


def _stat(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def rss_peak_bytes() -> int:
    """This process's peak resident set so far (VmHWM)."""
    try:
        for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
