"""Weights: where an env's declared weight files live on this host, whether they are at their pins, and
fetching them with the spec's own `source` command.

The rules (seed 002, each answering a failure that happened):

- verify is deep: every declared file is present, at its size, and at its
  sha256, read in full (a 28.5 MB fragment of a 2,286 MB checkpoint served
  predictions for a month because nothing compared it to anything);
- fetch runs only the spec's `source` command, the tool's own downloader:
  envport restates no URL, so a mirror change upstream cannot break it;
- nothing is deleted: a downloader writes straight to the final name, so a
  truncated transfer and a corrupt file look alike, and removing one to retry
  destroys the evidence that says which it was. A file off its pin is named
  with both digests and left in place;
- a weight dir fetched by its `source` without a pinned file list is checked the way seed 004 says to
  (`du -sh` every subdir): an empty subdirectory, or a total far below `size_gb`, is a download that
  swallowed its error, FAILED naming the folder, never `present`;
- a weight's token (`auth_hint`, gated or not) is read from the environment at
  fetch time, passed to the command and scrubbed from everything envport
  prints or keeps (core/secrets).

Layout on a host: `<weights root>/<env name>/<weight name>/<file>`, the root
being `--root`, else $ENVPORT_WEIGHTS_DIR, else ~/.envport/weights. Docker and
apptainer mount `<root>/<env>/<weight>` read-only at the spec's path; a venv
(here or over SSH) gets the weight's env var pointed at it.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from envport.core import secrets
from envport.core.proc import run, spawn
from envport.core.progress import Progress, quiet
from envport.core.verdict import StepResult, Verdict
from envport.spec.loader import Loaded
from envport.spec.model import Spec, WeightDir

WEIGHTS_DIR_VAR = "ENVPORT_WEIGHTS_DIR"
DEFAULT_WEIGHTS_DIR = "~/.envport/weights"
# Always exported to `source`, beside the weight's own variable: a weight without `env:` still needs a target.
WEIGHT_DIR_VAR = "ENVPORT_WEIGHT_DIR"
PROGRESS_BYTES = 256 * 2**20  # files at least this large print a progress line while they are hashed
CHUNK = 4 * 2**20
FETCH_TIMEOUT_S = 4 * 3600
TAIL = 12
# An unpinned weight dir holding less than this share of its size_gb stopped early (a half-fetched
# checkpoint is far below; compression or a smaller revision is not this far).
FAR_BELOW = 0.5


def weights_root(explicit: Optional[str] = None) -> Path:
    return Path(os.path.expanduser(explicit or os.environ.get(WEIGHTS_DIR_VAR) or DEFAULT_WEIGHTS_DIR)).absolute()


def host_dir(root: Path, env_name: str, weight: str) -> Path:
    return Path(root) / env_name / weight


def runtime_env(spec: Spec, root: Optional[Path] = None) -> dict[str, str]:
    """Each weight's env var pointed at its folder on this host (venv targets: there is no mount); ROOT: the
    weights root, by default weights_root()'s."""
    root = weights_root() if root is None else root
    return {w.env: str(host_dir(root, spec.name, n)) for n, w in sorted(spec.weight_dirs.items()) if w.env}


def mounts(spec: Spec, root: Path) -> list[tuple[str, str]]:
    """(host folder, path in the env) per weight, for read-only bind mounts."""
    return [(str(host_dir(root, spec.name, n)), w.path) for n, w in sorted(spec.weight_dirs.items())]


def existing_mounts(spec: Spec, root: Optional[Path] = None) -> list[tuple[str, str]]:
    """mounts() whose host folder exists: docker would otherwise create an empty one, as root. ROOT: the
    weights root, by default weights_root()'s."""
    return [(h, p) for h, p in mounts(spec, weights_root() if root is None else root) if Path(h).is_dir()]


def remote_env(spec: Spec) -> dict[str, str]:
    """Each weight's variable on an SSH host, as a path under that host's weights root (where `stage` copies)."""
    return {w.env: f"{spec.name}/{n}" for n, w in sorted(spec.weight_dirs.items()) if w.env}


