"""`envport build --target docker` against the real engine (tests/services.py fixtures).

demo-cpu is built for real once per session (tests/fixtures.py `demo_image`); the
faults use tiny specs (six only, no torch) so each builds in seconds. The docker
marker comes from the fixtures (tests/conftest.py): the log-parsing units and the
unreachable-engine fault need no engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


from envport.engines import docker as docker_engine
from envport.builders.docker.log import BuildkitLog, instruction_steps

from .support import as_json, missing, run_envport, tags_of, unique, write_site, write_spec

# --- demo-cpu: a real build, then `present` ------------------------------------


def test_demo_cpu_builds_from_the_wheelhouse(demo_image, docker_client):
    steps = {s["step"].split()[0]: s for s in demo_image.result["steps"]}
    assert steps["base"]["verdict"] == "present"
    assert steps["wheelhouse"]["verdict"] in ("OK", "present")
    build = demo_image.result["steps"][-1]
    # --rebuild ran the engine's build: every layer step was built, or reused from its layer cache.
    ran = set(build["data"]["built_steps"]) | set(build["data"]["cached_steps"])
    assert {"python", "pip-1", "pip-2", "files", "weights"} <= ran, build
    # Progress names the plan's steps, pip phases included.
    assert "envport: [docker] step" in demo_image.stderr
    assert "pip-1: pip phase 1: torch==2.13.0" in demo_image.stderr
    image = docker_client.images.get(demo_image.tag)
    name, hash12 = demo_image.tag.split(":")
    assert f"{name}:latest" in image.tags
    labels = image.labels
    assert labels["envport.hash"].startswith(hash12)
    assert labels["envport.name"] == "demo-cpu"
    assert labels["envport.version"]
    assert json.loads(labels["envport.spec"])["pip_phases"][0]["packages"] == ["torch==2.13.0"]
    # The wheels were bind-mounted, never copied into a layer.
    wheels = docker_client.containers.run(image.id, ["sh", "-c", "find / -xdev -name 'torch-*.whl' 2>/dev/null"],
                                          remove=True, network_mode="host")
    assert wheels.decode().split() == []
    from envport.report import ledger
    build_recs = [r for r in ledger.read(demo_image.root, "demo-cpu") if r["kind"] == "build" and r["target"] == "docker"]
    assert build_recs[-1]["image_id"] == image.id and build_recs[-1]["verdict"] == "OK"
    assert build_recs[-1]["size"] == image.attrs["Size"]
    assert build_recs[-1]["weights"] == {"tiny": "/weights/tiny"}


def test_second_build_is_present_without_an_engine_build(demo_image, docker_client):
    before = docker_client.images.get(demo_image.tag).id
    from envport.report import ledger
    n_records = len(ledger.read(demo_image.root, "demo-cpu"))
    proc = run_envport("build", "demo-cpu", "--target", "docker", "--json", root=demo_image.root)
    out = as_json(proc)
    assert proc.returncode == 0, proc.stderr
    # One step, `present`: no base check, no wheelhouse, no build was started.
    assert [s["verdict"] for s in out["steps"]] == ["present"], out
    assert out["steps"][0]["step"] == f"image {demo_image.tag}"
    assert "building" not in proc.stderr and "[docker] step" not in proc.stderr
    assert "SBOM" not in proc.stderr  # the SBOM it carries is not read or made again
    assert docker_client.images.get(demo_image.tag).id == before
    assert len(ledger.read(demo_image.root, "demo-cpu")) == n_records  # a no-op records nothing
    plain = run_envport("build", "demo-cpu", "--target", "docker", root=demo_image.root)
    assert plain.stdout.startswith("present "), plain.stdout


# --- faults --------------------------------------------------------------------


def test_daemon_unreachable_is_refused(project, tmp_path):
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    proc = run_envport("build", "demo-cpu", "--target", "docker", "--json", root=project, env=env, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    step = as_json(proc)["steps"][0]
    assert step["verdict"] == "REFUSED" and step["reason"] == "docker_unreachable"
    assert "no-engine.sock" in step["detail"] and "start" in step["detail"] and "DOCKER_HOST" in step["detail"]


def test_missing_envport_base_is_refused_with_the_fix(docker_client, project):
    write_spec(project, "tiny-nobase", base="envport/debian-bookworm:absent-" + unique("x"))
    proc = run_envport("build", "tiny-nobase", "--target", "docker", "--json", root=project)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    step = as_json(proc)["steps"][-1]
    assert step["verdict"] == "REFUSED" and step["reason"] == "base_image_missing"
    assert "envport base debian-bookworm" in step["detail"]


def test_missing_registry_base_names_the_site_rewrite(docker_client, project, throwaway_images):
    write_spec(project, "tiny-remote", base="registry.example.org/debian:bookworm-slim")
    proc = run_envport("build", "tiny-remote", "--target", "docker", "--json", root=project)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    step = as_json(proc)["steps"][-1]
    assert step["reason"] == "base_image_missing"
    assert "docker pull registry.example.org/debian:bookworm-slim" in step["detail"]
    assert "base_images" in step["detail"]
    # Following the fix: the site maps the base to a local image, and the build goes through.
    site = write_site(project, "mirror",
                      base_images={"registry.example.org/debian:bookworm-slim": "envport/debian-bookworm:base"})
    throwaway_images.append("tiny-remote")
    proc = run_envport("build", "tiny-remote", "--target", "docker", "--site", site, "--json", root=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_unreachable_index_fails_with_pips_last_lines(docker_client, base_image, project, throwaway_images):
    name = "tiny-noindex"
    throwaway_images.append(name)
    write_spec(project, name, pip_phases=[{"packages": ["six==1.16.0"], "index_url": "http://127.0.0.1:9/simple"}],
               env={"TINY_RUN": unique("run")})  # a fresh pip layer: never a cached result
    site = write_site(project, "nowheels", wheelhouse=False)
    proc = run_envport("build", name, "--target", "docker", "--site", site, "--json", root=project)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    step = as_json(proc)["steps"][-1]
    assert step["verdict"] == "FAILED"
    assert "pip-1" in step["detail"] and "no tag was written" in step["detail"]
    text = "\n".join(step["lines"])
    assert "127.0.0.1" in text
    assert "No matching distribution found for six==1.16.0" in text, text
    assert 0 < len(step["lines"]) <= 40
    assert tags_of(docker_client, name) == []


def _wait_for(proc: subprocess.Popen, needle: str, limit: float) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + limit
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"never saw {needle!r}:\n{''.join(seen)}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_killed_build_leaves_no_tag_and_a_rerun_completes(docker_client, base_image, project, throwaway_images):
    name = "tiny-killed"
    throwaway_images.append(name)
    # A run id in env (before the pip phases) makes every pip layer new to the engine.
    write_spec(project, name, pip_phases=[["six==1.16.0"], ["iniconfig==2.0.0"]], env={"TINY_RUN": unique("run")})
    argv = [sys.executable, "-m", "envport", "-C", str(project), "build", name, "--target", "docker"]
    proc = subprocess.Popen(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for(proc, "pip-2: pip phase 2", limit=300)
        os.killpg(proc.pid, signal.SIGKILL)  # what a lost terminal or an OOM kill does, mid-phase
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # The build's docker client was in the killed group too: wait (bounded) until the whole group is
    # gone, so the engine has lost its build session before the tags are read.
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid):
        assert time.monotonic() < deadline, f"process group {proc.pid} outlived SIGKILL by 30s"
        time.sleep(0.1)
    assert tags_of(docker_client, name) == [], "a killed build must leave no tag"

    rerun = run_envport("build", name, "--target", "docker", "--json", root=project)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    build = as_json(rerun)["steps"][-1]
    assert build["verdict"] == "OK"
    assert "pip-1" in build["data"]["cached_steps"], build  # continued from the engine's layer cache
    assert "pip-2" in build["data"]["built_steps"], build
    hash12 = build["data"]["image"].split(":")[1]
    assert tags_of(docker_client, name) == [f"envport/{name}:{hash12}", f"envport/{name}:latest"]
    leftovers = list((project / ".cache" / "docker-build").glob(f"{name}-*"))
    assert leftovers == [], leftovers


def test_no_cache_and_rebuild_build_again(docker_client, base_image, project, throwaway_images):
    name = "tiny-nocache"
    throwaway_images.append(name)
    write_spec(project, name)
    run_envport("build", name, "--target", "docker", root=project, check=True)
    again = as_json(run_envport("build", name, "--target", "docker", "--rebuild", "--json", root=project))
    assert again["steps"][-1]["verdict"] == "OK" and "pip-1" in again["steps"][-1]["data"]["cached_steps"]
    fresh = as_json(run_envport("build", name, "--target", "docker", "--no-cache", "--rebuild", "--json",
                                root=project))
    assert fresh["steps"][-1]["verdict"] == "OK"
    assert "pip-1" in fresh["steps"][-1]["data"]["built_steps"]
    assert "pip-1" not in fresh["steps"][-1]["data"]["cached_steps"]
    # Each rebuild replaced the image under the tag; the replaced ones were not left dangling. The tagged
    # image's own ancestry stays: the SBOM layer (builders/docker/builder.py _sbom_layer) sits on the built
    # image, which is their parent, not a leftover.
    tagged = fresh["steps"][-1]["data"]["image_id"]
    ancestry, at = [], tagged
    while at:
        ancestry.append(at)
        at = docker_client.images.get(at).attrs.get("Parent") or ""
    mine = docker_client.images.list(all=True, filters={"label": f"envport.name={name}"})
    assert [img.id for img in mine if img.id not in ancestry] == [], ancestry


def test_without_buildkit_the_legacy_builder_or_a_clear_refusal(docker_client, base_image, project,
                                                                throwaway_images):
    legacy_cli = "/usr/local/bin/docker"
    probe = subprocess.run([legacy_cli, "build", "--help"], capture_output=True, text=True,
                           env={**os.environ, "DOCKER_BUILDKIT": "1"}) if os.path.exists(legacy_cli) else None
    if probe is None or probe.returncode == 0:
        # This machine kind ships docker 28 at /usr/local/bin without the buildx plugin: CI always has one.
        missing(f"no docker client without BuildKit at {legacy_cli} to stand for a legacy-only host")
    name = "tiny-legacy"
    throwaway_images.append(name)
    write_spec(project, name, env={"TINY_RUN": unique("run")})
    env = {**os.environ, "ENVPORT_DOCKER_CLI": legacy_cli}
    # The wheelhouse is bind-mounted with RUN --mount: only BuildKit can, so this is refused with the fix.
    proc = run_envport("build", name, "--target", "docker", "--json", root=project, env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    step = as_json(proc)["steps"][-1]
    assert step["reason"] == "no_buildkit" and "wheelhouse: false" in step["detail"]
    # Without a wheelhouse the docker SDK's legacy builder builds it (pip reaches the index itself).
    site = write_site(project, "nowheels", wheelhouse=False)
    proc = run_envport("build", name, "--target", "docker", "--site", site, "--json", root=project, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    build = as_json(proc)["steps"][-1]
    assert "legacy builder" in proc.stderr and "step 5/6 pip-1: pip phase 1: six==1.16.0" in proc.stderr
    assert "pip-1" in build["data"]["built_steps"]
    assert docker_client.images.get(build["data"]["image"]).labels["envport.name"] == name


# --- log parsing (no engine) ---------------------------------------------------

DOCKERFILE = """\
# step 1/4 base: base img
FROM img

