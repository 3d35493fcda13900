"""Assertions generated from a spec, and how each is judged against a built env.

One `Check` per thing the spec promises: every system package installed
(dpkg), every pip package at the version the LAST phase naming it asks for,
the python version, every env var's exact bytes, every shim file's sha256 and
mode, every pinned weight file at its size and sha256 where the env reads it, and the image's
`envport.hash` label.  `Facts` asks the env once per kind (one `pip list`,
one `env -0`, one `dpkg-query`) through a testinfra host, so a check costs a
dictionary lookup; the same checks work on any testinfra backend.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from envport.spec.loader import Loaded
from envport.plan.steps import CONTAINER_VENV
from envport.spec.model import GIT_SHA_RE, Spec, canonical_name, direct_ref, last_pins


@dataclass(frozen=True)
class Check:
    id: str  # readable and unique: pip[torch==2.13.0], env[DEMO_GREETING]
    kind: str  # system | pip | pip-ref (a `name @ URL`) | python | env | file | weight | label
    key: str  # package, variable, path or label
    expected: str  # version/specifier, value, sha256, hash
    mode: Optional[str] = None  # files: octal mode


class CheckFailed(AssertionError):
    """A check that did not hold; its message is the whole report (no traceback)."""


class CheckSkipped(Exception):
    pass


def last_requirements(spec: Spec) -> dict[str, Requirement]:
    """Each package's requirement from the last phase that names it (canonical name -> requirement)."""
    out: dict[str, Requirement] = {}
    for phase in spec.pip_phases:
        for text in phase.packages:
            req = Requirement(text)
            out[canonical_name(req.name)] = req
    return out


def spec_checks(loaded: Loaded, hash_: str) -> list[Check]:
    spec = loaded.spec
    checks: list[Check] = []
    for pkg in spec.system_pkgs:
        name, _, version = pkg.partition("=")
        checks.append(Check(f"system[{pkg}]", "system", name, version))
    pins = last_pins(spec)
    for name, req in sorted(last_requirements(spec).items()):
        if req.url:
            checks.append(_direct_check(name, str(req)))
        elif name in pins:
            checks.append(Check(f"pip[{name}=={pins[name]}]", "pip", name, f"=={pins[name]}"))
        else:
            checks.append(Check(f"pip[{name}{req.specifier}]", "pip", name, str(req.specifier)))
    checks.append(Check(f"python[{spec.python}]", "python", "python", spec.python))
    env = dict(spec.env)
    for w in spec.weight_dirs.values():
        if w.env:
            env.setdefault(w.env, w.path)
    for key, value in sorted(env.items()):
        checks.append(Check(f"env[{key}]", "env", key, value))
    for dest, f in sorted(_shims(loaded).items()):
        checks.append(Check(f"file[{dest}]", "file", dest, f[0], mode=f[1] or None))
    for wname, w in sorted(spec.weight_dirs.items()):
        # What the spec pins, where the env finds it (a backend rebases the path to its weights).
        for f in w.files:
            checks.append(Check(f"weight[{wname}/{f.path}]", "weight", f"{w.path}/{f.path}",
                                f"{'' if f.size is None else f.size}:{f.sha256 or ''}"))
        if not w.files:
            checks.append(Check(f"weight[{wname}:{w.path}]", "weight-dir", w.path, ""))
    checks.append(Check("label[envport.hash]", "label", "envport.hash", hash_))
    return checks


def _direct_check(name: str, text: str) -> Check:
    """A `name @ URL` requirement pins what its URL names: a git commit, or the version in a wheel's file name."""
    kind, url, ref = direct_ref(text)
    if kind == "git":
        # Only a full sha pins anything; a branch or tag is checked for presence (the spec warns).
        return Check(f"pip[{name}@{ref or 'HEAD'}]", "pip-ref", name, f"commit:{ref}" if GIT_SHA_RE.match(ref) else "")
    file = url.split("#", 1)[0].rsplit("/", 1)[-1]
    parts = file[:-4].split("-") if file.endswith(".whl") else []
    if len(parts) >= 5:
        return Check(f"pip[{name}=={parts[1]}]", "pip", name, f"=={parts[1]}")
    return Check(f"pip[{name}@{file}]", "pip-ref", name, "")


