"""`envport gc` (issue 27 row 13): builds of old hashes go, the current one, held ones, the --keep most recent
and anything in use stay, and nothing without envport's marks is touched.

Real things throughout: images imported into the docker engine under envport/<name>:<hash12> with the labels
a build gives them (each with its own random layer, so removing one frees real bytes), SIFs written by
envport's own SIF writer around a real squashfs, venvs made by `python -m venv` in the layout the setup script
leaves (a link <envs>/<name> to a build under <envs>/.<name>.builds). Every test names its own env: a gc of
every spec would reach the shared test images.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from envport.targets.base import Artefact

from .support import as_json, cli_env, run_envport, unique, write_spec


def _hash(root: Path, name: str) -> str:
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.spec.loader import load_spec

    return resolve(load_spec(name, root), load_site(None, root), "docker").identity.hash


def _old(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()


def _env(tmp_path: Path) -> dict:
    return cli_env(ENVPORT_STATE_DIR=str(tmp_path / "state"), ENVPORT_ENVS_DIR=str(tmp_path / "envs"))


def _gc(root: Path, env: dict, *args: str):
    proc = run_envport("gc", *args, "--json", root=root, env=env, timeout=300)
    out = as_json(proc)
    assert list(out)[:4] == ["command", "exit_code", "steps", "problems"] and out["exit_code"] == proc.returncode
    return proc, out


def _actions(out: dict) -> dict[str, str]:
    return {s["data"]["hash12"] or s["data"]["where"]: s["data"]["action"] for s in out["steps"] if s["data"]}


# --- the policy, on its own -------------------------------------------------------------------------------

def test_decide_orders_old_hashes_by_their_newest_ledger_record_before_when_they_were_made():
    from envport.flow.gc import KEEP, LEAVE, REMOVE, EnvState, decide

    def art(h, made, **kw):
        return Artefact("docker", "x", h * 12, f"envport/x:{h * 12}", 10, made, **kw)

    arts = [art("a", 100.0), art("b", 300.0), art("c", 200.0), art("d", 50.0), art("e", 10.0, foreign="no labels"),
            art("f", 1.0, unfinished=True), art("9", 400.0, busy="container c1 uses it")]
    # a was made first but used last (a witness run yesterday): it is the most recent old hash
    state = EnvState(frozenset({"d" * 12}), {}, {("docker", "a" * 12): 500.0, ("venv", "c" * 12): 900.0})
    got = {d.art.hash12[0]: d.action for d in decide(arts, state, keep=2)}
    # a (used at 500), then 9 (made at 400; the venv record of c is another target's): --keep 2 keeps both
    assert got == {"a": KEEP, "9": KEEP, "c": REMOVE, "b": REMOVE, "d": KEEP, "e": LEAVE, "f": REMOVE}
    why = {d.art.hash12[0]: d.why for d in decide(arts, state, keep=0)}
    assert why["9"].startswith("in use: container c1") and why["d"] == "the current hash"
    assert why["a"].startswith("an old hash") and why["e"] == "not envport's: no labels"


# --- docker: real images --------------------------------------------------------------------------------

def _payload_tar() -> bytes:
    """A tar of one random 1 MB file: an image's content that no other image shares."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(1 << 20)
        info = tarfile.TarInfo("payload")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _import(client, name: str, hash_: str, *, extra_tags: tuple[str, ...] = (), labels: dict | None = None) -> str:
    """An image envport/NAME:<hash12> of one random 1 MB file, labelled as a build of NAME@HASH_ is."""
    labels = {"envport.name": name, "envport.hash": hash_} if labels is None else labels
    changes = [f"LABEL {k}={v}" for k, v in labels.items()]
    tag = f"envport/{name}:{hash_[:12]}"
    subprocess.run(["docker", "import", *sum((["-c", c] for c in changes), []), "-", tag], input=_payload_tar(),
                   check=True, capture_output=True)
    for t in extra_tags:
        client.images.get(tag).tag(t)
    return tag


def _tags(client, name: str) -> set[str]:
    return {t for img in client.images.list(name=f"envport/{name}") for t in img.tags}


