"""A witness call's captured output (any launcher, or a Slurm job's log) judged as StepResults.

Only the `ENVPORT-WITNESS {...}` sentinel lines count: a check without its
sentinel line is FAILED with the output tail, since a witness that died proves nothing.
"""

from __future__ import annotations

import json
from typing import Sequence

from envport.core.verdict import StepResult, Verdict, exit_code
from envport.spec.model import Spec
from envport.witness.plan import LAUNCH_MARGIN_S, WORLD1_CAVEAT, WitnessCall
from envport.witness.scripts.envport_sentinel import PREFIX


def parse_sentinels(text: str) -> list[dict]:
    """Every sentinel record in `text`; other lines (and mangled ones) are ignored."""
    out = []
    for line in text.splitlines():
        at = line.find(PREFIX)
        if at < 0:
            continue
        try:
            rec = json.loads(line[at + len(PREFIX):])
        except ValueError:
            continue
        if isinstance(rec, dict) and "check" in rec:
            out.append(rec)
    return out



def with_outcomes(skipped: Sequence[StepResult], ran: dict[str, StepResult]) -> list[StepResult]:
    """The SKIPPED lines with how the runs in their place really ended ("... FAILED"), not what was planned."""
    out = []
    for r in skipped:
        instead = r.data.get("instead") or []
        if not instead or not all(step in ran for step in instead):
            out.append(r)
            continue
        head = r.detail.split("; instead: ")[0]
        ends = " and ".join(f"{step} {ran[step].verdict.value}" for step in instead)
        out.append(StepResult(r.step, r.verdict, f"{head}; instead: {ends}", reason=r.reason, lines=r.lines,
                              data=r.data))
    return out


def call_results(spec: Spec, call: WitnessCall, launched) -> list[StepResult]:
    """The StepResults of one witness call from its captured output (any launcher, or a job log)."""
    records = parse_sentinels(launched.output)
    if call.script == "basic.py":
        return _basic_results(spec, call, records, launched)
    if call.script == "kernel.py":
        return _kernel_results(spec, call, records, launched)
    if call.script == "docs.py":
        from envport.witness.doc_check import judge

        return judge(call.docs, records, why_missing(launched, call.deadline_s + LAUNCH_MARGIN_S))
    return _dist_results(call, records, launched)


# --- turning records into StepResults ------------------------------------------------


def _tail(launched, n: int = 20) -> list[str]:
    lines = [ln for ln in launched.output.splitlines() if ln.strip() and PREFIX not in ln]
    return lines[-n:]


def why_missing(launched, deadline: float) -> str:
    if launched.timed_out:
        return f"no result: stopped at the {deadline:.0f}s launcher deadline"
    return f"no result: the witness exited {launched.returncode} before reporting"


def _basic_results(spec: Spec, call: WitnessCall, records: list[dict], launched) -> list[StepResult]:
    out: list[StepResult] = []
    by_key = {(r["check"], r.get("name")): r for r in records}
    wanted: list[tuple[str, str, str]] = []
    if "python" in call.checks:
        wanted.append(("python", "python", "python"))
    if "imports" in call.checks:
        wanted += [("import", m, f"import {m}") for m in spec.witnesses.imports]
    if "cli" in call.checks:
        wanted += [("cli", c.cmd, f"cli {c.cmd}") for c in spec.witnesses.cli]
    if "weights" in call.checks:
        wanted += [("weight", n, f"weight {n}") for n, w in sorted(spec.weight_dirs.items()) if w.files]
    for check, name, step in wanted:
        rec = by_key.get((check, name))
        if rec is None:
            out.append(StepResult(step, Verdict.FAILED, why_missing(launched, call.deadline_s + LAUNCH_MARGIN_S),
                                  lines=_tail(launched), seconds=launched.seconds))
            continue
        secs = float(rec.get("seconds") or 0.0)
        if check == "python":
            detail = f"{rec.get('got')} at {rec.get('executable')} (spec: {rec.get('expected')})"
            out.append(StepResult(step, Verdict.OK if rec["ok"] else Verdict.FAILED, detail, seconds=secs,
                                  lines=[] if rec["ok"] else [f"fix: the env's interpreter is {rec.get('got')}, "
                                                              f"the spec says python: \"{rec.get('expected')}\""]))
        elif check == "weight":
            where = f"${rec.get('env')}={rec.get('folder')}" if rec.get("env") else str(rec.get("folder"))
            if rec["ok"]:
                ro = "read-only" if rec.get("read_only") else \
                    f"writable: {rec.get('writable_why') or 'the launcher mounted it nowhere read-only'}"
                out.append(StepResult(step, Verdict.OK, f"{rec.get('files')} file(s) at their pins via {where} "
                                      f"({ro})", seconds=secs, data={"read_only": bool(rec.get("read_only"))}))
            else:
                probs = list(rec.get("problems") or [])
                out.append(StepResult(step, Verdict.FAILED, probs[0] if probs else "weight check failed",
                                      lines=probs[1:] + [f"fix: envport weights verify {spec.name}, then "
                                                         f"envport weights fetch {spec.name}"], seconds=secs))
        elif check == "import":
            if rec["ok"]:
                ver = rec.get("version") or "no __version__"
                out.append(StepResult(step, Verdict.OK, f"{ver} from {rec.get('file')}", seconds=secs))
            else:
                out.append(StepResult(step, Verdict.FAILED, rec.get("error", "import failed"),
                                      lines=list(rec.get("tail") or [])[-4:], seconds=secs))
        else:
            if rec["ok"]:
                out.append(StepResult(step, Verdict.OK, f"matched {rec.get('matched')!r} (exit {rec.get('returncode')})",
                                      seconds=secs))
            else:
                why = rec.get("error") or f"/{rec.get('expect')}/ not found in the output (exit {rec.get('returncode')})"
                out.append(StepResult(step, Verdict.FAILED, why, lines=list(rec.get("tail") or []), seconds=secs))
    return out