# step 2/4 env: env (1 vars)
ENV A="1"

# step 3/4 pip-1: pip phase 1: six==1.16.0
RUN python -m pip install \\
      six==1.16.0

# step 4/4 labels: labels and hash
LABEL envport.hash="x"
"""


def test_vertices_map_to_plan_steps():
    ops, every = instruction_steps(DOCKERFILE)
    assert [s.marker for s in ops] == ["base", "pip-1"]
    assert [s.marker for s in every] == ["base", "env", "pip-1", "labels"]
    lines: list[str] = []
    log = BuildkitLog(ops, lines.append)
    for line in [
        "#1 [internal] load build definition from Dockerfile",
        "#1 DONE 0.0s",
        "#4 [1/2] FROM docker.io/library/img",
        "#4 CACHED",
        "#5 [2/2] RUN python -m pip install six==1.16.0",
        "#5 0.512 Collecting six==1.16.0",
        "#5 1.100 ERROR: No matching distribution found for six==1.16.0",
        "#5 ERROR: executor failed running [/bin/sh -c python -m pip install six==1.16.0]: exit code: 1",
        "------",
        " > [2/2] RUN python -m pip install six==1.16.0:",
        "#5 1.100 ERROR: No matching distribution found for six==1.16.0",
        "------",
        "executor failed running [/bin/sh -c python -m pip install six==1.16.0]: exit code: 1",
    ]:
        log.feed(line)
    assert "envport: [docker] step 3/4 pip-1: pip phase 1: six==1.16.0" in lines
    assert "envport: [docker] step 1/4 base cached" in lines
    ref, tail = log.tail()
    assert ref.marker == "pip-1"
    assert tail[:2] == ["Collecting six==1.16.0", "ERROR: No matching distribution found for six==1.16.0"]
    assert tail.count("ERROR: No matching distribution found for six==1.16.0") == 1  # summary not repeated
    assert tail[-1].startswith("executor failed running")


def test_the_docker_client_never_sees_the_hosts_secrets(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws_secret")
    env = docker_engine.cli_env()
    assert "HF_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert set(env) <= set(docker_engine.CLI_ENV_KEEP)
