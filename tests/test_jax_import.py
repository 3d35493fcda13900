"""Import (issue 42): a recipe that installs jax or jaxlib gets the JAX kernel witness in its spec; one that
does not gets none.  The real `envport import`, on a requirements file and a Dockerfile."""

from __future__ import annotations

import yaml

from .support import cli_env, fail_with, run_envport


def _imported(project, name: str, source: str, text: str) -> dict:
    (project / source).write_text(text)
    proc = run_envport("import", source, "--name", name, "--base", "debian:bookworm-slim", "--python", "3.11",
                       "--force", root=project, env=cli_env(), timeout=120)
    assert proc.returncode in (0, 3), fail_with(proc, f"envport import {source}")
    spec = yaml.safe_load((project / "specs" / f"{name}.yaml").read_text())
    return spec, proc.stdout + proc.stderr


def test_a_recipe_installing_jax_gets_the_jax_kernel_witness(project):
    spec, said = _imported(project, "jaxreq", "requirements.txt", "jax==0.4.38\njaxlib==0.4.38\n")
    assert spec["witnesses"]["kernel"] == ["jax"] and spec["witnesses"]["imports"] == ["jax", "jaxlib"]
    assert "turned into witnesses.kernel: jax, jaxlib" in said
    proc = run_envport("validate", "jaxreq", root=project, env=cli_env(), timeout=120)
    assert proc.returncode == 0, fail_with(proc, "envport validate jaxreq")


def test_a_dockerfile_installing_jax_with_its_cuda_extra_gets_it_too(project):
    spec, _ = _imported(project, "jaxdf", "Dockerfile",
                        "FROM debian:bookworm-slim\nRUN pip install 'jax[cuda12]==0.4.38' six==1.16.0\n")
    assert spec["witnesses"]["kernel"] == ["jax"]


def test_a_recipe_without_jax_gets_no_kernel_witness(project):
    spec, said = _imported(project, "plain", "requirements.txt", "six==1.16.0\n")
    assert "kernel" not in spec["witnesses"] and "witnesses.kernel" not in said
