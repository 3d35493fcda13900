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

# Ledgers go to the user's state dir (report/ledger.py); the tests' runs go to a throwaway one,
# inherited by every `envport` subprocess, so a test run leaves nothing in ~/.local/state.
os.environ.setdefault("ENVPORT_STATE_DIR", tempfile.mkdtemp(prefix="envport-test-state-"))
# demo-cpu pins a weight: every `envport` run of the tests reads it from one throwaway weights root,
# fetched once per session by the spec's own source command (the `demo_weights` fixture).
os.environ.setdefault("ENVPORT_WEIGHTS_DIR", tempfile.mkdtemp(prefix="envport-test-weights-"))



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
        for marker, fixture in SERVICE_FIXTURES.items():
            if fixture in uses:
                item.add_marker(marker)
            elif item.get_closest_marker(marker) is not None:
                wrong.append(f"{item.nodeid}: marked {marker} but uses no {fixture} fixture")
    if wrong:
        raise pytest.UsageError("service markers that match no fixture (drop the marker, or reach the "
                                "service through its fixture):\n  " + "\n  ".join(wrong))


@pytest.fixture(scope="session", autouse=True)
def demo_weights():
    """demo-cpu's pinned weight under ENVPORT_WEIGHTS_DIR (0.1 s: a seeded 4 KiB file), before any test runs."""
    from envport.builders.weights import fetch, weights_root
    from envport.spec.loader import load_spec

    from .support import ENV_NAME, REPO

    result = fetch(load_spec(ENV_NAME, REPO), weights_root())
    assert result.verdict.ok, result.line() + "\n" + "\n".join(result.lines)
    return weights_root()
