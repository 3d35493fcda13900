"""Shell commands (Dockerfile RUN, `.def` %post, install scripts) -> spec fields, words read as bash reads them.

A command line is split at its top-level `&&` and `;`; each simple command
is then either a package install that maps onto a field (apt -> system_pkgs,
pip -> one phase per call, `python3.X -m venv` -> python), cleanup envport's
renderers do themselves (dropped), or a run command, kept in order with its
source line (consecutive ones from one line stay joined with `&&`).  A line
with `||`, `&`, a here-document or an `if`/`for`/`while` is kept whole: it
cannot be split without changing what it does.  Kept text is then looked at
for what a user must hear about (downloads, branch clones, patched packages,
bash-only syntax under /bin/sh).
"""

from __future__ import annotations

import enum
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import Callable, Optional

from envport.porting.words import COMPUTED, strip_comments
from envport.porting.words import split as split_words
from envport.porting.pip_args import install_phase
from envport.porting.report import DROPPED, KEPT, REPORTED, Draft, turned_into
from envport.porting.requirements import PipContext

CONTAINER_VENV = "/opt/envport/venv"
COMPOUND = {"if", "for", "while", "until", "case", "select", "function", "{", "(", "[["}
CLEANUP = re.compile(r"^(/var/lib/apt/lists(/\*)?|/var/cache/apt(/\*)?|/var/cache/apt/archives(/\*)?|"
                     r"(/root|~|\$HOME)/\.cache/pip(/\*)?|/tmp/envport-wheelhouse|/var/cache/(yum|dnf|apk)(/\*)?)/?$")
APT = {"apt-get", "apt", "aptitude"}
YUM = {"yum", "dnf", "microdnf"}
CONDA = {"conda", "mamba", "micromamba"}
LOCKFILE = {("uv", "sync"), ("poetry", "install"), ("pipenv", "install"), ("pipenv", "sync"), ("pdm", "install"),
            ("pdm", "sync"), ("conda-lock", "install"), ("conda-lock", ""), ("pip-sync", ""), ("hatch", "env")}
PYTHON_CMD = re.compile(r"^python(3(\.\d{1,2})?)?$")
PIP_CMD = re.compile(r"^pip(3(\.\d{1,2})?)?$")
# A weight file by its extension, at the end of a word (a URL, an -o target), not only of the line.
WEIGHT_FILE = re.compile(r"\.(pt|pth|ckpt|safetensors|bin|h5|onnx|gguf|npz|msgpack|pb|tflite|params)"
                         r"(\?\S*)?(?=$|[\s'\";|&)])", re.I)
# An archive whose name says what it holds: alphafold_params_2022-12-06.tar, weights.tar.gz, checkpoints.zip.
WEIGHT_ARCHIVE = re.compile(r"[\w.-]*(params|weights?|checkpoints?|ckpts?|models?)[\w.-]*"
                            r"\.(tar(\.(gz|bz2|xz|zst))?|tgz|zip)(?=$|[\s'\";|&)?])", re.I)
WEIGHT_HINT = re.compile(r"huggingface\.co|zenodo\.org|/(weights?|models?|checkpoints?)(/|$)|\bhf_hub|"
                         r"from_pretrained|snapshot_download|hf_hub_download|torch\.hub\.load|"
                         # hosts that serve model weights: ESM and fairseq, RoseTTAFold, AlphaFold's params,
                         # torchvision's, NGC's model registry
                         r"dl\.fbaipublicfiles\.com|files\.ipd\.uw\.edu|storage\.googleapis\.com/alphafold|"
                         r"download\.pytorch\.org/models|api\.ngc\.nvidia\.com", re.I)
