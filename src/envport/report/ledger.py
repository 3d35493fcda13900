"""The ledger: what this machine did to an env, kept outside the checkout.

Every build, verify and witness appends one record (hash, target, host, when,
durations, image facts, each check's verdict) to this user's state dir:
`$ENVPORT_STATE_DIR`, else the site profile's `ledger_dir`, else
`$XDG_STATE_HOME/envport` (`~/.local/state/envport`), under
`ledger/<project>-<hash of its path>/<name>.json`.  Nothing is written into the
project as a side effect (a checkout stays clean after any local run);
`envport ledger NAME --write-docs` regenerates docs/envs/<name>.md on purpose,
as `### env: <name>@<hash12>` blocks, so the doc never says more than was done.
Appends are locked and atomic: two concurrent runs never lose a record and a
crash never leaves half a file.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import hashlib
import json
import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from envport.core import secrets
from envport.core.errors import EnvportError
from envport.core.files import write_atomic

STATE_DIR_VAR = "ENVPORT_STATE_DIR"
LEDGER_SUBDIR = "ledger"


def state_dir(site_ledger_dir: Optional[str] = None) -> Path:
    """$ENVPORT_STATE_DIR (this run), else the site's ledger_dir (this place), else the XDG state dir."""
    explicit = os.environ.get(STATE_DIR_VAR) or site_ledger_dir
    if explicit:
        return Path(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(xdg) / "envport"


def project_key(root: Path) -> str:
    """One folder per project checkout: its name plus a hash of its real path (two clones never mix)."""
    real = os.path.realpath(root)
    return f"{os.path.basename(real) or 'root'}-{hashlib.sha256(real.encode()).hexdigest()[:12]}"


def ledger_path(root: Path, name: str, site_ledger_dir: Optional[str] = None) -> Path:
    return state_dir(site_ledger_dir) / LEDGER_SUBDIR / project_key(root) / f"{name}.json"


def doc_path(root: Path, name: str) -> Path:
    return root / "docs" / "envs" / f"{name}.md"


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


@contextmanager
def _locked(path: Path):
    """flock on `<name>.lock` beside the ledger.  O_NOFOLLOW and no O_TRUNC: in a shared ledger_dir
    another user's symlink planted as the lock must be neither followed nor have its target emptied."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_suffix(".lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise EnvportError(f"the ledger lock {lock} is a symlink; envport does not follow it (another user "
                               f"may have planted it): remove it (rm {lock}) and re-run", exit_code=3) from None
        raise EnvportError(f"cannot open the ledger lock {lock}: {exc.strerror}; fix the ledger dir's "
                           "permissions, or point $ENVPORT_STATE_DIR elsewhere", exit_code=3) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _records(path: Path) -> list[dict] | str:
    """The ledger's records, or why the file is not a ledger (a crash of another tool, a hand edit)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8"
    except (ValueError, RecursionError) as exc:
        return f"not JSON ({type(exc).__name__})"
    records = data.get("records") if isinstance(data, dict) else None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        return "not an envport ledger (no list of records)"
    return records


def _set_aside(path: Path, why: str) -> None:
    """Rename a corrupt ledger beside itself (kept as evidence) and say so in one line; a new one starts."""
    aside = path.with_name(f"{path.name}.corrupt-{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%SZ}-{os.getpid()}")
    os.replace(path, aside)
    print(f"envport: the ledger {path} was corrupt ({why}); set aside as {aside}, a new one started",
          file=sys.stderr)


def _read_locked(path: Path) -> list[dict]:
    """Under the lock: the records, after setting a corrupt ledger aside."""
    if not path.is_file():
        return []
    got = _records(path)
    if isinstance(got, str):
        _set_aside(path, got)
        return []
    return got


def read(root: Path, name: str, site_ledger_dir: Optional[str] = None) -> list[dict]:
    path = ledger_path(root, name, site_ledger_dir)
    if not path.is_file():
        return []
    got = _records(path)
    if isinstance(got, str):
        with _locked(path):  # set aside once, whoever of two readers gets there first
            return _read_locked(path)
    return got


def append(root: Path, name: str, entry: dict, site_ledger_dir: Optional[str] = None) -> dict:
    """Append one record (adding when/host/key) to this machine's ledger; the project is not touched."""
    # Whatever a run saw (a log tail, a command line) may hold a configured secret: never recorded.
    record = secrets.scrub_data({"when": now_utc(), "host": socket.gethostname(), **entry})
    if "hash" in record:
        record.setdefault("key", f"env:{name}@{record['hash'][:12]}")
    path = ledger_path(root, name, site_ledger_dir)
    with _locked(path):
        records = _read_locked(path) + [record]
        write_atomic(path, json.dumps({"env": name, "project": os.path.realpath(root), "records": records},
                                      indent=2, sort_keys=True) + "\n")
    return record


def compact_checks(checks: list[dict]) -> list[dict]:
    """A verify run's checks as the ledger keeps them: id, outcome and the message when there is one."""
    return [{"id": c["id"], "outcome": c["outcome"], **({"message": c["message"]} if c.get("message") else {})}
            for c in checks]


def record(root: Path, spec, *, kind: str, target: str, hash_: str, result, seconds: float | None = None,
           site=None, **facts) -> dict:
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
        # The whole resolved spec: a later build of another hash names the fields it changed (previous_build).
        entry.update({"resources": spec.resources.model_dump(), "sm_range": spec.sm_range,
                      "weights": {n: w.path for n, w in spec.weight_dirs.items()},
                      "spec": spec.model_dump(mode="json")})
    return append(root, spec.name, {**entry, **data, **facts}, getattr(site, "ledger_dir", None))


GOOD = ("OK", "present")


def previous_build(records: list[dict], target: str, *, ssh_host: Optional[str] = None,
                   hash_prefix: Optional[str] = None, other_than: Optional[str] = None,
                   verdicts: tuple[str, ...] = GOOD) -> Optional[dict]:
    """The newest good build record of TARGET (on SSH_HOST, None: this machine) whose hash starts with
    HASH_PREFIX (the env a build replaced), or else is not OTHER_THAN (the env built before this one).
    VERDICTS: ("OK",) for a record of the build itself, not of a later `present` check."""
    for rec in reversed(records):
        h = str(rec.get("hash") or "")
        if rec.get("kind") != "build" or rec.get("target") != target or rec.get("verdict") not in verdicts or not h:
            continue
        if (rec.get("ssh_host") or None) != ssh_host:
            continue
        if (hash_prefix and h.startswith(hash_prefix)) or (not hash_prefix and other_than and h != other_than):
            return rec
    return None


def doc_passes(records: list[dict], *, target: str, hash_: str, ssh_host: Optional[str] = None) -> dict[str, str]:
    """doc sha256 -> when a witness run of TARGET (on SSH_HOST; None: this machine) on env HASH_ last ran that
    doc and it passed: the docs level is re-run only when the env or the doc changed (seed 004)."""
    out: dict[str, str] = {}
    for rec in records:
        if rec.get("kind") != "witness" or rec.get("target") != target or rec.get("hash") != hash_:
            continue
        if (rec.get("ssh_host") or None) != ssh_host:
            continue
        for step in rec.get("steps") or []:
            data = step.get("data") if isinstance(step, dict) else None
            if isinstance(data, dict) and data.get("doc_sha256") and step.get("verdict") == "OK":
                out[str(data["doc_sha256"])] = str(rec.get("when") or "?")
    return out


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
    """The env doc: one block per hash, newest first by when it first appeared, so a later run of an
    old env changes its block's lines but never moves it (the doc's diff shows what changed)."""
    lines = [f"# env: {name}", "",
             f"Generated by `envport ledger {name} --write-docs` from a machine's ledger; do not edit.", ""]
    by_hash: dict[str, list[dict]] = {}
    first: dict[str, int] = {}  # records are in append order: position beats a same-second timestamp
    for i, rec in enumerate(records):
        if rec.get("hash"):
            by_hash.setdefault(rec["hash"], []).append(rec)
            first.setdefault(rec["hash"], i)
    for hash_, recs in sorted(by_hash.items(), key=lambda kv: first[kv[0]], reverse=True):
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
        lines += _docs_lines(checks)
        failed = [r for r in checks if r.get("verdict") not in ("OK", "present")]
        if failed:
            f = failed[-1]
            lines.append(f"last failure: {f['when'][:10]} {f['kind']} {f.get('target', '?')}: {f.get('summary', '')}")
        # Host properties `envport up` diagnosed (seed 004): the next user of this env here sees them.
        gotchas = {r.get("diagnosis"): r for r in recs if r.get("kind") == "gotcha"}
        for g in gotchas.values():
            lines.append(f"gotcha: {g['when'][:10]} {g.get('target', '?')} at {g.get('host', '?')}: "
                         f"{g.get('symptom', '')} [{g.get('diagnosis')}] -> {g.get('fix', '')}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _docs_lines(checks: list[dict]) -> list[str]:
    """Per doc of the docs level (seed 004's third level), how its latest real run on this env ended; a
    `present` row (unchanged since a pass) is not a run and does not move the date."""
    latest: dict[str, tuple[str, dict]] = {}
    for rec in checks:
        for step in rec.get("steps") or []:
            data = step.get("data") if isinstance(step, dict) else None
            if isinstance(data, dict) and data.get("doc") and step.get("verdict") in ("OK", "FAILED"):
                latest[str(data["doc"])] = (str(step["verdict"]), rec)
    return [f"docs: {doc} {verdict} {rec.get('when', '?')[:10]} on {rec.get('target', '?')}"
            for doc, (verdict, rec) in sorted(latest.items())]


def write_doc(root: Path, name: str, records: list[dict]) -> Path:
    path = doc_path(root, name)
    write_atomic(path, render_doc(name, records))
    return path
