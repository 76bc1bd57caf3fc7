"""Run each mutated model in its own `edgeflash` process and sort what happens into classes.

Every case is run as `edgeflash generate` (plain and under a memory budget) and `edgeflash
inspect`, each with a timeout and a cap on its address space (a mutated size must not take the
machine's memory). The classes:

- clean_error: exit status 2 and exactly one line, `edgeflash: error: ...`, on stderr;
- ran: exit status 0 (for a SAME mutation, generate printed what the unmutated model prints);
- failures: traceback, hang (the timeout passed), signal, exit_code (any other status),
  messy_error (status 2 but not one clean line), raw_bytes (control characters, escape
  sequences or invalid UTF-8 on stderr, or on inspect's stdout), not_rejected (an invalid file
  ran), corrupted_output (a file that must run as the original printed something else).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bundle_mutator import BundleModel, BundleMutation, mutate_bundle
from gguf_image import GGUFImage
from gguf_mutator import REJECT, SAME, Model, Mutation, mutate

PROMPT = "The capital of France is"
MAX_TOKENS = 6
ADDRESS_SPACE_LIMIT = 8 << 30  # bytes of virtual memory a run may map
FAILURE_CLASSES = ("traceback", "hang", "signal", "exit_code", "messy_error", "raw_bytes", "not_rejected",
                   "corrupted_output")
RUN_KINDS = ("generate", "generate_budget", "inspect")


@dataclass
class Target:
    """A model to mutate and how to run it."""

    name: str
    path: Path
    budget: str  # --memory-budget for the budgeted run

    def argv(self, run: str, model: Path) -> list[str]:
        if run == "inspect":
            return ["inspect", str(model)]
        argv = ["generate", "-m", str(model), "-p", PROMPT, "-n", str(MAX_TOKENS), "--temp", "0"]
        return argv + (["--memory-budget", self.budget] if run == "generate_budget" else [])


@dataclass
class BundleTarget:
    """A bundle directory to mutate, run plain, budgeted and in sparse mode, and inspected."""

    name: str
    path: Path
    budget: str
    sparsity: float = 0.5

    def argv(self, run: str, model: Path) -> list[str]:
        if run == "inspect":
            return ["inspect", str(model)]
        argv = ["generate", "-m", str(model), "-p", PROMPT, "-n", str(MAX_TOKENS), "--temp", "0"]
        if run in ("generate_budget", "generate_sparse"):
            argv += ["--memory-budget", self.budget]
        if run == "generate_sparse":
            argv += ["--ffn-sparsity", str(self.sparsity)]
        return argv


BUNDLE_RUN_KINDS = ("generate", "generate_budget", "generate_sparse", "inspect")


@dataclass
class Outcome:
    target: str
    case: int
    seed: int
    op: str
    detail: str
    expect: str
    run: str
    klass: str
    status: int | None
    seconds: float
    stderr: str = ""  # the last lines, escaped
    matches_baseline: bool | None = None  # stdout equals the unmutated model's (None: no baseline)

    @property
    def failed(self) -> bool:
        return self.klass in FAILURE_CLASSES

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Harness:
    edgeflash: str  # the command to run (the path of an installed `edgeflash` script)
    work_dir: Path
    timeout: float = 120.0
    runs: tuple[str, ...] = RUN_KINDS
    rotate: bool = False  # run each case once, taking `runs` in turn (a quicker pass over more cases)
    baselines: dict[tuple[str, str], bytes] = field(default_factory=dict)
    # run `edgeflash` as forked children of a process that imported it once (fork_runner.py), with
    # the same session, address-space cap, timeout and output capture, instead of a new interpreter.
    # A child's RSS before loading leaves out the imports' pages it shares with that process until
    # it touches them, so a budgeted load counts more as its fixed cost: its plan is as cautious or
    # more.
    fork: bool = False
    _runners: list = field(default_factory=list)
    _local: threading.local = field(default_factory=threading.local)

    def _execute(self, argv: list[str]) -> tuple[int | None, bytes, bytes, float]:
        if self.fork:
            runner = getattr(self._local, "runner", None)
            if runner is None:
                from fork_runner import ForkRunner

                runner = self._local.runner = ForkRunner(self.work_dir)
                self._runners.append(runner)
            return runner.run(argv, self.timeout, ADDRESS_SPACE_LIMIT)
        start = time.monotonic()
        # prlimit caps the run's address space (a fork hook would not be safe beside the worker threads).
        command = ["prlimit", f"--as={ADDRESS_SPACE_LIMIT}", "--", self.edgeflash, *argv]
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            out, err = proc.communicate(timeout=self.timeout)
            status: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            status = None
        return status, out, err, time.monotonic() - start

    def baseline(self, target: Target) -> None:
        """The unmutated model's output for each run; a run that fails here is a broken setup."""
        for run in self.runs:
            status, out, err, _ = self._execute(target.argv(run, target.path))
            if status != 0 and run != "inspect":
                raise RuntimeError(f"the unmutated {target.name} fails its {run} run: {err.decode()[-2000:]}")
            self.baselines[(target.name, run)] = out

    def run_case(self, target: Target | BundleTarget, model: Model | BundleModel, case: int,
                 seed: int) -> list[Outcome]:
        case_dir = Path(tempfile.mkdtemp(prefix=f"case{case}-", dir=self.work_dir))
        try:
            if isinstance(model, BundleModel):
                mutation = mutate_bundle(model, seed)
                path = _copy_bundle(model.path, case_dir / "bundle")
                mutation.apply(path)
            else:
                mutation = mutate(model, seed)
                path = _materialize(mutation, model, target, case_dir)
            outcomes = []
            for run in (self.runs[case % len(self.runs)],) if self.rotate else self.runs:
                status, out, err, seconds = self._execute(target.argv(run, path))
                baseline = self.baselines.get((target.name, run))
                klass = classify(run, mutation, status, out, err, baseline)
                expect = mutation.expect_for(run) if isinstance(mutation, BundleMutation) else mutation.expect
                outcomes.append(Outcome(target.name, case, seed, mutation.op, mutation.detail, expect, run,
                                        klass, status, round(seconds, 3), _tail(err),
                                        None if baseline is None else out == baseline))
            return outcomes
        finally:
            shutil.rmtree(case_dir, ignore_errors=True)

    def run(self, target: Target | BundleTarget, seeds: Iterable[tuple[int, int]], workers: int = 1,
            on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        """Run every (case number, seed) on `target`; `on_outcome` sees each result as it comes."""
        model = BundleModel(target.path) if isinstance(target, BundleTarget) else Model(GGUFImage.read(target.path))
        results: list[Outcome] = []
        try:
            if (target.name, self.runs[0]) not in self.baselines:
                self.baseline(target)
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for outcomes in pool.map(lambda cs: self.run_case(target, model, *cs), seeds):
                    for outcome in outcomes:
                        results.append(outcome)
                        if on_outcome is not None:
                            on_outcome(outcome)
        finally:
            while self._runners:
                self._runners.pop().close()
            self._local = threading.local()
        return results


def _materialize(mutation: Mutation, model: Model, target: Target, case_dir: Path) -> Path:
    """The mutated model on disk (a file, or the special file the mutation asks for)."""
    path = case_dir / "model.gguf"
    special = mutation.special
    if special is None:
        return mutation.image.write(path)
    if special == "fifo":
        os.mkfifo(path)
    elif special in ("dev_zero", "dev_urandom", "dev_null"):
        path.symlink_to("/dev/" + special[4:])
    elif special == "directory":
        path.mkdir()
    elif special == "symlink_loop":
        path.symlink_to(path)
    elif special == "dangling_symlink":
        path.symlink_to(case_dir / "absent.gguf")
    elif special == "empty":
        path.touch()
    elif special == "symlink_to_model":
        path.symlink_to(target.path.resolve())
    elif special == "sparse_tail":  # the model followed by 4 GiB of holes
        image = model.image.clone()
        image.append = b"\0"
        image.write(path)
        os.truncate(path, path.stat().st_size + (4 << 30))
    else:
        raise ValueError(special)
    return path


def _copy_bundle(source: Path, dest: Path) -> Path:
    """A private copy of a bundle directory (its regular files) to mutate."""
    dest.mkdir()
    for item in source.iterdir():
        if item.is_file():
            with open(item, "rb") as src, open(dest / item.name, "wb") as dst:
                size = os.fstat(src.fileno()).st_size
                done = 0
                while done < size:
                    n = os.sendfile(dst.fileno(), src.fileno(), done, size - done)
                    if n == 0:
                        break
                    done += n
    return dest


def has_raw_bytes(data: bytes, allow: str = "\n") -> bool:
    """Control characters (C0 except `allow`, DEL, C1), format characters such as bidirectional
    overrides, or bytes that are not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return any(ch not in allow and (unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn")) for ch in text)


def classify(run: str, mutation: Mutation | BundleMutation, status: int | None, out: bytes, err: bytes,
             baseline: bytes | None) -> str:
    if status is None:
        return "hang"
    if status < 0:
        return "signal"
    text = err.decode("utf-8", errors="replace")
    if "Traceback (most recent call last)" in text:
        return "traceback"
    if has_raw_bytes(err) or (run == "inspect" and has_raw_bytes(out, allow="\n")):
        return "raw_bytes"
    if status == 2:
        lines = text.splitlines()
        if len(lines) != 1 or not lines[0].startswith("edgeflash: error: "):
            return "messy_error"
        return "clean_error"
    if status != 0:
        return "exit_code"
    expect = mutation.expect_for(run) if isinstance(mutation, BundleMutation) else mutation.expect
    if expect == REJECT:
        return "not_rejected"
    if expect == SAME and run != "inspect" and baseline is not None and out != baseline:
        return "corrupted_output"
    return "ran"


def _tail(err: bytes, lines: int = 3) -> str:
    text = err.decode("utf-8", errors="backslashreplace")
    return "\n".join(text.splitlines()[-lines:]).encode("unicode_escape").decode()[:600]


def summarize(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    """Counts of each class per target and run: {"smollm2-135m/generate": {"clean_error": 812, ...}}."""
    table: dict[str, Counter] = {}
    for o in outcomes:
        table.setdefault(f"{o.target}/{o.run}", Counter())[o.klass] += 1
    return {key: dict(sorted(counts.items())) for key, counts in sorted(table.items())}


def scratch_dir() -> Path:
    """Where mutated files go: memory-backed when the machine has /dev/shm (each case writes a
    full copy of the model, which a disk would pay for)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="edgeflash-fuzz-", dir=base))
