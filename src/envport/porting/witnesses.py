"""The witnesses an imported spec carries: one `import` per distribution its pip phases name, and the
JAX kernel witness where the recipe installs jax or jaxlib.

A recipe says what it installs, not how to tell that it worked; without a
witness `envport witness` has nothing to check and says SKIPPED, so an
imported env could never be shown to work unedited.  The module a
distribution installs comes from a maintained table (module_names.yaml,
data with its source and rules) or, for the rest, from the distribution's
name; a wrong guess fails the witness naming the module, it never passes.
"""

from __future__ import annotations

import functools

import yaml

from envport.porting.report import Draft, turned_into

NAMES_FILE = "module_names.yaml"


@functools.lru_cache(maxsize=1)
def table() -> dict:
    """porting/module_names.yaml: distribution -> module (None: nothing to import), and the skip list."""
    from importlib.resources import files

    return yaml.safe_load(files("envport.porting").joinpath(NAMES_FILE).read_text(encoding="utf-8"))


def module_of(name: str) -> str | None:
    """The module `import` names for distribution NAME (as written in a requirement); None: none to import."""
    from envport.spec.model import MODULE_RE, canonical_name

    t = table()
    key = canonical_name(name)
    if key in t["skip"]:
        return None
    if key in t["modules"]:
        return t["modules"][key]
    guess = name.lower().replace("-", "_")
    return guess if MODULE_RE.match(guess) else None


def add_import_witnesses(draft: Draft) -> None:
    """Fill draft.witness_imports from the pip phases, in phase order, each module once, with one note."""
    from packaging.requirements import Requirement

    shown = []
    for ph in sorted(draft.phases, key=lambda p: p.seq):
        for req in ph.packages:
            name = Requirement(req).name
            module = module_of(name)
            if module is None or module in draft.witness_imports:
                continue
            draft.witness_imports.append(module)
            shown.append(module if module == name.lower().replace("-", "_") else f"{module} ({name})")
    if shown:
        draft.note(None, "pip_phases", turned_into("witnesses.imports"),
                   f"{', '.join(shown)}: `envport witness` imports each in the built env; a module not in "
                   f"porting/{NAMES_FILE} is its distribution's name with - as _",
                   "correct a module named otherwise; add witnesses.cli for the recipe's tools")
    add_kernel_witness(draft)


# Distributions whose presence means "this env's accelerator is JAX's": its kernel witness proves XLA compiles.
JAX_DISTRIBUTIONS = frozenset({"jax", "jaxlib"})


def add_kernel_witness(draft: Draft) -> None:
    """witnesses.kernel: [jax] where a pip phase installs jax or jaxlib (with one note)."""
    from packaging.requirements import Requirement

    from envport.spec.model import canonical_name

    names = {canonical_name(Requirement(req).name) for ph in draft.phases for req in ph.packages}
    if not names & JAX_DISTRIBUTIONS or "jax" in draft.witness_kernel:
        return
    draft.witness_kernel.append("jax")
    draft.note(None, "pip_phases", turned_into("witnesses.kernel"),
               f"{', '.join(sorted(names & JAX_DISTRIBUTIONS))}: `envport witness` runs JAX's kernel witness (a "
               "seeded jit-compiled MLP on JAX's default backend; on a GPU also on the CPU, compared)",
               "write kernel: true to witness every framework the env holds (torch, jax, triton)")
