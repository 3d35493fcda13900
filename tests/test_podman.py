"""`--target podman`, rootless, against Debian's real podman, run AS AN UNPRIVILEGED USER.

Every podman call here runs as the test users .ci/services/podman.sh makes (`runuser -u`, never as root):
`envport-podman`, with a subordinate uid/gid range and its own storage and runroot, and
`envport-podman-1uid`, with no range (podman's single-uid mode).  envport runs as that user through the
podman target found in the registry (targets.registry.get), on a small env (six only, no torch).

Host changes made here, said so: a venv for the test user at PODMAN_VENV (this checkout's envport and its
dependencies, for the user's own interpreter; root's pyenv python is not readable by other users), made
once and kept like tests/support.py's LOCAL_ENVS_DIR; project folders in the test users' homes, removed at
the end; the small env's images in the test user's podman storage, removed at the end; demo-cpu's image
(1.1 GB) kept there, as the docker tests keep theirs, so the next run finds it present (a first build
here: 185 s).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from .registry_fixture import registry  # noqa: F401
from .support import copy_project, copy_tracked, missing, proven, unique, write_spec

USER = os.environ.get("ENVPORT_PODMAN_USER", "envport-podman")
SINGLE_UID_USER = os.environ.get("ENVPORT_PODMAN_1UID_USER", "envport-podman-1uid")
PODMAN_VENV = Path(os.environ.get("ENVPORT_PODMAN_VENV", "/var/tmp/envport-podman-venv"))
# The interpreter the test user can run (Debian's), and the distributions envport needs on it.
USER_PYTHON = "/usr/bin/python3"
USER_DEPS = ("pydantic>=2.6", "PyYAML>=6", "Jinja2>=3.1", "packaging>=23", "cryptography>=41", "tree-sitter>=0.23",
             "tree-sitter-bash>=0.23", "docker>=7", "pytest-testinfra>=10", "pytest>=8", "dockerfile-parse>=2",
             "cyclonedx-python-lib[json-validation]>=8", "oras>=0.2.25")

# Runs as the test user: parity's probe through the podman target, as `envport parity` runs it.
PROBE_DRIVER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.report import parity
    from envport.spec.loader import load_spec
    from envport.targets import registry

    loaded, site = load_spec(sys.argv[1], Path.cwd()), load_site("local", Path.cwd())
    target = registry.get("podman")
    tag = resolve(loaded, site, target.recipe).identity.image_tag
    rc, text = target.probe(lambda argv, env=None: parity.run_probe(argv, stdin=parity.PROBE, env=env), tag,
                            parity.env_names(loaded))
    print(json.dumps({"rc": rc, "text": text}))
""")

# Runs as the test user: the SBOM of IMAGE read from its whole exported filesystem, with the facts of the SBOM
# file given (what `envport sbom --target podman` read before it streamed only the SBOM's files).
WHOLE_EXPORT_SBOM = textwrap.dedent("""
    import json, sys, tempfile
    from datetime import datetime
    from pathlib import Path
    from envport.engines import podman
    from envport.engines.docker import export_rootfs
    from envport.sif import sbom

    doc = json.loads(Path(sys.argv[2]).read_text())
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    facts = sbom.EnvFacts(props["envport:name"], props["envport:hash"], props["envport:target"],
                          lock=None if props["envport:lock"] == "none" else props["envport:lock"],
                          created=datetime.fromisoformat(doc["metadata"]["timestamp"]))
    with tempfile.TemporaryDirectory() as tmp:
        export_rootfs(sys.argv[1], Path(tmp) / "whole", docker=podman.podman(), env=podman.cli_env())
        print(sbom.make_sbom(Path(tmp) / "whole", facts)[0])
""")


def _user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        missing(f"podman test user {name} does not exist: run `bash .ci/services/podman.sh` (as root)")
        raise


