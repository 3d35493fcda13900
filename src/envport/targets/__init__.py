"""Targets: one module per backend (docker, apptainer, venv, conda), each one `Target`, found through one registry.

Every command asks a backend the same questions through `base.Target`: its
name and recipe kind, `needs()` (what the host must have; the matrix and
preflight read it), `present()`, `build()`, `verify()` (the testinfra
connection), `launcher()` (the witness launcher), `probe()` (parity's freeze,
python and env), `slurm_wrap()` where it has one, `artefacts()` and `remove()`
(what its builds of any hash left on this host, for `envport gc`; targets/gc.py
has what the image targets share). What a backend cannot do
is declared, with the reason, in its `unsupported` table: the operation then
raises `base.Unsupported`, and the command says why (`witness --target conda`
is REFUSED [unsupported] naming the reason) instead of not existing.

SSH is not a target: it is a host option of the host targets (venv, conda:
`hosts = True`), and the matrix/parity row of a venv on the site's SSH hosts
(`ssh_row`).

Adding a backend (podman, enroot, a cloud builder):

1. Write `targets/<name>.py` defining `TARGET`, an instance of a `Target`
   subclass with `name`, `recipe` (the renderer kind: docker, apptainer or
   shell), `summary` (one line for the docs' table), `unsupported`
   ({operation: reason} for what it cannot do) and the methods of the
   operations it can do. Import heavy modules inside the methods: `envport
   --help` imports every target module to list the `--target` choices.
2. Add its name to `NAMES` in `targets/registry.py` (the one registry line).

Nothing outside this package lists target names or branches on one
(tests/test_targets_registry.py reads the AST and the import graph for it).
"""