def kernel_step(framework: str) -> str:
    """A kernel witness's row: torch's keeps the plain name it always had, another framework's names it."""
    return "kernel" if framework == "torch" else f"kernel ({framework})"


def _kernel_results(spec: Spec, call: WitnessCall, records: list[dict], launched) -> list[StepResult]:
    """One row per framework: each named one (`kernel: [torch, jax]`) or each one the env held (`true`)."""
    # A record without `framework` came from a kernel witness that knew only torch.
    by_fw = {r.get("framework") or "torch": r for r in records if r["check"] == "kernel"}
    named = spec.witnesses.kernel_frameworks()
    if not named and by_fw and not any(r.get("ok") or "device" in r or r.get("skipped") for r in by_fw.values()):
        return [_nothing_to_witness(by_fw, launched)]
    out = []
    for fw in named or list(by_fw) or ["torch"]:
        rec = by_fw.get(fw)
        if rec is None:
            out.append(StepResult(kernel_step(fw), Verdict.FAILED,
                                  why_missing(launched, call.deadline_s + LAUNCH_MARGIN_S),
                                  lines=_tail(launched), seconds=launched.seconds))
        else:
            out.append(_kernel_row(spec, fw, rec, launched))
    return out


def _nothing_to_witness(by_fw: dict, launched) -> StepResult:
    """`kernel: true` in an env that holds none of the frameworks: one row naming each one's import error."""
    said = "; ".join(f"{fw}: {r.get('error')}" for fw, r in by_fw.items())
    if len(by_fw) == 1:
        said = next(iter(by_fw.values())).get("error") or said
    return StepResult("kernel", Verdict.FAILED, said, seconds=launched.seconds,
                      lines=[f"fix: install {' or '.join(by_fw)} in the env, or set witnesses.kernel: false"])


# A Triton that cannot build a kernel for the card: the FAILED row's token (the witness and the doctor alike).
TRITON_REASON = "triton_cannot_compile"
# Where a Triton that cannot build its kernels for the card leaves an env (seed 002: each was the way out somewhere).
TRITON_ROUTES = ("a Triton whose LLVM and bundled ptxas know this card, pinned in the spec (a decision: it deviates "
                 "from the recipe's lock)", "the model's own switch that turns its Triton kernels off, where it has "
                 "one", "a host whose card this Triton knows (route the job by sm_range)")


def _triton_row(rec: dict, secs: float) -> StepResult:
    """The compile probe: SKIPPED without a GPU (its reason), OK when the child printed its line, FAILED naming
    the card's sm, the Triton version and the routes out (the child's abort is its verdict, not envport's)."""
    version = rec.get("triton")
    if version is None:  # the spec names triton and the env cannot import it
        return StepResult(kernel_step("triton"), Verdict.FAILED, rec.get("error") or "triton is not importable",
                          lines=["fix: install triton in the env, or drop it from witnesses.kernel"], seconds=secs)
    if rec.get("skipped"):
        return StepResult(kernel_step("triton"), Verdict.SKIPPED, f"triton {version}: {rec['skipped']}", seconds=secs)
    card = f"{rec.get('sm', '?')} ({rec.get('gpu', 'GPU')})"
    if rec.get("ok"):
        return StepResult(kernel_step("triton"), Verdict.OK, f"triton {version} compiled and ran a tl.sum kernel on "
                          f"{card} in a child process", seconds=secs)
    lines = [f"  {ln}" for ln in rec.get("tail") or []]
    lines += [f"route out: {r}" for r in TRITON_ROUTES]
    return StepResult(kernel_step("triton"), Verdict.FAILED, f"triton {version} cannot build a tl.sum kernel for "
                      f"{card}: {rec.get('error', 'no reason given')}", reason=TRITON_REASON, lines=lines,
                      seconds=secs)


