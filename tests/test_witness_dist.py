"""Collectives and DTensor witnesses for real on CPU/gloo, and their failure modes.

Each test starts real ranks (torch 2.13.0 CPU): world 2 takes ~6 s and world 4
~10-17 s on 2 cores, so the cases are few and each proves one thing. No test
asserts on time: a hang is judged by what ended it (the deadline's note and the
stacks it dumped), and how fast that happens is bench/ material.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from envport.witness.launchers.base import WITNESS_DIR

from envport.witness.launchers.local import LocalLauncher
from envport.spec.model import Spec
from envport.core.verdict import Verdict
from envport.witness.judge import parse_sentinels
from envport.witness.plan import WitnessOptions
from envport.witness.run import run_witnesses
from .support import torch_python


def dist_spec(world: int, mesh: list[int] | None) -> Spec:
    w = {"collectives": {"world_size": world}}
    if mesh:
        w["dtensor"] = {"mesh": mesh}
    return Spec(name="wit", base="debian:bookworm", python="3.11", witnesses=w)


def run(spec: Spec, **opts):
    # Only the checks the spec asks for: an --only name the spec does not ask
    # for comes back as its own SKIPPED row (issue 27), which is not what these
    # tests are about.
    only = [name for name in ("collectives", "dtensor") if name in spec.witnesses.model_dump(exclude_none=True)]
    launcher = LocalLauncher(torch_python())
    return run_witnesses(spec, launcher, WitnessOptions(only=only, **opts))


def by_step(results):
    return {r.step: r for r in results}


def test_world_2_collectives_and_1d_mesh_pass():
    results = by_step(run(dist_spec(2, [2])))
    assert set(results) == {"collectives (world 2)", "dtensor (mesh 2)"}
    for r in results.values():
        assert r.verdict is Verdict.OK, (r.detail, r.lines)
        assert "gloo/cpu" in r.detail


def test_world_4_collectives_and_square_mesh_pass():
    lines: list[str] = []
    results = by_step(run(dist_spec(4, [2, 2]), on_line=lines.append))
    assert set(results) == {"collectives (world 4)", "dtensor (mesh 2x2)"}
    for r in results.values():
        assert r.verdict is Verdict.OK, (r.detail, r.lines)
        assert r.detail.startswith("4 ranks")
    # The mesh's sub-groups carry the group's timeout (dist.py's --gloo-timeout, 120 s),
    # not torch's 30-minute default for groups created without one.
    dtensor = [r for r in parse_sentinels("\n".join(lines)) if r["check"] == "dtensor"]
    assert len(dtensor) == 4
    assert all(r["timeouts_s"] == {"default": 120.0, "mesh": [120.0, 120.0]} for r in dtensor), dtensor


def test_hanging_rank_fails_within_deadline_with_every_stack():
    # Long enough for both ranks to import torch and reach their places on a
    # loaded 2-core machine; the bound asserted is the required one.
    deadline = 20.0
    (res,) = run(dist_spec(2, None), deadline_s=deadline, fault="hang:1")
    assert res.verdict is Verdict.FAILED
    assert "the group did not finish within 20.0s" in res.detail  # the deadline ended it, nothing later
    text = "\n".join(res.lines)
    assert "rank 0 stack:" in text and "rank 1 stack:" in text
    assert "_injected_hang" in text  # rank 1's own frame
    rank0 = text.split("rank 0 stack:")[1].split("rank 1 stack:")[0]
    assert "run_collectives" in rank0  # rank 0 is waiting in a collective


def test_wrong_value_names_rank_op_expected_and_got():
    (res,) = run(dist_spec(2, None), fault="wrong:1")
    assert res.verdict is Verdict.FAILED
    assert "rank 1 all_reduce" in res.detail
    assert "expected [3.0, 3.0, 3.0, 3.0]" in res.detail and "got [4.0, 4.0, 4.0, 4.0]" in res.detail
    assert "rank 0" not in res.detail


def test_crashing_rank_ends_the_others_without_waiting_for_the_deadline():
    (res,) = run(dist_spec(2, None), deadline_s=240, fault="crash:1")
    assert res.verdict is Verdict.FAILED
    assert "rank 1 exited with code 13" in res.detail
    assert "did not finish" not in res.detail  # ended by the failure, not by the deadline


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_external(world: int, args: list[str], fault: str = "") -> list[subprocess.Popen]:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if fault:
            env["ENVPORT_WITNESS_FAULT"] = fault
        procs.append(subprocess.Popen([torch_python(), str(WITNESS_DIR / "dist.py"), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _finish(procs, timeout: float):
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        out.append((p.returncode, stdout, stderr))
    return out


def test_external_launch_runs_just_this_rank():
    """RANK/WORLD_SIZE/MASTER_* already set (srun, torchrun): each process is one rank."""
    procs = _start_external(2, ["--checks", "collectives,dtensor"])
    results = _finish(procs, timeout=120)
    for rank, (rc, stdout, stderr) in enumerate(results):
        assert rc == 0, stderr[-2000:]
        recs = parse_sentinels(stdout)
        assert {r["check"] for r in recs} == {"collectives", "dtensor"}  # no group line: no parent
        assert all(r["rank"] == rank and r["ok"] for r in recs)


@pytest.mark.parametrize("deadline", [15.0])
def test_external_rank_watchdog_dumps_its_stack_at_the_deadline(deadline):
    procs = _start_external(2, ["--deadline", str(deadline)], fault="hang:1")
    results = _finish(procs, timeout=deadline + 60)
    # Each rank ended itself (exit code 1), not _finish's kill (-9).
    assert [rc for rc, _, _ in results] == [1, 1], [r[2][-2000:] for r in results]
    (_, peer_out, peer_err), (_, _, hung_err) = results  # rank 0, rank 1 (the hung one)
    # The hung rank's watchdog dumped its stack at the deadline, showing where it hangs.
    assert "most recent call first" in hung_err and "_injected_hang" in hung_err, hung_err[-3000:]
    # Rank 0 waits in the ring for rank 1: either its own watchdog dumps it there, or rank 1's
    # exit at the deadline ends that wait first and rank 0 reports it on its sentinel line
    # (which one wins is a race between two watchdogs armed at the same deadline).
    peer = [r for r in parse_sentinels(peer_out) if r["check"] == "collectives"]
    dumped = "most recent call first" in peer_err and "run_collectives" in peer_err
    reported = bool(peer) and peer[0]["ok"] is False and bool(peer[0].get("error"))
    assert dumped or reported, (peer_out[-2000:], peer_err[-3000:])