BASH_ONLY = [
    (re.compile(r"\[\[\s"), "`[[ … ]]`"),
    (re.compile(r"(^|[;&|(\s])source\s"), "`source` (sh has `.`)"),
    (re.compile(r"[<>]\("), "process substitution `<(…)`"),
    (re.compile(r"&>"), "`&>` redirection"),
    (re.compile(r"\$'"), "`$'…'` quoting"),
    (re.compile(r"(^|[;&|\s])function\s"), "`function` definitions"),
    (re.compile(r"(^|\s)\w+=\("), "arrays"),
    (re.compile(r"(^|[;&|\s])(pushd|popd|shopt|declare|typeset)\s"), "bash builtins (pushd/shopt/declare)"),
    (re.compile(r"(?<![$\\])\{[^{}\s,$]*,[^{}\s$]*\}"), "brace expansion `{a,b}`"),
]
# A model's own downloader (transformers, the HF hub, torch.hub, a tool's `download-models`).
MODEL_DOWNLOADER = re.compile(r"from_pretrained|snapshot_download|hf_hub_download|torch\.hub\.load|"
                              r"download[-_]?models?\b|install[-_]models\b|fetch[-_]weights|"
                              # download_alphafold_params.sh, download-weights, download_checkpoints.py
                              r"download[-_]\w*?(params|weights?|checkpoints?|models?)\b|"
                              # a tool's downloader module: python -m colabfold.download DIR
                              r"(^|\s)-m\s+[\w.]+\.download(_\w+)?(\s|$)", re.I)
# What unpacks or tidies a download in the same RUN: it belongs to the download's `source`, not the image.
UNPACK = {"tar", "unzip", "gunzip", "zstd", "rm", "mv"}
# `sed … -i …` then an installed package's path: two linear scans (one regex with both, `[^|;&]*\s-i\b.*(…)`,
# backtracked quadratically: 60 KB of ` -i` took 16 s).
SED_INPLACE = re.compile(r"\bsed\b[^|;&]*")
SITE_PATH = re.compile(r"site-packages|dist-packages|/venv/|/lib/python\d|/opt/conda")


def patches_installed(text: str) -> bool:
    """An in-place `sed -i` with an installed package's path after its `-i`."""
    last = max((m.start() for m in SITE_PATH.finditer(text)), default=-1)
    for sed in SED_INPLACE.finditer(text):
        flag = re.search(r"\s-i\b", sed.group())
        if flag and last >= sed.start() + flag.end():
            return True
    return False
GIT_CLONE = re.compile(r"\bgit\s+clone\b")
GIT_PINNED = re.compile(r"\b(checkout|reset\s+--hard|switch\s+--detach|fetch\s+\S+)\s+[0-9a-f]{40}\b")
DOWNLOAD = re.compile(r"(^|[;&|(\s])(wget|curl)\s")
DEB_PKG = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$")


@dataclass
class ShellContext:
    draft: Draft
    file: str
    mode: str  # "docker" (each RUN is its own /bin/sh), "def" (%post: one sh), "script" (one bash)
    open_file: Callable[[str], Optional[tuple[str, str]]] = lambda p: None
    variables: dict[str, str] = field(default_factory=dict)
    shell_is_bash: bool = False  # a Dockerfile SHELL or a script's shebang: bash-only syntax ran fine there
    runtime_env: dict[str, str] = field(default_factory=dict)  # a .def's %environment
    rendered_step: Optional[str] = None  # the plan step of an envport-rendered recipe being read
    rendered_title: str = ""  # that step's title (a pip phase's: its first three requirements)
    rendered: bool = False
    cwd: str = "/"
    # A Dockerfile's other stages the final one copies from: stage name (or index) -> what reading it found.
    stages: dict = field(default_factory=dict)

    def note(self, line, construct, action, why, fix=""):
        self.draft.note(line, construct, action, why, fix, file=self.file)

    def pip(self, line) -> PipContext:
        return PipContext(self.draft, self.file, line, self.open_file, self.variables,
                          python=self.draft.python or "3.11")


