"""Whether an EAGLE-style draft head trained on the CPU pays: how often it guesses the target.

    python benchmarks/speculative/feature_head.py                 # Qwen2.5-Coder-1.5B, about 25 minutes
    python benchmarks/speculative/feature_head.py --answers 72 --corpus-tokens 40000 --record

The head predicts the target's next final-normed hidden state from its current one and the token
just chosen (f_t, x_{t+1}) -> f_{t+1}, then the target's own head picks the token: a linear layer
over both, one SwiGLU block, an RMS norm (about 7-14M weights; a draft token would read a few
percent of what a target step reads). Training text, read by the target (teacher forcing) for its
hidden states and its own next token at every position (`Engine.hidden`):
- `answers`: the draft model's greedy answers to the MT-Bench questions the benchmark does not ask
  (first turns), in the chat format: text like the benchmark's answers;
- `corpus`: windows of the calibration corpus (code text for a code model), what an export has.
Loss: regression on f_{t+1} plus the cross-entropy of the target's next token against the head
rows of the batch's tokens and a sample of others; a little noise on the inputs.
Reported: top-1 agreement with the target along its greedy answers to the benchmark's MT-Bench
questions at draft depths 1-4 (each depth given that the ones before it were right), the same on
training text (how far it generalizes), and agreement by the head's own confidence. The draft
model's agreement on the same answers is `draft_agreement.py`'s. `--record` appends metric
`feature_head_top1` (depth 1) to benchmarks/results/speculative.jsonl.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import edgeflash as ef

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "results"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import mtbench_questions
from record import append_results, new_run_id

WINDOW = 512  # tokens per corpus window
BATCH = 512
NEGATIVES = 1024  # random head rows besides the batch's own tokens in the cross-entropy
CE_WEIGHT = 1.0
INPUT_NOISE = 0.05  # of the features' RMS
DEPTHS = 4
CONFIDENCE_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.95, 1.01)


@dataclass
class Features:
    hidden: np.ndarray  # f32 [positions, d_model], final-normed (divided by a scale once joined)
    tokens: np.ndarray  # int64 [positions]
    best: np.ndarray  # int64 [positions]: the target's most likely token after each position
    pairs: np.ndarray  # positions t whose t+1 is in the same text, from its first scored position on
    ends: np.ndarray  # for each pair, the end of its text


def read(engine, texts: list[tuple[list[int], int]]) -> Features:
    """Hidden states and next tokens of the target along each (ids, first scored position)."""
    d, native = engine.spec.d_model, engine._engine
    hidden, tokens, best, pairs, ends, at = [], [], [], [], [], 0
    for ids, first in texts:
        engine.reset()
        ids = np.asarray(ids[:engine.context_length], dtype=np.int32)
        for s in range(0, len(ids), engine.max_batch):
            chunk = ids[s:s + engine.max_batch]
            n = len(chunk)
            out = np.empty(n, dtype=np.int32)
            native.forward(chunk, np.arange(s, s + n, dtype=np.int32), None, np.arange(n, dtype=np.int32), out)
            h = np.empty((n, d), dtype=np.float32)
            native.hidden(h)
            hidden.append(h)
            best.append(out)
        tokens.append(ids)
        pairs.append(np.arange(at + max(0, first - 1), at + len(ids) - 1))
        ends.append(np.full(len(pairs[-1]), at + len(ids)))
        at += len(ids)
    engine.reset()
    cat = lambda parts, dtype: np.concatenate(parts).astype(dtype)
    return Features(cat(hidden, np.float32), cat(tokens, np.int64), cat(best, np.int64), cat(pairs, np.int64),
                    cat(ends, np.int64))


def joined(parts: list[Features], scale: float) -> Features:
    """One set of several, its hidden states divided by `scale`."""
    offsets = np.cumsum([0] + [len(f.tokens) for f in parts[:-1]])
    return Features(np.concatenate([f.hidden for f in parts]) / scale, np.concatenate([f.tokens for f in parts]),
                    np.concatenate([f.best for f in parts]), np.concatenate([f.pairs + o for f, o in zip(parts, offsets)]),
                    np.concatenate([f.ends + o for f, o in zip(parts, offsets)]))


def network(d: int, ffn: int):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.w_in = nn.Linear(2 * d, d)
            self.w_gate_up = nn.Linear(d, 2 * ffn, bias=False)
            self.w_down = nn.Linear(ffn, d, bias=False)
            self.g_out = nn.Parameter(torch.ones(d))

        def forward(self, feature, embedding):
            e = embedding * torch.rsqrt(embedding.pow(2).mean(-1, keepdim=True) + 1e-6)
            z = self.w_in(torch.cat([feature, e], -1))
            gate, up = self.w_gate_up(z).chunk(2, dim=-1)
            z = z + self.w_down(F.silu(gate) * up)
            return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6) * self.g_out

    return Head()


def train(train: Features, scale: float, embedding, head, *, ffn: int, epochs: int, weight_decay: float,
          seed: int = 0):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    hidden = torch.from_numpy(train.hidden)
    used = np.unique(np.concatenate([train.tokens, train.best]))
    net = network(hidden.shape[1], ffn)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=weight_decay)
    per_epoch = max(1, len(train.pairs) // BATCH)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=epochs * per_epoch, pct_start=0.05)
    tokens, best = torch.from_numpy(train.tokens), torch.from_numpy(train.best)
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(train.pairs))
        for b in range(per_epoch):
            t = order[b * BATCH:(b + 1) * BATCH]
            estimate = net(hidden[t] + INPUT_NOISE * torch.randn(len(t), hidden.shape[1]), embedding[tokens[t + 1]])
            label = best[t + 1]
            candidates = torch.unique(torch.cat([label, torch.from_numpy(rng.choice(used, NEGATIVES))]))
            logits = (estimate * scale) @ head[candidates].T
            loss = F.smooth_l1_loss(estimate, hidden[t + 1]) + \
                CE_WEIGHT * F.cross_entropy(logits, torch.searchsorted(candidates, label))
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
    return net


def agreement(net, data: Features, scale: float, embedding, head, limit: int = 2000) -> tuple[list[float], list[tuple]]:
    """Top-1 agreement by depth (given the depths before it were right) over the whole vocabulary,
    and (share, agreement) of the first guesses by the head's confidence."""
    import torch

    t = torch.from_numpy(data.pairs[:limit])
    ends = torch.from_numpy(data.ends[:limit])
    best = torch.from_numpy(data.best)
    by_depth, bins = [], []
    with torch.no_grad():
        f, x = torch.from_numpy(data.hidden)[t], torch.from_numpy(data.tokens)[t + 1]
        alive = torch.ones(len(t), dtype=torch.bool)
        for depth in range(DEPTHS):
            f = net(f, embedding[x])
            probs = torch.softmax((f * scale) @ head.T, dim=-1)
            confidence, x = probs.max(-1)
            position = t + 1 + depth
            alive &= position < ends
            right = alive & (x == best[position.clamp(max=len(best) - 1)])
            by_depth.append(round(right.sum().item() / max(1, alive.sum().item()), 3))
            if depth == 0:
                for lo, hi in zip(CONFIDENCE_BINS[:-1], CONFIDENCE_BINS[1:]):
                    s = (confidence >= lo) & (confidence < hi)
                    bins.append((lo, round(s.float().mean().item(), 3),
                                 round(right[s].float().mean().item(), 3) if s.any() else None))
            alive = right
    return by_depth, bins