def test_gc_removes_old_images_and_keeps_current_held_recent_busy_and_foreign(project, tmp_path, docker_client,
                                                                               throwaway_images):
    name = unique("gc-docker")
    throwaway_images.append(name)
    write_spec(project, name)
    env = _env(tmp_path)
    cur = _hash(project, name)
    busy, gone, held, recent = (_old(f"{name}-{k}") for k in ("busy", "gone", "held", "recent"))
    # Made in this order (the engine's Created has whole seconds): the busy one oldest, the recent one newest.
    _import(docker_client, name, busy)
    container = docker_client.containers.create(f"envport/{name}:{busy[:12]}", ["/payload"])
    try:
        _import(docker_client, name, gone, extra_tags=(f"envport/{name}:latest",))
        _import(docker_client, name, held)
        time.sleep(1.1)
        _import(docker_client, name, recent)
        _import(docker_client, name, cur)
        foreign = _import(docker_client, name, _old(f"{name}-foreign"), labels={"maintainer": "someone"})
        before = _tags(docker_client, name)

        hold = run_envport("gc", name, "--hold", held, root=project, env=env, timeout=120)
        assert hold.returncode == 0 and f"hold {name}@{held[:12]}" in hold.stdout, hold.stdout + hold.stderr

        proc, out = _gc(project, env, name, "--target", "docker", "--dry-run")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _tags(docker_client, name) == before  # a dry run removes nothing
        assert _actions(out) == {cur[:12]: "kept", recent[:12]: "kept", held[:12]: "kept", busy[:12]: "kept",
                                 gone[:12]: "would_remove", foreign.split(":")[1]: "left"}
        assert out["summary"].startswith("would free 1 MB: 1 to remove (--dry-run: nothing was removed)")

        text = run_envport("gc", name, "--target", "docker", root=project, env=env, timeout=300)
        assert text.returncode == 0, text.stdout + text.stderr
        lines = text.stdout.splitlines()
        removed = [ln for ln in lines if ln.startswith("OK ")]
        assert removed == [f"OK       docker envport/{name}:{gone[:12]}: removed {gone[:12]}: an old hash, last used "
                           f"{time.strftime('%Y-%m-%d', time.gmtime())}; 1 MB freed"], lines
        assert f"kept {busy[:12]}: in use: container(s) {container.name} use it (`docker rm {container.name}`" in \
            text.stdout
        assert f"kept {held[:12]}: held since" in text.stdout and f"kept {cur[:12]}: the current hash" in text.stdout
        assert "left: not envport's: its labels say envport.name=(none)" in text.stdout
        assert lines[-1] == "freed 1 MB: 1 removed, 4 kept, 1 left (not envport's)"
        # `latest` was on the removed image: it went with it, and nothing else did
        assert _tags(docker_client, name) == before - {f"envport/{name}:{gone[:12]}", f"envport/{name}:latest"}
    finally:
        container.remove(force=True)

    release = run_envport("gc", name, "--release", held[:12], root=project, env=env, timeout=120)
    assert release.returncode == 0, release.stderr
    proc, out = _gc(project, env, name, "--target", "docker", "--keep", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {k for k, v in _actions(out).items() if v == "removed"} == {held[:12], recent[:12], busy[:12]}
    assert out["freed_bytes"] >= 3 << 20
    assert _tags(docker_client, name) == {f"envport/{name}:{cur[:12]}", foreign}
    docker_client.images.remove(foreign, force=True)   # not envport's: the throwaway fixture's label misses it


# --- apptainer: real SIFs -------------------------------------------------------------------------------

def _sif(path: Path, tmp_path: Path, labels: dict) -> int:
    from envport.builders.apptainer.singularity_d import inspect_metadata
    from envport.sif.format import write_sif

    tree = tmp_path / f"tree-{path.name}"
    tree.mkdir()
    (tree / "payload").write_bytes(os.urandom(200_000))
    sqfs = tmp_path / f"{path.name}.sqfs"
    subprocess.run(["mksquashfs", str(tree), str(sqfs), "-noappend", "-quiet", "-no-progress"], check=True)
    write_sif(path, deffile=b"Bootstrap: docker\n", squashfs_path=sqfs, created=0, uuid=bytes(16),
              inspect_metadata=inspect_metadata(deffile="Bootstrap: docker", environment={}, labels=labels))
    return path.stat().st_blocks * 512


def test_gc_removes_old_sifs_by_envports_marks_and_leaves_whatever_only_looks_like_one(project, tmp_path,
                                                                                     monkeypatch):
    from envport.sif import content as sif_content
    from envport.sif import record as sif_record
    from envport.sif.format import read_sif

    name = unique("gc-sif")
    write_spec(project, name)
    env = _env(tmp_path)
    monkeypatch.setenv("ENVPORT_STATE_DIR", env["ENVPORT_STATE_DIR"])  # this process writes the build record
    cur, labelled, recorded, other = (_old(f"{name}-{k}") for k in ("cur", "labelled", "recorded", "other"))
    cur = _hash(project, name)
    sifs = project / ".cache" / "sif"
    sifs.mkdir(parents=True)
    _sif(sifs / f"{name}-{cur[:12]}.sif", tmp_path, {"envport.name": name, "envport.hash": cur})
    freed = _sif(sifs / f"{name}-{labelled[:12]}.sif", tmp_path, {"envport.name": name, "envport.hash": labelled})
    # No labels at all, but this machine's build record says it wrote that hash there.
    rec = sifs / f"{name}-{recorded[:12]}.sif"
    freed += _sif(rec, tmp_path, {})
    sif_record.write(str(rec), recorded, "0" * 64, sif_content.layout(read_sif(rec)))
    # Named like a SIF of this env, without envport's marks: each is left.
    _sif(sifs / f"{name}-{other[:12]}.sif", tmp_path, {"envport.name": "another", "envport.hash": other})
    (sifs / f"{name}-{'e' * 12}.sif").write_bytes(os.urandom(5000))
    outside = tmp_path / "outside.sif"
    _sif(outside, tmp_path, {"envport.name": name, "envport.hash": "f" * 64})
    (sifs / f"{name}-{'f' * 12}.sif").symlink_to(outside)
    listing = sorted(p.name for p in sifs.iterdir())

    broken = project / "specs" / "broken.yaml"
    broken.write_text("name: broken\npip_phases: 3\n")
    proc = run_envport("gc", "--keep", "0", root=project, env=env, timeout=120)
    assert proc.returncode == 2 and "broken.yaml" in proc.stderr, proc.stdout + proc.stderr
    assert sorted(p.name for p in sifs.iterdir()) == listing  # an invalid spec: nothing removed
    broken.unlink()

    proc, out = _gc(project, env, name, "--target", "apptainer", "--keep", "0", "--dry-run")
    assert proc.returncode == 0 and sorted(p.name for p in sifs.iterdir()) == listing, proc.stdout + proc.stderr
    assert _actions(out) == {cur[:12]: "kept", labelled[:12]: "would_remove", recorded[:12]: "would_remove",
                             other[:12]: "left", "e" * 12: "left", "f" * 12: "left"}
    why = {s["data"]["hash12"]: s["detail"] for s in out["steps"]}
    assert "not a SIF envport can read" in why["e" * 12] and "not a regular file" in why["f" * 12]
    assert "its labels say envport.name=another" in why[other[:12]]

    proc, out = _gc(project, env, name, "--target", "apptainer", "--keep", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out["freed_bytes"] == freed
    assert sorted(p.name for p in sifs.iterdir()) == sorted(set(listing) - {f"{name}-{labelled[:12]}.sif",
                                                                            f"{name}-{recorded[:12]}.sif"})
    assert outside.is_file() and sif_record.read(str(rec)) is None  # the link's target stays; the record goes


# --- venv: real venvs in the setup script's layout ---------------------------------------------------------

def _venv_build(builds: Path, dirname: str, hash_: str | None) -> Path:
    d = builds / dirname
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True)
    (d / "lib" / "payload").write_bytes(os.urandom(300_000))
    if hash_ is not None:
        (d / ".envport").mkdir()
        (d / ".envport" / "hash").write_text(hash_ + "\n")
    return d


def test_gc_removes_old_venvs_under_the_lock_and_never_follows_a_link_out(project, tmp_path):
    name, linked_out = unique("gc-venv"), unique("gc-venv-out")
    write_spec(project, name)
    write_spec(project, linked_out)
    env = _env(tmp_path)
    envs = tmp_path / "envs"
    builds = envs / f".{name}.builds"
    builds.mkdir(parents=True)
    old = _old(f"{name}-old")
    live = _venv_build(builds, f"{old[:12]}-4242", old)
    (envs / name).symlink_to(live)
    # Inside the env: a link to a folder outside; removing the env must not reach through it.
    keepsake = tmp_path / "keepsake"
    keepsake.mkdir()
    (keepsake / "precious").write_text("mine")
    (live / "lib" / "escape").symlink_to(keepsake)
    stopped = _venv_build(builds, f"{_hash(project, name)[:12]}-999", None)  # killed before it was finished
    # Another env's link pointing outside envport's builds folder: left, its target untouched.
    mine = _venv_build(tmp_path, "hand-made", _old("x"))
    (envs / linked_out).symlink_to(mine)

    # A build of NAME holds its lock: nothing of NAME is touched.
    lock = os.open(envs / f".{name}.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        proc, out = _gc(project, env, name, linked_out, "--target", "venv", "--keep", "0")
    finally:
        os.close(lock)
    assert proc.returncode == 0 and live.is_dir() and stopped.is_dir(), proc.stdout + proc.stderr
    assert all("in use: a build holds" in s["detail"] for s in out["steps"] if s["data"]["env"] == name)

    # --keep 1 (the default): the env of the old hash is the most recent old one and stays; the stopped build goes.
    proc, out = _gc(project, env, name, linked_out, "--target", "venv")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _actions(out) == {old[:12]: "kept", stopped.name[:12]: "removed", str(envs / linked_out): "left"}
    assert not stopped.exists() and live.is_dir() and (envs / name).is_symlink()

    proc, out = _gc(project, env, name, "--target", "venv", "--keep", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _actions(out) == {old[:12]: "removed"} and out["freed_bytes"] > 300_000
    assert not os.path.lexists(envs / name) and not live.exists()
    assert (keepsake / "precious").read_text() == "mine" and (mine / ".envport" / "hash").is_file()


# --- what a target cannot do, and the --hold forms ----------------------------------------------------------

def test_a_named_target_without_gc_is_refused_and_a_bad_hold_is_a_usage_error(project, tmp_path):
    name = unique("gc-misc")
    write_spec(project, name)
    env = _env(tmp_path)
    proc, out = _gc(project, env, name, "--target", "conda")
    assert proc.returncode == 3 and out["steps"][0]["reason"] == "unsupported", proc.stdout
    assert "conda env is one per name" in out["steps"][0]["detail"]
    for args, words in (((name, "--hold", "xyz"), "12 to 64 lowercase hex digits"),
                        (("--hold", "a" * 12), "name exactly one env"),
                        ((name, "--keep", "-1"), "expected 0 or more")):
        proc, out = _gc(project, env, *args)
        assert proc.returncode == 2 and words in out["problems"][0]["message"], (args, proc.stdout)
    hold = run_envport("gc", name, "--hold", "a" * 12, root=project, env=env, timeout=120)
    ledger = run_envport("ledger", name, "--json", root=project, env=env, timeout=120)
    assert hold.returncode == 0 and [r["kind"] for r in json.loads(ledger.stdout)["records"]] == ["hold"]


# --- podman: the same marks in podman's own storage --------------------------------------------------------

def _podman(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], input=stdin, capture_output=True, timeout=120)


def test_gc_removes_old_podman_images_and_leaves_unlabelled_ones(project, tmp_path):
    """In the storage of the user the tests run as (a host change, said so: two 1 MB images, removed at the end;
    tests/test_podman.py covers podman as an unprivileged user)."""
    from .support import missing

    if _podman("info").returncode != 0:
        missing("podman does not answer as this user (`podman info`)")
    name = unique("gc-podman")
    write_spec(project, name)
    env = _env(tmp_path)
    cur, old = _hash(project, name), _old(f"{name}-old")
    try:
        for hash_, labels in ((cur, {"envport.name": name, "envport.hash": cur}),
                              (old, {"envport.name": name, "envport.hash": old}), ("d" * 64, {})):
            changes = sum((["-c", f"LABEL {k}={v}"] for k, v in labels.items()), [])
            ran = _podman("import", *changes, "-", f"envport/{name}:{hash_[:12]}", stdin=_payload_tar())
            assert ran.returncode == 0, ran.stderr
        proc, out = _gc(project, env, name, "--target", "podman", "--keep", "0")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _actions(out) == {cur[:12]: "kept", old[:12]: "removed", "d" * 12: "left"}
        assert out["freed_bytes"] >= 1 << 20
        listed = _podman("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", f"reference=envport/{name}")
        assert sorted(listed.stdout.decode().split()) == sorted(f"localhost/envport/{name}:{h}"
                                                                for h in (cur[:12], "d" * 12))
    finally:
        for hash_ in (cur, old, "d" * 64):
            _podman("rmi", f"envport/{name}:{hash_[:12]}")
