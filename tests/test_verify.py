"""`envport verify --target docker`: spec-generated testinfra checks against real images."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import pytest
import yaml

from envport.spec.loader import load_spec
from envport.verify.checks import spec_checks

from .support import REPO, as_json, run_envport, write_spec

USER_TEST = '''
import pytest

def test_demo_script_runs(host, envport_name):
    assert envport_name == "demo-cpu"
    out = host.check_output("/opt/envport/venv/bin/python /opt/demo/run.py")
    assert "demo ok" in out

@pytest.mark.envport_env("some-other-env")
def test_only_for_another_env(host):
    raise AssertionError("must be deselected for demo-cpu")
'''


def _containers(docker_client, name: str) -> list:
    return docker_client.containers.list(all=True, filters={"name": f"envport-verify-{name}-"})


@pytest.fixture(scope="module")
def user_test(demo_image):
    """USER_TEST in the session project's tests/images/ until this module ends: the project is shared,
    and the venv verifies of demo-cpu elsewhere (tests/test_ssh.py) must not run it."""
    path = demo_image.root / "tests" / "images" / "test_demo_extra.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(USER_TEST)
    yield path
    path.unlink()


@pytest.mark.docker
def test_demo_cpu_verifies(demo_image, docker_client, user_test):
    root = demo_image.root
    proc = run_envport("verify", "demo-cpu", "--target", "docker", "--json", root=root, timeout=300)
    out = as_json(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    step = out["steps"][0]
    assert step["verdict"] == "OK"
    checks = {c["id"]: c for c in step["data"]["checks"]}
    assert {"pip[torch==2.13.0]", "pip[six==1.16.0]", "python[3.11]", "env[DEMO_GREETING]", "env[OMP_NUM_THREADS]",
            "env[DEMO_WEIGHTS]", "file[/opt/demo/run.py]", "weight[tiny/tiny.f32]", "label[envport.hash]"} <= set(checks)
    assert all(c["outcome"] == "passed" for c in checks.values()), checks
    # The user's test ran against the same container; the other env's test was deselected.
    user = [c for i, c in checks.items() if i.startswith("tests/images/test_demo_extra.py::test_demo_script_runs")]
    assert len(user) == 1 and user[0]["user_test"] is True
    assert not any("test_only_for_another_env" in c for c in checks)
    assert "envport: [verify] PASS pip[torch==2.13.0]" in proc.stderr
    # JUnit: one testcase per check, none failed.
    suite = ET.parse(root / "reports" / "verify-demo-cpu.xml").getroot().find("testsuite")
    assert int(suite.get("tests")) == len(checks) and suite.get("failures") == "0" and suite.get("errors") == "0"
    names = {tc.get("name") for tc in suite.iter("testcase")}
    assert "pip[torch==2.13.0]" in names and "env[DEMO_GREETING]" in names
    from envport.report import ledger as envport_ledger
    ledger = envport_ledger.read(root, "demo-cpu")  # this user's state dir, not the checkout
    rec = [r for r in ledger if r["kind"] == "verify"][-1]
    assert rec["verdict"] == "OK" and rec["target"] == "docker" and rec["image_id"] == demo_image.id
    assert len(rec["checks"]) == len(checks) and rec["size"] > 0
    assert _containers(docker_client, "demo-cpu") == []  # always removed


@pytest.mark.docker
def test_altered_image_fails_naming_exactly_what_differs(demo_image, docker_client, throwaway_images, tmp_path):
    root = demo_image.root
    # The same recipe with six dropped and DEMO_GREETING changed, built as another env.
    spec = yaml.safe_load((REPO / "specs" / "demo-cpu.yaml").read_text())
    spec["name"] = "demo-cpu-altered"
    spec["pip_phases"] = [p for p in spec["pip_phases"] if p != ["six==1.16.0"]]
    spec["env"]["DEMO_GREETING"] = "hello from somewhere else"
    write_spec(root, "demo-cpu-altered", **spec)
    throwaway_images.append("demo-cpu-altered")
    built = as_json(run_envport("build", "demo-cpu-altered", "--target", "docker", "--json", root=root))
    assert built["exit_code"] == 0, built
    altered = built["steps"][-1]["data"]["image"]

    junit = tmp_path / "altered.xml"
    proc = run_envport("verify", "demo-cpu", "--image", altered, "--junit", str(junit), "--json", root=root,
                       timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    step = as_json(proc)["steps"][0]
    assert step["verdict"] == "FAILED"
    failed = {c["id"]: c["message"] for c in step["data"]["checks"] if c["outcome"] != "passed"
              and c["outcome"] != "skipped"}
    assert set(failed) == {"pip[six==1.16.0]", "env[DEMO_GREETING]"}, failed
    assert "six is not installed" in failed["pip[six==1.16.0]"]
    assert "hello from somewhere else" in failed["env[DEMO_GREETING]"]
    assert "hello from demo-cpu" in failed["env[DEMO_GREETING]"]
    # The label names another version of the spec: said so, as a skip, not hidden.
    label = next(c for c in step["data"]["checks"] if c["id"] == "label[envport.hash]")
    assert label["outcome"] == "skipped" and "another version" in label["message"]
    assert {ln.split(":")[0] for ln in step["lines"]} == set(failed)
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "2"
    assert _containers(docker_client, "demo-cpu") == []


@pytest.mark.docker
def test_verify_refuses_an_image_that_was_never_built(docker_client, project):
    write_spec(project, "tiny-unbuilt", env={"NEVER": "built"})
    proc = run_envport("verify", "tiny-unbuilt", "--json", root=project, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    step = as_json(proc)["steps"][0]
    assert step["reason"] == "image_missing" and "envport build tiny-unbuilt --target docker" in step["detail"]


def test_verify_refuses_when_the_engine_is_unreachable(project, tmp_path):
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/dead.sock"}
    proc = run_envport("verify", "demo-cpu", "--json", root=project, env=env, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert as_json(proc)["steps"][0]["reason"] == "docker_unreachable"


# --- the generated checks (no engine) ------------------------------------------


def test_checks_follow_the_last_phase_that_names_a_package(tmp_path):
    (tmp_path / "specs" / "files").mkdir(parents=True)
    (tmp_path / "specs" / "files" / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    write_spec(tmp_path, "pins",
               system_pkgs=["git", "curl=7.88.1-10+deb12u5"],
               pip_phases=[["numpy==1.26.4", "Foo_Bar==1.0"], ["foo-bar==2.0", "attrs>=23"],
                           {"packages": ["numpy==1.26.3"], "no_deps": True, "force_reinstall": True}],
               env={"B": "x $HOME \\ y"},
               shim_files={"/opt/run.sh": "files/run.sh"},
               weight_dirs={"hf": {"path": "/weights/hf", "env": "HF_HOME", "gated": True}})
    ids = [c.id for c in spec_checks(load_spec("pins", tmp_path), "h" * 64)]
    assert ids == [
        "system[git]", "system[curl=7.88.1-10+deb12u5]",
        "pip[attrs>=23]", "pip[foo-bar==2.0]", "pip[numpy==1.26.3]",
        "python[3.11]",
        "env[B]", "env[HF_HOME]",
        "file[/opt/run.sh]",
        "weight[hf:/weights/hf]",
        "label[envport.hash]",
    ]
    checks = {c.id: c for c in spec_checks(load_spec("pins", tmp_path), "h" * 64)}
    assert checks["env[B]"].expected == "x $HOME \\ y"  # bytes as written, no shell or Docker expansion
    assert checks["file[/opt/run.sh]"].mode == "0755"
    assert checks["system[curl=7.88.1-10+deb12u5]"].expected == "7.88.1-10+deb12u5"
