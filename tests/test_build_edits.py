"""Random spec edits on one venv env: after every build it equals a fresh build of the same spec.

Hypothesis draws sequences of edits (add/remove/change packages across phases, reorder phases, add or
drop a phase, toggle no_deps/force_reinstall, edit env) and applies them to ONE env, building after
each, with the real setup script and real pip installs of small local wheels (tests/tinywheels.py).
After every build, `pip freeze --all` and the env block equal those of a build of the same spec into
an empty envs dir (cached by the env's hash, so a spec seen before is not built twice).  A spec whose
fresh build fails (a resolve conflict, a moved pin) must fail the same way on the long-lived env,
and leave that env as the last good spec made it.

The builder is called in-process (`envport.builders.shell.build`: what `envport build` calls), which
saves the CLI's start-up per build; tests/test_shell_build.py runs the CLI itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envport.builders import shell
from envport.plan.site import load_site
from envport.recipe.identity import resolve
from envport.spec.loader import load_spec

from .support import REPO, examples
from .tinywheels import PACKAGES, ShellProject, env_vars, freeze, make_wheelhouse, pip_env, spec_data

NAME = "edits"
VERSIONS = {name: [*versions, None] for name, versions in PACKAGES.items()}  # None: unpinned
ENV_KEYS = ("EDIT_A", "EDIT_B", "EDIT_C")


def budget() -> int:
    """Edit sequences per run (tests/README.md "Time budget"): each costs ~2-4 real venv builds of ~5 s.
    CI 8 (was 25: 734 s, 43 % of CI with two others); --deep 40; ENVPORT_EDIT_SEQUENCES overrides."""
    return examples(8, 40, "ENVPORT_EDIT_SEQUENCES")


@contextlib.contextmanager
def environ(values: dict):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def build_env(root: Path, envs: Path, wheels: Path) -> tuple[str, str, tuple | None, str]:
    """Build NAME from ROOT into ENVS in this process: (verdict, reason, (freeze, env block) or None, hash)."""
    loaded = load_spec(NAME, root)
    site = load_site(None, root)
    with environ(pip_env(wheels, envs)):
        result = shell.build(loaded, site, root, flavour="venv", progress=lambda line: None)[-1]
    prefix = envs / NAME
    state = None
    if result.verdict.ok:
        env = env_vars(prefix)
        env["ENVPORT_ROOT"] = env["ENVPORT_ROOT"].replace(str(envs), "<envs>")
        state = (freeze(prefix), env)
    return result.verdict.value, result.reason, state, resolve(loaded, site, "venv").identity.hash


def fresh_build(where: Path, wheels: Path, data: dict) -> tuple[str, str, tuple | None, str]:
    """DATA built into an empty envs dir of its own under WHERE (removed after: its freeze and env block
    are all the comparison needs). Runs in the fork pool, beside the long-lived env's build."""
    other = ShellProject.make(where, wheels)
    shutil.copytree(REPO / "sites", other.root / "sites")
    other.write(data)
    try:
        return build_env(other.root, other.envs_dir, wheels)
    finally:
        shutil.rmtree(where)


class World:
    """The long-lived env, the fresh builds by hash, and the spec being edited.

    A spec's fresh build runs in a forked worker at the same time as the long-lived env's build of that
    spec (two builds, two cores, each step waits for both): the same two real builds as before, one
    after the other took twice the wall time (issue 25).  Both call the same in-process builder."""

    def __init__(self, base: Path):
        self.wheels = make_wheelhouse(base / "wheels")
        self.proj = ShellProject.make(base / "project", self.wheels)
        shutil.copytree(REPO / "sites", self.proj.root / "sites")
        self.base = base
        self.fresh: dict[str, tuple] = {}
        self.last_good: tuple | None = None
        self.builds = self.fresh_builds = 0
        # fork: the worker inherits the loaded modules and this process's environment, and builds
        # under its own `environ` (each process swaps only its own os.environ).
        self.pool = multiprocessing.get_context("fork").Pool(1)

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()

    def spec_hash(self, data: dict) -> str:
        self.proj.write(data)
        return resolve(load_spec(NAME, self.proj.root), load_site(None, self.proj.root), "venv").identity.hash

    def step(self, data: dict) -> None:
        hash_ = self.spec_hash(data)
        pending = None
        if hash_ not in self.fresh:
            pending = self.pool.apply_async(fresh_build, (self.base / f"fresh-{hash_[:12]}", self.wheels, data))
        verdict, reason, state, built_hash = build_env(self.proj.root, self.proj.envs_dir, self.wheels)
        self.builds += 1
        assert built_hash == hash_
        if pending is not None:
            fresh_verdict, fresh_reason, fresh_state, got = pending.get(timeout=600)
            assert got == hash_
            self.fresh[hash_] = ("OK" if fresh_verdict in ("OK", "present") else fresh_verdict, fresh_reason,
                                 fresh_state)
            self.fresh_builds += 1
        want_verdict, want_reason, want_state = self.fresh[hash_]
        if want_verdict == "OK":
            assert verdict in ("OK", "present"), (verdict, reason, data)
            assert state == want_state, f"the env differs from a fresh build of {data}"
            self.last_good = state
        else:
            assert (verdict, reason) == (want_verdict, want_reason), (verdict, reason, data)
            if self.last_good is not None:
                prefix = self.proj.prefix(NAME)
                assert freeze(prefix) == self.last_good[0], "a failed build changed the env"