def secrets_of(spec: Spec, environ: Mapping[str, str]) -> list[str]:
    """What this spec configures as secret: every weight's `auth_hint` token in `environ` (gated or not:
    the token is the same secret either way) and the password of any pip URL its phases name."""
    tokens = [environ.get(w.auth_hint) for w in spec.weight_dirs.values() if w.auth_hint]
    urls = [u for ph in spec.pip_phases for u in (ph.index_url, *ph.extra_index_urls)]
    return [v for v in tokens + [secrets.url_password(u) for u in urls] if v]


def guard_secrets(spec: Spec, environ: Optional[Mapping[str, str]] = None) -> None:
    """Register the spec's secrets: from now on nothing envport prints or records carries them."""
    secrets.register(secrets_of(spec, os.environ if environ is None else environ))


@dataclass(frozen=True)
class FileState:
    weight: str
    path: Path
    ok: bool
    problem: str = ""  # missing | size | digest | unpinned | link (to outside the weight dir) | incomplete
    message: str = ""


def sha256_file(path: Path, progress: Progress = quiet, label: str = "") -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    done, next_say = 0, PROGRESS_BYTES
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            if size >= PROGRESS_BYTES and done >= next_say:
                progress(f"envport: [weights] hashing {label or path.name}: {done / 2**20:.0f}/"
                         f"{size / 2**20:.0f} MiB")
                next_say += PROGRESS_BYTES
    return h.hexdigest()


def check_weight(spec: Spec, name: str, w: WeightDir, root: Path, progress: Progress = quiet) -> list[FileState]:
    """Every declared file of one weight dir, deep (size, then every byte's sha256)."""
    base = host_dir(root, spec.name, name)
    real_base = os.path.realpath(base)
    states = []
    for f in w.files:
        path = base / f.path
        real = os.path.realpath(path)
        if os.path.lexists(path) and os.path.commonpath([real_base, real]) != real_base:
            # Only the weight dir is mounted: the container would not see the file the link names,
            # and whoever owns that place could change it after this check.
            states.append(FileState(name, path, False, "link", f"{path} is a symlink to {real}, outside "
                                    f"{base}; the env sees only that folder: copy the file in place of the link"))
            continue
        if not path.is_file():
            states.append(FileState(name, path, False, "missing", f"{path} is absent"))
            continue
        size = path.stat().st_size
        digest = sha256_file(path, progress, f"{name}/{f.path}")
        pin = f"size {f.size if f.size is not None else '(any)'}, sha256 {f.sha256 or '(any)'}"
        if f.size is not None and size != f.size:
            states.append(FileState(name, path, False, "size",
                                    f"{path}: {size} bytes, sha256 {digest}; the pin is {pin}"))
        elif f.sha256 and digest != f.sha256:
            states.append(FileState(name, path, False, "digest",
                                    f"{path}: sha256 {digest} ({size} bytes); the pin is {pin}"))
        elif not f.sha256:
            states.append(FileState(name, path, False, "unpinned",
                                    f"{path}: {size} bytes, sha256 {digest}; the spec pins no sha256 "
                                    f"(add `sha256: {digest}` to weight_dirs.{name}.files once it is right)"))
        else:
            states.append(FileState(name, path, True, message=f"{path}: {size} bytes, sha256 {digest[:12]}"))
    return states


def _fetched_unpinned(w: WeightDir) -> bool:
    return not w.files and bool(w.source.strip())


def _dir_bytes(base: Path) -> tuple[int, list[Path]]:
    """(bytes of the regular files under BASE, its topmost subdirectories holding none); links not followed."""
    size: dict[str, int] = {}
    for here, dirs, files in os.walk(base, topdown=False):
        total = sum(size.get(os.path.join(here, d), 0) for d in dirs)
        for f in files:
            try:
                st = os.lstat(os.path.join(here, f))
            except OSError:
                continue
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        size[here] = total
    empty = [p for p, n in size.items() if n == 0 and p != str(base)]
    # Only the topmost of nested empty folders: naming a/ says a/b/ too.
    top = [p for p in empty if os.path.dirname(p) not in empty]
    return size.get(str(base), 0), [Path(p) for p in sorted(top)]


