"""renderers/envcheck.py and builders/pins.py: what an env has, and whether the spec's pins hold.

Pure functions on {distribution: version}, plus the scan itself run in a real venv with real installs
of small local wheels (tests/tinywheels.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envport.builders import pins
from envport.plan.steps import make_plan
from envport.renderers import envcheck
from envport.renderers.shell import ENVCHECK_SOURCE
from envport.spec.loader import load_spec

from .support import REPO, copy_project
from .tinywheels import make_wheelhouse, pip_env


@pytest.mark.parametrize("pin, installed, holds", [
    ("1.26.4", "1.26.4", True),
    ("1.26.4", "2.0.2", False),
    ("2.0", "2.0.0", True),
    ("2.13.0", "2.13.0+cpu", True),  # a pin without a local label admits any local build (PEP 440)
    ("2.13.0+cu124", "2.13.0+cpu", False),
    ("2.13.0+cpu", "2.13.0+cpu", True),
    ("1.*", "1.26.4", True),
    ("1.26.*", "1.27.0", False),
    ("1.0.post1", "1.0.post1", True),
    ("1.0", "1.0.post1", False),
    ("=1.0-custom", "1.0-custom", True),  # === arbitrary equality: the strings
])
def test_pin_holds_follows_pep440_equality(pin, installed, holds):
    assert envcheck.pin_holds(pin, installed) is holds


def test_a_moved_pin_names_the_package_the_pinning_phase_the_winner_the_mover_and_the_fix():
    snapshots = {1: {"numpy": "1.26.4"}, 2: {"numpy": "2.0.2", "pandas": "3.1.1"}}
    bad = envcheck.failures([("numpy", "1.26.4", 1)], {"numpy": "2.0.2"}, snapshots)
    assert bad == ['numpy==1.26.4 (pinned by pip phase 1): numpy 2.0.2 won (pip phase 2 moved it); fix: pin a '
                   'version of what pulled it that accepts numpy==1.26.4 in that phase, or add a snap-back phase '
                   'after pip phase 2: {packages: ["numpy==1.26.4"], no_deps: true, force_reinstall: true}']
    assert envcheck.failures([("numpy", "1.26.4", 1)], {"numpy": "1.26.4"}, snapshots) == []


def test_a_pin_that_is_not_installed_is_a_failure_too():
    bad = envcheck.failures([("Foo_Bar", "1.0", 2)], {})
    assert bad and bad[0].startswith("Foo_Bar==1.0 (pinned by pip phase 2): it is not installed;")


def test_the_last_phase_naming_a_package_decides_its_pin(tmp_path):
    root = copy_project(tmp_path)
    (root / "specs" / "p.yaml").write_text(
        "name: p\nbase: envport/debian-bookworm:base\npython: '3.11'\npip_phases:\n"
        "  - [numpy==1.26.4, six==1.16.0, 'Typing_Extensions==4.0']\n"
        "  - ['numpy>=1', 'six[extra]>=1.16', scipy==1.14.0]\n"
        "  - {packages: ['typing-extensions==4.12.2'], no_deps: true}\n")
    plan = make_plan(load_spec("p", root))
    # numpy and six: the last phase naming them does not pin them.
    assert pins.pins(plan) == [("scipy", "1.14.0", 2), ("typing-extensions", "4.12.2", 3)]
    assert pins.check(plan, {"SciPy": "1.14.0", "typing_extensions": "4.12.2"}) == []
    assert len(pins.check(plan, {"scipy": "1.14.1", "typing-extensions": "4.12.2"})) == 1


def test_scanpy_cpu_pins_numpy_where_its_resolve_keeps_it():
    """scanpy-cpu's own pins: numpy 1.26.4 (phase 1) held because phase 2 pins a pandas that accepts it."""
    plan = make_plan(load_spec("scanpy-cpu", REPO))
    got = {name: (version, phase) for name, version, phase in pins.pins(plan)}
    assert got["numpy"] == ("1.26.4", 1) and got["pandas"] == ("2.2.3", 2)


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "specs").glob("*.lock")))
def test_each_committed_lock_ends_with_every_pin_its_spec_states(name):
    """A real resolve, recorded: `envport lock` resolved each phase in order after the ones before it, and a
    build installs exactly those sets.  What the env holds after the last pass must meet every pin (for
    scanpy-cpu: phase 2's resolve kept numpy 1.26.4 instead of moving it to 2.x, as it did before pandas
    was pinned)."""
    from envport.plan import lock as lockfile

    loaded = load_spec(name, REPO)
    lock = lockfile.current(loaded)
    assert lock is not None, f"specs/{name}.lock does not fit specs/{name}.yaml (envport lock {name})"
    plan = make_plan(loaded, locked=False)  # the pins the spec states, not the lock's own sets
    final = {d.name: d.version for d in lock.final().values()}
    assert pins.check(plan, final) == []
    # The check can fail: the same end state with one pinned package moved (numpy to 2.0.2, as the issue
    # found scanpy-cpu) is named, with the phase that pinned it.
    pinned, version, phase = next((p for p in pins.pins(plan) if p[0] == "numpy"), pins.pins(plan)[0])
    moved = {**final, envcheck.canonical(pinned): "2.0.2" if pinned == "numpy" else version + ".post999"}
    assert [m.split(":")[0] for m in pins.check(plan, moved)] == [f"{pinned}=={version} (pinned by pip phase {phase})"]


