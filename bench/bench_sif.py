"""SIF build, present, witness and compression costs, measured side by side in one run.

    python bench/bench_sif.py [--spec demo-cpu] [--parts build,present,witness,sign,registry] [--project DIR]
                              [--repeat N] [--sif FILE] [--image TAG] [--json bench/results/sif.json]

(a) `envport build demo-cpu --target apptainer --rebuild` with envport's .def
    builder, its phases as the build reports them; envport's own assembly
    (metadata, SIF writing, cleanup: everything but bootstrap, %post and
    mksquashfs) against a bare `mksquashfs` of the same rootfs (goal <= 10 %);
(b) a no-op build of the present SIF: the builder call and the whole CLI
    process (goal <= 0.1 s; one stat against this machine's build record),
    beside, in the same rounds, the content check a SIF without that record
    gets and `envport inspect` of it (the partition's sha256 and listing):
    both as ratios to the no-op;
(c) the witness suite inside the SIF (ch-run, or apptainer where installed)
    against the same suite in docker (goal <= 1.0x), each `envport witness`
    run as a whole CLI process, SIF and docker alternating --repeat times
    (default 3): the ratio of their medians (and of their minima, less
    moved by other load on the host); as root the SIF runs on the kernel's
    loop mount and, in the same rounds, on squashfuse. The SIF and the docker image are
    built first where they are not present (docker: --target docker), or
    given (--sif, --image: the same env's);
(d) mksquashfs -comp gzip vs -comp zstd of that rootfs: seconds and MiB;
(e) "sign": `envport sign` and `envport verify-sig` of the spec's SIF against `sha256sum` of it (goal
    <= 1.2x each: signing is hashing), run by bench/bench_sign.py on that SIF;
(f) "registry": push and pull of that SIF through the test registry against a plain HTTP PUT/GET of
    the same bytes on loopback (goal <= 1.5x), run by bench/bench_registry.py on it (needs the
    registry of .ci/services/registry.sh);
(g) "rebuild": the phase cache and reproducibility, side by side in one run, every build --no-lock (an
    edit re-locked would move other phases' pins: the lock's own issue, not the cache's): a cold build
    into an empty phase cache; the spec's last pip phase edited (its first package's pin moved) and
    built through that cache (goal: <= 0.3 of cold); the spec restored and built again from nothing
    (the SIF removed, the cache off): the two builds from nothing must have the same sha256.  All three
    on the local site with --compression (default gzip; gzip and zstd, the local site's own, go through
    envport's own squashfs writer, which reuses the compressed blocks of unchanged files; another
    compressor goes through mksquashfs, which compresses the whole tree on every build); where the edited
    build's time went, step by step, and the partition's size and the cold build's squashfs seconds beside
    part (d)'s mksquashfs of the same tree with the same compressor (with fragments).  Kept as "rebuild"
    for gzip, "rebuild_COMPRESSION" for another, so each compressor's run is kept.  Before
    this work, two builds of one spec differed in the header (UUID, times), inspect-metadata.json and
    envport-spec.json, the SBOM and the partition (every mtime, labels.json, every .pyc): BEFORE.

--parts picks some of (a)+(d) "build", (b) "present", (c) "witness", (e) "sign", (f) "registry"; the
results of parts not run are kept from --json's file. Runs in a throwaway
copy of the project, or in --project DIR (its envs reused: a present SIF
is not rebuilt unless "build" is asked for). Needs root, the docker engine
with envport/debian-bookworm:base, bwrap, squashfs-tools, squashfuse, ch-run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def envport(*args: str, root: Path, timeout: float = 3600,
            env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "ENVPORT_SIF_BUILDER": "envport", **(env or {})})
    return time.monotonic() - t0, proc


def squash(rootfs: Path, out: Path, comp: str) -> tuple[float, float]:
    t0 = time.monotonic()
    subprocess.run(["mksquashfs", str(rootfs), str(out), "-noappend", "-comp", comp, "-no-progress", "-quiet"],
                   check=True, capture_output=True)
    seconds = time.monotonic() - t0
    size = out.stat().st_size / 2**20
    out.unlink()
    return seconds, size


PARTS = ("build", "present", "witness", "sign", "registry", "rebuild")
BEFORE = ("header uuid, created, modified; Def.FILE (times); JSON.Generic inspect-metadata.json (the build-date "
          "labels); JSON.Generic envport-spec.json (the partition sha256); SBOM sbom.cdx.json (timestamp); FS "
          "partition (every file's mtime, /.singularity.d/labels.json, every .pyc): tiny-sif built twice at "
          "3b00f71 with `siftool list` and sif/compare.py")


def bench_script(script: str, spec: str, root: Path, *args: str) -> dict:
    """(e) and (f): bench/SCRIPT on the spec's SIF (built where absent), its --json numbers."""
    _, step = built(spec, "apptainer", root)
    with tempfile.TemporaryDirectory(prefix="envport-bench-") as tmp:
        result = Path(tmp) / "out.json"
        proc = subprocess.run([sys.executable, str(REPO / "bench" / script), "--sif", step["data"]["sif"],
                               "--json", str(result), *args], text=True)
        if proc.returncode != 0:
            raise SystemExit(f"bench/{script} exited {proc.returncode}")
        return json.loads(result.read_text())


