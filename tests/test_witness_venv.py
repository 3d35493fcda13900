"""The interpreter with torch that the witness tests run (tests/support.py `torch_python`) is the pinned one.

Witness tests need a real torch, from one place: the CPU wheel torch==2.13.0 in
TORCH_WHEELS (tests/support.py says where it is looked for), installed once into a venv
under .cache/witness-venv (gitignored), or this interpreter when it already has
it. Never an unpinned torch: a resolver would pull a CUDA build. Failing to get
it skips with the reason locally and fails in CI.
"""

from __future__ import annotations

import pytest

from .support import TORCH_PIN, TORCH_WHEELS, missing, torch_python, torch_version, torch_wheel


def test_witness_interpreter_has_the_pinned_cpu_torch():
    python = torch_python()
    version = torch_version(python)
    assert version == f"{TORCH_PIN}+cpu", f"{python} has torch {version}, expected the CPU wheel {TORCH_PIN}+cpu"
    wheel = torch_wheel()
    assert wheel is not None and wheel.parent == TORCH_WHEELS, f"no torch-{TORCH_PIN}+cpu wheel in {TORCH_WHEELS}"


@pytest.mark.parametrize("env,outcome", [({"ENVPORT_REQUIRE_SERVICES": "1"}, pytest.fail.Exception),
                                         ({"CI": "true"}, pytest.fail.Exception),
                                         ({}, pytest.skip.Exception)])
def test_something_missing_fails_in_ci_and_skips_elsewhere(monkeypatch, env, outcome):
    monkeypatch.delenv("ENVPORT_REQUIRE_SERVICES", raising=False)
    monkeypatch.delenv("CI", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(outcome) as exc:
        missing("no torch wheel in /nowhere")
    assert "no torch wheel in /nowhere" in str(exc.value)
