"""The `envport` command line.

Each subcommand lives in envport/commands/<name>.py and exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int`.
The command modules import heavy libraries (docker, torch, spython) lazily,
inside the functions that need them, so `envport render` starts fast.
"""

from __future__ import annotations

import sys

# argparse, the command modules and the error types are imported in the functions that use them:
# a no-op `envport build NAME --target docker` answers before any of them (commands/fast.py).
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import argparse

    from envport.core.errors import EnvportError

# Order is the order of `envport --help`.
COMMANDS = [
    "validate",
    "import_",
    "schema",
    "show",
    "render",
    "lock",
    "base",
    "wheelhouse",
    "build",
    "inspect",
    "sign",
    "attest",
    "verify_sig",
    "sbom", "push", "pull",
    "module",
    "verify",
    "witness",
    "weights",
    "up",
    "diagnose",
    "doctor",
    "slurm",
    "parity",
    "matrix",
    "ledger",
    "gc",
    "rebuild_check",
]

EXIT_CODES_HELP = """exit codes:
  0  ok (every step OK, present or skipped)
  1  failed (something broke; the log tail is printed)
  2  usage error or invalid spec
  3  refused (the host cannot do it, or it does not match the spec; reason + fix printed)
  5  no accelerator where the spec requires one
  130  interrupted (SIGINT, SIGTERM or SIGHUP to envport; the signal is named)
"""


def build_parser() -> argparse.ArgumentParser:
    import argparse
    import importlib

    from envport import __version__

    parser = argparse.ArgumentParser(
        prog="envport",
        description="Render one env spec (specs/<name>.yaml) to a Dockerfile, an Apptainer .def "
        "or conda/venv setup scripts; build it; prove it with testinfra and witnesses.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"envport {__version__}")
    parser.add_argument(
        "-C", "--root", default=None,
        help="project root holding specs/ and images/ (default: nearest parent of the cwd with specs/)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f".commands.{name}", __package__).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from envport.commands.fast import fast_argv

    fast = fast_argv(sys.argv[1:] if argv is None else list(argv))
    if fast is not None:
        return fast
    from envport.core.errors import EnvportError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except EnvportError as exc:
        return _report_error(args, exc)
    except KeyboardInterrupt as exc:
        from envport.core.proc import Terminated

        # Name the signal: a SIGTERM from a scheduler and a Ctrl-C call for different next steps.
        print(f"envport: interrupted by {exc.signal_name if isinstance(exc, Terminated) else 'SIGINT'}",
              file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `envport show X | head`: the reader left; say nothing more (and no traceback at exit's flush).
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _report_error(args: argparse.Namespace, exc: EnvportError) -> int:
    """Problems one per line then a summary; under --json the same as the one JSON shape on stdout."""
    from envport.core.errors import SpecError, problems_of
    if getattr(args, "json", False):
        from envport.core.verdict import envelope, print_json
        # A nested verb (`slurm submit`) keeps its word under `<verb>_command`: the envelope names both.
        words = [args.command, getattr(args, f"{args.command}_command", None)]
        print_json(envelope(" ".join(w for w in words if w), exc.exit_code, problems=problems_of(exc)))
    if isinstance(exc, SpecError):
        for p in exc.problems:
            print(p, file=sys.stderr)
        print(f"envport: {exc.summary}", file=sys.stderr)
    else:
        print(f"envport: {exc}", file=sys.stderr)
    return exc.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
