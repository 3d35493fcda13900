"""The ledger: what this machine did to an env, and the doc generated from it.

Every build, verify and witness appends one record to
images/<name>/ledger.json (hash, target, host, when, durations, image facts,
each check's verdict); docs/envs/<name>.md is regenerated from the ledger as
`### env: <name>@<hash12>` blocks, so the doc never says more than was done.
Appends are locked and atomic: two concurrent runs never lose a record and a
crash never leaves half a file.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import socket
from contextlib import contextmanager
from pathlib import Path
from envport.core.files import write_atomic

LEDGER_NAME = "ledger.json"


def ledger_path(root: Path, name: str) -> Path:
    return root / "images" / name / LEDGER_NAME


def doc_path(root: Path, name: str) -> Path:
    return root / "docs" / "envs" / f"{name}.md"


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read(root: Path, name: str) -> list[dict]:
    path = ledger_path(root, name)
    if not path.is_file():
        return []
    return json.loads(path.read_text(encoding="utf-8")).get("records", [])


def append(root: Path, name: str, entry: dict) -> dict:
    """Append one record (adding when/host/key) and regenerate docs/envs/<name>.md."""
    record = {"when": now_utc(), "host": socket.gethostname(), **entry}
    if "hash" in record:
        record.setdefault("key", f"env:{name}@{record['hash'][:12]}")
    path = ledger_path(root, name)
    with _locked(path):
        records = read(root, name) + [record]
        write_atomic(path, json.dumps({"env": name, "records": records}, indent=2, sort_keys=True) + "\n")
    write_doc(root, name, records)
    return record


def compact_checks(checks: list[dict]) -> list[dict]:
    """A verify run's checks as the ledger keeps them: id, outcome and the message when there is one."""
    return [{"id": c["id"], "outcome": c["outcome"], **({"message": c["message"]} if c.get("message") else {})}
            for c in checks]


def record(root: Path, spec, *, kind: str, target: str, hash_: str, result, seconds: float | None = None,
           **facts) -> dict:
    """The one way a run becomes a ledger record: a StepResult plus where it ran.

    Builds also record the spec's tier, weights and sm range (the env doc
    shows them); a verify run's checks are kept compact.
    """
    data = dict(result.data)
    entry = {"kind": kind, "target": target, "hash": hash_, "verdict": result.verdict.value,
             "summary": result.detail, "seconds": round(result.seconds if seconds is None else seconds, 3)}
    if "checks" in data:
        entry["checks"] = compact_checks(data.pop("checks"))
    if kind == "build":
        entry.update({"resources": spec.resources.model_dump(), "sm_range": spec.sm_range,
                      "weights": {n: w.path for n, w in spec.weight_dirs.items()}})
    return append(root, spec.name, {**entry, **data, **facts})


def _resolves(target: str, rec: dict) -> str:
    if rec.get("image"):
        return f"{target}: image {rec['image']}"
    if rec.get("sif"):
        return f"{target}: apptainer {rec['sif']}"
    if rec.get("prefix"):
        where = f" on {rec['ssh_host']}" if rec.get("ssh_host") else ""
        return f"{target}: env at {rec['prefix']}{where}"
    return target


def render_doc(name: str, records: list[dict]) -> str:
    lines = [f"# env: {name}", "", "Generated from images/{0}/ledger.json by envport; do not edit.".format(name), ""]
    by_hash: dict[str, list[dict]] = {}
    latest: dict[str, int] = {}  # records are in append order: position beats a same-second timestamp
    for i, rec in enumerate(records):
        if rec.get("hash"):
            by_hash.setdefault(rec["hash"], []).append(rec)
            latest[rec["hash"]] = i
    for hash_, recs in sorted(by_hash.items(), key=lambda kv: latest[kv[0]], reverse=True):
        # Each fact from the latest record that carries it (a witness run has no tier).
        last = {k: next((r[k] for r in reversed(recs) if r.get(k)), None)
                for k in ("resources", "weights", "sm_range")}
        lines.append(f"### env: {name}@{hash_[:12]}")
        # A present build records nothing; a verify or witness run that found the env says where it is too.
        how = sorted({_resolves(r.get("target", "?"), r) for r in recs
                      if r.get("verdict") in ("OK", "present") and (r.get("image") or r.get("sif") or r.get("prefix"))})
        lines.append("how: " + ("; ".join(how) if how else "not built on this host"))
        if last.get("resources"):
            lines.append(f"tier: {json.dumps(last['resources'], sort_keys=True)}")
        if last.get("weights"):
            lines.append("weights: " + ", ".join(f"{k}={v}" for k, v in sorted(last["weights"].items())))
        if last.get("sm_range"):
            lines.append(f"sm_range: {'..'.join(last['sm_range'])}")
        checks = [r for r in recs if r.get("kind") in ("verify", "witness")]
        passed = [r for r in checks if r.get("verdict") in ("OK", "present")]
        if passed:
            latest = passed[-1]
            lines.append(f"validated: {latest['when'][:10]} ({latest['kind']} on {latest.get('target', '?')}"
                         f" at {latest.get('host', '?')}: {latest.get('summary', 'OK')})")
        else:
            lines.append("validated: never")
        failed = [r for r in checks if r.get("verdict") not in ("OK", "present")]
        if failed:
            f = failed[-1]
            lines.append(f"last failure: {f['when'][:10]} {f['kind']} {f.get('target', '?')}: {f.get('summary', '')}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_doc(root: Path, name: str, records: list[dict] | None = None) -> Path:
    path = doc_path(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, render_doc(name, read(root, name) if records is None else records))
    return path
