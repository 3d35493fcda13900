"""Session fixtures that hand tests the REAL services this machine can run.

Registered from tests/conftest.py (``pytest_plugins``, with tests/fixtures.py).

Each fixture checks that its service answers. When it does not, the fixture
skips with the reason (never a silent pass); with ``ENVPORT_START_SERVICES=1``
it first starts the service with the matching ``.ci/services/*.sh`` script, and
a start that fails is a test error with the script's output, not a skip.

In CI (``ENVPORT_REQUIRE_SERVICES=1``, which ``.ci/run`` sets, or ``CI=true``)
a missing service is a test ERROR naming the service, never a skip: a green CI
must mean the docker, Slurm and SSH tests ran. See tests/README.md.

Fixtures (all session-scoped):

- ``docker_client`` -> ``docker.DockerClient`` talking to a live engine.
- ``base_image`` -> ``str``: the tag of the Debian bookworm base image
  (``envport/debian-bookworm:base``, or ``$ENVPORT_BASE_IMAGE``), built by
  ``.ci/services/base-image.sh`` if missing.
- ``slurm`` -> ``SlurmNode``: the one-node Slurm cluster (node name, state, CPUs).
- ``slurm_multi`` -> ``SlurmMulti``: the two-node cluster of ``.ci/services/slurm-multi.sh``
  (each slurmd in its own network namespace; its own slurm.conf).
- ``ssh_host`` -> ``SshHost``: the test sshd on 127.0.0.1:2222 (alias,
  ssh_config path, testinfra URL ``ssh://envport-test``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from .support import REPO, missing

SERVICES_DIR = REPO / ".ci" / "services"
BASE_IMAGE_TAG = os.environ.get("ENVPORT_BASE_IMAGE", "envport/debian-bookworm:base")
SSH_DIR = Path(os.environ.get("ENVPORT_SSH_DIR", "/var/lib/envport-ssh"))
SSH_ALIAS = "envport-test"
# "Slurm is up" has one definition, shared with .ci/services/slurm.sh.
SLURM_UP = SERVICES_DIR / "slurm-up.sh"

# Limits for the start scripts; each script also bounds its own waits.
START_TIMEOUT_S = {"dockerd.sh": 120, "slurm.sh": 120, "slurm-multi.sh": 120, "sshd.sh": 60,
                   "base-image.sh": 1200}
# The multi-node cluster's slurm.conf (slurm/clusters/multi.yaml names the same file); .ci/run points it
# away with ENVPORT_CI_WITHOUT=slurm-multi.
SLURM_MULTI_CONF = os.environ.get("ENVPORT_SLURM_MULTI_CONF", "/etc/slurm-multi/slurm.conf")
SLURM_MULTI_NODES = ("node1", "node2")


@dataclass(frozen=True)
class SlurmNode:
    """The one-node cluster `.ci/services/slurm.sh` runs on localhost."""

    name: str  # node name, `hostname -s`; what `srun hostname` prints, short form
    state: str  # sinfo %t at session start: one of slurm-up.sh's UP_STATES
    cpus: int  # CPUs slurm.conf gives the node (= nproc)


@dataclass(frozen=True)
class SlurmMulti:
    """The two-node cluster `.ci/services/slurm-multi.sh` runs: slurmd `node<i>` in netns `envport-node<i>`."""

    conf: str  # its slurm.conf: SLURM_CONF for every Slurm command aimed at it
    nodes: tuple[str, ...]  # node1, node2
    state_dir: Path  # slurmd pid files: STATE_DIR/<node>/slurmd.pid

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.conf, **extra}

    def slurmd_pid_file(self, node: str) -> Path:
        return self.state_dir / node / "slurmd.pid"


@dataclass(frozen=True)
class SshHost:
    """The test sshd; every client option lives in ``ssh_config``."""

    alias: str  # Host alias in ssh_config: envport-test
    ssh_config: Path  # /var/lib/envport-ssh/ssh_config
    url: str  # testinfra host URL: ssh://envport-test

    def argv(self, *command: str) -> list[str]:
        """`ssh` argv running COMMAND (one remote shell line) on this host."""
        return ["ssh", "-F", str(self.ssh_config), self.alias, *command]

    @property
    def testinfra_kwargs(self) -> dict[str, str]:
        """``testinfra.get_host(h.url, **h.testinfra_kwargs)``; testinfra drops
        --ssh-extra-args, so the config file carries everything."""
        return {"ssh_config": str(self.ssh_config)}


def _which_sbin(name: str) -> str | None:
    """Daemons live in /usr/sbin, which a non-login PATH may lack."""
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/local/sbin:/usr/sbin:/sbin")


def start_requested() -> bool:
    return os.environ.get("ENVPORT_START_SERVICES") == "1"


def run_service_script(script: str, *args: str) -> tuple[bool, str]:
    """Run .ci/services/SCRIPT; return (succeeded, the tail of its output)."""
    path = SERVICES_DIR / script
    try:
        proc = subprocess.run(
            ["bash", str(path), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=START_TIMEOUT_S[script],
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        return False, f"{script} ran past {START_TIMEOUT_S[script]}s\n{out[-3000:]}"
    return proc.returncode == 0, proc.stdout[-3000:]


def _start_or_fail(script: str, *args: str) -> None:
    ok, out = run_service_script(script, *args)
    if not ok:
        pytest.fail(f"ENVPORT_START_SERVICES=1 but .ci/services/{script} failed:\n{out}", pytrace=False)


def _not_up(what: str, why: str, script: str) -> str:
    return f"{what}: {why} (start it with .ci/services/{script} or set ENVPORT_START_SERVICES=1)"


# --- docker ------------------------------------------------------------------


def _docker_connect():
    """(client, None) when an engine answers, else (None, why)."""
    import docker

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:  # DockerException, requests errors, socket errors
        return None, f"{type(exc).__name__}: {exc}"
    return client, None


@pytest.fixture(scope="session")
def docker_client():
    """A ``docker.DockerClient`` whose engine answered a ping."""
    try:
        import docker  # noqa: F401
    except ImportError as exc:
        missing(f"docker SDK not importable ({exc}); pip install -e '.[test]'")
    client, why = _docker_connect()
    if client is None:
        if not _which_sbin("dockerd"):
            missing(f"no docker engine answers ({why}) and dockerd is not installed (apt-get install docker.io)")
        if not start_requested():
            missing(_not_up("docker engine", f"no answer ({why})", "dockerd.sh"))
        _start_or_fail("dockerd.sh")
        client, why = _docker_connect()
        if client is None:
            pytest.fail(f"dockerd.sh succeeded but the docker SDK still gets no answer: {why}", pytrace=False)
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    """Tag of the Debian bookworm base image, present in the engine."""
    import docker

    try:
        docker_client.images.get(BASE_IMAGE_TAG)
        return BASE_IMAGE_TAG
    except docker.errors.ImageNotFound:
        pass
    ok, out = run_service_script("base-image.sh", BASE_IMAGE_TAG)
    if not ok:
        if not shutil.which("debootstrap"):
            missing(f"base image {BASE_IMAGE_TAG} absent and cannot be built (no debootstrap): "
                    f"{out.strip().splitlines()[-1:]}")
        pytest.fail(f".ci/services/base-image.sh {BASE_IMAGE_TAG} failed:\n{out}", pytrace=False)
    return BASE_IMAGE_TAG


# --- slurm -------------------------------------------------------------------


def _slurm_node() -> tuple[SlurmNode | None, str]:
    """(node, "") when .ci/services/slurm-up.sh says a node is up, else (None, why)."""
    try:
        proc = subprocess.run(["bash", str(SLURM_UP)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, f"{SLURM_UP.name} gave no answer in 60s"
    if proc.returncode != 0:
        return None, proc.stderr.strip() or f"{SLURM_UP.name} exited {proc.returncode}"
    name, state, cpus = proc.stdout.split()
    return SlurmNode(name=name, state=state, cpus=int(cpus)), ""


@pytest.fixture(scope="session")
def slurm() -> SlurmNode:
    """The local one-node cluster, with a node that is up (.ci/services/slurm-up.sh)."""
    if not shutil.which("sinfo") or not _which_sbin("slurmctld"):
        missing("Slurm is not installed (apt-get install slurm-wlm munge)")
    node, why = _slurm_node()
    if node is None:
        if not start_requested():
            missing(_not_up("slurm", why, "slurm.sh"))
        _start_or_fail("slurm.sh")
        node, why = _slurm_node()
        if node is None:
            pytest.fail(f"slurm.sh succeeded but {why}", pytrace=False)
    return node


def _slurm_multi_up() -> str:
    """Empty when every node of the multi-node cluster is up (slurm-up.sh, node by node), else why not."""
    env = {**os.environ, "SLURM_CONF": SLURM_MULTI_CONF}
    for node in SLURM_MULTI_NODES:
        try:
            proc = subprocess.run(["bash", str(SLURM_UP), node], capture_output=True, text=True, timeout=60, env=env)
        except subprocess.TimeoutExpired:
            return f"{SLURM_UP.name} {node} gave no answer in 60s"
        if proc.returncode != 0:
            return f"{node}: " + (proc.stderr.strip() or f"{SLURM_UP.name} exited {proc.returncode}")
    return ""


@pytest.fixture(scope="session")
def slurm_multi(slurm) -> SlurmMulti:
    """The two-node cluster in network namespaces, every node up (it shares the one-node cluster's munged)."""
    if not shutil.which("ip") or not shutil.which("nsenter"):
        missing("no ip/nsenter for the multi-node cluster's network namespaces (apt-get install iproute2 util-linux)")
    why = _slurm_multi_up()
    if why:
        if not start_requested():
            missing(_not_up("multi-node slurm", why, "slurm-multi.sh"))
        _start_or_fail("slurm-multi.sh")
        why = _slurm_multi_up()
        if why:
            pytest.fail(f"slurm-multi.sh succeeded but {why}", pytrace=False)
    return SlurmMulti(conf=SLURM_MULTI_CONF, nodes=SLURM_MULTI_NODES,
                      state_dir=Path(os.environ.get("ENVPORT_SLURM_MULTI_DIR", "/var/lib/envport-slurm-multi")))


# --- ssh ---------------------------------------------------------------------


def _ssh_works(host: SshHost) -> tuple[bool, str]:
    if not host.ssh_config.is_file():
        return False, f"{host.ssh_config} does not exist"
    try:
        proc = subprocess.run(host.argv("true"), capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return False, "ssh gave no answer in 30s"
    if proc.returncode != 0:
        return False, f"ssh exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
    return True, ""


@pytest.fixture(scope="session")
def ssh_host() -> SshHost:
    """The test sshd on 127.0.0.1:2222, reachable as ``ssh -F CONFIG envport-test``."""
    if not shutil.which("ssh"):
        missing("no ssh client (apt-get install openssh-client)")
    host = SshHost(alias=SSH_ALIAS, ssh_config=SSH_DIR / "ssh_config", url=f"ssh://{SSH_ALIAS}")
    ok, why = _ssh_works(host)
    if not ok:
        if not _which_sbin("sshd"):
            missing(f"test sshd not reachable ({why}) and openssh-server is not installed")
        if not start_requested():
            missing(_not_up("test sshd", why, "sshd.sh"))
        _start_or_fail("sshd.sh")
        ok, why = _ssh_works(host)
        if not ok:
            pytest.fail(f"sshd.sh succeeded but {why}", pytrace=False)
    return host