def _shims(loaded: Loaded) -> dict[str, tuple[str, str]]:
    """dest -> (sha256, mode) of each shim file; ("", "") where the bytes are not known (a SIF's embedded spec)."""
    import hashlib

    if loaded.embedded_in is not None:
        return {dest: ("", "") for dest in loaded.spec.shim_files}
    out = {}
    for dest, data in loaded.shim_bytes().items():
        out[dest] = (hashlib.sha256(data).hexdigest(), "0755" if data.startswith(b"#!") else "0644")
    return out


@dataclass
class Facts:
    """What the env holds, asked once per kind through a testinfra host."""

    host: object  # testinfra.host.Host
    labels: dict = field(default_factory=dict)  # the image's labels (docker), else empty
    venv: str = CONTAINER_VENV
    # --image given: an image built from another version of the spec may carry another hash.
    foreign_hash_ok: bool = False

    def _run(self, command: str):
        return self.host.run(command)

    @cached_property
    def pip(self) -> dict[str, str]:
        packages = self.host.pip.get_packages(pip_path=f"{self.venv}/bin/pip")
        return {canonical_name(k): v["version"] for k, v in packages.items()}

    @cached_property
    def direct_urls(self) -> dict[str, dict]:
        """Each distribution's PEP 610 direct_url.json (what pip recorded for a `name @ URL` install)."""
        import json

        script = ("import json, importlib.metadata as m; print(json.dumps({d.metadata['Name']: "
                  "json.loads(d.read_text('direct_url.json') or 'null') for d in m.distributions()}))")
        out = self._run(f"{shlex.quote(self.venv + '/bin/python')} -c {shlex.quote(script)}")
        if out.rc != 0:
            raise CheckFailed(f"reading direct_url.json in {self.venv} failed: {(out.stderr or out.stdout).strip()[-300:]}")
        return {canonical_name(k): v for k, v in json.loads(out.stdout).items() if v}

    @cached_property
    def env(self) -> dict[bytes, bytes]:
        out = self._run("env -0")
        if out.rc != 0:
            raise CheckFailed(f"`env -0` failed in the env: {out.stderr.strip()}")
        return parse_env0(out.stdout_bytes)

    @cached_property
    def dpkg(self) -> dict[str, tuple[str, str]]:
        out = self._run("dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Status}\\n'")
        if out.rc != 0:
            raise CheckFailed(f"dpkg-query failed in the env: {out.stderr.strip()}")
        rows = {}
        for line in out.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                rows[parts[0]] = (parts[1], parts[2])
        return rows

    @cached_property
    def python(self) -> str:
        out = self._run(f"{shlex.quote(self.venv + '/bin/python')} -c "
                        "'import sys; print(\"%d.%d.%d\" % sys.version_info[:3])'")
        if out.rc != 0:
            raise CheckFailed(f"{self.venv}/bin/python does not run: {(out.stderr or out.stdout).strip()[-300:]}")
        return out.stdout.strip()


def shell_path(path: str) -> str:
    """A path for the env's shell: quoted, with a leading ~/ left to the shell (an SSH host's home)."""
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _judge_weight(check: Check, facts: Facts) -> str:
    """Size and sha256 of one pinned weight file, every byte read where the env reads it."""
    size_pin, _, sha_pin = check.expected.partition(":")
    p = shell_path(check.key)
    out = facts.host.run(f"test -f {p} && stat -L -c %s {p} && sha256sum < {p}")
    if out.rc != 0:
        raise CheckFailed(f"weight file {check.key} is absent (fix: envport weights fetch, or the up command)")
    lines = out.stdout.split("\n")
    size, digest = lines[0].strip(), (lines[1].split() or [""])[0]
    if (size_pin and size != size_pin) or (sha_pin and digest != sha_pin):
        raise CheckFailed(f"weight file {check.key}: {size} bytes, sha256 {digest}; the pin is "
                          f"{size_pin or '(any)'} bytes, sha256 {sha_pin or '(any)'}")
    return f"{size} bytes, sha256 {digest[:12]}"


def parse_env0(data: bytes) -> dict[bytes, bytes]:
    """`env -0` output as {name: value}, bytes kept exactly (values may hold newlines)."""
    pairs = {}
    for item in data.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            pairs[k] = v
    return pairs