def split_top(text: str) -> tuple[list[str], str]:
    """Top-level `&&`/`;` segments of TEXT, and why TEXT must stay whole ("" when it can be split)."""
    segments, cur, i, depth, quote = [], [], 0, 0, ""
    while i < len(text):
        c = text[i]
        two = text[i:i + 2]
        if quote:
            cur.append(c)
            if c == "\\" and quote == '"' and i + 1 < len(text):
                cur.append(text[i + 1])
                i += 1
            elif c == quote:
                quote = ""
        elif c == "\\" and i + 1 < len(text):
            cur += [c, text[i + 1]]
            i += 1
        elif c in "'\"`":
            quote = c
            cur.append(c)
        elif c == "(":  # `$(` too: counted once, at its `(` (counting the `$` as well left depth 1 for good)
            depth += 1
            cur.append(c)
        elif c == ")":
            depth = max(0, depth - 1)
            cur.append(c)
        elif depth == 0 and two == "&&":
            segments.append("".join(cur))
            cur = []
            i += 1
        elif depth == 0 and two == "||":
            return [text], "`||`"
        elif depth == 0 and c == "&" and text[i - 1:i] not in (">", "<") and two not in ("&>",):
            return [text], "a background `&`"
        elif depth == 0 and two == "<<":
            return [text], "a here-document"
        elif depth == 0 and c in ";\n":
            segments.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    if quote:
        return [text], "unbalanced quotes"
    segments.append("".join(cur))
    segments = [s.strip() for s in segments if s.strip()]
    for s in segments:
        first = s.split(None, 1)[0] if s.split() else ""
        if first in COMPOUND or re.match(r"^[A-Za-z_][A-Za-z0-9_]*\(\)", s):
            return [text.strip()], f"`{first}`"
    return segments, ""


def handle(text: str, line: Optional[int], ctx: ShellContext) -> None:
    """Map one command line (a RUN's value, a %post or script line) onto the draft."""
    if ctx.rendered and ctx.rendered_step == "run":
        try:
            noise = _rendered_noise(shlex.split(text), "run", ctx)
        except ValueError:
            noise = False
        if not noise:
            ctx.draft.add_run(text, line, ctx.file)
        return
    text = strip_comments(text)  # a `#` comment is no command: its `;` and words are not split or read
    segments, whole = split_top(text)
    if whole:
        _keep(text.strip(), line, ctx, whole_because=whole)
        return
    pending: list[str] = []
    exports: list[str] = []
    fetched = False  # the previous segment downloaded weights: what unpacks them belongs to its `source`
    for seg in segments:
        first = posixpath.basename(seg.split(None, 1)[0]) if seg.split() else ""
        if fetched and first in UNPACK:
            _, entry = ctx.draft.suggested_weights.pop()
            _suggest_weights(f"{entry['source']} && {seg}", ctx)
            ctx.note(line, seg, DROPPED, "unpacks or tidies the weights downloaded before it in this line",
                     "it is part of that download's `source` in its weight_dirs entry")
            continue
        before = len(ctx.draft.suggested_weights)
        outcome = _classify(seg, line, ctx)
        fetched = len(ctx.draft.suggested_weights) > before
        if outcome is Outcome.KEEP:
            pending.append(seg)
        elif outcome is Outcome.EXPORT:
            exports.append(seg)
            pending.append(seg)
        else:
            _flush(pending, line, ctx)
            pending = []
    if exports and ctx.mode == "docker":
        tail = pending and pending[-1] in exports and all(p in exports for p in pending)
        for e in exports:
            ctx.note(line, f"RUN {e}", DROPPED if tail else KEPT,
                     "an export in a RUN line has no effect in later layers (each RUN is a new shell)",
                     "if the env needs it at run time, add it to `env`")
        if tail:
            pending = []
    _flush(pending, line, ctx)


def _flush(pending: list[str], line: Optional[int], ctx: ShellContext) -> None:
    if pending:
        _keep(" && ".join(pending), line, ctx)