def built(spec: str, target: str, root: Path, rebuild: bool = False) -> tuple[float, dict]:
    """`envport build SPEC --target TARGET --json` (present or built); its seconds and last step."""
    seconds, proc = envport("build", spec, "--target", target, "--json", *(["--rebuild"] if rebuild else []),
                            root=root)
    if proc.returncode != 0:
        raise SystemExit(f"envport build {spec} --target {target} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return seconds, json.loads(proc.stdout)["steps"][-1]


def bench_build(spec: str, root: Path) -> dict:
    """(a) and (d): the build with its phases, then bare mksquashfs gzip and zstd of the same rootfs."""
    _, last = built(spec, "apptainer", root, rebuild=True)
    timings, sif = last["data"]["timings"], Path(last["data"]["sif"])
    own = last["seconds"] - timings["bootstrap"] - timings["post"] - timings["squashfs"]
    shm = Path("/dev/shm") if shutil.disk_usage("/dev/shm").free > 8 << 30 else root
    rootfs = Path(tempfile.mkdtemp(prefix="envport-bench-rootfs-", dir=shm)) / "r"
    from envport.sif.gate import gate

    subprocess.run(["unsquashfs", "-no-progress", "-quiet", "-o", str(gate(sif).partition.offset), "-d", str(rootfs),
                    str(sif)], check=True, capture_output=True)
    try:
        gzip_s, gzip_mib = squash(rootfs, root / "g.sqfs", "gzip")
        zstd_s, zstd_mib = squash(rootfs, root / "z.sqfs", "zstd")
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(rootfs.parent)])
    return {"build": {"total_s": round(last["seconds"], 2), **timings, "envport_assembly_s": round(own, 2),
                      "bare_mksquashfs_gzip_s": round(gzip_s, 2),
                      "assembly_over_mksquashfs": round(own / gzip_s, 3)},
            "compression": {"gzip": {"s": round(gzip_s, 2), "MiB": round(gzip_mib, 1)},
                            "zstd": {"s": round(zstd_s, 2), "MiB": round(zstd_mib, 1)}}}


def _edit_last_phase(spec_file: Path) -> str:
    """Move the first pin of the spec's last pip phase (six==1.16.0 -> six==1.17.0 in demo-cpu); its text."""
    import yaml

    data = yaml.safe_load(spec_file.read_text())
    phase = data["pip_phases"][-1]
    packages = phase["packages"] if isinstance(phase, dict) else phase
    name, _, version = packages[0].partition("==")
    major, minor, *_ = version.split(".")
    packages[0] = f"{name}=={major}.{int(minor) + 1}.0"
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    return packages[0]


