"""What an env has, read inside it with the stdlib only, and whether the spec's pins hold.

This file runs in two places: envport imports it (the docker and apptainer
builders check an image's probe output with `failures`), and the setup
scripts embed its text and run it with the env's own interpreter
(`python -I -c SOURCE record|compare|pins ...`), over SSH too, where no
envport is installed.  So it imports nothing outside the stdlib at module
level, and it never starts pip: a `pip list` costs about a second, this scan
reads each `*.dist-info/METADATA` header and takes a few milliseconds.

A pin is a requirement `name==version` in the last pip phase that names the
package; pip does not keep earlier pins when a later phase's resolve wants
another version (seed 004: "Wrong torch/numpy after install"), so a build
that says OK must have checked them.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import sysconfig

SNAPSHOT_SUFFIX = ".dists"


def canonical(name: str) -> str:
    """PEP 503: `Foo_Bar.baz` and `foo-bar-baz` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _header(path: str) -> tuple[str, str]:
    name = version = ""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                break  # the headers end at the first blank line; the long description follows
            key, _, value = line.partition(":")
            if key == "Name" and not name:
                name = value.strip()
            elif key == "Version" and not version:
                version = value.strip()
    return name, version


def _site_dirs() -> list:
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


def _metadata_files(site_dir: str):
    """(dist-info dir or None, METADATA/PKG-INFO path) per distribution in SITE_DIR."""
    try:
        entries = sorted(os.listdir(site_dir))
    except OSError:
        return
    for entry in entries:
        if entry.endswith(".dist-info"):
            yield os.path.join(site_dir, entry), os.path.join(site_dir, entry, "METADATA")
        elif entry.endswith(".egg-info"):
            meta = os.path.join(site_dir, entry, "PKG-INFO")
            yield None, meta if os.path.isfile(meta) else os.path.join(site_dir, entry)


def scan() -> dict:
    """{canonical name: version} of every distribution in this interpreter's site dirs."""
    found: dict = {}
    for site_dir in _site_dirs():
        for _, meta in _metadata_files(site_dir):
            try:
                name, version = _header(meta)
            except OSError:
                continue
            if name:
                found[canonical(name)] = version
    return dict(sorted(found.items()))


def missing_files() -> dict:
    """{canonical name: [paths]} of installed files its RECORD lists that are gone.

    The metadata alone misses `rm -rf site-packages/einops` (the dist-info stays);
    a stat per RECORD line catches it (torch's ~20k lines: tens of milliseconds).
    Byte-code files are skipped: deleting them is harmless and Python rewrites them.
    """
    out: dict = {}
    for site_dir in _site_dirs():
        for info, meta in _metadata_files(site_dir):
            record = os.path.join(info, "RECORD") if info else ""
            if not record or not os.path.isfile(record):
                continue
            try:
                name, _ = _header(meta)
                with open(record, encoding="utf-8", errors="replace", newline="") as fh:
                    rows = list(csv.reader(fh))
            except (OSError, csv.Error):
                continue
            gone = []
            for row in rows:
                path = row[0] if row else ""
                if not path or path.endswith(".pyc"):
                    continue
                if not os.path.lexists(os.path.join(site_dir, path)):
                    gone.append(path)
            if gone:
                out[canonical(name)] = gone
    return out


def dump(dists: dict) -> str:
    return "".join(f"{n}=={v}\n" for n, v in sorted(dists.items()))