def _keep(text: str, line: Optional[int], ctx: ShellContext, whole_because: str = "") -> None:
    """A run command, with what the user must hear about it."""
    if not text:
        return
    if DOWNLOAD.search(text) or re.search(r"\b(huggingface-cli|hf)\s+download\b", text):
        weighty = _weighty(text)
        if weighty:
            ctx.note(line, text, KEPT, "downloads model weights during the build (the image would carry them)",
                     "move it to a weight_dirs entry's `source` and fetch at run time (see weight_dirs in "
                     "the spec)")
            _suggest_weights(text, ctx)
        else:
            ctx.note(line, text, KEPT, "downloads during the build: what it fetches can change under the same spec",
                     "check a sha256 after the download")
    if GIT_CLONE.search(text) and not GIT_PINNED.search(text):
        m = re.search(r"(-b|--branch)[ =](\S+)", text)
        ref = f"branch {m.group(2)!r}" if m else "the default branch"
        ctx.note(line, text, KEPT, f"clones {ref}: the build changes when it moves",
                 "check out a full commit sha, or install it as `name @ git+https://…@<sha>`")
    if patches_installed(text):
        ctx.note(line, text, KEPT, "patches an installed package in place; a later phase that reinstalls it "
                 "undoes the patch", "keep it after the last pip phase that touches that package, or ship a "
                 "fixed wheel")
    if re.search(r"\b(pip3?|-m pip)\s+uninstall\b", text):
        ctx.note(line, text, KEPT, "pip uninstall: envport's phases only install, and this runs after all of them",
                 "prefer not installing it: no_deps on the phase that pulls it in")
    bashisms = [what for rx, what in BASH_ONLY if rx.search(text)]
    if bashisms and ctx.shell_is_bash:
        ctx.note(line, text, turned_into("`bash -c …` in run_commands"),
                 f"uses {bashisms[0]}, which this recipe ran under bash; envport runs run_commands with /bin/sh "
                 "in Docker and Apptainer", "rewrite it for POSIX sh, or keep the bash -c wrapper")
        text = "bash -c " + shlex.quote(text)
    elif bashisms:
        ctx.note(line, text, KEPT, f"uses {bashisms[0]}, which /bin/sh (dash on Debian) does not understand",
                 "rewrite it for POSIX sh, or wrap it: bash -c '…'")
    if whole_because and not (ctx.rendered and ctx.rendered_step == "run"):
        if _installs(text):
            ctx.note(line, text, KEPT, f"a package install inside {whole_because}: envport keeps the line whole "
                     "(splitting it would change what it does), so it is not a pip phase",
                     "move the install out into its own line")
    ctx.draft.add_run(text, line, ctx.file)


def _weighty(text: str) -> bool:
    """A download that fetches model weights, by shape: a weight file, a weights archive, a known host."""
    return bool(WEIGHT_FILE.search(text) or WEIGHT_ARCHIVE.search(text) or WEIGHT_HINT.search(text))


def _installs(text: str) -> bool:
    return bool(re.search(r"\b(pip3?(\.\d+)?|-m pip|apt-get|apt|conda|mamba|yum|apk)\s+(install|add)\b", text))


def _suggest_weights(text: str, ctx: ShellContext) -> None:
    path, name = _weight_target(text, ctx), _weight_name(text)
    entry = {"path": path if path and path != "/" else f"/weights/{name}"}
    if not path and re.search(r"huggingface|from_pretrained|snapshot_download|hf_hub_download|\bhf\s", text):
        entry["env"] = "HF_HOME"  # the hub's cache: the downloader and the tool both look there
    entry["source"] = text
    ctx.draft.suggested_weights.append((name, entry))


def _weight_target(text: str, ctx: ShellContext) -> str:
    """Where the weights land: an unpack's -C/-d folder (the archive itself is transient), a download's
    folder option, an output file's folder, or a downloader's one absolute folder argument."""
    found = (re.search(r"\s(-C|--directory|-d)[ =](\S+)", text)
             or re.search(r"(-P|--directory-prefix|--local-dir|--cache-dir)[ =](\S+)", text)
             or re.search(r"(-O|-o|--output)[ =](\S+)", text))
    target = found.group(2).strip("'\"") if found else ""
    if target and found.group(1) in ("-O", "-o", "--output"):
        target = posixpath.dirname(target)
    if not target and not re.search(r"https?://", text):
        folders = [w for w in text.split() if w.startswith("/") and not WEIGHT_FILE.search(w)]
        target = folders[-1].strip("'\"") if folders else ""
    if target and not target.startswith("/"):
        target = posixpath.normpath(posixpath.join(ctx.cwd, target))
    return target


