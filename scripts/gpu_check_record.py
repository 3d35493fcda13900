"""The Python half of scripts/gpu-check.sh: what the record says about the install and each JSON file.

Run by the GPU host's own python with the carried wheels first on PYTHONPATH:

    python gpu_check_record.py versions WHL_DIR SITE_DIR   # import envport.cli and its commands; each carried
                                                           # distribution's imported version and origin
    python gpu_check_record.py doctor FILE SCHEMA          # validate a `doctor --json` report; what it saw of
                                                           # JAX and Triton (the compile probe's verdict)
    python gpu_check_record.py witness FILE SCHEMA         # validate a `witness --json` result, print its steps

Exit 0 when the file is there and valid (or the import worked), 1 otherwise, with
the reason on the last line, so the record says which and the script goes on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def versions(whl_dir: str, site: str) -> int:
    import importlib.metadata as md
    import re

    try:
        import envport.cli

        # The parser imports every command module: a module missing from the wheel shows here, not later.
        envport.cli.build_parser()
    except Exception as exc:  # the record must say why, not die on it
        print(f"import envport.cli FAILED: {type(exc).__name__}: {exc}")
        return 1
    print("import envport.cli and every command: OK")
    site_path = Path(site).resolve()
    for wheel in sorted(Path(whl_dir).glob("*.whl")):
        name = re.split(r"-\d", wheel.name, maxsplit=1)[0]
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            print(f"  {name}: carried as {wheel.name}, not found by importlib.metadata")
            continue
        where = Path(str(dist.locate_file(""))).resolve()
        origin = "carried" if where == site_path or site_path in where.parents else f"the host's ({where})"
        print(f"  {name} {dist.version} ({origin})")
    try:
        print(f"  torch {md.version('torch')} (the host's)")
    except md.PackageNotFoundError:
        print("  torch: not installed in this python")
    return 0


def _load(path: str, schema_path: str):
    """(data, None) when FILE is valid JSON matching SCHEMA, else (data or None, why)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"{path}: no JSON ({type(exc).__name__}: {exc})"
    try:
        import jsonschema
    except ImportError:
        return data, f"{path}: not validated (jsonschema does not import here)"
    schema = json.loads(Path(schema_path).read_text(encoding="utf-8"))
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(top)"
        return data, f"{path}: INVALID against {Path(schema_path).name} at {where}: {errors[0].message}"
    return data, None


def doctor(path: str, schema: str) -> int:
    data, why = _load(path, schema)
    print(why or f"{Path(path).name}: valid against {Path(schema).name}")
    if isinstance(data, dict) and "frameworks" in data:  # a report from before JAX and Triton has no such part
        for line in frameworks(data):
            print(line)
    return 1 if why else 0


def frameworks(report: dict) -> list[str]:
    """What the doctor's probe saw of JAX and Triton, one line each: the host's python may hold neither."""
    fw = report.get("frameworks") or {}
    if fw.get("error"):
        return [f"frameworks: not probed ({fw['error']})"]
    jax = fw.get("jax")
    if jax is None:
        lines = ["jax: not installed in this python (no JAX witness)"]
    elif jax.get("error"):
        lines = [f"jax: installed, broken: {jax['error']}"]
    else:
        cards = ", ".join(f"{d.get('name')} cc {d.get('capability')}" for d in jax.get("devices") or [])
        lines = [f"jax {jax.get('version')}: backend {jax.get('backend')}" + (f" ({cards})" if cards else "")]
    triton = fw.get("triton")
    if triton is None:
        return lines + ["triton: not installed in this python (no compile probe)"]
    probe = triton.get("compile") or {}
    verdict = "SKIPPED: " + probe["skipped"] if probe.get("skipped") else \
        "OK" if probe.get("ok") else f"FAILED: {probe.get('error')}"
    ptxas = "; ".join(f"{k}: {' '.join(v) or 'none'}" for k, v in sorted((triton.get("ptxas") or {}).items()))
    return lines + [f"triton {triton.get('version')}: tl.sum compile probe {verdict}",
                    f"  ptxas targets: {ptxas or 'no bundled ptxas found'}"]


def witness(path: str, schema: str) -> int:
    from envport.commands.witness import _table_row
    from envport.core.verdict import StepResult, Verdict

    data, why = _load(path, schema)
    for d in (data or {}).get("steps", []) if isinstance(data, dict) else []:
        step = StepResult(**{**d, "verdict": Verdict(d["verdict"])})
        print(_table_row(step))
        for ln in step.lines:
            print(f"    | {ln}")
    if isinstance(data, dict) and "verdict" in data:
        print(f"{data['verdict']}: exit {data.get('exit_code')} in {data.get('seconds')}s")
    print(why or f"{Path(path).name}: valid against {Path(schema).name}")
    return 1 if why else 0


if __name__ == "__main__":
    commands = {"versions": versions, "doctor": doctor, "witness": witness}
    if len(sys.argv) != 4 or sys.argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(commands[sys.argv[1]](*sys.argv[2:]))
