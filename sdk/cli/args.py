"""Argument parsing shared by the subcommands: one-line errors, typed values, and the options
`generate`, `chat` and `serve` share, in two tiers: everyday options first, engine tuning and
sampling details in an "advanced" group. An option name means one thing in every command."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from edgeflash.kernels.formats import KV_FORMATS, REQUANTIZE_FORMATS
from edgeflash.runtime.sampler import SAMPLING_DEFAULTS

ADVANCED_TITLE = "advanced (engine tuning and sampling details)"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


class Renamed(argparse.Action):
    """An option that was renamed: using it is a one-line error naming the new option."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        parser.error(f"{option} is now {self.new}")


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def parse_chunk_size(text: str) -> int:
    """A neuron chunk size: bytes or a size such as 64KiB."""
    from edgeflash.base.errors import UserError
    from edgeflash.base.sizes import parse_size

    try:
        return int(text) if text.isdigit() else parse_size(text, "neuron chunk")
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def sparsity_level(text: str) -> float | str:
    """--ffn-sparsity: a fraction in (0, 1), or auto."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.5, or auto, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, or auto, got {text!r}")
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


def penalty(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [-2, 2], got {text!r}") from None
    if not -2 <= value <= 2:
        raise argparse.ArgumentTypeError(f"expected a number in [-2, 2], got {text!r}")
    return value


def window_tokens(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -2
    if value < -1:
        raise argparse.ArgumentTypeError(f"expected an integer >= -1 (-1: the whole context), got {text!r}")
    return value


def advanced_group(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The command's "advanced" group (made once, listed after the everyday options)."""
    for group in p._action_groups:
        if group.title == ADVANCED_TITLE:
            return group
    return p.add_argument_group(ADVANCED_TITLE)


def add_model_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default="default",
                   help="GGUF file, bundle directory, Hugging Face directory, or an alias (`edgeflash models` "
                        "lists them) (default: %(default)s)")


def add_everyday_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--threads", type=positive_int, default=2, help="CPU threads (default: %(default)s)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="one byte budget for everything the model uses, e.g. 96MB or 1.5GiB; weights that "
                        "do not fit are read from flash for every token")


def add_advanced_engine_options(p: argparse.ArgumentParser) -> None:
    adv = advanced_group(p)
    adv.add_argument("--engine", choices=["auto", "native", "reference"], default="auto",
                     help="auto picks the fastest available; reference is the numpy oracle (default: %(default)s)")
    adv.add_argument("-c", "--context", type=positive_int, default=None, dest="context_length",
                     help="context length in tokens (default: the model's, capped by the engine)")
    adv.add_argument("--strategy", choices=["flash", "hybrid", "naive"], default="flash",
                     help="with --memory-budget: how weights stream (flash: planned residency, parallel "
                          "reads, prefetch; hybrid/naive: baselines) (default: %(default)s)")
    adv.add_argument("--ffn-sparsity", type=sparsity_level, default=None, metavar="S", dest="sparsity",
                     help="with --memory-budget and a bundle: approximate FFN that reads only predicted-active "
                          "neurons at this calibrated sparsity (e.g. 0.5; not used where it would be slower than "
                          "exact flash), or auto: the fastest measured at this budget; its quality cost is in "
                          "the bundle's report")
    adv.add_argument("--neuron-window", type=non_negative_int, default=4, metavar="K", dest="window",
                     help="with --ffn-sparsity: keep the FFN neurons of the last K tokens cached "
                          "(default: %(default)s)")
    adv.add_argument("--neuron-chunk", type=parse_chunk_size, default=0, metavar="SIZE", dest="neuron_chunk",
                     help="with --ffn-sparsity: read neurons in whole chunks of at least SIZE (e.g. 64KiB: the "
                          "most active 1 - S share of chunks a token, neighbours merged, hot neurons resident) "
                          "instead of one by one (default: one by one)")
    adv.add_argument("--head-shortlist", type=positive_int, default=None, metavar="N",
                     help="with --memory-budget and a bundle: approximate head over the N most frequent tokens")
    adv.add_argument("--speculative", default="none", metavar="KIND",
                     help="speculative decoding, lossless: none, lookup (n-grams of the context), self (the "
                          "model's first layers with a reduced head; bundles), draft:PATH (a smaller model with "
                          "the same tokenizer), auto (lookup and a smaller model with the same tokenizer among "
                          "the model aliases on this machine) or auto:PATH (default: %(default)s)")
    adv.add_argument("--activations", choices=["q8x2", "q8", "f32"], default="q8x2",
                     help="activation precision against quantized weights: q8x2 agrees with the reference, "
                          "q8 is fastest (default: %(default)s)")
    adv.add_argument("--kv-cache", choices=list(KV_FORMATS), default="f16", dest="kv_cache",
                     help="KV cache precision: q8_0 halves its memory, kivi2 (2-bit, KIVI) takes about a "
                          "quarter at long contexts (room for weights or a longer context under "
                          "--memory-budget) at a small quality cost (default: %(default)s)")
    adv.add_argument("--requantize", choices=list(REQUANTIZE_FORMATS), default=None, metavar="FORMAT",
                     help="without --memory-budget: convert every weight matrix stored with more bits to "
                          "FORMAT (q4_0, q8_0 or q3_k; q3_k needs rows of a multiple of 256 values, other "
                          "matrices get q4_0) at load: faster decoding at a quality cost (default: the "
                          "file's formats)")
    adv.add_argument("--sparsity", action=Renamed, new="--ffn-sparsity")
    adv.add_argument("--window", action=Renamed, new="--neuron-window")


