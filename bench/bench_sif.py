"""SIF build, present, witness and compression costs, measured side by side in one run.

    python bench/bench_sif.py [--spec demo-cpu] [--skip-build] [--json bench/results/sif.json]

(a) `envport build demo-cpu --target apptainer --rebuild` with envport's .def
    builder, its phases as the build reports them; envport's own assembly
    (metadata, SIF writing, cleanup: everything but bootstrap, %post and
    mksquashfs) against a bare `mksquashfs` of the same rootfs (goal <= 10 %);
(b) a no-op build of the present SIF: the builder call and the whole CLI
    process (goal <= 0.1 s);
(c) the witness suite inside the SIF (ch-run, or apptainer where installed)
    against the same suite in docker (goal <= 1.0x), when the docker image
    of the same hash exists;
(d) mksquashfs -comp gzip vs -comp zstd of that rootfs: seconds and MiB.

Runs in a throwaway copy of the project; needs root, the docker engine with
envport/debian-bookworm:base, bwrap, squashfs-tools, squashfuse, ch-run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def envport(*args: str, root: Path, timeout: float = 3600) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "envport", "-C", str(root), *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "ENVPORT_SIF_BUILDER": "envport"})
    return time.monotonic() - t0, proc


def squash(rootfs: Path, out: Path, comp: str) -> tuple[float, float]:
    t0 = time.monotonic()
    subprocess.run(["mksquashfs", str(rootfs), str(out), "-noappend", "-comp", comp, "-no-progress", "-quiet"],
                   check=True, capture_output=True)
    seconds = time.monotonic() - t0
    size = out.stat().st_size / 2**20
    out.unlink()
    return seconds, size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="demo-cpu")
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "sif.json"))
    args = ap.parse_args()
    out: dict = {"spec": args.spec}
    with tempfile.TemporaryDirectory(prefix="envport-bench-sif-") as tmp:
        root = Path(tmp)
        for d in ("specs", "sites", "images"):
            shutil.copytree(REPO / d, root / d)
        # (a) the build, then a bare mksquashfs of the same rootfs (unpacked from the SIF's partition)
        seconds, proc = envport("build", args.spec, "--target", "apptainer", "--rebuild", "--json", root=root)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            return 1
        last = json.loads(proc.stdout)["steps"][-1]
        timings, sif = last["data"]["timings"], Path(last["data"]["sif"])
        own = last["seconds"] - timings["bootstrap"] - timings["post"] - timings["mksquashfs"]
        shm = Path("/dev/shm") if shutil.disk_usage("/dev/shm").free > 8 << 30 else root
        rootfs = Path(tempfile.mkdtemp(prefix="envport-bench-rootfs-", dir=shm)) / "r"
        from envport.engines.sif_run import partition_offset

        subprocess.run(["unsquashfs", "-no-progress", "-quiet", "-o", str(partition_offset(sif)), "-d", str(rootfs),
                        str(sif)], check=True, capture_output=True)
        try:
            gzip_s, gzip_mib = squash(rootfs, root / "g.sqfs", "gzip")
            zstd_s, zstd_mib = squash(rootfs, root / "z.sqfs", "zstd")
        finally:
            subprocess.run(["rm", "-rf", "--one-file-system", str(rootfs.parent)])
        out["build"] = {"total_s": round(last["seconds"], 2), **timings, "envport_assembly_s": round(own, 2),
                        "bare_mksquashfs_gzip_s": round(gzip_s, 2),
                        "assembly_over_mksquashfs": round(own / gzip_s, 3)}
        out["compression"] = {"gzip": {"s": round(gzip_s, 2), "MiB": round(gzip_mib, 1)},
                              "zstd": {"s": round(zstd_s, 2), "MiB": round(zstd_mib, 1)}}
        # (b) no-op present: in-process builder call and the whole CLI
        sys.path.insert(0, str(REPO / "src"))
        from envport.build.apptainer import builder
        from envport.core.progress import quiet
        from envport.plan.site import load_site
        from envport.spec.loader import load_spec

        loaded, site = load_spec(args.spec, root), load_site(None, root)
        t0 = time.monotonic()
        res = builder.build(loaded, site, root, progress=quiet)
        call_s = time.monotonic() - t0
        cli_s, proc = envport("build", args.spec, "--target", "apptainer", root=root)
        out["present"] = {"verdict": res[-1].verdict.value, "builder_call_s": round(call_s, 4),
                          "cli_process_s": round(cli_s, 3)}
        # (c) witnesses in the SIF vs docker
        sif_s, proc = envport("witness", args.spec, "--target", "apptainer", "--no-ledger", root=root)
        dock_s, dproc = envport("witness", args.spec, "--target", "docker", "--no-ledger", root=root)
        out["witness"] = {"sif_s": round(sif_s, 2), "sif_rc": proc.returncode, "docker_s": round(dock_s, 2),
                          "docker_rc": dproc.returncode,
                          "ratio": round(sif_s / dock_s, 3) if dproc.returncode == 0 else None}
    b, c, p, w = out["build"], out["compression"], out["present"], out["witness"]
    print(f"(a) SIF build {b['total_s']:.1f}s: bootstrap {b['bootstrap']:.1f}s, %post {b['post']:.1f}s, "
          f"mksquashfs {b['mksquashfs']:.1f}s, envport's own assembly {b['envport_assembly_s']:.1f}s; "
          f"bare mksquashfs of the same rootfs {b['bare_mksquashfs_gzip_s']:.1f}s: assembly adds "
          f"{100 * b['assembly_over_mksquashfs']:.1f} % (goal <= 10 %)")
    print(f"(b) present: builder call {p['builder_call_s']:.3f}s, whole CLI {p['cli_process_s']:.3f}s "
          f"(goal <= 0.1 s) [{p['verdict']}]")
    ratio = f"{w['ratio']:.2f}x" if w["ratio"] is not None else "n/a (docker witness failed or image absent)"
    print(f"(c) witnesses: SIF {w['sif_s']:.1f}s (rc {w['sif_rc']}), docker {w['docker_s']:.1f}s "
          f"(rc {w['docker_rc']}): {ratio} (goal <= 1.0x)")
    print(f"(d) gzip {c['gzip']['s']:.1f}s {c['gzip']['MiB']:.0f} MiB; zstd {c['zstd']['s']:.1f}s "
          f"{c['zstd']['MiB']:.0f} MiB")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