def _weight_name(text: str) -> str:
    url = re.search(r"(https?://\S+)", text)
    repo = re.search(r"download\s+([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)", text) or \
        re.search(r"(?:from_pretrained|snapshot_download|hf_hub_download)\(\s*(?:repo_id=)?['\"]([^'\"]+)['\"]", text)
    module = re.search(r"-m\s+([\w]+)[\w.]*\.download", text)
    script = re.search(r"([\w-]*download[\w-]*)\.(sh|py)\b", text)
    stem = (repo.group(1).split("/")[-1] if repo else
            url.group(1).rstrip("/").rsplit("/", 1)[-1].split("?")[0] if url else
            module.group(1) if module else script.group(1) if script else "weights")
    return re.sub(r"[^a-z0-9-]+", "-", stem.lower().split(".")[0]).strip("-")[:40] or "weights"


# Build args and env names recipes use for the interpreter's version (`ARG PYTHON_VERSION=3.10`).
PYTHON_VARIABLE = re.compile(r"^(PYTHON|PY|PYTHON_VER|PYTHON_VERSION|PY_VERSION|PYVER)$")


def python_variable(key: str, value: str, construct: str, line: Optional[int], ctx: ShellContext) -> None:
    """A variable that names the python version: the spec's python, with the line it came from."""
    m = re.match(r"^(3\.\d{1,2})(\.\d+)?$", value or "")
    if PYTHON_VARIABLE.match(key) and m:
        ctx.draft.set_python(m.group(1), f"`{construct}`", line, ctx.file)


def _strip_prefix(words: list[str], line, ctx: ShellContext) -> list[str]:
    while words:
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) and len(words) > 1:
            if not words[0].startswith("DEBIAN_FRONTEND="):
                ctx.variables = dict(ctx.variables)
            words = words[1:]
        elif words[0] in ("sudo", "command", "exec", "nice", "time"):
            words = words[1:]
            while words and words[0].startswith("-") and words[0] != "-":
                words = words[1:]
        else:
            break
    return words


class Outcome(enum.Enum):
    """What one simple command became."""

    KEEP = "keep"  # a run command, kept in order
    EXPORT = "export"  # a RUN's export: kept unless nothing follows it in the line
    DONE = "done"  # mapped onto a field, or dropped with a note


def _classify(seg: str, line: Optional[int], ctx: ShellContext) -> Outcome:
    try:
        words = split_words(seg)
    except ValueError:
        ctx.note(line, seg, KEPT, "unbalanced quotes: shlex cannot split it into words")
        return Outcome.KEEP
    words = _command_words(_strip_prefix(words, line, ctx), ctx)
    if not words:
        return Outcome.DONE
    if ctx.rendered and _rendered_noise(words, ctx.rendered_step, ctx):
        return Outcome.DONE
    for handler in HANDLERS:
        outcome = handler(words, seg, line, ctx)
        if outcome is not None:
            return outcome
    if posixpath.basename(words[0]) == "cd" and len(words) == 2 and words[1].startswith("/"):
        ctx.cwd = words[1]
    return Outcome.KEEP


def _command_words(words: list[str], ctx: ShellContext) -> list[str]:
    """`python${PYTHON_VERSION} -m venv`: the command name with the build args' defaults substituted."""
    if words and "$" in words[0] and not COMPUTED.search(words[0]):
        from envport.porting.envvars import substitute

        sub, missing = substitute(words[0], ctx.variables)
        if sub is not None and not missing:
            return [sub, *words[1:]]
    return words


# One handler per command family: (words, seg, line, ctx) -> an Outcome, or None when it is not theirs.
def _packages_family(words, seg, line, ctx) -> Optional[Outcome]:
    cmd = posixpath.basename(words[0])
    if cmd in APT:
        return _apt(words, seg, line, ctx)
    if cmd in YUM or cmd == "apk":
        return _other_pkg(cmd, words, seg, line, ctx)
    return None