def add_everyday_sampling_options(p: argparse.ArgumentParser) -> None:
    d = SAMPLING_DEFAULTS
    p.add_argument("--temp", "--temperature", type=non_negative_float, default=d["temperature"], dest="temperature",
                   metavar="T",
                   help="sampling temperature; 0 = greedy, the same text every run (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="random seed: the same seed gives the same sampled text")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text appears (repeatable)")


def add_advanced_sampling_options(p: argparse.ArgumentParser) -> None:
    d = SAMPLING_DEFAULTS
    adv = advanced_group(p)
    adv.add_argument("--top-k", type=non_negative_int, default=d["top_k"], metavar="K",
                     help="sample from the K most likely tokens; 0 = all (default: %(default)s)")
    adv.add_argument("--top-p", type=float, default=d["top_p"], metavar="P",
                     help="sample from the smallest set of tokens holding this probability (default: %(default)s)")
    adv.add_argument("--min-p", type=float, default=d["min_p"], metavar="P",
                     help="drop tokens less likely than min-p x the best one (default: %(default)s)")
    adv.add_argument("--repeat-penalty", type=float, default=d["repetition_penalty"], dest="repetition_penalty",
                     metavar="X",
                     help="> 1 discourages tokens seen in the last --repeat-last-n tokens; 1 = off "
                          "(default: %(default)s)")
    adv.add_argument("--repeat-last-n", type=window_tokens, default=d["repeat_last_n"], metavar="N",
                     help="tokens the penalties look back over; 0 = no penalties, -1 = the whole context "
                          "(default: %(default)s)")
    adv.add_argument("--frequency-penalty", type=penalty, default=d["frequency_penalty"], metavar="X",
                     help="subtracted from a token's logit per occurrence in that window (default: %(default)s)")
    adv.add_argument("--presence-penalty", type=penalty, default=d["presence_penalty"], metavar="X",
                     help="subtracted once from the logit of every token in that window (default: %(default)s)")


def sampling_kwargs(args: argparse.Namespace) -> dict:
    return {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
            "repetition_penalty": args.repetition_penalty, "repeat_last_n": args.repeat_last_n,
            "frequency_penalty": args.frequency_penalty, "presence_penalty": args.presence_penalty,
            "seed": args.seed, "stop": args.stop}


def load_kwargs(args: argparse.Namespace) -> dict:
    return {"memory_budget": args.memory_budget, "threads": args.threads, "engine": args.engine,
            "context_length": args.context_length, "strategy": args.strategy, "activations": args.activations,
            "kv_cache": args.kv_cache, "sparsity": args.sparsity, "window": args.window,
            "head_shortlist": args.head_shortlist, "speculative": args.speculative, "neuron_chunk": args.neuron_chunk,
            "requantize": args.requantize}


def warn_without_chat_template(model: Any) -> None:
    """The one-line warning for chatting with a model that has no chat template."""
    warning = model.chat_template_warning()
    if warning:
        sys.stderr.write(warning + "\n")
        sys.stderr.flush()
