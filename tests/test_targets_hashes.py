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
    "chai-lab": "a7c3f2ca397fae12ac8b388a2bc2ac3b425eb99169fb5df401a751e74d346f80",
    "cuda-torch": "f3909b6bc1073a6f006437081470ff798d3002ab3cf03386a1a862c97eb0c290",
    "demo-cpu": "d4a888b33947c75412419a5e9af818defce4d045799dfb521e0314caf525fa71",
    # added with the spec (issue 42), after targets/ existed: pinned so a later change cannot move it unsaid
    "jax-cpu": "df3d4595cb672c90e43cbf4158487965fef6db46d3bc10615429186fdb02809f",
    "proteomics-gpu": "3040d8b421ca7a3ce17ad825376c03dee47499b0cdb69bb464c0749f1302f11d",
    "scanpy-cpu": "40ffa343d8bd18e04aeda5ea7f4d91f74e3e69a928912f579de00aaf1332ead9",
}
# The github site's hashes moved on purpose once: sites/github.yaml gained the CPU torch index (issue 27
# row 3); the portable hashes above did not move.
# Every hash moved on purpose once more (issue 39): the bytecode step (renderers/bytecode.py) compiles only
# stale files, in fixed chunks, and compiles after uv phases too, so every recipe's text changed.
SITE_HASHES = {
    "chai-lab": "ac843e6181cfb135ac9ba829032ac5597a75eb86fe64a92bfbc792f9991b6c0f",
    "cuda-torch": "36492fc0c71c141f6e71cb868defc45243ee514b2626cbaeac853cf24e2126ab",
    "demo-cpu": "628b82f3d4c4b0626a404da517654a25f134b8338115ce3aeec83e4bb0e04020",
    "jax-cpu": "f388630aee52a4897ade394deddc88854b8ecc0510179522af49752ddf1f6a16",
    "proteomics-gpu": "6f1a1f9b5e170066071bb4984b4ca117d02c0201a614338d876db252295d2b87",
    "scanpy-cpu": "13d72293f5e4d25aaa7a517409703ce5902aa584fad7d075f62763d56e6c19d8",
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