def check_unpinned(spec: Spec, name: str, w: WeightDir, root: Path) -> FileState:
    """A weight dir its `source` fills without a pinned file list: there, no empty subdirectory, near size_gb."""
    base = host_dir(root, spec.name, name)
    if not base.is_dir() or not any(base.iterdir()):
        return FileState(name, base, False, "missing", f"{base} is {'empty' if base.is_dir() else 'absent'}")
    total, empty = _dir_bytes(base)
    problems = [f"{d}: empty subdirectory (a download that swallowed its error?)" for d in empty]
    if total == 0:
        problems.append(f"{base}: holds folders but 0 bytes of files")
    elif w.size_gb and total < FAR_BELOW * w.size_gb * 1e9:
        problems.append(f"{base}: {_human(total)} in all, far below its size_gb {w.size_gb} (under "
                        f"{FAR_BELOW:.0%}): a fetch that stopped early?")
    if problems:
        return FileState(name, base, False, "incomplete", "; ".join(problems))
    return FileState(name, base, True, message=f"{base}: {_human(total)}, no empty subdirectory (no pinned files)")


def weight_states(spec: Spec, name: str, w: WeightDir, root: Path, progress: Progress = quiet) -> list[FileState]:
    """The pinned files of one weight dir, deep; or, fetched by `source` without pins, its completeness."""
    if _fetched_unpinned(w):
        return [check_unpinned(spec, name, w, root)]
    return check_weight(spec, name, w, root, progress)


def verify(loaded: Loaded, root: Path, progress: Progress = quiet) -> StepResult:
    """present when every declared file is at its pin (and every unpinned fetched dir complete); REFUSED
    naming each file that is not; FAILED naming each incomplete folder."""
    start = time.monotonic()
    spec = loaded.spec
    step = f"weights {spec.name}"
    if not any(w.files or _fetched_unpinned(w) for w in spec.weight_dirs.values()):
        what = "declares no weights" if not spec.weight_dirs else "pins no weight files (nothing to verify)"
        return StepResult(step, Verdict.SKIPPED, f"{spec.name} {what}", seconds=time.monotonic() - start)
    states = [s for n, w in sorted(spec.weight_dirs.items()) for s in weight_states(spec, n, w, root, progress)]
    bad = [s for s in states if not s.ok]
    data = {"weights_root": str(root), "files": len(states)}
    warnings = writable_by_others(root, spec)
    if not bad:
        total = sum(f.size or 0 for w in spec.weight_dirs.values() for f in w.files)
        return StepResult(step, Verdict.PRESENT, f"{len(states)}/{len(states)} files at their pins under "
                          f"{host_dir(root, spec.name, '')} ({_human(total)})", seconds=time.monotonic() - start,
                          data=data, lines=warnings)
    result = _off_pin(step, bad, len(states), root, spec, start, data)
    result.lines = warnings + result.lines
    return result


def writable_by_others(root: Path, spec: Spec) -> list[str]:
    """A warning per folder on the way to the weights that another user could write: what was verified
    here could be swapped before the env reads it (a check is only as good as who can change its subject)."""
    out = []
    dirs = [Path(root), host_dir(root, spec.name, "")] + [host_dir(root, spec.name, n) for n in sorted(spec.weight_dirs)]
    for d in dirs:
        try:
            mode = os.stat(d).st_mode
        except OSError:
            continue
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            who = "others" if mode & stat.S_IWOTH else "its group"
            out.append(f"warning: {d} is writable by {who} ({stat.filemode(mode)}): a verified file "
                       f"could be replaced before the env reads it; fix: chmod go-w {d}")
    return out


