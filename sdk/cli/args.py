"""Argument parsing shared by the subcommands: one-line errors, typed values, common options."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default="default",
                   help="GGUF file, bundle directory, Hugging Face directory, or an alias: default "
                        "(Gemma 3 270M), gemma3-270m, smollm2-135m (default: %(default)s)")
    p.add_argument("-t", "--threads", type=positive_int, default=2, help="CPU threads (default: %(default)s)")
    p.add_argument("--engine", choices=["auto", "native", "reference"], default="auto",
                   help="auto picks the fastest available; reference is the numpy oracle (default: %(default)s)")
    p.add_argument("-c", "--context", type=positive_int, default=None, dest="context_length",
                   help="context length in tokens (default: the model's, capped by the engine)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="one byte budget for everything the model uses, e.g. 96MB or 1.5GiB; weights that "
                        "do not fit are read from flash for every token")
    p.add_argument("--strategy", choices=["flash", "hybrid", "naive"], default="flash",
                   help="with --memory-budget: how weights stream (flash: planned residency, parallel "
                        "reads, prefetch; hybrid/naive: baselines) (default: %(default)s)")
    p.add_argument("--sparsity", type=float, default=None, metavar="S",
                   help="with --memory-budget and a bundle: approximate FFN that reads only predicted-active "
                        "neurons at this calibrated sparsity (e.g. 0.5); its quality cost is in the bundle's report")
    p.add_argument("--window", type=non_negative_int, default=4, metavar="K",
                   help="with --sparsity: keep the neurons of the last K tokens cached (default: %(default)s)")
    p.add_argument("--head-shortlist", type=positive_int, default=None, metavar="N",
                   help="with --memory-budget and a bundle: approximate head over the N most frequent tokens")
    p.add_argument("--speculative", default="none", metavar="KIND",
                   help="speculative decoding, lossless: none, lookup (n-grams of the context), self (the "
                        "model's first layers with a reduced head; bundles), draft:PATH (a smaller model with "
                        "the same tokenizer) or auto (default: %(default)s)")
    p.add_argument("--activations", choices=["q8x2", "q8", "f32"], default="q8x2",
                   help="activation precision against quantized weights: q8x2 agrees with the reference, "
                        "q8 is fastest (default: %(default)s)")
    p.add_argument("--kv-cache", choices=["f16", "q8_0"], default="f16", dest="kv_cache",
                   help="KV cache precision: q8_0 halves its memory (room for weights or a longer context "
                        "under --memory-budget) at a small quality cost (default: %(default)s)")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", "--temp", type=non_negative_float, default=0.0,
                   help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=non_negative_int, default=0, help="0 = off (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: %(default)s)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x best (default: %(default)s)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, dest="repetition_penalty",
                   help="> 1 discourages repeating tokens (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text appears (repeatable)")


def sampling_kwargs(args: argparse.Namespace) -> dict:
    return {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
            "repetition_penalty": args.repetition_penalty, "seed": args.seed, "stop": args.stop}


def load_kwargs(args: argparse.Namespace) -> dict:
    return {"memory_budget": args.memory_budget, "threads": args.threads, "engine": args.engine,
            "context_length": args.context_length, "strategy": args.strategy, "activations": args.activations,
            "kv_cache": args.kv_cache, "sparsity": args.sparsity, "window": args.window, "head_shortlist": args.head_shortlist,
            "speculative": args.speculative}