def _kernel_row(spec: Spec, fw: str, rec: dict, launched) -> StepResult:
    secs = float(rec.get("seconds") or launched.seconds)
    if fw == "triton":
        return _triton_row(rec, secs)
    version = rec.get(fw) or "?"
    detail = f"{rec.get('device', '?')}: shape {rec.get('shape')}, checksum {rec.get('checksum')} ({fw} {version})"
    lines: list[str] = []
    ok = bool(rec.get("ok"))
    if rec.get("gpu_is"):
        # The env's GPU is another framework's (a CPU torch beside a JAX on the card): this one proves the CPU.
        detail += f"; {fw} sees no GPU, {rec['gpu_is']} drives it"
    if rec.get("capability") and rec.get("arch_list") is not None:
        detail += _arch_said(rec, lines)
    elif rec.get("capability"):
        from envport.core.arch import sm_name

        detail += f"; {rec.get('gpu', 'GPU')} {sm_name(tuple(rec['capability']))} (judged by {fw})"
    if rec.get("capability") and spec.sm_range:
        from envport.core.arch import parse_capability, sm_name

        cap = tuple(rec["capability"])
        lo, hi = (parse_capability(s) for s in spec.sm_range)
        if not lo <= cap <= hi:
            lines.append(f"note: this GPU ({sm_name(cap)}) is outside the spec's sm_range "
                         f"{spec.sm_range[0]}..{spec.sm_range[1]}")
    if not ok:
        detail = rec.get("error") or detail
        from envport.core.arch import no_kernel_image_hint

        hint = no_kernel_image_hint(rec.get("error"), rec.get("capability"), rec.get("arch_list"))
        if hint:
            lines.append(f"fix: {hint}")
    return StepResult(kernel_step(fw), Verdict.OK if ok else Verdict.FAILED, detail, lines=lines, seconds=secs)


def _arch_said(rec: dict, lines: list[str]) -> str:
    """torch's arch list against the card it ran on: the words for the detail, an `arch:` line when uncovered."""
    from envport.core.arch import gpu_runnable, sm_name

    cap = tuple(rec["capability"])
    match = gpu_runnable(cap, rec["arch_list"])
    said = f"; {rec.get('gpu', 'GPU')} {sm_name(cap)} via {match.via or 'nothing'}"
    if match.jit:
        said += " (PTX JIT)"
    if not match.runnable:
        lines.append(f"arch: {match.reason}")
    return said


def _fmt_failure(rank: int, op: dict) -> str:
    if "expected_shape" in op:
        return (f"rank {rank} {op['op']} ({op.get('api')}): expected shape {op['expected_shape']}, "
                f"got {op['got_shape']}")
    return f"rank {rank} {op['op']} ({op.get('api')}): expected {op.get('expected')}, got {op.get('got')}"


def _rank_problems(ranks: dict[int, dict]) -> tuple[list[str], list[str]]:
    """(one line per distinct error or wrong value, naming its ranks; the fixes and arch hints they carry)."""
    from envport.core.arch import no_kernel_image_hint

    by_error: dict[str, list[int]] = {}
    problems: list[str] = []
    fixes: list[str] = []
    for rank, rec in sorted(ranks.items()):
        if rec.get("error"):
            by_error.setdefault(rec["error"], []).append(rank)
            for extra in (rec.get("fix"), no_kernel_image_hint(rec["error"], rec.get("capability"),
                                                                rec.get("arch_list"))):
                if extra:
                    extra = extra if extra.startswith("fix: ") else f"fix: {extra}"
                    if extra not in fixes:
                        fixes.append(extra)
        for op in rec.get("failures") or []:
            problems.append(_fmt_failure(rank, op))
    errors = [f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, rs))}: {err}"
              for err, rs in sorted(by_error.items(), key=lambda kv: kv[1])]
    return errors + problems, fixes


def _placement(ranks: dict) -> list[tuple[tuple, list[int]]]:
    """[((node rank, node), [ranks]), ...] by node rank, where the ranks said which node they ran on (Slurm tasks:
    SLURMD_NODENAME, NODE_RANK); [] otherwise."""
    placed: dict = {}
    for r, rec in sorted(ranks.items()):
        if rec.get("node") is not None or rec.get("node_rank") is not None:
            placed.setdefault((rec.get("node_rank"), rec.get("node") or "?"), []).append(r)
    return sorted(placed.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))


