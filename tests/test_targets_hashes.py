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
    "proteomics-gpu": "0dabeca58652eac31fad57c0d9d3c3c3f3d15cd58592b9daaad41fc6e7e96022",
    "scanpy-cpu": "2fdde2f77d346c0667c5e88da17aad0d8bb657128f1c253501b03fbe2a3a95c8",
}


def test_every_spec_is_pinned():
    assert sorted(all_spec_names(REPO)) == sorted(HASHES)


@pytest.mark.parametrize("name", sorted(HASHES))
def test_the_portable_hash_is_unchanged(name):
    assert portable(load_spec(name, REPO)).hash == HASHES[name]


@pytest.mark.parametrize("name", sorted(HASHES))
def test_every_target_resolves_the_same_hash_as_before(name):
    loaded, site = load_spec(name, REPO), load_site("github", REPO)
    assert {t: resolve(loaded, site, t).hash for t in NAMES} == {t: HASHES[name] for t in NAMES}
