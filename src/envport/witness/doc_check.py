"""The docs witness, host side: the jobs docs.py runs for a set of docs, and its records judged per doc.

A doc is one verdict row.  Its problems name the doc, the line, the command and what differs:
`<doc>.md:14: $ pip show --files-only six: pip show has no --files-only (closest: --files)`,
`<doc>.md:9: expected 1.17.0, got 1.16.0`.  Pure: records in, StepResults out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional, Sequence

from envport.core.verdict import StepResult, Verdict
from envport.witness import doc_flags, doc_transcript
from envport.witness.doc_sources import Doc

TAIL = 8


@dataclass
class DocRun:
    """One doc as a witness call carries it: its transcript, each command's flag uses and job ids."""

    doc: Doc
    transcript: doc_transcript.Transcript
    uses: dict[int, list[doc_flags.Use]] = field(default_factory=dict)  # command index -> its programs
    job: dict[int, str] = field(default_factory=dict)  # command index -> the id of the job that runs it


@dataclass
class DocJobs:
    runs: list[DocRun]
    jobs: list[dict]  # {"id", "cmd"} in the order docs.py runs them
    help_ids: dict[str, str]  # help line -> job id

    def args(self, timeout_s: float) -> list[str]:
        out = ["--timeout", str(timeout_s)]
        for job in self.jobs:
            out += ["--job", json.dumps(job, sort_keys=True)]
        return out


def plan_jobs(docs: Sequence[Doc]) -> DocJobs:
    """Each doc's commands (not the norun ones) in doc order, then every distinct help line once."""
    runs, jobs, help_ids = [], [], {}
    for d, doc in enumerate(docs):
        run = DocRun(doc, doc_transcript.parse(doc.text))
        for c, cmd in enumerate(run.transcript.commands):
            run.uses[c] = doc_flags.uses(cmd.text)
            if not cmd.norun:
                run.job[c] = f"d{d}c{c}"
                jobs.append({"id": run.job[c], "cmd": cmd.text})
        runs.append(run)
    for run in runs:
        for use in (u for us in run.uses.values() for u in us):
            for line in use.help_lines():
                if line not in help_ids:
                    help_ids[line] = f"h{len(help_ids)}"
                    jobs.append({"id": help_ids[line], "cmd": line})
    return DocJobs(runs, jobs, help_ids)


def judge(planned: DocJobs, records: list[dict], why_missing: str) -> list[StepResult]:
    """One StepResult per doc from docs.py's records (WHY_MISSING: what to say of a job with none)."""
    by_id = {r.get("name"): r for r in records if r.get("check") == "doc"}
    return [_judge_doc(run, planned.help_ids, by_id, why_missing) for run in planned.runs]


def _judge_doc(run: DocRun, help_ids: dict[str, str], by_id: dict, why_missing: str) -> StepResult:
    label = run.doc.label
    problems = [[f"{label}:{line}: {msg}"] for line, msg in run.transcript.problems]
    if not run.transcript.commands:
        # Named for the docs level yet nothing to follow: an OK here would promise a check that never ran.
        problems.append([f"{label}: no ```console block with a `$ ` command: nothing to run or check (fence "
                         "what a user types as ```console, each command after `$ `)"])
    flags = 0
    for c, cmd in enumerate(run.transcript.commands):
        for use in run.uses[c]:
            flags += len(use.flags)
            problems += [[p] for p in _flag_problems(label, cmd, use, help_ids, by_id, why_missing)]
        if c in run.job:
            problems += _run_problems(label, cmd, by_id.get(run.job[c]), why_missing)
    cmds = run.transcript.commands
    norun = sum(1 for c in cmds if c.norun)
    data = {"doc": label, "doc_sha256": run.doc.sha256, "commands": len(cmds), "norun": norun, "flags": flags}
    secs = sum(float((by_id.get(j) or {}).get("seconds") or 0) for j in run.job.values())
    if not problems:
        return StepResult(run.doc.step, Verdict.OK, f"{len(cmds) - norun} command(s) ran as the doc shows, "
                          f"{norun} norun; {flags} flag(s) found in their --help", seconds=secs, data=data)
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    lines = problems[0][1:] + [ln for p in problems[1:] for ln in p]
    return StepResult(run.doc.step, Verdict.FAILED, problems[0][0] + more, lines=lines, seconds=secs, data=data)


def _flag_problems(label: str, cmd, use: doc_flags.Use, help_ids: dict[str, str], by_id: dict,
                   why_missing: str) -> list[str]:
    where = f"{label}:{cmd.line}: $ {cmd.shown}"
    recs = [by_id.get(help_ids[h]) for h in use.help_lines()]
    if recs[0] is None:
        return [f"{where}: no result for `{use.name} --help` ({why_missing})"]
    offered = set().union(*(doc_flags.help_flags(r.get("output") or "") for r in recs if r))
    if not offered:
        said = (recs[0].get("output") or "").strip().splitlines()
        return [f"{where}: `{use.name} --help` lists no options (exit {recs[0].get('returncode')}"
                f"{': ' + said[-1] if said else ''}), so {', '.join(use.flags)} cannot be checked"]
    sub = recs[1] if len(recs) > 1 else None
    name = f"{use.name} {use.sub}" if sub and doc_flags.help_flags(sub.get("output") or "") else use.name
    out = []
    for flag in use.flags:
        if flag not in offered:
            near = doc_flags.closest(flag, offered)
            out.append(f"{where}: {name} has no {flag} ({f'closest: {near}' if near else 'nothing close in its --help'})")
    return out


def _run_problems(label: str, cmd, rec: Optional[dict], why_missing: str) -> list[list[str]]:
    where = f"{label}:{cmd.line}: $ {cmd.shown}"
    if rec is None:
        return [[f"{where}: no result ({why_missing})"]]
    output = rec.get("output") or ""
    tail = [f"  {ln}" for ln in output.splitlines() if ln.strip()][-TAIL:]
    if rec.get("error"):
        return [[f"{where}: {rec['error']}"] + tail]
    if rec.get("returncode") != cmd.exit_status:
        promised = f" (the doc promises [{cmd.exit_status}])" if cmd.exit_status else ""
        return [[f"{where}: exited {rec.get('returncode')}{promised}"] + tail]
    miss = doc_transcript.compare(cmd, output)
    if miss is None:
        return []
    head = f"{label}:{miss.line}: {miss.message}"
    return [[head] + ([] if miss.message.startswith("$ ") else [f"  in the output of $ {cmd.shown} "
                                                                  f"(line {cmd.line})"])]


def not_run(doc: Doc) -> Optional[StepResult]:
    """The row of a doc that is not run this time: unreadable, or unchanged since it passed on this env."""
    if doc.problem:
        return StepResult(doc.step, doc.problem_verdict, doc.problem, data={"doc": doc.label})
    if doc.passed_on:
        return StepResult(doc.step, Verdict.PRESENT, f"unchanged since it passed on {doc.passed_on} (doc sha256 "
                          f"{doc.sha256[:12]}); not run again (--rerun-docs runs it)",
                          data={"doc": doc.label, "doc_sha256": doc.sha256, "passed_on": doc.passed_on})
    return None