def as_user(name: str, *argv: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """ARGV as the unprivileged user NAME with a login-like environment (no root variable leaks in)."""
    pw = _user(name)
    env = ["env", "-i", f"HOME={pw.pw_dir}", f"USER={name}", f"LOGNAME={name}",
           f"PATH={PODMAN_VENV}/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"XDG_RUNTIME_DIR=/run/user/{pw.pw_uid}"]
    return subprocess.run(["runuser", "-u", name, "--", *env, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def envport(name: str, *args: str, project: Path, timeout: float = 900, exit_code: int = 0):
    """`envport ARGS --json` as the user NAME in PROJECT: (its steps, its stderr)."""
    proc = as_user(name, "envport", *args, "--json", cwd=project, timeout=timeout)
    assert proc.returncode == exit_code, (f"envport {' '.join(args)} as {name} exited {proc.returncode}\n"
                                          f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)["steps"], proc.stderr


@pytest.fixture(scope="session")
def user_venv():
    """PODMAN_VENV with this checkout's envport for the test user's python; made once per content, kept.

    Installed from a copy of the tracked files, not editable: the checkout may sit where the test user cannot
    read (a clone under a 0700 home), and a package build in the checkout would leave build/ behind."""
    if shutil.which("podman") is None or shutil.which("runuser") is None:
        missing("podman or runuser not installed (.ci/install.sh installs podman)")
    if os.geteuid() != 0:
        missing("the rootless podman tests switch to their test user with runuser, which needs root")
    marker = PODMAN_VENV / ".envport-checkout"
    PODMAN_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{PODMAN_VENV}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with tempfile.TemporaryDirectory(prefix="envport-podman-src-") as src:
            copy_tracked(Path(src))
            digest = hashlib.sha256()
            for path in sorted(Path(src).rglob("*")):
                if path.is_file():
                    digest.update(str(path.relative_to(src)).encode() + b"\0" + path.read_bytes())
            if not (marker.is_file() and marker.read_text() == digest.hexdigest()):
                subprocess.run([USER_PYTHON, "-m", "venv", str(PODMAN_VENV)], check=True, timeout=300)
                pip = [str(PODMAN_VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
                subprocess.run([*pip, *USER_DEPS], check=True, timeout=900, capture_output=True)
                subprocess.run([*pip, "--no-deps", "--force-reinstall", src], check=True, timeout=600,
                               capture_output=True)
                marker.write_text(digest.hexdigest())
    return PODMAN_VENV


@pytest.fixture(scope="module")
def tiny(user_venv):
    """A project in the test user's home with one small env, built rootless once for this module."""
    pw = _user(USER)
    project = Path(pw.pw_dir) / "envport-tests" / unique("proj")
    project.mkdir(parents=True)
    copy_project(project)
    name = unique("tinypm")
    write_spec(project, name, witnesses={"imports": ["six"],
                                         "cli": [{"cmd": "python -c 'import six; print(six.__version__)'",
                                                  "expect": "1\\.16\\.0"}]})
    subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(project.parent)], check=True)
    try:
        results, stderr = envport(USER, "build", name, "--target", "podman", project=project)
        yield project, name, results, stderr
    finally:
        tags = [r["data"]["image"] for r in results if r["data"].get("image")] if "results" in locals() else []
        for ref in (*tags, f"envport/{name}:latest"):
            as_user(USER, "podman", "rmi", ref, cwd=project, timeout=120)
        shutil.rmtree(project, ignore_errors=True)


def test_build_rootless_then_present(tiny):
    project, name, results, stderr = tiny
    verdicts = [(r["step"].split()[0], r["verdict"]) for r in results]
    assert verdicts[0] == ("base", "present") and verdicts[-1] == ("build", "OK"), results
    assert "rootless" in stderr and "STEP 1/" in stderr
    tag = results[-1]["data"]["image"]
    # The image lives in the test user's own storage with the env's hash, not in root's engines.
    labels = as_user(USER, "podman", "image", "inspect", "--format", "{{json .Labels}}", tag, cwd=project)
    assert labels.returncode == 0, labels.stderr
    assert json.loads(labels.stdout)["envport.hash"].startswith(tag.split(":")[1])
    assert subprocess.run(["podman", "image", "exists", tag], capture_output=True).returncode != 0
    again, _ = envport(USER, "build", name, "--target", "podman", project=project)
    assert [(r["step"], r["verdict"]) for r in again] == [(f"image {tag}", "present")], again


def test_verify_through_testinfra_podman_backend(tiny):
    project, name, _, _ = tiny
    (result,), stderr = envport(USER, "verify", name, "--target", "podman", project=project)
    assert result["verdict"] == "OK", result
    ids = {c["id"] for c in result["data"]["checks"]}
    assert {"pip[six==1.16.0]", "env[TINY_GREETING]", "label[envport.hash]"} <= ids, ids
    assert "(podman, network host)" in stderr
    left = as_user(USER, "podman", "ps", "-a", "--format", "{{.Names}}", cwd=project)
    assert f"envport-verify-{name}-" not in left.stdout  # the verify container is removed


def test_witnesses_by_podman_run(tiny):
    project, name, _, _ = tiny
    results, _ = envport(USER, "witness", name, "--target", "podman", project=project)
    assert results and all(r["verdict"] == "OK" for r in results), results
    assert {r["step"].split()[0] for r in results} >= {"import", "cli"}, results


def test_parity_probe_reads_the_same_freeze_as_docker(tiny, docker_client, base_image, throwaway_images):
    """The podman image and a docker build of the same spec and site: the same hash, the same probe output."""
    project, name, results, _ = tiny
    throwaway_images.append(name)   # the docker build's image (the podman one lives in the user's store)
    from envport.report import parity

    from .support import run_envport

    root_project = _root_copy(project)
    run_envport("build", name, "--target", "docker", "--site", "local", root=root_project, check=True)
    tag = results[-1]["data"]["image"]
    from envport.targets import registry

    rc, docker_text = registry.get("docker").probe(lambda argv, env=None: parity.run_probe(argv, stdin=parity.PROBE, env=env),
                                                   tag, parity.env_names(_loaded(root_project, name)))
    assert rc == 0, docker_text
    proc = as_user(USER, "python", "-c", PROBE_DRIVER, name, cwd=project, timeout=300)
    assert proc.returncode == 0, proc.stderr
    podman_out = json.loads(proc.stdout)
    assert podman_out["rc"] == 0, podman_out
    assert podman_out["text"] == docker_text


def test_parity_cli_podman_against_a_venv(tiny):
    """`envport parity NAME --target podman,venv` as the test user: both built (or present), probed, equal."""
    project, name, _, _ = tiny
    proc = as_user(USER, "envport", "parity", name, "--target", "podman,venv", "--no-ledger", cwd=project,
                   timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"OK parity {name}: 2 targets agree (podman, venv)" in proc.stdout, proc.stdout


def _root_copy(project: Path) -> Path:
    import tempfile

    dest = Path(tempfile.mkdtemp(prefix="envport-podman-parity-"))
    for d in ("specs", "sites", "images"):
        shutil.copytree(project / d, dest / d)
    return dest


def _loaded(root: Path, name: str):
    from envport.spec.loader import load_spec

    return load_spec(name, root)


@pytest.fixture(scope="module")
def demo_podman(user_venv, tmp_path_factory):
    """demo-cpu (torch on gloo) built rootless by the test user. Its wheelhouse is staged by root, as the
    docker tests stage it (the host's pip config that finds the torch wheel is root's), then handed over."""
    from .support import run_envport

    pw = _user(USER)
    staging = copy_project(tmp_path_factory.mktemp("podman-wheelhouse"))
    run_envport("wheelhouse", "demo-cpu", root=staging, check=True)
    project = Path(pw.pw_dir) / "envport-tests" / unique("demo")
    project.mkdir(parents=True)
    copy_project(project)
    shutil.copytree(staging / ".cache" / "wheelhouse", project / ".cache" / "wheelhouse")
    subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(project.parent)], check=True)
    try:
        envport(USER, "weights", "fetch", "demo-cpu", project=project, timeout=300)  # the spec's own source
        results, _ = envport(USER, "build", "demo-cpu", "--target", "podman", project=project, timeout=1800)
        assert results[-1]["verdict"] in ("OK", "present"), results
        yield project
    finally:
        shutil.rmtree(project, ignore_errors=True)


def test_demo_witnesses_with_collectives_at_world_2_by_podman_run(demo_podman):
    results, _ = envport(USER, "witness", "demo-cpu", "--target", "podman", project=demo_podman, timeout=1200)
    failed = [r for r in results if not proven(r)]
    assert results and not failed, failed
    steps = {r["step"]: r for r in results}
    assert "collectives (world 2)" in steps, sorted(steps)
    assert steps["collectives (world 2)"]["detail"].startswith("2 ranks on "), steps["collectives (world 2)"]


def test_matrix_lists_podman_runnable_for_the_user(tiny):
    """`envport matrix` (the CLI, as the test user) has a podman row from the registry, judged by its needs."""
    project, name, _, _ = tiny
    proc = as_user(USER, "envport", "matrix", "--env", name, "--target", "podman", "--json", cwd=project,
                   timeout=300)
    pairs = [p for p in json.loads(proc.stdout)["pairs"] if p["target"] == "podman"]
    assert len(pairs) == 1 and pairs[0]["runnable"] is True, proc.stdout + proc.stderr
    needs = {n["what"]: n for n in pairs[0]["needs"]}
    assert needs["podman engine"]["detail"].startswith("rootless, overlay storage "), needs
    assert needs["base image envport/debian-bookworm:base"]["ok"] is True


def test_single_uid_mode_is_refused_with_the_fix(user_venv, tmp_path):
    """Measured (docs/podman.md): with no /etc/subuid range podman maps one uid and cannot even store the
    Debian base image, so the build is REFUSED before anything is built, naming the usermod fix."""
    pw = _user(SINGLE_UID_USER)
    project = Path(pw.pw_dir) / "envport-tests" / unique("proj")
    project.mkdir(parents=True)
    try:
        copy_project(project)
        write_spec(project, "tinypm")
        subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(project.parent)], check=True)
        (result,), _ = envport(SINGLE_UID_USER, "build", "tinypm", "--target", "podman", project=project,
                               timeout=300, exit_code=3)
        matrix = as_user(SINGLE_UID_USER, "envport", "matrix", "--env", "tinypm", "--target", "podman", "--json",
                         cwd=project, timeout=300)
    finally:
        shutil.rmtree(project, ignore_errors=True)
    assert result["verdict"] == "REFUSED" and result["reason"] == "podman_single_uid", result
    assert f"usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {SINGLE_UID_USER}" in result["detail"]
    assert "podman system migrate" in result["detail"]
    (pair,) = [p for p in json.loads(matrix.stdout)["pairs"] if p["target"] == "podman"]
    assert pair["runnable"] is False and pair["why_not"].startswith("podman_single_uid: podman engine: "), pair


def _push_site(project: Path, ca: Path) -> str:
    """sites/pushreg.yaml: the local site plus the CI registry's CA (registry_ca reaches no recipe: same hash)."""
    pw = _user(USER)
    shutil.copyfile(ca, project / "registry-ca.crt")
    text = (project / "sites" / "local.yaml").read_text().replace("name: local", "name: pushreg", 1)
    (project / "sites" / "pushreg.yaml").write_text(text + f"\nregistry_ca: {project / 'registry-ca.crt'}\n")
    for path in (project / "registry-ca.crt", project / "sites" / "pushreg.yaml"):
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return "pushreg"


def test_push_through_the_podman_target_to_the_ci_registry(tiny, registry):
    """`envport push NAME --target podman` (rootless) to the CI registry over TLS: the manifest is there under
    the hash12 tag. Before, `--target podman` was an argparse error (exit 2)."""
    project, name, results, _ = tiny
    site = _push_site(project, registry.ca)
    repo = f"envport/{unique('pm')}"
    (step,), _ = envport(USER, "push", name, "--target", "podman", "--site", site, "--to", registry.url(repo),
                         project=project)
    hash12 = results[-1]["data"]["image"].rsplit(":", 1)[1]
    assert step["verdict"] == "OK" and hash12 in step["detail"], step
    assert step["data"]["manifest_digest"].startswith("sha256:"), step
    status, _, body = registry.get(f"/v2/{repo}/manifests/{hash12}",
                                   accept="application/vnd.oci.image.manifest.v1+json,"
                                          "application/vnd.docker.distribution.manifest.v2+json")
    assert status == 200, body[:300]
    for pushed in step["data"]["pushed"]:
        as_user(USER, "podman", "rmi", pushed, cwd=project, timeout=120)


def test_sbom_through_the_podman_target(tiny):
    """`envport sbom NAME --target podman`: the image's export streamed rootless and only the files the SBOM
    reads written (docker's streamed route, engines/docker.py export_files); its packages listed, and the same
    SBOM as the whole exported filesystem gives (the route it replaced, run here as the same user)."""
    project, name, results, _ = tiny
    out = project / "sbom.cdx.json"
    proc = as_user(USER, "envport", "sbom", name, "--target", "podman", "-o", str(out), cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bom = json.loads(out.read_text())
    names = {c["name"] for c in bom["components"]}
    assert "six" in names, sorted(names)[:20]
    props = {p["name"]: p["value"] for p in bom["metadata"]["properties"]}
    assert props["envport:target"] == "podman" and props["envport:hash"][:12] == \
        results[-1]["data"]["image"].rsplit(":", 1)[1]
    whole = as_user(USER, "python", "-c", WHOLE_EXPORT_SBOM, results[-1]["data"]["image"], str(out), cwd=project)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert json.loads(whole.stdout) == bom


def test_parity_as_root_skips_a_podman_that_answers_but_cannot_start(tmp_path):
    """Issue 36 item 7: an engine is judged by starting a container, not by its binary answering. As root in a
    container whose limits rootful podman cannot raise, `podman info` answers and every `podman run` fails
    (runc: "error setting rlimit type 7"): parity skips podman with that reason and judges the rest, instead of
    failing whole on podman's build; the matrix lists the pair as not runnable here, for the same reason.
    Runs as root (this test's own process); rootless podman on the same host is the other tests' user."""
    from envport.engines import podman

    from .support import as_json, run_envport

    if shutil.which("podman") is None:
        missing("podman not installed (.ci/install.sh installs podman)")
    if os.geteuid() != 0:
        pytest.skip("judges rootful podman: run as root")
    why = podman.cannot_start(podman.podman(), tuple(sorted(podman.cli_env().items())))
    if not why:
        pytest.skip("rootful podman starts containers on this host: no engine that answers but cannot start")
    project = copy_project(tmp_path / "project")
    name = unique("tinyroot")
    write_spec(project, name, witnesses={"imports": ["six"]})
    proc = run_envport("parity", name, "--target", "podman,venv", "--no-ledger", root=project, timeout=600)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]  # one target left: nothing to compare
    row = next(ln for ln in proc.stdout.splitlines() if ln.split()[:2] == ["skipped", "podman"])
    assert "podman_cannot_start" in row and why[:60] in row, row
    assert "fewer than two targets could run here (venv)" in proc.stdout
    pairs = as_json(run_envport("matrix", "--env", name, "--target", "podman", "--json", root=project))["pairs"]
    (pair,) = pairs
    assert not pair["runnable"] and pair["why_not"].startswith("podman_cannot_start: "), pair
