"""Fixture registration: real services (docker, slurm, sshd) from tests/services.py, and every shared
fixture from tests/fixtures.py.  Plain helpers and constants live in tests/support.py."""

pytest_plugins = ["tests.services", "tests.fixtures"]
