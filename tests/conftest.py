"""Fixture registration: real services (docker, slurm, sshd) from tests/services.py, and every shared
fixture from tests/fixtures.py.  Plain helpers and constants live in tests/support.py.

The service markers (docker, slurm, ssh, registry) are derived here from the fixtures a test uses, so
`-m "not docker"` never reaches the engine: hand-written markers drifted from the fixtures
(11 tests once reached a service their markers did not name).  A hand-written service marker on
a test that does not use the service's fixture is a collection error, for the same reason.
"""

import os
import tempfile

import pytest

pytest_plugins = ["tests.services", "tests.fixtures"]

# The xdist worker this process is ("gw0", "gw1"), or "" when pytest runs alone (`-n 0`).
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _throwaway_dir(var: str, prefix: str) -> None:
    """VAR names a fresh folder of this process's own, unless the user set it.  A worker inherits the
    controller's environment: a folder the controller made is not the user's, and two workers sharing
    one would read each other's ledgers and weights."""
    made = f"_ENVPORT_TEST_MADE_{var}"
    if var in os.environ and os.environ.get(made) != os.environ[var]:
        return  # the user's
    if var in os.environ and not WORKER:
        return  # this process made it
    os.environ[var] = os.environ[made] = tempfile.mkdtemp(prefix=f"{prefix}{WORKER + '-' if WORKER else ''}")


# Ledgers go to the user's state dir (report/ledger.py); the tests' runs go to a throwaway one,
# inherited by every `envport` subprocess, so a test run leaves nothing in ~/.local/state.
_throwaway_dir("ENVPORT_STATE_DIR", "envport-test-state-")
# demo-cpu pins a weight: every `envport` run of the tests reads it from one throwaway weights root,
# fetched once per session by the spec's own source command (the `demo_weights` fixture).
_throwaway_dir("ENVPORT_WEIGHTS_DIR", "envport-test-weights-")



def pytest_addoption(parser):
    parser.addoption("--deep", action="store_true", default=False,
                     help="property tests draw their deep example counts, not CI's (tests/README.md 'Time budget')")


def pytest_configure(config):
    # In the environment, not only on `config`: xdist workers and `envport` subprocesses inherit it.
    from .support import DEEP_ENV

    if config.getoption("--deep"):
        os.environ[DEEP_ENV] = "1"


def pytest_report_header(config):
    from .support import deep

    return f"property tests: {'--deep' if deep() else 'CI'} example counts (tests/README.md 'Time budget')"


# marker -> the session fixture through which every test reaches that service
# (demo_image, base_image, throwaway_images use docker_client; ssh_venv uses ssh_host).
SERVICE_FIXTURES = {"docker": "docker_client", "slurm": "slurm", "ssh": "ssh_host", "registry": "registry"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    wrong = []
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        reaches = False
        for marker, fixture in SERVICE_FIXTURES.items():
            if fixture in uses:
                item.add_marker(marker)
                reaches = True
            elif item.get_closest_marker(marker) is not None:
                wrong.append(f"{item.nodeid}: marked {marker} but uses no {fixture} fixture")
        item.add_marker(pytest.mark.xdist_group(_xdist_group(item, reaches)))
    if wrong:
        raise pytest.UsageError("service markers that match no fixture (drop the marker, or reach the "
                                "service through its fixture):\n  " + "\n  ".join(wrong))


def _xdist_group(item, reaches_a_service: bool) -> str:
    """The group `--dist loadgroup` runs on one worker, in order (tests/README.md "Two workers").

    Every test that reaches a service (docker, slurm, sshd, registry) is in one group: they share one
    engine and its images, one Slurm, one sshd, and the session's demo image and SIF, which a second
    worker would build again.  Every other test runs with the rest of its file: a module fixture
    (gpu-check's prepared tree, podman's user venv) is made once, and a file's tests keep their order."""
    return "services" if reaches_a_service else item.path.stem


@pytest.fixture(scope="session", autouse=True)
def demo_weights():
    """demo-cpu's pinned weight under ENVPORT_WEIGHTS_DIR (0.1 s: a seeded 4 KiB file), before any test runs."""
    from envport.builders.weights import fetch, weights_root
    from envport.spec.loader import load_spec

    from .support import ENV_NAME, REPO

    result = fetch(load_spec(ENV_NAME, REPO), weights_root())
    assert result.verdict.ok, result.line() + "\n" + "\n".join(result.lines)
    return weights_root()
