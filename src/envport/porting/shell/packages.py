"""System package managers: apt (-> system_pkgs), and yum/dnf/apk, whose names are another distribution's."""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Optional

from envport.porting.report import DROPPED, KEPT, turned_into
from envport.porting.shell.context import Outcome, ShellContext
from envport.porting.words import COMPUTED

APT = {"apt-get", "apt", "aptitude"}
YUM = {"yum", "dnf", "microdnf"}
DEB_PKG = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$")


def packages_family(words, seg, line, ctx) -> Optional[Outcome]:
    cmd = posixpath.basename(words[0])
    if cmd in APT:
        return _apt(words, seg, line, ctx)
    if cmd in YUM or cmd == "apk":
        return _other_pkg(cmd, words, seg, line, ctx)
    return None


def _apt(words, seg, line, ctx) -> Outcome:
    from envport.porting.security import note_insecure

    note_insecure(ctx.draft, "apt", words, line, ctx.file)
    sub = next((w for w in words[1:] if not w.startswith("-")), "")
    if sub in ("update", "clean", "autoclean", "autoremove"):
        return Outcome.DONE
    if sub in ("upgrade", "dist-upgrade", "full-upgrade"):
        ctx.note(line, seg, KEPT, "upgrades the base image's packages: the env changes as the mirror does",
                 "use a newer base image instead")
        return Outcome.KEEP
    if sub != "install":
        return Outcome.KEEP
    pkgs, bad, args = [], [], _known_args(words[1:], seg, line, ctx)
    computed = [w for w in args if "$" in w or COMPUTED.search(w)]
    if computed:
        ctx.note(line, seg, KEPT, f"a package name computed when the line runs ({computed[0]}): its value is unknown "
                 "here, so the whole install stays a run command", "write the package names into system_pkgs")
        return Outcome.KEEP
    skip = False
    for j, w in enumerate(args):
        if skip:
            skip = False
            continue
        if w in ("-t", "--target-release", "-o", "--option"):
            ctx.note(line, f"{w} {args[j + 1] if j + 1 < len(args) else ''}", DROPPED,
                     "apt options other than -y/--no-install-recommends have no spec field")
            skip = True
            continue
        if w.startswith("-") or w == "install":
            continue
        (pkgs if DEB_PKG.match(w) else bad).append(w)
    ctx.draft.add_system(pkgs)
    for p in pkgs:  # deadsnakes' `python3.10`, `python3.10-venv`: the interpreter the env runs
        if (m := re.match(r"^python(3\.\d{1,2})(-venv|-dev|-full)?$", p)):
            ctx.draft.set_python(m.group(1), f"the apt package {p}", line, ctx.file)
    if bad:
        ctx.note(line, " ".join(bad), KEPT, "not Debian package names the spec accepts (a variable, glob or "
                 "file?)", "write the package names into system_pkgs")
        ctx.draft.add_run("apt-get install -y " + " ".join(shlex.quote(b) for b in bad), line, ctx.file)
    return Outcome.DONE


def _known_args(args: list[str], seg: str, line, ctx: ShellContext) -> list[str]:
    """ARGS with each `$VAR` a build arg's default or an earlier ENV gives substituted (one rule: the
    default is what the build used); a word with an unknown variable, or a command substitution, is left as
    written."""
    from envport.porting.envvars import substitute

    out, used = [], []
    for w in args:
        if "$" in w and not COMPUTED.search(w):
            sub, missing = substitute(w, ctx.variables)
            if sub is not None and not missing:
                used.append(f"{w} -> {sub}")
                w = sub
        out.append(w)
    if used:
        ctx.note(line, seg, turned_into("system_pkgs"), f"package names written with build args or ENV values, "
                 f"read with their defaults: {', '.join(used)}", "a build with other --build-arg values needs "
                 "those names in system_pkgs")
    return out


def _other_pkg(cmd, words, seg, line, ctx) -> Outcome:
    sub = next((w for w in words[1:] if not w.startswith("-")), "")
    if (cmd == "apk" and sub in ("update",)) or sub in ("clean", "makecache"):
        return Outcome.DONE
    if not ((cmd == "apk" and sub == "add") or (cmd != "apk" and sub == "install")):
        return Outcome.KEEP
    pkgs = [w for w in words[1:] if not w.startswith("-") and w != sub]
    good = [p for p in pkgs if DEB_PKG.match(p)]
    ctx.draft.add_system(good)
    ctx.note(line, seg, turned_into("system_pkgs"), f"{cmd} package names are that distribution's; envport installs "
             "system_pkgs with apt-get on a Debian/Ubuntu base", "check each name against Debian's "
             "(e.g. gcc-c++ -> g++, python3-devel -> python3-dev)")
    return Outcome.DONE