def main() -> int:
    from edgeflash.export.corpus import calibration_text, code_calibration_text, is_code_model
    from edgeflash.export.text import token_windows
    from edgeflash.runtime.speculative.draft_model import find_draft_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--questions", type=int, default=8, help="benchmark questions (held out; as compare.py asks them)")
    p.add_argument("--tokens", type=int, default=64, help="greedy answer tokens per benchmark question")
    p.add_argument("--answers", type=int, default=72, help="other MT-Bench questions the draft model answers for training")
    p.add_argument("--answer-tokens", type=int, default=120)
    p.add_argument("--corpus-tokens", type=int, default=40_000)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--record", action="store_true")
    args = p.parse_args()
    import torch

    torch.set_num_threads(2)
    started = time.perf_counter()
    target = ef.load(args.model, kv_cache="q8_0", context_length=1024)
    engine, tok = target.engine, target.tokenizer
    asked = mtbench_questions(args.questions)
    held_out = []
    for q in asked:
        ids = target.chat_prompt([{"role": "user", "content": q}])
        engine.reset()
        held_out.append((list(ids) + list(target.generate(ids, max_tokens=args.tokens).tokens), len(ids)))
    from compare import MTBENCH_QUESTIONS

    others = [q for q in mtbench_questions(MTBENCH_QUESTIONS) if q not in asked][:args.answers]
    answers = []
    draft_path = find_draft_model(target.source)
    if draft_path is not None and others:
        draft = ef.load(draft_path, kv_cache="q8_0", context_length=1024)
        for q in others:
            ids = draft.chat_prompt([{"role": "user", "content": q}])
            draft.engine.reset()
            answers.append((list(ids) + list(draft.generate(ids, max_tokens=args.answer_tokens).tokens), 0))
        del draft
    code = is_code_model(Path(str(engine.source.path)).name)
    text = code_calibration_text() if code else calibration_text()
    corpus = [(ids, 0) for ids in token_windows(tok, text, args.corpus_tokens, WINDOW, "--corpus-tokens")]
    print(f"texts read: {len(held_out)} benchmark answers, {len(answers)} draft-model answers, "
          f"{len(corpus)} corpus windows ({time.perf_counter() - started:.0f} s)", flush=True)

    spec = engine.spec
    table = engine.source.tensors["token_embd.weight"]
    head_tensor = engine.source.tensors["token_embd.weight" if spec.tied_embeddings else "output.weight"]
    embedding = torch.from_numpy(table.dequantize())
    head = embedding if head_tensor is table else torch.from_numpy(head_tensor.dequantize())
    read_answers, read_corpus = read(engine, answers) if answers else None, read(engine, corpus)
    scale = float(np.sqrt(np.mean(read_corpus.hidden[read_corpus.pairs] ** 2)))
    evaluation = joined([read(engine, held_out)], scale)
    sets = {"answers+corpus": [read_answers, read_corpus], "corpus": [read_corpus]}
    if not answers:
        del sets["answers+corpus"]
    run, records, rows = new_run_id(), [], []
    command = "python benchmarks/speculative/feature_head.py " + " ".join(sys.argv[1:])
    for name, parts in sets.items():
        training = joined(parts, scale)
        t0 = time.perf_counter()
        net = train(training, scale, embedding, head, ffn=args.ffn, epochs=args.epochs,
                    weight_decay=args.weight_decay)
        seconds = time.perf_counter() - t0
        heldout_depths, bins = agreement(net, evaluation, scale, embedding, head)
        train_depths, _ = agreement(net, training, scale, embedding, head)
        rows.append((name, len(training.pairs), seconds, heldout_depths, train_depths, bins))
        records.append({"run": run, "model": args.model, "config": f"feature head, ffn {args.ffn}, trained on {name}",
                        "metric": "feature_head_top1", "value": heldout_depths[0], "command": command.strip(),
                        "notes": f"{len(training.pairs)} training positions, {args.epochs} epochs in {seconds:.0f} s; "
                                 f"held-out depths 1-{DEPTHS}: {heldout_depths}; on its training text: "
                                 f"{train_depths}; {len(evaluation.pairs)} MT-Bench answer positions"})
    print(f"{args.model}: agreement with the target's greedy answers to {len(asked)} MT-Bench questions")
    print("| trained on | positions | train s | depth 1 | 2 | 3 | 4 | depth 1 on its training text |")
    print("|---|---|---|---|---|---|---|---|")
    for name, n, seconds, held, seen, _ in rows:
        print(f"| {name} | {n} | {seconds:.0f} | " + " | ".join(f"{v:.3f}" for v in held) + f" | {seen[0]:.3f} |")
    print("\nfirst guesses by the head's confidence (held out, " + rows[0][0] + "):")
    print("| confidence from | share | agreement |")
    print("|---|---|---|")
    for lo, share, right in rows[0][5]:
        print(f"| {lo:.2f} | {share:.3f} | {'-' if right is None else f'{right:.3f}'} |")
    if args.record:
        append_results("speculative", records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
