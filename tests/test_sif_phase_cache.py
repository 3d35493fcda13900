"""The SIF builder's phase cache (builders/apptainer/phase_cache.py) with real builds: envport's own .def
builder, docker's base image, bwrap, envport's squashfs writer (zstd, the project site's compressor: the
`sif-zstd` site), one small spec of two pip phases (no torch), one cache directory per module.  The cache
holds both halves of a rebuild's saving: each phase's tree, and the compressed blocks of the last image
(sif/squash_blocks.py), which an edited build takes for every file it did not change.

- two builds started together into an empty shared cache both end right, with the same bytes (the
  reproducibility half: both built from nothing);
- a random sequence of phase edits built through the cache, each reusing most blocks, then `envport
  rebuild-check` of the last SIF
  (which rebuilds it from nothing, the cache off) says the bytes are the same; on a difference the two
  partitions' manifests (every path's mode, owner, time, size and content sha256) name the files;
- a build killed while it writes an entry leaves nothing any build uses, and the next sweep removes it;
- an entry whose tree was damaged is named, removed and rebuilt, never used; that build, through the
  cache, equals the build from nothing file for file (unsquashfs of both partitions: every path's mode,
  owner, time, size and content sha256) and byte for byte.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envport.builders.apptainer.phase_cache import BLOCKS_KIND, PhaseCache
from envport.plan.lock import sha256_file
from envport.sif.gate import gate
from envport.sif.compare import manifest_diff, manifest_digest, tree_manifest, unpack_partition

from .sif_fixtures import SIF_TIMEOUT, require_sif_tools, sif_env
from .support import as_json, copy_project, fail_with, run_envport, write_site, write_spec

NAME = "cache-sif"
SITE = "sif-zstd"
SEED = int(os.environ.get("ENVPORT_TEST_SEED", "39"))
# setuptools in phase 2 replaces the venv's own, as demo-cpu's torch phase does: the next interpreter imports
# its `_distutils_hack` at startup (a .pth) and writes a timestamp .pyc holding the install time, which the
# bytecode step must rewrite, or two builds differ in it (renderers/bytecode.py).
PHASES = [["six==1.16.0"], ["idna==3.7", "setuptools==84.0.0"]]
# Each edit changes one phase; the step the next build restores is the one before it.
EDITS = {
    "pip-2": lambda p: [p[0], ["idna==3.6" if p[1][0] == "idna==3.7" else "idna==3.7", *p[1][1:]]],
    "pip-1": lambda p: [["six==1.17.0" if p[0] == ["six==1.16.0"] else "six==1.16.0"], p[1]],
}


def _project(root: Path, phases) -> Path:
    if not (root / "specs").is_dir():
        copy_project(root)
        write_site(root, SITE, apptainer={"compression": "zstd"})
    write_spec(root, NAME, pip_phases=phases)
    return root


def _argv(root: Path) -> list[str]:
    return [sys.executable, "-m", "envport", "-C", str(root), "build", NAME, "--target", "apptainer",
            "--site", SITE, "--rebuild", "--json"]


def _build(root: Path, cache: Path) -> dict:
    proc = run_envport(*_argv(root)[5:], root=root, env=sif_env(ENVPORT_SIF_PHASE_CACHE=str(cache)),
                       timeout=SIF_TIMEOUT)
    assert proc.returncode == 0, fail_with(proc, "envport build")
    last = as_json(proc)["steps"][-1]
    return {**last["data"], "stderr": proc.stderr}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("phase-cache") / "cache"


@pytest.fixture(scope="module")
def cold(base_image, tmp_path_factory, cache_dir) -> list[dict]:
    """Two builds of the same spec from two projects, started together into one empty cache."""
    require_sif_tools()
    roots = [_project(tmp_path_factory.mktemp(f"cold{i}"), PHASES) for i in range(2)]
    env = sif_env(ENVPORT_SIF_PHASE_CACHE=str(cache_dir))
    procs = [subprocess.Popen(_argv(r), cwd=r, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in roots]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=SIF_TIMEOUT)
        done = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
        assert p.returncode == 0, fail_with(done, "concurrent envport build")
        out.append({**as_json(done)["steps"][-1]["data"], "stderr": stderr})
    return out


def test_two_builds_sharing_an_empty_cache_both_end_right_with_the_same_bytes(cold, cache_dir):
    a, b = cold
    assert sha256_file(a["sif"]) == sha256_file(b["sif"]), "two builds of one spec, lock and site from nothing differ"
    assert a["squashfs"]["blocks_reused"] == 0 == b["squashfs"]["blocks_reused"], (a["squashfs"], b["squashfs"])
    cache = PhaseCache(cache_dir, 1 << 40)
    entries = [e for e in cache.entries() if e.meta.get("kind") != BLOCKS_KIND]
    # kept: the step before the first pip phase, then each pip phase but the last step (labels); and the
    # image's compressed blocks, one pack for the env (the second build's replaced the first's)
    assert sorted(e.meta["marker"] for e in entries) == ["env", "pip-1", "pip-2"], entries
    assert [e.meta["name"] for e in cache.entries() if e.meta.get("kind") == BLOCKS_KIND] == [NAME]
    assert not [p.name for p in cache_dir.iterdir() if p.name.startswith(".tmp-")]
    for e in entries:
        assert manifest_digest(tree_manifest(e.rootfs)) == e.meta["manifest"], f"entry {e.key} is not its manifest"


def test_random_phase_edits_through_the_cache_equal_a_build_from_nothing(cold, cache_dir, tmp_path):
    rng = random.Random(SEED)
    root = _project(tmp_path, PHASES)
    phases, done = PHASES, []
    for _ in range(2):
        edit = rng.choice(sorted(EDITS))
        phases = EDITS[edit](phases)
        _project(root, phases)
        built = _build(root, cache_dir)
        done.append(edit)
        restored = built["timings"].get("restored_step")
        assert restored is not None, f"seed {SEED}, edits {done}: nothing came from the cache\n{built['stderr']}"
        # phase N edited: at least the tree after the step before it comes from the cache (a later one
        # when an earlier edit of the sequence built this very phase already)
        assert restored >= {"pip-2": 5, "pip-1": 4}[edit], (SEED, done, restored)
        squashed = built["squashfs"]  # an edit of one small phase: the rest of the image's blocks come back
        assert 0 < squashed["blocks_compressed"] < squashed["blocks_reused"] / 20, (SEED, done, squashed)
    proc = run_envport("rebuild-check", built["sif"], "--json", root=root, env=sif_env(), timeout=SIF_TIMEOUT)
    out = as_json(proc)
    if proc.returncode != 0:
        rebuilt = out["steps"][-1].get("data", {})
        raise AssertionError(f"seed {SEED}, edits {done}: the cached build differs from one from nothing: "
                             f"{rebuilt}\n{proc.stderr[-3000:]}")
    assert out["sha256"] == out["rebuilt_sha256"] == sha256_file(built["sif"])
    # which writer made the partition is in the labels: another writer or version writes other bytes
    offset = gate(Path(built["sif"])).partition.offset
    labels = json.loads(subprocess.run(["unsquashfs", "-o", str(offset), "-cat", built["sif"],
                                        ".singularity.d/labels.json"], capture_output=True, check=True).stdout)
    assert re.fullmatch(r"envport \S+ squashfs_writer \(zstd level 15, zstandard \S+, libzstd \S+, 128 KiB "
                        r"blocks, no fragments\)", labels["envport.squashfs"]), labels


def test_a_killed_build_leaves_no_usable_entry(cold, cache_dir, tmp_path):
    root = _project(tmp_path, [PHASES[0], ["idna==3.5"]])
    proc = subprocess.Popen(_argv(root), cwd=root, env=sif_env(ENVPORT_SIF_PHASE_CACHE=str(cache_dir)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    before = {p.name for p in cache_dir.iterdir()}
    half = None
    deadline = time.monotonic() + SIF_TIMEOUT
    while half is None and proc.poll() is None and time.monotonic() < deadline:
        half = next((p for p in cache_dir.iterdir() if p.name.startswith(".tmp-") and p.name not in before), None)
        time.sleep(0.01)
    if half is None:
        proc.wait()
        pytest.fail("the build never wrote a cache entry (it kept step 6, pip-2, of the edited spec)")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    key = half.name.removeprefix(".tmp-").split(".")[0]
    cache = PhaseCache(cache_dir, 1 << 40)
    if not half.exists():  # the kill came after the rename: then the entry is whole
        entry = cache.find(key)
        assert entry is not None and manifest_digest(tree_manifest(entry.rootfs)) == entry.meta["manifest"]
        return
    assert cache.find(key) is None and key not in {e.key for e in cache.entries()}
    cache.sweep()
    assert not half.exists(), "a dead build's half entry outlived the sweep"


def test_a_damaged_entry_is_named_removed_and_rebuilt(cold, cache_dir, tmp_path):
    cache = PhaseCache(cache_dir, 1 << 40)
    pip2 = [e for e in cache.entries() if e.meta.get("marker") == "pip-2" and e.meta.get("name") == NAME]
    assert pip2
    for e in pip2:  # whichever the next build picks
        victim = next(p for p in sorted(e.rootfs.rglob("idna/*.py")))
        victim.write_bytes(victim.read_bytes() + b"\n# damaged\n")
    root = _project(tmp_path / "p", PHASES)
    built = _build(root, cache_dir)
    assert "is corrupt (its tree does not match its manifest); removed" in built["stderr"], built["stderr"]
    assert built["timings"].get("restored_step") == 5, built["stderr"]  # pip-1's tree, pip-2 run again
    # file for file: every path, mode, owner, time, size and content sha256 of the two partitions
    a = tree_manifest(unpack_partition(cold[0]["sif"], tmp_path / "a"))
    b = tree_manifest(unpack_partition(built["sif"], tmp_path / "b"))
    assert manifest_diff(a, b) == []
    assert sha256_file(built["sif"]) == sha256_file(cold[0]["sif"])


def test_gc_phase_cache_empties_it_saying_what_it_freed(cold, cache_dir, tmp_path):
    root = _project(tmp_path, PHASES)
    env = sif_env(ENVPORT_SIF_PHASE_CACHE=str(cache_dir))
    count, size = PhaseCache(cache_dir, 1 << 40).size()
    assert count and size
    proc = run_envport("gc", NAME, "--target", "apptainer", "--phase-cache", "--json", root=root, env=env,
                       timeout=300)
    assert proc.returncode == 0, fail_with(proc, "envport gc --phase-cache")
    step = as_json(proc)["steps"][-1]
    assert step["data"]["where"] == str(cache_dir) and step["data"]["freed"] == size, step
    assert PhaseCache(cache_dir, 1 << 40).size() == (0, 0)
    assert not [p for p in cache_dir.iterdir() if p.name != ".lock"]
