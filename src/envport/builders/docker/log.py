"""Reading a docker build's output back in terms of the plan's steps.

The rendered Dockerfile marks every plan step with `# step N/T marker: title`.
BuildKit numbers only the instructions that create a vertex (`[k/K] RUN ...`),
the legacy builder every instruction (`Step j/J : ENV ...`); both are mapped
back to the plan step that wrote the instruction, so progress reads
`envport: [docker] step 5/9 pip-1 ...` on either builder, and a failure names
its step and shows that step's own log.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Optional

STEP_COMMENT = re.compile(r"^# step (\d+)/(\d+) (\S+): (.*)$")
INSTRUCTION = re.compile(r"^([A-Z]+)\s")
# Instructions BuildKit's Dockerfile frontend turns into a numbered vertex.
BUILDKIT_OPS = ("FROM", "RUN", "COPY", "ADD", "WORKDIR")
VERTEX_LINE = re.compile(r"^#(\d+) (.*)$")
VERTEX_NAME = re.compile(r"^\[(?:[^\]]* )?(\d+)/(\d+)\] ")
LOG_TIME = re.compile(r"^\d+\.\d+ ")
LEGACY_STEP = re.compile(r"^Step (\d+)/(\d+) : ")
# pip lines worth showing while a phase runs (the rest stays in the log tail).
NOTABLE = re.compile(r"^(Collecting|Installing collected|Successfully installed|ERROR|WARNING: Retrying)")
TAIL_LINES = 30


@dataclass(frozen=True)
class StepRef:
    n: int
    total: int
    marker: str
    title: str

    def label(self) -> str:
        return f"step {self.n}/{self.total} {self.marker}"


def instruction_steps(dockerfile: str) -> tuple[list[Optional[StepRef]], list[Optional[StepRef]]]:
    """(plan step of each BuildKit vertex [k/K], plan step of each legacy `Step j/J`)."""
    current: Optional[StepRef] = None
    ops: list[Optional[StepRef]] = []
    every: list[Optional[StepRef]] = []
    for line in dockerfile.splitlines():
        m = STEP_COMMENT.match(line)
        if m:
            current = StepRef(int(m.group(1)), int(m.group(2)), m.group(3), m.group(4))
            continue
        m = INSTRUCTION.match(line)
        if m:
            every.append(current)
            if m.group(1) in BUILDKIT_OPS:
                ops.append(current)
    return ops, every


@dataclass
class BuildLog:
    """Feeds on the build's output lines; emits progress; keeps each step's log for a failure."""

    steps: list[Optional[StepRef]]
    progress: Callable[[str], None]
    logs: dict[str, list[str]] = field(default_factory=dict)  # vertex/step key -> its lines
    where: dict[str, Optional[StepRef]] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # vertex -> its name, "[4/8] RUN python -m pip ..."
    failed: Optional[str] = None  # key of the first vertex that failed
    cached: list[str] = field(default_factory=list)  # markers the engine reused
    built: list[str] = field(default_factory=list)  # markers the engine ran
    errors: list[str] = field(default_factory=list)  # the engine's own error lines
    everything: deque = field(default_factory=lambda: deque(maxlen=200))
    _started: set = field(default_factory=set)

    def _say(self, text: str) -> None:
        self.progress(f"envport: [docker] {text}")

    def _start(self, key: str, ref: Optional[StepRef]) -> None:
        self.where[key] = ref
        self.logs.setdefault(key, [])
        if ref is not None and ref.n not in self._started:
            self._started.add(ref.n)
            self._say(f"{ref.label()}: {ref.title}")

    def _log(self, key: str, text: str) -> None:
        self.logs.setdefault(key, []).append(text)
        if NOTABLE.match(text):
            self._say(f"  {text[:200]}")

    def tail(self) -> tuple[Optional[StepRef], list[str]]:
        """The failing step and the last lines of its own log (else of the whole output)."""
        if self.failed is not None:
            lines = self.logs.get(self.failed, [])[-TAIL_LINES:]
            return self.where.get(self.failed), lines + self.errors[-3:]
        return None, list(self.everything)[-TAIL_LINES:]


class BuildkitLog(BuildLog):
    """`docker build --progress=plain` output (BuildKit)."""

    _summary = False  # inside the closing `------` error block, which repeats log lines
    # One plan step can write several vertices (a shim file's COPY and its RUN): the step says `done`
    # once, when its last vertex ends, not once per vertex (`step 6/8 ... done` printed twice).
    _left: Optional[dict] = None  # plan step number -> its vertices not yet ended
    _ran: Optional[dict] = None  # plan step number -> the DONE times of its vertices that ran

    def _finish(self, ref: StepRef, took: Optional[str]) -> None:
        if self._left is None:
            self._left, self._ran = Counter(r.n for r in self.steps if r is not None), {}
        self._ran.setdefault(ref.n, [])
        if took is not None:
            self._ran[ref.n].append(took)
        self._left[ref.n] -= 1
        if self._left[ref.n] > 0:
            return
        ran = self._ran[ref.n]
        if len(ran) == 1:
            self._say(f"{ref.label()} done ({ran[0]})")
        elif ran:
            total = sum(float(t.rstrip("s")) for t in ran if re.fullmatch(r"\d+(\.\d+)?s", t))
            self._say(f"{ref.label()} done ({total:.1f}s, {len(ran)} instructions)")
        elif ref.marker in self.cached:
            self._say(f"{ref.label()} cached")

    def feed(self, line: str) -> None:
        line = line.rstrip("\n")
        self.everything.append(line)
        if line.startswith("------"):
            self._summary = True
            return
        m = VERTEX_LINE.match(line)
        if not m:
            if self._summary and line.strip() and not line.startswith(" > "):
                self.errors.append(line.strip())
            return
        if self._summary:
            return
        key, rest = m.groups()
        if key not in self.where:
            vm = VERTEX_NAME.match(rest)
            ref = self.steps[int(vm.group(1)) - 1] if vm and int(vm.group(1)) <= len(self.steps) else None
            self._start(key, ref)
            self.headers[key] = rest
            return
        ref = self.where[key]
        header = self.headers[key]
        if rest.startswith("sha256:") or rest == header:  # plain output repeats a vertex's name
            return
        if rest == "CACHED":
            if ref is not None:
                self.cached.append(ref.marker)
                self._finish(ref, None)
        elif rest.startswith("DONE "):
            if ref is not None:
                ran = bool(VERTEX_NAME.match(header)) and not header.split("] ", 1)[1].startswith("FROM ")
                if ran:
                    self.built.append(ref.marker)
                self._finish(ref, rest[5:] if ran else None)
        elif rest.startswith("ERROR"):
            if self.failed is None:
                self.failed = key
            self.errors.append(rest)
        else:
            self._log(key, LOG_TIME.sub("", rest, count=1))


class LegacyLog(BuildLog):
    """The docker SDK's (legacy builder's) JSON stream."""

    _key: Optional[str] = None

    def feed_chunk(self, chunk: dict) -> None:
        if "error" in chunk:
            self.failed = self._key or "?"
            self.errors.append(str(chunk["error"]).strip())
            self.everything.append(str(chunk["error"]).strip())
            return
        for line in str(chunk.get("stream", "")).splitlines():
            self.everything.append(line)
            m = LEGACY_STEP.match(line)
            if m:
                j = int(m.group(1))
                self._key = str(j)
                self._start(self._key, self.steps[j - 1] if j <= len(self.steps) else None)
                continue
            ref = self.where.get(self._key) if self._key else None
            if line.strip() == "---> Using cache" and ref is not None:
                self.cached.append(ref.marker)
            elif line.strip().startswith("---> Running in") and ref is not None:
                self.built.append(ref.marker)
            elif self._key and line.strip() and not line.strip().startswith("--->"):
                self._log(self._key, line)
