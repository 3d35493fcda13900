"""Every env hash as it was before targets/ existed (issue 23): moving the backends into one module each renames nothing.

The hashes were computed on main's tree (f6eaa42) before the change, with
`portable(loaded).hash` and `resolve(loaded, load_site("github"), target).hash`
for every target; sites/github.yaml is machine-independent (sites/local.yaml
reads this host's CA bundle, so its hash is not portable across machines).
A renderer, plan or site change that moves a hash on purpose updates this table
in the same commit, and says why.
"""

from __future__ import annotations

import pytest

from envport.plan.site import load_site
from envport.recipe.identity import portable, resolve
from envport.spec.loader import all_spec_names, load_spec
from envport.targets.registry import NAMES

from .support import REPO

HASHES = {
    "chai-lab": "3d36b41e3d0bf001bae7d9e40de633c926de863bca34231b89ff4f2c20353af0",
    "cuda-torch": "d94c68dbfb600ba2c96f1e34e94a7ef24b5138d125765708ed60ba164ebd271f",
    "demo-cpu": "8cf9b8ffaf6dffa79116801d220c51d52adea4fd17dfe4f544818f0163518e34",
    # added with the spec (issue 42), after targets/ existed: pinned so a later change cannot move it unsaid
    "jax-cpu": "04bca12815fa5796f92ed54c4261391300b3e48dae097e4b18479e12fa276a39",
    "proteomics-gpu": "0dabeca58652eac31fad57c0d9d3c3c3f3d15cd58592b9daaad41fc6e7e96022",
    "scanpy-cpu": "2fdde2f77d346c0667c5e88da17aad0d8bb657128f1c253501b03fbe2a3a95c8",
}
# The github site's hashes moved on purpose once: sites/github.yaml gained the CPU torch index (issue 27
# row 3); the portable hashes above did not move.
SITE_HASHES = {
    "chai-lab": "232a203dbb182fb54fd9c0dcf616a1c3b68d225ec9b9f4f6550c1be2e8a25a15",
    "cuda-torch": "bcaf2f634265783af9e5ae929b02f331651b2f30abdb57fbd64241740278c291",
    "demo-cpu": "929c02696ede9d08016056e1115509f66fff6ab37103e3c47968c74791f1816d",
    "jax-cpu": "30bc2002bd3c96dd792b7a24c40b3760037c537a7cdc014fcf800b987500a6c1",
    "proteomics-gpu": "bdf634115a102e65b4c4b7afc0dc284fa1927b67c94d386fea3dc4327f1e4f2d",
    "scanpy-cpu": "a3952ede49dd42d66dbbb9a98eed720b4b71862537e5cf20f7e180c4e2bd5041",
}


def test_every_spec_is_pinned():
    assert sorted(all_spec_names(REPO)) == sorted(HASHES)


@pytest.mark.parametrize("name", sorted(HASHES))
def test_the_portable_hash_is_unchanged(name):
    assert portable(load_spec(name, REPO)).hash == HASHES[name]


@pytest.mark.parametrize("name", sorted(HASHES))
def test_every_target_resolves_the_same_hash_as_before(name):
    loaded, site = load_spec(name, REPO), load_site("github", REPO)
    assert {t: resolve(loaded, site, t).hash for t in NAMES} == {t: SITE_HASHES[name] for t in NAMES}
