"""The trust gate (issue 35): the file that is checked is the file that runs, for every command.

Each test is one row of the issue, reproduced on the real code path (the envport CLI on tiny-sif's SIF,
built once a session by envport's own builder, tests/sif_fixtures.py):

- G1: a second primary partition carrying the signed partition's object ID, in an earlier slot;
- G2: an unsigned SIF renamed over the signed one after the check (the mount tool's own wrapper does the
  rename, so the swap lands exactly between check and mount), a file another user owns, and the per-task
  wrapper (what srun runs on each node) given a swapped file;
- U1: verify and witness of a SIF with one flipped partition byte, or 4 KiB appended, in a project;
- U2: verify where squashfuse cannot mount (a stand-in squashfuse that fails as a FUSE-less host's does:
  a mock, said so, because this machine's /dev/fuse works);
- G3: an embedded spec whose hash holds `../..` and terminal escapes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envport.sif.format import read_sif
from envport.sif.header import DESCRIPTOR, HEADER

from .sif_fixtures import SIF_TIMEOUT, BuiltSif, sif_env
from .support import as_json, fail_with, run_envport
from .test_trust import MOUNT_TOOLS, Strict, strict, witness  # noqa: F401  (strict: a fixture)

pytest_plugins = ["tests.sif_fixtures"]

SPEC_OBJECT = "envport-spec.json"


def signed_copy(tiny_sif: BuiltSif, strict: Strict, name: str = "signed.sif") -> Path:
    sif = strict.sif.parent / name
    shutil.copyfile(tiny_sif.path, sif)
    proc = run_envport("sign", str(sif), "--key", str(strict.key), root=tiny_sif.root, timeout=300)
    assert proc.returncode == 0, fail_with(proc, "sign")
    return sif


def primary(path: Path):
    info = read_sif(path)
    return next(d for d in info.descriptors if d.datatype == 0x4004 and d.partition_type == 2)


def with_twin_partition(signed: Path, out: Path) -> None:
    """SIGNED with a second primary partition in slot 0: the signed partition's descriptor (same ID, size,
    every signed field) pointing at a copy of its bytes with one byte changed, appended at the end; the
    other descriptors move one slot down (slots are not signed)."""
    data = bytearray(signed.read_bytes())
    head = list(HEADER.unpack(bytes(data[:HEADER.size])))
    part = primary(signed)
    table_at, n = head[9], head[8]
    slots = [bytes(data[table_at + i * DESCRIPTOR.size: table_at + (i + 1) * DESCRIPTOR.size]) for i in range(n)]
    used = [s for s in slots if DESCRIPTOR.unpack(s)[1]]
    twin_src = next(s for s in used if DESCRIPTOR.unpack(s)[2] == part.id)
    evil = bytearray(data[part.offset:part.offset + part.size])
    evil[len(evil) // 2] ^= 0xFF
    at = -(-len(data) // 4096) * 4096
    data.extend(bytes(at - len(data)) + evil)
    fields = list(DESCRIPTOR.unpack(twin_src))
    fields[5] = at  # offset: the only field changed, and offsets are not signed
    table = [DESCRIPTOR.pack(*fields)] + used
    raw = b"".join(table).ljust(n * DESCRIPTOR.size, b"\0")
    data[table_at:table_at + len(raw)] = raw
    head[7] -= 1  # one slot fewer free
    head[12] = len(data) - head[11]
    data[:HEADER.size] = HEADER.pack(*head)
    out.write_bytes(bytes(data))


def test_g1_a_twin_primary_partition_is_refused_when_the_sif_is_read(tiny_sif, strict, tmp_path):
    signed = signed_copy(tiny_sif, strict)
    evil = strict.sif.parent / "twin.sif"
    with_twin_partition(signed, evil)
    pub = str(strict.key).replace(".pem", ".pub.pem")
    for args in (["verify-sig", str(evil), "--key", pub], ["inspect", str(evil), "--key", pub]):
        proc = run_envport(*args, "--json", root=tiny_sif.root, timeout=300)
        text = proc.stdout + proc.stderr
        assert proc.returncode in (1, 3) and "corrupt_descriptor" in text and "two objects carry ID" in text, \
            fail_with(proc, " ".join(args))
        assert '"verdict": "verified"' not in proc.stdout
    proc = witness(tiny_sif, evil, strict)
    assert proc.returncode in (1, 3) and "corrupt_descriptor" in proc.stdout + proc.stderr, fail_with(proc, "witness")
    assert not strict.marker.exists(), f"a mount tool was started: {strict.marker.read_text()}"
    # The signed original still runs under the same site: the gate refuses the twin, not signatures.
    proc = witness(tiny_sif, signed, strict)
    assert proc.returncode == 0, fail_with(proc, "witness of the signed SIF")


def test_g2_a_sif_renamed_over_the_checked_one_never_runs(tiny_sif, strict, tmp_path):
    """The mount tools' wrappers rename an unsigned SIF over the signed one the moment a mount starts (after
    the gate judged it): what they are handed must be the descriptor of the judged file, not its name."""
    signed = signed_copy(tiny_sif, strict)
    judged_inode = signed.stat().st_ino
    unsigned = strict.sif  # tiny-sif, unsigned: refused by this site
    seen = tmp_path / "sources"
    bin_dir = tmp_path / "swapbin"
    bin_dir.mkdir()
    for tool in MOUNT_TOOLS:
        real = shutil.which(tool)
        if real is None:
            continue
        (bin_dir / tool).write_text(
            "#!/bin/sh\n"
            f"[ -e {shlex.quote(str(unsigned))} ] && mv -f {shlex.quote(str(unsigned))} {shlex.quote(str(signed))}\n"
            # the source each tool is handed, and the inode it opens to
            f'for a do case "$a" in /proc/*/fd/*) echo "$a $(stat -L -c %i "$a")" >> {shlex.quote(str(seen))};; '
            f'{shlex.quote(str(signed))}) echo "PATH $a" >> {shlex.quote(str(seen))};; esac; done\n'
            f'exec {shlex.quote(real)} "$@"\n')
        (bin_dir / tool).chmod(0o755)
    env = dict(strict.env, PATH=f"{bin_dir}:{strict.env['PATH']}")
    proc = run_envport("witness", tiny_sif.name, "--target", "apptainer", "--sif", str(signed), "--site",
                       strict.site, root=tiny_sif.root, env=env, timeout=SIF_TIMEOUT)
    assert not unsigned.exists() and signed.stat().st_ino != judged_inode, "the swap did not happen"
    sources = seen.read_text().split("\n") if seen.exists() else []
    assert sources and all(s.startswith("/proc/") for s in sources if s), sources
    assert {s.split()[1] for s in sources if s} == {str(judged_inode)}, sources
    assert proc.returncode == 0, fail_with(proc, "witness")


def test_g2_the_per_task_wrapper_refuses_a_file_swapped_after_the_check(tiny_sif, strict, tmp_path):
    """What srun runs on each node reopens the path (a node cannot share envport's descriptor): it must
    run only the file the gate judged."""
    signed = signed_copy(tiny_sif, strict)
    code = ("import json, sys\n"
            "from pathlib import Path\n"
            "from envport.witness.launchers.sif import SifLauncher\n"
            "inv = SifLauncher(Path(sys.argv[1]), runtime='ch-run').invocation('x.py', [], {})\n"
            "print(json.dumps(inv.argv))\n")
    env = dict(strict.env, ENVPORT_SITE=strict.site)
    got = subprocess.run([sys.executable, "-c", code, str(signed)], capture_output=True, text=True, timeout=300,
                         env=env, cwd=tiny_sif.root)
    assert got.returncode == 0, got.stderr
    argv = json.loads(got.stdout)
    shutil.copyfile(strict.sif, signed.with_suffix(".new"))
    os.replace(signed.with_suffix(".new"), signed)
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=strict.env)
    assert ran.returncode == 3 and "REFUSED [sif_changed]" in ran.stderr, (ran.returncode, ran.stderr)
    assert not strict.marker.exists(), f"a mount tool was started: {strict.marker.read_text()}"


def test_g2_a_sif_another_user_can_rewrite_is_refused(tiny_sif, strict, tmp_path):
    """Changes the owner of a copy in this test's own temp folder to uid 65534 (nobody) and makes a
    group-writable folder: both are refused by name, before anything is read as a spec or mounted."""
    theirs = strict.sif.parent / "theirs.sif"
    shutil.copyfile(tiny_sif.path, theirs)
    os.chown(theirs, 65534, 65534)
    proc = run_envport("witness", tiny_sif.name, "--target", "apptainer", "--sif", str(theirs),
                       root=tiny_sif.root, env=strict.env, timeout=SIF_TIMEOUT)
    assert proc.returncode == 3 and "[sif_unsafe]" in proc.stdout + proc.stderr, fail_with(proc, "witness")
    assert "owned by uid 65534" in proc.stdout + proc.stderr
    shared = strict.sif.parent / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    mine = shared / "mine.sif"
    shutil.copyfile(tiny_sif.path, mine)
    proc = run_envport("verify", tiny_sif.name, "--target", "apptainer", "--sif", str(mine), "--json",
                       root=tiny_sif.root, env=strict.env, timeout=SIF_TIMEOUT)
    step = as_json(proc)["steps"][-1]
    assert proc.returncode == 3 and step["reason"] == "sif_unsafe" and str(shared) in step["detail"], step
    assert not strict.marker.exists(), f"a mount tool was started: {strict.marker.read_text()}"


@pytest.mark.parametrize("damage", ["flip", "append"])
def test_u1_verify_and_witness_fail_a_damaged_sif_in_a_project(tiny_sif, strict, tmp_path, damage):
    bad = strict.sif.parent / f"{damage}.sif"
    shutil.copyfile(tiny_sif.path, bad)
    part = primary(bad)
    with open(bad, "r+b") as fh:
        if damage == "flip":
            fh.seek(part.offset + part.size // 2)
            byte = fh.read(1)
            fh.seek(part.offset + part.size // 2)
            fh.write(bytes([byte[0] ^ 0x01]))
        else:
            fh.seek(0, 2)
            fh.write(b"\0" * 4096)
    want = "corrupt" if damage == "flip" else "trailing_bytes"
    for command in ("verify", "witness"):
        proc = run_envport(command, tiny_sif.name, "--target", "apptainer", "--sif", str(bad), "--json",
                           root=tiny_sif.root, env=sif_env(), timeout=SIF_TIMEOUT)
        data = as_json(proc)
        reasons = [s.get("reason") for s in data["steps"]]
        assert proc.returncode == 1 and want in reasons, fail_with(proc, command)
        assert not any(s["verdict"] == "OK" and "passed" in s["detail"] for s in data["steps"]), data["steps"]


def test_u2_verify_where_squashfuse_cannot_mount_says_so_in_one_line(tiny_sif, tmp_path):
    """A mock: squashfuse replaced by a stand-in that fails as it does where /dev/fuse is root-only (this
    machine's FUSE works, so the refusal cannot be had for real here); the kernel's mount is not used
    (ENVPORT_SIF_MOUNT=squashfuse, the unprivileged route)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squashfuse", "squashfuse_ll"):
        (bin_dir / tool).write_text("#!/bin/sh\necho 'fuse: device not found, try modprobe fuse first' >&2\n"
                                    "exit 1\n")
        (bin_dir / tool).chmod(0o755)
    env = sif_env(PATH=f"{bin_dir}:{os.environ['PATH']}", ENVPORT_SIF_MOUNT="squashfuse",
                  ENVPORT_SIF_RUNTIME="ch-run")
    proc = run_envport("verify", tiny_sif.name, "--target", "apptainer", "--sif", str(tiny_sif.path),
                       root=tiny_sif.root, env=env, timeout=SIF_TIMEOUT)
    assert proc.returncode in (1, 3) and "Traceback" not in proc.stderr, fail_with(proc, "verify")
    assert "[sif_mount_failed]" in proc.stdout + proc.stderr and "fuse: device not found" in proc.stdout + \
        proc.stderr, fail_with(proc, "verify")


def test_g3_an_embedded_hash_that_is_no_hash_is_refused_and_never_printed_raw(tiny_sif, tmp_path):
    """A SIF whose labels (descriptor and image alike) and embedded spec agree on a `hash` holding a path
    and terminal escapes: refused as no spec envport wrote, with every byte from the file escaped."""
    from envport.sif.format import read_json_object, write_sif

    bad_hash = "../../etc\x1b[31mX"
    info = read_sif(tiny_sif.path)
    doc = read_json_object(info, SPEC_OBJECT)
    doc["hash"] = bad_hash
    doc.pop("partition", None)  # no record of the partition: the crafted one is not tiny-sif's
    labels = {"envport.name": tiny_sif.name, "envport.hash": bad_hash}
    tree = tmp_path / "tree"
    (tree / ".singularity.d" / "env").mkdir(parents=True)
    (tree / ".singularity.d" / "labels.json").write_text(json.dumps(labels))
    squash = tmp_path / "p.sqfs"
    subprocess.run(["mksquashfs", str(tree), str(squash), "-noappend", "-quiet", "-no-progress"], check=True)
    meta = json.dumps({"data": {"attributes": {"labels": labels, "environment": {}}}}).encode()
    admin = tmp_path / "admin"
    admin.mkdir()
    sif = tmp_path / "crafted.sif"
    write_sif(sif, deffile=b"Bootstrap: docker\n", inspect_metadata=meta, squashfs_path=squash, created=0,
              uuid=bytes(16), extra_json=((SPEC_OBJECT, json.dumps(doc).encode()),))
    for command in ("witness", "verify"):
        proc = subprocess.run([sys.executable, "-m", "envport", command, tiny_sif.name, "--target", "apptainer",
                               "--sif", str(sif)], cwd=admin, capture_output=True, text=True, timeout=600,
                              env=sif_env())
        assert proc.returncode == 3 and "[embedded_spec_mismatch]" in proc.stdout + proc.stderr, \
            fail_with(proc, command)
        assert "\x1b" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-800:]



def test_a_sif_named_with_sif_that_does_not_exist_says_so(tiny_sif, tmp_path):
    """issue 37, U24: the fix was "envport build ..., or pass --sif FILE" although --sif was passed."""
    proc = run_envport("witness", tiny_sif.name, "--target", "apptainer", "--sif", str(tmp_path / "none.sif"),
                       "--json", root=tiny_sif.root, env=sif_env(), timeout=SIF_TIMEOUT)
    step = as_json(proc)["steps"][0]
    assert proc.returncode == 3 and step["reason"] == "sif_missing", step
    assert step["lines"] == ["fix: the file you named does not exist: check the path given to --sif"], step