def _housekeeping_family(words, seg, line, ctx) -> Optional[Outcome]:
    """Cleanup and shell options envport's renderers do themselves."""
    cmd = posixpath.basename(words[0])
    if cmd == "rm" and len(words) > 1 and all(w.startswith("-") or CLEANUP.match(w) for w in words[1:]):
        return Outcome.DONE
    if cmd == "set" and all(w.startswith(("-", "+")) or w in ("pipefail", "errexit", "nounset", "xtrace")
                            for w in words[1:]):
        return Outcome.DONE
    if _compiles_bytecode(words):
        if not ctx.rendered:  # envport's own recipes compile after each pip phase: nothing to say
            ctx.note(line, seg, DROPPED, "compiles bytecode: envport compiles it after each pip phase "
                     "(or leaves it to the first import, as the site's `bytecode` says)")
        return Outcome.DONE
    return None


def _python_family(words, seg, line, ctx) -> Optional[Outcome]:
    """pip (every spelling), venv/virtualenv, conda, lockfile installers, venv activation."""
    pip = _pip_words(words, line, ctx)
    if pip is not None:
        return _pip(pip, words, seg, line, ctx)
    if _venv(words, seg, line, ctx):
        return Outcome.DONE
    cmd = posixpath.basename(words[0])
    if cmd in CONDA:
        return _conda(words, seg, line, ctx)
    sub = words[1] if len(words) > 1 else ""
    if (cmd, sub) in LOCKFILE or (cmd, "") in LOCKFILE or (cmd == "uv" and words[1:3] == ["pip", "sync"]):
        ctx.note(line, seg, KEPT, "installs from a lockfile, which envport cannot read into pip phases",
                 "export the lock to pinned requirements (`uv export`, `poetry export`) and import those")
        return Outcome.KEEP
    if cmd in ("source", ".") and len(words) > 1 and re.search(r"activate$", words[1]):
        ctx.note(line, seg, DROPPED, "envport's venv is active in every step", "")
        return Outcome.DONE
    return None


def _export_family(words, seg, line, ctx) -> Optional[Outcome]:
    return _export(words, seg, line, ctx) if posixpath.basename(words[0]) == "export" else None


def _weights_family(words, seg, line, ctx) -> Optional[Outcome]:
    """Model weights downloaded during the build: dropped, suggested as weight_dirs fetched at run time."""
    cmd = posixpath.basename(words[0])
    sub = words[1] if len(words) > 1 else ""
    hub = cmd in ("huggingface-cli", "hf") and sub == "download"
    fetch = cmd in ("wget", "curl") and _weighty(seg)
    if not (hub or fetch or MODEL_DOWNLOADER.search(seg)):
        return None
    ctx.note(line, seg, DROPPED, "downloads model weights during the build; envport never bakes weights",
             "see its weight_dirs entry in the spec (commented out where its command cannot write to "
             "$ENVPORT_WEIGHT_DIR): once its files are pinned, `envport weights fetch` runs that `source` at run time")
    _suggest_weights(seg, ctx)
    return Outcome.DONE


HANDLERS = (_packages_family, _housekeeping_family, _python_family, _export_family, _weights_family)


def _compiles_bytecode(words: list[str]) -> bool:
    """`python -m compileall ...`, or a `python -c` program that calls compileall."""
    if not PYTHON_CMD.match(posixpath.basename(words[0])) or len(words) < 3:
        return False
    return words[1:3] == ["-m", "compileall"] or (words[1] == "-c" and "compileall.compile_" in words[2])


def _rendered_noise(words: list[str], step: Optional[str], ctx: ShellContext) -> bool:
    """Lines envport's own renderers write around each step: nothing the spec holds."""
    if words[0] == "echo" and len(words) == 2 and words[1].startswith("envport: step "):
        return True
    if words[0] == ":" and words[1:3] == ["base", "image"]:
        return True
    if step == "files" and words[0] == "chmod":
        return True
    if step == "weights" and words[:2] == ["mkdir", "-p"]:
        for path in words[2:]:
            name = re.sub(r"[^a-z0-9-]+", "-", posixpath.basename(path).lower()).strip("-") or "weights"
            while name in ctx.draft.weight_dirs:
                name += "-2"
            ctx.draft.weight_dirs[name] = {"path": path}
        return True
    return False


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