def _off_pin(step, bad, total, root, spec, start, data) -> StepResult:
    incomplete = [s for s in bad if s.problem == "incomplete"]
    if incomplete:
        return StepResult(step, Verdict.FAILED, f"{incomplete[0].weight}: {incomplete[0].message}",
                          reason="weights_incomplete", lines=[s.message for s in incomplete[1:]] +
                          [s.message for s in bad if s not in incomplete] +
                          ["fix: the folder is left in place: read the source command's output above, remove "
                           f"what it left by hand and re-run `envport weights fetch {spec.name}`"],
                          seconds=time.monotonic() - start, data=data)
    absent = all(s.problem == "missing" for s in bad)
    lines = [s.message for s in bad]
    if not absent:
        lines.append("fix: files are left in place for inspection; remove the named file by hand and re-run "
                     f"(`envport weights fetch {spec.name}` fetches it again)")
    else:
        lines.append(f"fix: envport weights fetch {spec.name}")
    reason = "weights_missing" if absent else "weights_off_pin"
    return StepResult(step, Verdict.REFUSED, f"{len(bad)} of {total} declared files are not at their pins under "
                      f"{host_dir(root, spec.name, '')}", reason=reason, lines=lines,
                      seconds=time.monotonic() - start, data=data)


def fetch(loaded: Loaded, root: Path, *, interpreter_bin: Optional[Path] = None, progress: Progress = quiet,
          environ: Optional[Mapping[str, str]] = None) -> StepResult:
    """verify; where a weight is absent, run its `source` command, then verify again. Never deletes."""
    start = time.monotonic()
    spec = loaded.spec
    environ = dict(os.environ if environ is None else environ)
    first = verify(loaded, root, progress)
    if first.verdict.ok or first.reason != "weights_missing":
        # A file that is there but off its pin is evidence: fetching over it would destroy it.
        return first
    guard_secrets(spec, environ)
    lines: list[str] = []
    for name, w in sorted(spec.weight_dirs.items()):
        states = weight_states(spec, name, w, root)
        if all(s.ok for s in states):
            continue
        step = f"weights {spec.name}: fetch {name}"
        if not w.source.strip():
            return StepResult(step, Verdict.REFUSED, f"weight_dirs.{name} declares no `source` command and its "
                              "files are absent", reason="weights_no_source",
                              lines=[f"fix: put the files under {host_dir(root, spec.name, name)} by hand, or add "
                                     f"weight_dirs.{name}.source to {loaded.path.name}"],
                              seconds=time.monotonic() - start)
        if w.gated and w.auth_hint and not environ.get(w.auth_hint):
            return StepResult(step, Verdict.REFUSED, f"weight_dirs.{name} is gated and ${w.auth_hint} is not set",
                              reason="weights_token_missing",
                              lines=[f"fix: export {w.auth_hint}=<your token> in this shell and re-run; envport "
                                     "passes it to the source command and writes it nowhere"],
                              seconds=time.monotonic() - start)
        result = _run_source(loaded, name, w, root, interpreter_bin, environ, progress)
        if result is not None:
            result.seconds = time.monotonic() - start
            return result
        left = check_unpinned(spec, name, w, root) if _fetched_unpinned(w) else None
        if left is not None and left.problem == "missing":
            return StepResult(step, Verdict.FAILED, f"`{w.source}` exited 0 and left {left.path} empty: a download "
                              "that swallowed its error", reason="weights_incomplete",
                              lines=[f"fix: run `{w.source}` by hand with ${w.env or WEIGHT_DIR_VAR}={left.path} "
                                     "and read what it says"], seconds=time.monotonic() - start)
        lines.append(f"fetched {name} with `{w.source}`")
    again = verify(loaded, root, progress)
    again.lines = lines + again.lines
    again.seconds = time.monotonic() - start
    if again.verdict is Verdict.PRESENT:
        again.verdict = Verdict.OK
        again.detail = "fetched; " + again.detail
    return again