def _dist_results(call: WitnessCall, records: list[dict], launched) -> list[StepResult]:
    group = next((r for r in records if r["check"] == "group"), None)
    stack_lines = _group_stacks(group)
    out: list[StepResult] = []
    for n, check in enumerate(call.checks):
        step = call.step_name(check)
        ranks = {r["rank"]: r for r in records if r["check"] == check and "rank" in r}
        problems, fixes = _rank_problems(ranks)
        missing = sorted(set(range(call.world)) - set(ranks))
        # The first check of a group carries the launch (interpreter, torch
        # import, rendezvous); a check sharing the group adds only its own time.
        secs = launched.seconds if n == 0 else max(
            [float(r.get("seconds") or 0) for r in ranks.values()] or [0.0])
        if not missing and not problems:
            out.append(_dist_ok(call, step, ranks, secs))
            continue
        head = _group_problem(call, group, missing, launched)
        if head is not None:
            problems.insert(0, head)
        detail = problems[0]
        if len(problems) > 1:
            detail += f" (+{len(problems) - 1} more)"
        # Without a group line (srun, torchrun) each rank's watchdog wrote its
        # own stack to the output: keep enough of it to show every rank.
        lines = problems[1:] + fixes + stack_lines + (_tail(launched, 20 * max(call.world, 2)) if not group else [])
        out.append(StepResult(step, Verdict.FAILED, detail, lines=lines, seconds=secs))
    return out


def _group_stacks(group: dict | None) -> list[str]:
    """Every rank's stack the spawning parent dumped at the deadline, rank by rank."""
    stack_lines: list[str] = []
    if group and group.get("stacks"):
        for rank, text in sorted(group["stacks"].items(), key=lambda kv: int(kv[0])):
            stack_lines.append(f"rank {rank} stack:")
            stack_lines += [f"  {ln}" for ln in text.splitlines() if ln.strip()]
    return stack_lines


def _dist_ok(call: WitnessCall, step: str, ranks: dict[int, dict], secs: float) -> StepResult:
    """Every rank reported and every op was exact: where it ran, and where each rank sat."""
    any_rec = next(iter(ranks.values()), {})
    where = f"{any_rec.get('backend', '?')}/{any_rec.get('device', '?')}" if any_rec else "?"
    # Only ops that ran count as exact; a skipped op is named apart.
    n_ops = len([o for o in any_rec.get("ops") or [] if not o.get("skipped")])
    skipped = sorted({o["op"] for r in ranks.values() for o in r.get("ops", []) if o.get("skipped")})
    detail = f"{call.world} ranks on {where}, {n_ops} ops exact on every rank"
    if skipped:
        detail += f" (skipped: {', '.join(skipped)})"
    if call.backend == "nccl" and call.world == 1:
        detail += f" ({WORLD1_CAVEAT})"
    placed = _placement(ranks)
    if placed:
        detail += "; " + ", ".join(f"{node} (node rank {nr}): ranks {','.join(map(str, rs))}"
                                   for (nr, node), rs in placed)
    data = {"ranks": {str(r): {"node": rec.get("node"), "node_rank": rec.get("node_rank"),
                               "local_rank": rec.get("local_rank")} for r, rec in sorted(ranks.items())}} \
        if placed else {}
    return StepResult(step, Verdict.OK, detail, seconds=secs, data=data)


def _group_problem(call: WitnessCall, group: dict | None, missing: list[int], launched) -> str | None:
    """What goes before the ranks' own problems: the group's refusal, or which ranks never reported and why."""
    if group and group.get("error"):
        # The group refused before any rank started ("world size 2 needs 2 GPUs, torch sees 1").
        return group["error"]
    if not missing:
        return None
    if group and group.get("note"):
        return f"no report from ranks {missing}: {group['note']}"
    if group is None:
        return f"no report from ranks {missing}; {why_missing(launched, call.deadline_s + LAUNCH_MARGIN_S)}"
    return f"no report from ranks {missing}"


def summary(results: Sequence[StepResult]) -> str:
    """One line for a run: counts by verdict and the first problem."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
    text = ", ".join(f"{n} {v}" for v, n in counts.items())
    bad = next((r for r in results if not r.verdict.ok), None)
    if bad:
        text += f"; first: {bad.step}: {bad.detail}"
    return text


def overall(results: Sequence[StepResult], seconds: float) -> StepResult:
    """A whole witness run as one StepResult: the first step that is not ok decides the verdict.

    `envport witness` and `envport slurm submit` print and record it the same way.
    """
    bad = next((r for r in results if not r.verdict.ok), None)
    verdict = Verdict.OK if bad is None else bad.verdict
    return StepResult("witnesses", verdict, summary(results), reason=bad.reason if bad else None,
                      seconds=seconds, data={"exit_code": exit_code(results),
                                             "steps": [r.to_dict() for r in results]})
