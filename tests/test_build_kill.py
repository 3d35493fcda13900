"""SIGKILL at random points of venv builds: every next build ends in an env equal to a fresh build.

Each round starts `envport build` (the real CLI, the real setup script, real pip installs of small
local wheels) and kills it with SIGKILL after a random progress line plus a random jitter, so the
kill lands anywhere: making the venv, inside pip, recording, during the swap.  Half the rounds kill
envport alone (the build then stops through its stdin lifeline and cleans up); the other half kill
every process of the build at once, so no trap runs and the half-made build dir, the lock file and
maybe a half-done swap are left as a power cut would leave them.  The next build must repair that and
end in an env whose `pip freeze --all` and env block equal a build of the same spec from nothing.
The seed is printed; ENVPORT_KILL_SEED replays a run; rounds() says how many rounds (CI 8, --deep 30).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .support import REPO, examples
from .tinywheels import ShellProject, env_vars, freeze, make_wheelhouse, spec_data

NAME = "killed"


def rounds() -> int:
    """Kill rounds per run (tests/README.md "Time budget"): each is a killed build and a full one, ~13 s.
    CI 8 (was 20: 293 s), 4 of each kill kind; --deep 30; ENVPORT_KILL_ROUNDS overrides."""
    return examples(8, 30, "ENVPORT_KILL_ROUNDS")

SPECS = (
    spec_data(NAME, [["alpha==1.0"], ["gamma==1.0"]], env={"KILL_SPEC": "a"}),
    spec_data(NAME, [["alpha==2.0", "epsilon==1.0"]], env={"KILL_SPEC": "b"}),
    spec_data(NAME, [["beta==1.0"], {"packages": ["delta==1.0"], "force_reinstall": True}], env={"KILL_SPEC": "c"}),
)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL the process and every descendant's process group at once: nothing gets to clean up."""
    groups = set()
    for p in [pid, *descendants(pid)]:
        try:
            groups.add(os.getpgid(p))
        except ProcessLookupError:
            pass
    groups.discard(os.getpgid(0))
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def state(proj: ShellProject) -> tuple:
    prefix = proj.prefix(NAME)
    env = env_vars(prefix)
    env["ENVPORT_ROOT"] = env["ENVPORT_ROOT"].replace(str(proj.envs_dir), "<envs>")
    return freeze(prefix), env


def timed_build(proj: ShellProject) -> tuple[int, list[tuple[float, str]]]:
    """Build once, keeping when each progress line came: the rounds pick their kill points from these."""
    proc = subprocess.Popen(proj.argv(NAME), cwd=proj.root, env=proj.env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    t0, stamps = time.monotonic(), []
    for line in proc.stderr:
        stamps.append((time.monotonic() - t0, line.rstrip("\n")))
    proc.stderr.close()
    rc = proc.wait(timeout=600)
    assert len(stamps) >= 3, f"a build that prints {len(stamps)} progress lines leaves nowhere to kill it: {stamps}"
    return rc, stamps


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    return make_wheelhouse(tmp_path_factory.mktemp("wheels"))


@pytest.mark.slow  # minutes: every build makes a real venv
def test_sigkill_at_random_points_then_the_next_build_is_a_fresh_build(tmp_path, wheels):
    seed = int(os.environ.get("ENVPORT_KILL_SEED", random.SystemRandom().randrange(1 << 30)))
    rng = random.Random(seed)
    n_rounds = rounds()
    print(f"\nENVPORT_KILL_SEED={seed} ENVPORT_KILL_ROUNDS={n_rounds}")
    proj = ShellProject.make(tmp_path / "project", wheels)
    shutil.copytree(REPO / "sites", proj.root / "sites")
    fresh, lines = {}, {}
    for i, data in enumerate(SPECS):
        other = ShellProject.make(tmp_path / f"fresh-{i}", wheels)
        shutil.copytree(REPO / "sites", other.root / "sites")
        other.write(data)
        rc, lines[i] = timed_build(other)
        assert rc == 0, lines[i]
        fresh[i] = state(other)

    where, current, landed = [], None, 0
    for round_ in range(n_rounds):
        # Another spec than the env's: the killed run is a real build, never a `present`.
        killed = rng.choice([i for i in range(len(SPECS)) if i != current])
        proj.write(SPECS[killed])
        proc = subprocess.Popen(proj.argv(NAME), cwd=proj.root, env=proj.env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        # A random progress line of this spec's own build, then a jitter no longer than the gap a
        # fresh build left before its next line: the kill lands inside the build, wherever it is.
        stamps = lines[killed]
        k = rng.randrange(len(stamps) - 1)
        seen = []
        for line in proc.stderr:
            seen.append(line.rstrip("\n"))
            if len(seen) > k:
                break
        time.sleep(rng.uniform(0, min(1.5, stamps[k + 1][0] - stamps[k][0])))  # the random point itself
        landed += proc.poll() is None
        whole_tree = round_ % 2 == 1
        if whole_tree:
            kill_tree(proc.pid)
        else:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stderr.close()
        where.append(f"{'tree' if whole_tree else 'envport'} after {seen[-1] if seen else '-'}")

        nxt = current = rng.randrange(len(SPECS))
        proj.write(SPECS[nxt])
        built = proj.build(NAME, timeout=600)
        assert built.rc == 0 and built.verdict in ("OK", "present"), f"round {round_} (seed {seed}): {built.why()}"
        assert state(proj) == fresh[nxt], f"round {round_} (seed {seed}): killed {where[-1]}"
        builds = proj.envs_dir / f".{NAME}.builds"
        assert len([p for p in builds.iterdir() if not p.name.startswith(".")]) == 1, list(builds.iterdir())
    print("\n".join(f"  round {i}: SIGKILL {w}" for i, w in enumerate(where)))
    assert landed >= n_rounds * 3 // 4, f"only {landed} of {n_rounds} kills hit a running build (seed {seed})"
