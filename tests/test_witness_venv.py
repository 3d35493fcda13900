"""The interpreter with torch that the witness tests run (tests/support.py `torch_python`) is the pinned one.

Witness tests need a real torch: this interpreter when it has torch==2.13.0,
else a venv under .cache/witness-venv (gitignored) created once with
`python -m venv` + `pip install torch==2.13.0`, which takes the CPU wheel from
local disk (~30 s). Never an unpinned torch: a resolver would pull a CUDA build.
"""

from __future__ import annotations

from .support import TORCH_PIN, torch_python, torch_version


def test_witness_interpreter_has_the_pinned_cpu_torch():
    python = torch_python()
    version = torch_version(python)
    assert version is not None and version.split("+")[0] == TORCH_PIN