def _pip_words(words: list[str], line, ctx: ShellContext) -> Optional[list[str]]:
    """The words after `pip` when WORDS runs pip (pip, pip3.X, pythonX -m pip, uv pip), else None."""
    cmd = posixpath.basename(words[0])
    if PIP_CMD.match(cmd):
        m = re.match(r"^pip(3\.\d+)$", cmd)
        if m:
            ctx.draft.set_python(m.group(1), f"`{cmd}`", line, ctx.file)
        return words[1:]
    if PYTHON_CMD.match(cmd) and words[1:3] == ["-m", "pip"]:
        if re.match(r"^python3\.\d+$", cmd):
            ctx.draft.set_python(cmd[6:], f"`{cmd} -m pip`", line, ctx.file)
        return words[3:]
    if cmd == "uv" and words[1:2] == ["pip"] and words[2:3] != ["sync"]:
        return words[2:]
    return None


def _pip(rest: list[str], words, seg, line, ctx: ShellContext) -> Outcome:
    opts = []
    while rest and rest[0].startswith("-"):
        opts.append(rest[0])
        rest = rest[1:]
    sub = rest[0] if rest else ""
    if sub == "install" and any(COMPUTED.search(w) for w in rest):
        ctx.note(line, seg, KEPT, "a requirement computed when the line runs (`$(…)`, a backtick): its value is "
                 "unknown here, so the pip call stays a run command", "write the requirements into pip_phases")
        return Outcome.KEEP
    if sub == "install":
        if posixpath.basename(words[0]) == "uv":
            ctx.note(line, seg, turned_into("a pip phase"), "uv's resolver may choose other versions than pip's "
                     "for unpinned requirements", "pin them")
        args = opts + rest[1:]
        if ctx.rendered and "--require-hashes" in args:
            args = _locked_phase(args, line, ctx)
        phase = install_phase(args, ctx.pip(line))
        if phase:
            ctx.draft.add_phase(phase)
        return Outcome.DONE
    if sub == "cache":
        return Outcome.DONE
    return Outcome.KEEP


def _locked_phase(args: list[str], line, ctx: ShellContext) -> list[str]:
    """A phase envport rendered from its lock: the spec's requirements are in the step title."""
    title = ctx.rendered_title.split(": ", 1)[-1]
    if title.endswith(" ...") or ": " not in ctx.rendered_title:
        ctx.note(line, "pip install --require-hashes -r …", REPORTED, "a phase envport installed from its lock, "
                 "with more requirements than its step comment names: the phase holds the lock's pins",
                 "replace them with the phase's own requirements, then `envport lock NAME`")
        return args
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-r", "--requirement"):
            skip = True
        elif a not in ("--require-hashes", "--no-deps"):
            out.append(a)
    ctx.note(line, f"pip phase: {title}", REPORTED, "installed from envport's lock (--no-deps --require-hashes); "
             "the requirements come from the step comment, and the lock's no_deps/pre are not in the recipe",
             "`envport lock NAME` writes specs/NAME.lock again")
    return out + title.split(", ")


def _venv(words, seg, line, ctx: ShellContext) -> bool:
    cmd = posixpath.basename(words[0])
    path = None
    if PYTHON_CMD.match(cmd) and words[1:3] == ["-m", "venv"]:
        path = next((w for w in words[3:] if not w.startswith("-")), None)
        if re.match(r"^python3\.\d+$", cmd):
            ctx.draft.set_python(cmd[6:], f"`{cmd} -m venv`", line, ctx.file)
    elif cmd == "virtualenv" or (PYTHON_CMD.match(cmd) and words[1:3] == ["-m", "virtualenv"]):
        args = words[1:] if cmd == "virtualenv" else words[3:]
        py = next((a.split("=", 1)[-1] for a in args if a.startswith(("-p", "--python"))), "")
        m = re.search(r"3\.\d+", py + " " + " ".join(args))
        if m:
            ctx.draft.set_python(m.group(0), f"`{seg}`", line, ctx.file)
        path = next((a for a in args if not a.startswith("-") and not re.match(r"^python", a)), None)
    else:
        return False
    if path != CONTAINER_VENV:
        ctx.note(line, seg, DROPPED, f"envport makes the env's venv itself at {CONTAINER_VENV} and every pip "
                 "phase installs there", f"paths that named {path} now live under {CONTAINER_VENV}")
    return True