# --- the spec model and its edits --------------------------------------------------------------


def to_spec(phases: list[dict], env: dict) -> dict:
    out = []
    for ph in phases:
        pkgs = [f"{n}=={v}" if v else n for n, v in ph["packages"].items()]
        if not pkgs:
            continue
        out.append({"packages": pkgs, "no_deps": ph["no_deps"], "force_reinstall": ph["force_reinstall"]}
                   if ph["no_deps"] or ph["force_reinstall"] else pkgs)
    return spec_data(NAME, out or [["epsilon==1.0"]], env=dict(env) or None)


package = st.sampled_from(sorted(VERSIONS))
edit = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 2), package, st.integers(0, 2)),  # add or change
    st.tuples(st.just("remove"), st.integers(0, 2), package),
    st.tuples(st.just("swap"), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("add_phase"), package),
    st.tuples(st.just("drop_phase"), st.integers(0, 2)),
    st.tuples(st.just("toggle"), st.integers(0, 2), st.sampled_from(["no_deps", "force_reinstall"])),
    st.tuples(st.just("env"), st.sampled_from(ENV_KEYS), st.sampled_from(["", "one", "two words", None])),
)


def apply(edit_: tuple, phases: list[dict], env: dict) -> None:
    kind, *args = edit_
    n = len(phases)
    if kind == "set":
        i, name, v = args
        versions = VERSIONS[name]
        phases[i % n]["packages"][name] = versions[v % len(versions)]
    elif kind == "remove":
        phases[args[0] % n]["packages"].pop(args[1], None)
    elif kind == "swap":
        i, j = args[0] % n, args[1] % n
        phases[i], phases[j] = phases[j], phases[i]
    elif kind == "add_phase" and n < 3:
        phases.append({"packages": {args[0]: VERSIONS[args[0]][0]}, "no_deps": False, "force_reinstall": False})
    elif kind == "drop_phase" and n > 1:
        phases.pop(args[0] % n)
    elif kind == "toggle":
        phases[args[0] % n][args[1]] = not phases[args[0] % n][args[1]]
    elif kind == "env":
        key, value = args
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value


def base_phases() -> list[dict]:
    return [{"packages": {"alpha": "1.0"}, "no_deps": False, "force_reinstall": False},
            {"packages": {"gamma": "1.0", "epsilon": None}, "no_deps": False, "force_reinstall": False}]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("edits"))
    yield w
    w.close()


@pytest.mark.slow  # minutes: every build makes a real venv
def test_random_edit_sequences_leave_the_env_equal_to_a_fresh_build(world):
    start = time.monotonic()
    drawn = []
    sequences = budget()

    @settings(max_examples=sequences, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(edit, min_size=1, max_size=3))
    def run(edits):
        phases, env = base_phases(), {"EDIT_A": "base"}
        drawn.append(len(edits))
        for e in edits:
            apply(e, phases, env)
            world.step(to_spec(phases, env))

    run()
    print(f"\n{len(drawn)} edit sequences, {world.builds} builds of the long-lived env, "
          f"{world.fresh_builds} fresh builds (cached by hash), {time.monotonic() - start:.0f}s")
    assert len(drawn) >= sequences and world.builds >= sequences