def judge(check: Check, facts: Facts) -> str:
    """Raise CheckFailed (or CheckSkipped) unless the check holds; return what was seen."""
    judge_kind = JUDGES.get(check.kind)
    if judge_kind is None:
        raise ValueError(f"unknown check kind {check.kind!r}")
    return judge_kind(check, facts)


# One judge per check kind: (check, facts) -> what was seen, or CheckFailed / CheckSkipped.
def _judge_system(check: Check, facts: Facts) -> str:
    row = facts.dpkg.get(check.key)
    if row is None or row[1] != "installed":
        raise CheckFailed(f"{check.key} is not installed (dpkg: {row[1] if row else 'unknown package'})")
    if check.expected and row[0] != check.expected:
        raise CheckFailed(f"{check.key} is {row[0]}, the spec pins {check.expected}")
    return row[0]


def _judge_pip(check: Check, facts: Facts) -> str:
    have = facts.pip.get(check.key)
    if have is None:
        raise CheckFailed(f"{check.key} is not installed (pip list in {facts.venv} has no {check.key})")
    try:
        ok = SpecifierSet(check.expected).contains(Version(have), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise CheckFailed(f"{check.key} {have} is installed, the last phase naming it asks {check.expected}")
    return have


def _judge_pip_ref(check: Check, facts: Facts) -> str:
    have = facts.pip.get(check.key)
    if have is None:
        raise CheckFailed(f"{check.key} is not installed (pip list in {facts.venv} has no {check.key})")
    if check.expected.startswith("commit:"):
        want = check.expected.split(":", 1)[1]
        got = (facts.direct_urls.get(check.key) or {}).get("vcs_info", {}).get("commit_id")
        if got != want:
            raise CheckFailed(f"{check.key} {have} was installed from commit {got or '(no direct_url.json)'}, "
                              f"the spec pins {want}")
        return f"{have} @ {want[:12]}"
    return have


def _judge_python(check: Check, facts: Facts) -> str:
    have = facts.python
    if have.rsplit(".", 1)[0] != check.expected:
        raise CheckFailed(f"{facts.venv}/bin/python is {have}, the spec says {check.expected}")
    return have


def _judge_env(check: Check, facts: Facts) -> str:
    have = facts.env.get(check.key.encode())
    want = check.expected.encode("utf-8")
    if want.startswith(b"~/") and facts.env.get(b"HOME"):
        want = facts.env[b"HOME"] + want[1:]  # a weights folder on an SSH host, under its home
    if have is None:
        raise CheckFailed(f"{check.key} is not set in the env (expected {want!r})")
    if have != want:
        raise CheckFailed(f"{check.key} is {have!r}, expected {want!r}")
    return have.decode("utf-8", "replace")


def _judge_file(check: Check, facts: Facts) -> str:
    f = facts.host.file(check.key)
    if not f.exists or not f.is_file:
        raise CheckFailed(f"{check.key} is missing (or not a regular file)")
    if not check.expected:
        raise CheckSkipped(f"{check.key} is there; its bytes were not checked: the spec the SIF embeds "
                           "names the file, not its bytes (verify in its project to check them)")
    digest = f.sha256sum
    if digest != check.expected:
        raise CheckFailed(f"{check.key} has sha256 {digest}, the spec's file has {check.expected}")
    mode = "%04o" % f.mode
    if check.mode and mode != check.mode:
        raise CheckFailed(f"{check.key} has mode {mode}, expected {check.mode}")
    return digest


def _judge_weight_dir(check: Check, facts: Facts) -> str:
    out = facts.host.run(f"test -d {shell_path(check.key)}")
    if out.rc != 0:
        raise CheckFailed(f"weight folder {check.key} is missing")
    return "present"


def _judge_label(check: Check, facts: Facts) -> str:
    have = facts.labels.get(check.key)
    if have == check.expected:
        return have
    if have and facts.foreign_hash_ok:
        raise CheckSkipped(f"the image was built from another version of the spec ({check.key}={have[:12]}, "
                           f"spec {check.expected[:12]}); its contents are what was checked")
    raise CheckFailed(f"image label {check.key} is {have!r}, expected {check.expected}")


JUDGES = {"system": _judge_system, "pip": _judge_pip, "pip-ref": _judge_pip_ref, "python": _judge_python,
          "env": _judge_env, "file": _judge_file, "weight": _judge_weight, "weight-dir": _judge_weight_dir,
          "label": _judge_label}
