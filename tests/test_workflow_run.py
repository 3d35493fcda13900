"""The generated workflow's `run:` steps for one pair, in order, on a stand-in for GitHub's Ubuntu runner
(issue 27 row 4): no GitHub here, so the runner is a fresh docker container.

What it keeps of the real runner: a non-root user (`runner`) with password-less sudo whose `secure_path` is
the Ubuntu images' own, and a python set up the way actions/setup-python sets it up (under
/opt/hostedtoolcache/Python/<version>/x64, owned by the runner user, its bin/ first on PATH, `pythonLocation`
set) and no other python of that version on the system PATH. What it replaces, and says so: `actions/checkout` is a copy of
the project, setup-python the tree above, PyPI a find-links folder of the wheels `pip download` fetched on
this host (PIP_NO_INDEX/PIP_FIND_LINKS, as a runner's pip config could), `upload-artifact` is left out (it
uploads, it runs nothing). Each `run:` runs as GitHub runs it: `bash --noprofile --norc -eo pipefail`, with
the job's and step's `env:`, and `$GITHUB_PATH` lines put on PATH for the steps after. An `if:` or a `${{ }}`
this test cannot evaluate fails it, so a template change cannot skip a step here unseen.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys

import yaml

from .support import copy_tracked, missing, run_envport, unique, write_spec

WORKFLOW = ".github/workflows/envs.yml"
RUNNER_BASE = "envport/debian-bookworm:base"
# GitHub's Ubuntu images (runner-images: images/ubuntu/scripts/build/configure-environment.sh keeps
# Ubuntu's default /etc/sudoers line).
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/snap/bin"
TOOLCACHE = "/opt/hostedtoolcache/Python/3.11.2/x64"
WORKSPACE = "/home/runner/work/project"

# A python under the tool cache, off secure_path, the way setup-python leaves one: Debian's python3.11 binary
# moved there (its stdlib stays where its build looks), the interpreter on PATH a `venv --copies` of it
# (bin/ holds python, pip and what pip installs), and no python3.11 left on the system PATH.
RUNNER_DOCKERFILE = f"""FROM {RUNNER_BASE}
RUN apt-get update && apt-get install -y --no-install-recommends sudo python3-venv ca-certificates \\
 && rm -rf /var/lib/apt/lists/*
RUN mkdir -p {TOOLCACHE}/../real/bin && cp /usr/bin/python3.11 {TOOLCACHE}/../real/bin/python3.11 \\
 && rm -f /usr/bin/python3.11 /usr/bin/python3 /usr/bin/python \\
 && {TOOLCACHE}/../real/bin/python3.11 -m venv --copies {TOOLCACHE} && {TOOLCACHE}/bin/python -m pip --version
RUN useradd -m -u 1001 runner && chown -R runner: /opt/hostedtoolcache \\
 && echo 'runner ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/runner \\
 && echo 'Defaults secure_path="{SECURE_PATH}"' > /etc/sudoers.d/secure_path \\
 && chmod 0440 /etc/sudoers.d/*
"""

_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def _value(expr: str, ctx: dict) -> str:
    if expr in ctx:
        return ctx[expr]
    raise AssertionError(f"this test cannot evaluate the workflow expression ${{{{ {expr} }}}}: teach it")


def _subst(text: str, ctx: dict) -> str:
    return _EXPR.sub(lambda m: _value(m[1], ctx), text)


def _runs(cond: str | None, ctx: dict) -> bool:
    """The `if:` forms the workflow uses; any other fails the test."""
    if cond is None or cond == "always()":
        return True
    if "&&" in cond:
        return all(_runs(term.strip(), ctx) for term in cond.split("&&"))
    m = re.fullmatch(r"(matrix\.[\w-]+)\s*(==|!=)\s*'([^']*)'", cond)
    if m:
        return (_value(m[1], ctx) == m[3]) == (m[2] == "==")
    m = re.fullmatch(r"matrix\.[\w-]+", cond)
    if m:
        return _value(cond, ctx) not in ("", "false")
    raise AssertionError(f"this test cannot evaluate `if: {cond}`: teach it")


def _runner_image() -> str:
    tag = "envport-test/gh-runner:" + hashlib.sha256(RUNNER_DOCKERFILE.encode()).hexdigest()[:12]
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0:
        # Host networking: containers here reach Debian's mirror only through the host's network.
        proc = subprocess.run(["docker", "build", "--network", "host", "-t", tag, "-"], input=RUNNER_DOCKERFILE,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tag


def _script(workflow: dict, row: dict) -> tuple[str, list[str]]:
    """The job as one bash script for the runner user, and the names of the steps it runs."""
    job = workflow["jobs"]["up"]
    ctx = {f"matrix.{k}": ("true" if v is True else "false" if v is False else str(v)) for k, v in row.items()}
    ctx["github.workspace"] = WORKSPACE
    job_env = {k: _subst(str(v), ctx) for k, v in (job.get("env") or {}).items()}
    out = ["set -eu", f"export GITHUB_WORKSPACE={WORKSPACE} GITHUB_PATH=/tmp/github_path",
           f"export pythonLocation={TOOLCACHE} PATH={TOOLCACHE}/bin:$PATH", ": > /tmp/github_path",
           *(f"export {k}={shlex.quote(v)}" for k, v in job_env.items()), "mkdir -p /tmp/steps"]
    names = []
    for i, step in enumerate(job["steps"]):
        uses = step.get("uses", "")
        if uses.startswith("actions/checkout@"):
            out += [f"cp -a /src/. {WORKSPACE}/"]
            names.append("checkout (a copy)")
            continue
        if uses.startswith(("actions/setup-python@", "actions/upload-artifact@")):
            names.append(f"{uses} (stood in for, see the module doc)")
            continue
        assert "run" in step, f"step {i} uses {uses!r}, which this test cannot stand in for"
        if not _runs(step.get("if"), ctx):
            continue
        names.append(step.get("name", f"step {i}"))
        env = " ".join(f"{k}={shlex.quote(_subst(str(v), ctx))}" for k, v in (step.get("env") or {}).items())
        out += [f"cat > /tmp/steps/{i}.sh <<'ENVPORT_STEP_EOF'", _subst(step["run"], ctx).rstrip("\n"),
                "ENVPORT_STEP_EOF",
                f"echo '::step:: {names[-1]}'",
                f"(cd {WORKSPACE} && PATH=\"$(tac /tmp/github_path | tr '\\n' :)$PATH\" {env} "
                f"bash --noprofile --norc -eo pipefail /tmp/steps/{i}.sh) "
                f"|| {{ echo \"::failed:: {names[-1]}\"; cp -r {WORKSPACE}/reports/. /out/ 2>/dev/null; exit 1; }}"]
    out += [f"cp -r {WORKSPACE}/reports/. /out/"]
    return "\n".join(out) + "\n", names


def test_the_generated_workflow_runs_one_venv_pair_as_a_non_root_runner(tmp_path_factory):
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode:
        missing("docker engine not reachable (the runner stand-in is a container)")
    # The whole checkout (git's tracked files), as actions/checkout gives the job.
    project = copy_tracked(tmp_path_factory.mktemp("checkout"))
    name = unique("ghrun")
    write_spec(project, name, witnesses={"imports": ["six"]})
    # The user commits what these write: the workflow with the new spec's jobs, and its images/.
    wrote = run_envport("matrix", "--format", "github", root=project, timeout=300)
    assert wrote.returncode in (0, 3), wrote.stdout + wrote.stderr  # 3: pairs left out, each named
    assert f"REFUSED  {name}-venv " not in wrote.stdout, wrote.stdout
    run_envport("render", "--all", root=project, timeout=300, check=True)
    workflow = yaml.safe_load((project / WORKFLOW).read_text())
    row = next(r for r in workflow["jobs"]["up"]["strategy"]["matrix"]["include"] if r["pair"] == f"{name}-venv")
    assert row["runner"] == ["ubuntu-24.04"]
    script, names = _script(workflow, row)
    assert names[2:-1] == ["Install envport", "Render check (images/ and this workflow match the specs)",
                           "envport up"], names

    tmp_path = tmp_path_factory.mktemp("runner")  # beside the project: /src is the project alone
    wheels = tmp_path / "wheels"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), f"envport[build] @ {project.as_uri()}",
                           "six==1.16.0", "setuptools>=68", "wheel"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for readable in (project, wheels):  # the runner user (uid 1001) reads them; pytest's tmp dirs are 0700
        readable.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    (tmp_path / "job.sh").write_text(script)
    image = _runner_image()
    argv = ["docker", "run", "--rm", "--network", "host", "--user", "runner",
            "-v", f"{project}:/src:ro", "-v", f"{wheels}:/wheels:ro", "-v", f"{out}:/out",
            "-v", f"{tmp_path / 'job.sh'}:/job.sh:ro",
            "-e", "PIP_NO_INDEX=1", "-e", "PIP_FIND_LINKS=/wheels", "-e", "PIP_DISABLE_PIP_VERSION_CHECK=1",
            image, "bash", "-c", f"mkdir -p {WORKSPACE} && bash /job.sh"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    log = proc.stdout[-6000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, log
    up = json.loads((out / f"up-{name}-venv.json").read_text())
    assert up["exit_code"] == 0, json.dumps(up["steps"], indent=1)[-4000:]
    assert [s["step"] for s in up["steps"]] == ["preflight", "build", "weights", "verify", "witness"], up["steps"]
    assert all(s["verdict"] in ("OK", "present", "skipped") for s in up["steps"]), up["steps"]
    assert up["steps"][1]["verdict"] == "OK", up["steps"]  # built there, by the runner user