def _run_source(loaded: Loaded, name: str, w: WeightDir, root: Path, interpreter_bin: Optional[Path],
                environ: dict, progress: Progress) -> Optional[StepResult]:
    target = host_dir(root, loaded.spec.name, name)
    target.mkdir(parents=True, exist_ok=True)
    env = dict(environ)
    env[WEIGHT_DIR_VAR] = str(target)
    if w.env:
        env[w.env] = str(target)
    if interpreter_bin is not None:
        # The tool's own downloader looks for `python` on PATH, not in a variable: the env's comes first.
        env["PATH"] = f"{interpreter_bin}{os.pathsep}{env.get('PATH', '')}"
    step = f"weights {loaded.spec.name}: fetch {name}"
    progress(f"envport: [weights] {name}: running `{w.source}` in {loaded.path.parent} -> {target}")
    proc = run(["bash", "-c", w.source], cwd=loaded.path.parent, env=env, errors="replace", timeout=FETCH_TIMEOUT_S)
    if proc.timed_out:
        return StepResult(step, Verdict.FAILED, f"`{w.source}` did not finish within {FETCH_TIMEOUT_S}s",
                          reason="weights_fetch_failed")
    out = [secrets.scrub(ln) for ln in proc.text.strip().splitlines()[-TAIL:]]
    for ln in out:
        progress(f"envport: [weights]   {ln}")
    if proc.returncode == 3:
        # The tool's own vocabulary: 3 is "refused, and here is why", not "it broke".
        return StepResult(step, Verdict.REFUSED, f"`{w.source}` refused (exit 3); its own words follow",
                          reason="weights_fetch_refused", lines=out)
    if not proc.ok:
        return StepResult(step, Verdict.FAILED, f"`{w.source}` exited {proc.returncode}",
                          reason="weights_fetch_failed", lines=out)
    return None


def stage(loaded: Loaded, root: Path, host_target, *, progress: Progress = quiet) -> StepResult:
    """Copy verified weights to an SSH host's weights root (`~/.envport/weights/<env>/...` there)."""
    from envport.engines.ssh import ssh_argv

    start = time.monotonic()
    spec = loaded.spec
    first = verify(loaded, root, progress)
    step = f"weights {spec.name}: stage"
    if not first.verdict.ok:
        first.step = step
        return first
    if first.verdict is Verdict.SKIPPED:
        return first
    src = host_dir(root, spec.name, "")
    files = sorted(str(Path(n) / f.path) for n, w in spec.weight_dirs.items() for f in w.files)
    tar = spawn(["tar", "-C", str(src), "-cf", "-", "--", *files], stderr=None)
    remote = f'mkdir -p "$HOME/.envport/weights/{spec.name}" && tar -C "$HOME/.envport/weights/{spec.name}" -xf -'
    proc = run(ssh_argv(host_target) + [remote], stdin_from=tar.stdout, timeout=FETCH_TIMEOUT_S)
    tar.stdout.close()
    tar.wait()
    if not proc.ok or tar.returncode != 0:
        return StepResult(step, Verdict.FAILED, f"copying {len(files)} files failed (ssh exit {proc.returncode})",
                          reason="weights_stage_failed", lines=(proc.stderr or proc.why).splitlines()[-TAIL:],
                          seconds=time.monotonic() - start)
    return StepResult(step, Verdict.OK, f"{len(files)} files copied to ~/.envport/weights/{spec.name} on the host",
                      seconds=time.monotonic() - start)


def declared_bytes(spec: Spec) -> int:
    """What the weights take on disk, from their files' sizes, else each dir's size_gb."""
    total = 0
    for w in spec.weight_dirs.values():
        sized = sum(f.size or 0 for f in w.files)
        total += sized or int((w.size_gb or 0) * 1e9)
    return total


def missing_bytes(spec: Spec, root: Path) -> int:
    """The declared bytes not already on disk (cheap: sizes, not digests)."""
    total = 0
    for n, w in spec.weight_dirs.items():
        base = host_dir(root, spec.name, n)
        if not w.files:
            total += 0 if base.is_dir() and any(base.iterdir()) else int((w.size_gb or 0) * 1e9)
            continue
        for f in w.files:
            p = base / f.path
            have = p.stat().st_size if p.is_file() else 0
            total += max((f.size or 0) - have, 0)
    return total


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