def _timed_build(spec: str, root: Path, env: dict, site: str) -> dict:
    seconds, proc = envport("build", spec, "--target", "apptainer", "--json", "--rebuild", "--no-lock", "--site",
                            site, root=root, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"envport build {spec} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    last = json.loads(proc.stdout)["steps"][-1]
    from envport.plan.lock import sha256_file

    from envport.sif.gate import gate

    return {"s": round(seconds, 2), "timings": last["data"]["timings"], "sha256": sha256_file(last["data"]["sif"]),
            "sif": last["data"]["sif"], "squashfs": last["data"].get("squashfs", {}),
            "partition_bytes": gate(Path(last["data"]["sif"])).partition.size}


def _site_with(root: Path, compression: str) -> str:
    """A site of ROOT's project: the local one, its SIFs squashed with COMPRESSION; its --site name."""
    import yaml

    data = yaml.safe_load((root / "sites" / "local.yaml").read_text())
    name = f"bench-squash-{compression}"
    data.update(name=name, apptainer={**data.get("apptainer", {}), "compression": compression})
    (root / "sites" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return name


def rebuild_key(compression: str) -> str:
    return "rebuild" if compression == "gzip" else f"rebuild_{compression}"


def bench_rebuild(spec: str, root: Path, compression: str) -> dict:
    """(g): cold into an empty cache, the last phase edited through it, cold again from nothing; the local
    site with COMPRESSION (gzip, zstd: envport's own writer, which reuses the blocks of unchanged files; any
    other goes through mksquashfs, which compresses the whole tree on every build)."""
    site = _site_with(root, compression)
    wheels = root / ".cache" / "wheelhouse"
    if wheels.is_symlink():  # the edit downloads a wheel: into the bench's own copy, never the checkout's
        target = wheels.resolve()
        wheels.unlink()
        shutil.copytree(target, wheels)
    spec_file = root / "specs" / f"{spec}.yaml"
    original = spec_file.read_text()
    with tempfile.TemporaryDirectory(prefix="envport-bench-cache-", dir="/dev/shm") as cache:
        env = {"ENVPORT_SIF_PHASE_CACHE": cache, "ENVPORT_SIF_PHASE_CACHE_MAX": "64G"}
        cold = _timed_build(spec, root, env, site)
        edit = _edit_last_phase(spec_file)
        edited = _timed_build(spec, root, env, site)
    spec_file.write_text(original)
    kept = root / "cold.sif"
    os.replace(cold["sif"], kept)  # the next build writes the same name: from nothing, the cache off
    again = _timed_build(spec, root, {"ENVPORT_SIF_PHASE_CACHE": "off"}, site)
    from envport.sif.compare import compare_sifs

    differs = [] if again["sha256"] == cold["sha256"] else list(compare_sifs(kept, again["sif"]).objects)
    kept.unlink()
    return {rebuild_key(compression): {"compression": compression, "cold_s": cold["s"], "cold_timings": cold["timings"],
                        "edit": edit,
                        "edited_s": edited["s"], "edited_timings": edited["timings"],
                        "cold_squashfs": cold["squashfs"], "edited_squashfs": edited["squashfs"],
                        "partition_MiB": round(cold["partition_bytes"] / 2**20, 1),
                        "edit_over_cold": round(edited["s"] / cold["s"], 3),
                        "cold_again_s": again["s"], "cold_again_timings": again["timings"],
                        "edit_over_cold_again": round(edited["s"] / again["s"], 3),
                        "cold_sha256": cold["sha256"], "cold_again_sha256": again["sha256"],
                        "same_sha256": cold["sha256"] == again["sha256"], "objects_differing": differs,
                        "before": BEFORE, "load_1min_after": os.getloadavg()[0]}}


def bench_present(spec: str, root: Path, repeat: int) -> dict:
    """(b): a no-op build of the present SIF (the builder call in-process: its one stat against this machine's
    build record; the whole CLI), beside what a file without that record costs (its content checked, as
    for a SIF in a shared sif_dir) and `envport inspect` of the same SIF, alternating --repeat times."""
    sif = built(spec, "apptainer", root)[1]["data"]["sif"]
    sys.path.insert(0, str(REPO / "src"))
    from envport.builders.apptainer import builder, sif_content
    from envport.core.progress import quiet
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.spec.loader import load_spec

    loaded, site = load_spec(spec, root), load_site(None, root)
    resolved = resolve(loaded, site, "apptainer")
    t0 = time.monotonic()
    res = builder.build(loaded, site, root, progress=quiet)
    call_s = time.monotonic() - t0
    cli, inspect, content = [], [], []
    for _ in range(repeat):
        cli.append(envport("build", spec, "--target", "apptainer", root=root)[0])
        seconds, proc = envport("inspect", sif, root=root)
        inspect.append(seconds)
        t0 = time.monotonic()
        ok, why = sif_content.content_matches(sif, resolved.hash, resolved.plan, loaded.spec.python)
        content.append(time.monotonic() - t0)
    cli_s, inspect_s, content_s = (statistics.median(x) for x in (cli, inspect, content))
    return {"present": {"verdict": res[-1].verdict.value, "builder_call_s": round(call_s, 4),
                        "cli_process_s": round(cli_s, 3), "cli_runs_s": [round(x, 3) for x in cli],
                        "content_check_s": round(content_s, 2), "content_ok": ok, "content_why": why,
                        "inspect_s": round(inspect_s, 2), "inspect_rc": proc.returncode,
                        "inspect_runs_s": [round(x, 2) for x in inspect],
                        "inspect_over_noop": round(inspect_s / cli_s, 1),
                        "content_check_over_noop": round(content_s / cli_s, 1),
                        "sif_bytes": os.path.getsize(sif)}}


def bench_witness(spec: str, root: Path, repeat: int, sif: str | None = None, image: str | None = None) -> dict:
    """(c): `envport witness` in the SIF and in docker, alternating; medians and their ratio. As root the
    SIF runs twice a round: on the kernel's loop mount (the default there) and on squashfuse (the
    unprivileged route, ENVPORT_SIF_MOUNT=squashfuse): "witness" and "witness_squashfuse"."""
    from envport.sif import run as sif_run

    sif = sif or built(spec, "apptainer", root)[1]["data"]["sif"]
    image = image or built(spec, "docker", root)[1]["data"]["image"]
    runs = {"sif": (["--target", "apptainer", "--sif", sif], {})}
    if sif_run.runtime() == "ch-run" and sif_run.mount_kind() == "kernel":
        runs["squashfuse"] = (runs["sif"][0], {"ENVPORT_SIF_MOUNT": "squashfuse"})
    runs["docker"] = (["--target", "docker", "--image", image], {})
    times: dict[str, list[float]] = {k: [] for k in runs}
    rcs: dict[str, list[int]] = {k: [] for k in runs}
    for _ in range(repeat):
        for kind, (extra, env) in runs.items():
            seconds, proc = envport("witness", spec, *extra, "--no-ledger", root=root, env=env)
            if proc.returncode != 0:
                print(f"witness in {kind} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            times[kind].append(round(seconds, 2))
            rcs[kind].append(proc.returncode)
    load = round(os.getloadavg()[0], 2)
    dock_s = statistics.median(times["docker"])
    out = {}
    for kind in runs:
        if kind == "docker":
            continue
        mount = "squashfuse" if kind == "squashfuse" else sif_run.mount_kind()
        how = "kernel squashfs" if mount == "kernel" else sif_run.squashfuse()
        ok = set(rcs[kind]) == {0} and set(rcs["docker"]) == {0}
        sif_s = statistics.median(times[kind])
        out["witness" if kind == "sif" else "witness_squashfuse"] = {
            "runtime": sif_run.runtime() + ("" if sif_run.runtime() == "apptainer" else f" ({how}, one mount per run)"),
            "sif_s": sif_s, "docker_s": dock_s, "sif_runs_s": times[kind], "docker_runs_s": times["docker"],
            "sif_rc": max(rcs[kind]), "docker_rc": max(rcs["docker"]), "load_1min_after": load,
            "ratio": round(sif_s / dock_s, 3) if ok else None,
            "ratio_of_minima": round(min(times[kind]) / min(times["docker"]), 3) if ok else None}
    return out


def report(out: dict, parts: list[str]) -> None:
    if "build" in parts:
        b, c = out["build"], out["compression"]
        print(f"(a) SIF build {b['total_s']:.1f}s: bootstrap {b['bootstrap']:.1f}s, %post {b['post']:.1f}s, "
              f"squashfs {b.get('squashfs', b.get('mksquashfs', 0)):.1f}s, envport's own assembly "
              f"{b['envport_assembly_s']:.1f}s; "
              f"bare mksquashfs of the same rootfs {b['bare_mksquashfs_gzip_s']:.1f}s: assembly adds "
              f"{100 * b['assembly_over_mksquashfs']:.1f} % (goal <= 10 %)")
    if "present" in parts:
        p = out["present"]
        print(f"(b) present: builder call {p['builder_call_s']:.3f}s, whole CLI {p['cli_process_s']:.3f}s "
              f"(goal <= 0.1 s) [{p['verdict']}]; a file without this machine's record, its content checked: "
              f"{p['content_check_s']:.2f}s ({p['content_check_over_noop']}x the no-op); envport inspect "
              f"{p['inspect_s']:.2f}s ({p['inspect_over_noop']}x the no-op, exit {p['inspect_rc']}) of "
              f"{p['sif_bytes'] / 1e9:.2f} GB")
    for key in ("witness", "witness_squashfuse"):
        if "witness" not in parts or key not in out:
            continue
        w = out[key]
        ratio = f"{w['ratio']:.2f}x" if w["ratio"] is not None else "n/a (a witness run failed)"
        minima = f", of the minima {w['ratio_of_minima']:.2f}x" if w["ratio_of_minima"] is not None else ""
        print(f"(c) witnesses ({w['runtime']}): SIF median {w['sif_s']:.1f}s {w['sif_runs_s']}, docker median "
              f"{w['docker_s']:.1f}s {w['docker_runs_s']}: {ratio}{minima} (goal <= 1.0x; load "
              f"{w['load_1min_after']})")
    if "sign" in parts:
        g = out["sign"]
        print(f"(e) sign {g['median']['sign']:.2f}s ({g['ratio_to_sha256sum']['sign']:.2f}x sha256sum), verify-sig "
              f"{g['median']['verify-sig']:.2f}s ({g['ratio_to_sha256sum']['verify-sig']:.2f}x), sha256sum "
              f"{g['median']['sha256sum']:.2f}s of {g['bytes'] / 2**20:.0f} MiB (goal <= {g['goal']}x)")
    if "registry" in parts:
        r = out["registry"]
        print(f"(f) push {r['push_ratio']:.2f}x a plain HTTP PUT, pull {r['pull_ratio']:.2f}x a plain GET of "
              f"{r['bytes'] / 2**20:.0f} MiB (goal <= {r['goal']}x; vs curl to the registry: push "
              f"{r['push_vs_curl']:.2f}x, pull {r['pull_vs_curl']:.2f}x)")
    if "rebuild" in parts:
        for key in sorted(k for k in out if k == "rebuild" or k.startswith("rebuild_")):
            report_rebuild(out[key], out.get("compression", {}))
    if "build" in parts:
        c = out["compression"]
        print(f"(d) gzip {c['gzip']['s']:.1f}s {c['gzip']['MiB']:.0f} MiB; zstd {c['zstd']['s']:.1f}s "
              f"{c['zstd']['MiB']:.0f} MiB")


def report_rebuild(r: dict, bare: dict) -> None:
    """(g) of one compressor, beside part (d)'s bare mksquashfs of the same compressor (BARE)."""
    comp = r.get("compression", "gzip")
    squashed = r.get("edited_squashfs", {})
    print(f"(g) [{comp}] cold SIF build {r['cold_s']:.1f}s into an empty phase cache (squashfs "
          f"{r['cold_timings'].get('squashfs', 0):.1f}s); last phase edited ({r['edit']}) through it "
          f"{r['edited_s']:.1f}s: {r['edit_over_cold']:.2f} of cold (goal <= 0.3; where it went: "
          f"{', '.join(f'{k} {v}' for k, v in sorted(r['edited_timings'].items()))}; squashfs blocks "
          f"{squashed.get('blocks_compressed')} compressed, {squashed.get('blocks_reused')} reused); cold again "
          f"from nothing (cache off) "
          f"{r['cold_again_s']:.1f}s ({r['edit_over_cold_again']:.2f}); two builds from nothing: sha256 "
          f"{'equal' if r['same_sha256'] else 'DIFFERENT'} ({r['cold_sha256'][:16]}..., "
          f"{r['cold_again_sha256'][:16]}...); before this work they differed in: {r['before']}")
    writer = "envport's writer, no fragments" if r.get("cold_squashfs") else "mksquashfs"
    same = bare.get(comp, {})
    again = r.get("cold_again_timings", {}).get("squashfs")
    print(f"(g) [{comp}] the partition ({writer}) {r['partition_MiB']:.1f} MiB, the cold builds' squashfs "
          f"{r['cold_timings'].get('squashfs', 0):.1f}s" + (f" and {again:.1f}s" if again else "")
          + (f"; bare mksquashfs -comp {comp} with fragments, part (d): {same['MiB']:.1f} MiB "
             f"({100 * (r['partition_MiB'] / same['MiB'] - 1):+.1f} %), {same['s']:.1f}s" if same else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="demo-cpu")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--project", default=None, help="run in this project (default: a throwaway copy)")
    ap.add_argument("--repeat", type=int, default=3, help="witness runs per target, alternating")
    ap.add_argument("--sif", default=None, help="witness: this SIF (default: the spec's, built where absent)")
    ap.add_argument("--image", default=None, help="witness: this docker image (default: the spec's, built where absent)")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "sif.json"))
    ap.add_argument("--compression", default="gzip", help="rebuild: the SIFs' squashfs compressor (default gzip; "
                    "gzip and zstd, the local site's, go through envport's own writer, others through mksquashfs)")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    path = Path(args.json)
    out: dict = json.loads(path.read_text()) if path.is_file() else {}
    out["spec"] = args.spec
    with contextlib.ExitStack() as stack:
        if args.project:
            root = Path(args.project).absolute()
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="envport-bench-sif-")))
            for d in ("specs", "sites", "images"):
                shutil.copytree(REPO / d, root / d)
            (root / ".cache").mkdir()
            wheelhouse = REPO / ".cache" / "wheelhouse"
            if wheelhouse.is_dir():
                (root / ".cache" / "wheelhouse").symlink_to(wheelhouse)
        if "build" in parts:
            out.update(bench_build(args.spec, root))
        if "present" in parts:
            out.update(bench_present(args.spec, root, args.repeat))
        if "witness" in parts:
            out.update(bench_witness(args.spec, root, args.repeat, args.sif, args.image))
        if "sign" in parts:
            out["sign"] = bench_script("bench_sign.py", args.spec, root, "--repeat", str(max(args.repeat, 3)))
        if "registry" in parts:
            out["registry"] = bench_script("bench_registry.py", args.spec, root, "--runs", str(args.repeat))
        if "rebuild" in parts:
            out.update(bench_rebuild(args.spec, root, args.compression))
    report(out, parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