def load(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        name, sep, version = line.partition("==")
        if sep:
            out[name] = version
    return out


def differences(recorded: dict, now: dict) -> list:
    """What changed since a build recorded `recorded`, one phrase per distribution."""
    out = []
    for name in sorted(set(recorded) | set(now)):
        was, has = recorded.get(name), now.get(name)
        if was == has:
            continue
        if has is None:
            out.append(f"{name} {was} is missing")
        elif was is None:
            out.append(f"{name} {has} was added")
        else:
            out.append(f"{name} is {has}, the build installed {was}")
    return out


# --- PEP 440 `==` without `packaging` (the env may not have it) -------------------------


def _norm(version: str) -> tuple:
    v = version.strip().lower()
    if v.startswith("v"):
        v = v[1:]
    m = re.match(r"^(?:(\d+)!)?(\d+(?:\.\d+)*)(.*)$", v)
    if not m:
        return ("", v)
    release = [int(x) for x in m.group(2).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()  # 2.0 == 2.0.0
    rest = re.sub(r"[-_.]", "", m.group(3))
    return (int(m.group(1) or 0), tuple(release), rest)


def pin_holds(pin: str, installed: str) -> bool:
    """`==pin` admits `installed`: zero padding, `.*` prefixes, a local label only when the pin names one."""
    if pin.startswith("="):  # === arbitrary equality: the strings themselves
        return pin[1:] == installed
    if pin.endswith(".*"):
        want = [int(x) for x in re.findall(r"\d+", pin[:-2])]
        public = installed.split("+")[0]
        got = _norm(public)
        return got[0] == 0 and list(got[1][: len(want)]) + [0] * max(0, len(want) - len(got[1])) == want
    if "+" in pin:
        return _norm(pin.split("+")[0]) == _norm(installed.split("+")[0]) and \
            pin.split("+", 1)[1].lower() == (installed.split("+", 1)[1].lower() if "+" in installed else None)
    return _norm(pin) == _norm(installed.split("+")[0])


def _mover(name: str, pinned_in: int, snapshots: dict) -> str:
    """The first later phase after which the package is no longer what its pinning phase left."""
    base = snapshots.get(pinned_in, {}).get(name)
    for phase in sorted(p for p in snapshots if p > pinned_in):
        if snapshots[phase].get(name) != base:
            return f"pip phase {phase}"
    return ""


def failures(pins: list, installed: dict, snapshots: dict | None = None) -> list:
    """One message per pin the env does not hold: the package, the phase that pinned it, the
    version that won, who moved it (when phase snapshots say) and the fix."""
    snapshots = snapshots or {}
    out = []
    for name, version, phase in pins:
        have = installed.get(canonical(name))
        if have is not None and pin_holds(version, have):
            continue
        mover = _mover(canonical(name), phase, snapshots)
        after = f"after {mover}" if mover else "after the last phase that changes it"
        got = f"{name} {have} won" if have is not None else "it is not installed"
        by = f" ({mover} moved it)" if mover and have is not None else (f" ({mover} removed it)" if mover else "")
        out.append(f"{name}=={version} (pinned by pip phase {phase}): {got}{by}; fix: pin a version of "
                   f"what pulled it that accepts {name}=={version} in that phase, or add a snap-back phase "
                   f"{after}: {{packages: [\"{name}=={version}\"], no_deps: true, force_reinstall: true}}")
    return out


def plan_pins(plan) -> list:
    """[(name, version, phase)] for each package whose last naming phase pins it with `==`.

    Runs in envport only (needs `packaging`).  A requirement with an environment
    marker is skipped: whether it applies depends on the env, not the spec.
    """
    from packaging.requirements import Requirement

    last: dict = {}
    for step in plan.steps:
        if step.kind != "pip":
            continue
        for text in step.packages:
            req = Requirement(text)
            exact = [s.version for s in req.specifier if s.operator == "=="]
            exact += ["=" + s.version for s in req.specifier if s.operator == "==="]
            pinned = exact[0] if exact and req.marker is None and not req.url else None
            last[canonical(req.name)] = (req.name, pinned, step.index)
    return [(name, v, phase) for _, (name, v, phase) in sorted(last.items()) if v is not None]


def main(argv: list) -> int:
    cmd = argv[0] if argv else ""
    if cmd == "scan":
        print(json.dumps(scan(), sort_keys=True))
        return 0
    if cmd == "record":  # record FILE
        with open(argv[1], "w", encoding="utf-8") as fh:
            fh.write(dump(scan()))
        return 0
    if cmd == "compare":  # compare FILE: exit 1 naming what differs
        with open(argv[1], encoding="utf-8") as fh:
            diffs = differences(load(fh.read()), scan())
        for name, gone in sorted(missing_files().items()):
            more = f" and {len(gone) - 3} more" if len(gone) > 3 else ""
            diffs.append(f"{name} lost {len(gone)} installed file(s): {', '.join(gone[:3])}{more}")
        if diffs:
            print("; ".join(diffs))
        return 1 if diffs else 0
    if cmd == "pins":  # pins PINS_JSON SNAPSHOT_DIR: exit 1, one line per pin that does not hold
        snapshots = {}
        if len(argv) > 2 and os.path.isdir(argv[2]):
            for entry in os.listdir(argv[2]):
                if entry.endswith(SNAPSHOT_SUFFIX) and entry[: -len(SNAPSHOT_SUFFIX)].isdigit():
                    with open(os.path.join(argv[2], entry), encoding="utf-8") as fh:
                        snapshots[int(entry[: -len(SNAPSHOT_SUFFIX)])] = load(fh.read())
        bad = failures(json.loads(argv[1]), scan(), snapshots)
        for line in bad:
            print(line)
        return 1 if bad else 0
    print(f"usage: envcheck scan | record FILE | compare FILE | pins PINS_JSON [DIR] (got {argv!r})",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