def _conda(words, seg, line, ctx: ShellContext) -> Outcome:
    from envport.porting.conda import conda_packages

    sub = words[1] if len(words) > 1 else ""
    if sub == "env" and len(words) > 2 and words[2] in ("create", "update"):
        spec = next((words[i + 1] for i, w in enumerate(words) if w in ("-f", "--file") and i + 1 < len(words)), "")
        found = ctx.open_file(spec) if spec else None
        if found:
            from envport.porting.conda import read_environment
            ctx.note(line, seg, turned_into("fields"), f"read {found[1]} (conda itself is not run: see its lines)")
            read_environment(found[0], found[1], ctx.draft, ctx.open_file)
        else:
            ctx.draft.lose(line, seg, "a conda environment file that is not a file inside the build context "
                           "(missing, or outside it through `..` or a link)", "import the environment.yml itself",
                           file=ctx.file)
        return Outcome.DONE
    if sub in ("create", "install"):
        pkgs, skip = [], False
        for w in words[2:]:
            if skip:
                skip = False
            elif w in ("-n", "--name", "-p", "--prefix", "-c", "--channel", "--file"):
                skip = True
            elif not w.startswith("-"):
                pkgs.append(w)
        if sub == "install" and ctx.draft.phases:
            ctx.note(line, seg, REPORTED, "a conda install after pip phases: conda may replace what pip installed, "
                     "so the order changes what is installed", "install conda packages before any pip call")
        conda_packages(pkgs, ctx.draft, ctx.file, line)
        return Outcome.DONE
    if sub in ("activate", "deactivate", "init", "clean", "config"):
        ctx.note(line, seg, DROPPED, "envport has no conda in containers; its venv is active in every step")
        return Outcome.DONE
    ctx.note(line, seg, KEPT, "a conda command envport cannot map")
    return Outcome.KEEP


def _export(words, seg, line, ctx: ShellContext) -> Outcome:
    from envport.porting.envvars import add_env

    pairs = [w.partition("=") for w in words[1:] if "=" in w]
    if not pairs or len(pairs) != len(words) - 1:
        return Outcome.KEEP
    if all(k == "DEBIAN_FRONTEND" for k, _, _ in pairs):
        return Outcome.DONE  # envport's apt step sets it itself
    if ctx.mode == "def":
        if all(ctx.runtime_env.get(k) == v for k, _, v in pairs):
            return Outcome.DONE  # the same value %environment sets at run time: the spec's env has it
        ctx.note(line, seg, KEPT, "an export in %post lasts only for the build, and %environment does not set it",
                 "if the env needs it at run time, add it to `env`")
        return Outcome.KEEP
    if ctx.mode == "docker":
        return Outcome.EXPORT
    if any("`" in v or "$(" in v for _, _, v in pairs):
        ctx.note(line, seg, KEPT, "a command substitution (`…` or $(…)): the spec's env values are literal text, "
                 "so the export stays a run command and lasts only while it runs",
                 "write the value out in `env` if the env needs it at run time")
        return Outcome.KEEP
    for k, _, v in pairs:
        before = dict(ctx.draft.env)
        add_env(ctx.draft, k, v, line, ctx.file, construct=f"export {k}={v}")
        if ctx.draft.env != before:
            ctx.variables[k] = v
            ctx.draft.note(line, f"export {k}={v}", turned_into(f"env.{k}"), "a script's export; the spec's env "
                           "is also set when the env runs, not only while it is built", file=ctx.file)
    return Outcome.DONE
