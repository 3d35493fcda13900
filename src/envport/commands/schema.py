"""`envport schema`: write (or check) docs/spec.schema.json."""

from __future__ import annotations

import sys

from envport.commands._common import project_root


def register(sub) -> None:
    p = sub.add_parser("schema", help="write the spec's JSON Schema to docs/spec.schema.json",
                       description="Write the spec's JSON Schema (for editors: specs start with a "
                       "`# yaml-language-server: $schema=../docs/spec.schema.json` line).")
    p.add_argument("--check", action="store_true", help="exit 1 if the committed schema is out of date")
    p.add_argument("--stdout", action="store_true", help="print the schema instead of writing it")
    p.set_defaults(func=run)


def run(args) -> int:
    from envport.core.files import write_atomic
    from envport.spec.schema import SCHEMA_PATH, schema_text

    text = schema_text()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    path = project_root(args) / SCHEMA_PATH
    current = path.read_text(encoding="utf-8") if path.is_file() else None
    if args.check:
        if current != text:
            print(f"drift: {SCHEMA_PATH} is out of date; run `envport schema`", file=sys.stderr)
            return 1
        print(f"OK       {SCHEMA_PATH} is up to date")
        return 0
    if current == text:
        print(f"present  {SCHEMA_PATH}")
        return 0
    write_atomic(path, text)
    print(f"OK       wrote {SCHEMA_PATH}")
    return 0
