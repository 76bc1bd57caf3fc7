"""The `edgeflash` command: one subcommand per job; user errors are one line and exit 2."""

from __future__ import annotations

import sys

from edgeflash.base.errors import UserError
from edgeflash.cli import bench, chat, export, generate, inspect, models, probe_io, serve
from edgeflash.cli.args import OneLineParser

SUBCOMMANDS = [generate, chat, serve, models, export, inspect, bench, probe_io]


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="edgeflash",
                           description="Run language models on devices whose memory is smaller than the model.")
    from edgeflash.base import __version__

    parser.add_argument("--version", action="version", version=f"edgeflash {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except UserError as e:
        sys.stdout.flush()
        sys.stderr.write(f"edgeflash: error: {e}\n")
        return e.exit_status
    except KeyboardInterrupt:
        sys.stderr.write("edgeflash: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