def test_differences_say_what_changed():
    assert envcheck.differences({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "3", "d": "4"}) == [
        "b is 3, the build installed 2", "c 3 is missing", "d 4 was added"]
    assert envcheck.load(envcheck.dump({"b": "2", "a": "1"})) == {"a": "1", "b": "2"}


def test_probe_output_parses_past_a_banner():
    assert pins.parse_probe('welcome to the image\n{"six": "1.16.0"}\n') == {"six": "1.16.0"}
    with pytest.raises(ValueError):
        pins.parse_probe("no json here")


def test_the_scan_inside_a_real_venv_sees_installs_and_lost_files(tmp_path):
    """The embedded source, run as the setup scripts run it: real pip installs, then a deleted package dir."""
    wheels = make_wheelhouse(tmp_path / "wheels")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    env = pip_env(wheels, tmp_path / "envs")
    subprocess.run([py, "-m", "pip", "install", "-q", "gamma==1.0", "epsilon==1.0"], check=True, env=env,
                   timeout=300)
    src = ENVCHECK_SOURCE.read_text()
    scan = json.loads(subprocess.run([py, "-I", "-c", src, "scan"], capture_output=True, text=True, check=True,
                                     timeout=60).stdout)
    assert scan["gamma"] == "1.0" and scan["delta"] == "1.1" and scan["epsilon"] == "1.0" and "pip" in scan
    record = tmp_path / "dists"
    subprocess.run([py, "-I", "-c", src, "record", str(record)], check=True, timeout=60)
    same = subprocess.run([py, "-I", "-c", src, "compare", str(record)], capture_output=True, text=True, timeout=60)
    assert same.returncode == 0 and same.stdout == ""
    site = next(venv.glob("lib/python3*/site-packages"))
    shutil.rmtree(site / "epsilon")
    gone = subprocess.run([py, "-I", "-c", src, "compare", str(record)], capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1
    assert gone.stdout.strip() == "epsilon lost 1 installed file(s): epsilon/__init__.py"
    shutil.rmtree(next(site.glob("gamma-*.dist-info")))
    gone = subprocess.run([py, "-I", "-c", src, "compare", str(record)], capture_output=True, text=True, timeout=60)
    assert gone.stdout.startswith("gamma 1.0 is missing; epsilon lost 1"), gone.stdout


def build_a_moved_pin(project: Path, base_image: str, tmp_path: Path, name: str, target: str, **extra: str):
    """Build NAME for TARGET from a spec whose phase 2 (beta 2.0 requires alpha>=2) moves phase 1's
    alpha==1.0: FAILED [pin_mismatch] naming alpha.  Returns (spec, env, proc) for a follow-up build."""
    import yaml

    from .support import run_envport, unique

    env = pip_env(make_wheelhouse(tmp_path / "wheels"), tmp_path / "envs", **extra)
    spec = {"name": name, "base": base_image, "python": "3.11", "env": {"TINY_RUN": unique("run")},
            "pip_phases": [["alpha==1.0"], ["beta==2.0"]]}
    (project / "specs" / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = run_envport("build", name, "--target", target, "--json", root=project, env=env, timeout=900)
    last = json.loads(proc.stdout)["steps"][-1]
    assert proc.returncode == 1 and last["reason"] == "pin_mismatch", proc.stdout + proc.stderr
    assert last["detail"].startswith("alpha==1.0 (pinned by pip phase 1): alpha 2.0 won;"), last["detail"]
    return spec, env, proc


def test_the_docker_builder_checks_pins_before_it_tags(docker_client, base_image, project, throwaway_images,
                                                      tmp_path):
    """A docker build whose later phase moved a pinned package is FAILED [pin_mismatch] and left untagged,
    so it is never `present`; a build whose pins hold is tagged.  Wheels: tests/tinywheels.py, through the
    site's wheelhouse (host pip pointed at them only)."""
    import yaml

    from .support import run_envport, tags_of, unique

    name = unique("pins")
    throwaway_images.append(name)
    spec, env, _ = build_a_moved_pin(project, base_image, tmp_path, name, "docker")
    assert tags_of(docker_client, name) == []

    spec["pip_phases"].append({"packages": ["alpha==1.0"], "no_deps": True, "force_reinstall": True})
    (project / "specs" / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = run_envport("build", name, "--target", "docker", "--json", root=project, env=env, timeout=900)
    assert proc.returncode == 0 and json.loads(proc.stdout)["steps"][-1]["verdict"] == "OK", proc.stdout
    assert len(tags_of(docker_client, name)) == 2  # :<hash12> and :latest


def test_the_sif_builder_checks_pins_before_it_writes_a_sif(base_image, project, tmp_path):
    """The same moved pin through envport's own `.def` builder: the probe runs in the rootfs after %post,
    FAILED [pin_mismatch] naming the package, and no SIF is written (so it is never `present`)."""
    from .sif_fixtures import require_sif_tools
    from .support import unique

    require_sif_tools()
    name = unique("pins-sif")
    _, _, proc = build_a_moved_pin(project, base_image, tmp_path, name, "apptainer", ENVPORT_SIF_BUILDER="envport")
    assert re.search(r"%post step (\d+)/\1 labels and hash\n", proc.stderr), proc.stderr  # after all of %post
    assert not list(project.rglob(f"{name}-*.sif")), "a SIF was written for a build whose pins do not hold"
