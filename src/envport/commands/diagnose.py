"""`envport diagnose LOGFILE|-`: match a log against the diagnosis table (layer, what is wrong, the fix)."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("diagnose", help="name the layer and the fix for a failed log (the diagnosis table)",
                       description="Match every line of a log (a file, or - for stdin) against envport's "
                       "diagnosis table (seed 004's symptoms: numpy aliases, missing shared libraries, a --no-deps "
                       "phase that left a dependency out, a read-only weights mount, #!/bin/bash on a /bin/sh-only "
                       "runtime, torch asked for CUDA on a CPU host, a torch built for other GPUs, ...). Prints the "
                       "first matching row (the verdict: its layer and fix) and any other row that matched. Exit 0 "
                       "when a row matched, 1 when none did. docs/cli.md lists every row.")
    p.add_argument("log", metavar="LOGFILE|-", help="the log to read; - reads stdin")
    p.add_argument("--json", action="store_true", help="print the matches as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.errors import EnvportError
    from envport.report.diagnosis import diagnose

    if args.log == "-":
        text = sys.stdin.read()
    else:
        try:
            with open(args.log, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as exc:
            raise EnvportError(f"{args.log}: {exc.strerror or exc}; pass a log file, or - for stdin") from None
    found = diagnose(text.splitlines())
    if args.json:
        json.dump({"command": "diagnose", "exit_code": 0 if found else 1, "steps": [], "problems": [],
                   "diagnoses": [d.to_dict() for d in found]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if found else 1
    if not found:
        print("no row of the diagnosis table matches this log (docs/cli.md lists them)")
        return 1
    for i, d in enumerate(found):
        if i == 1:
            print("also matched:")
        for ln in d.lines():
            print(ln if i == 0 else f"  {ln}")
    return 0
