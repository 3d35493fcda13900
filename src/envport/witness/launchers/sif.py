"""Run witnesses inside a SIF: `apptainer exec --cleanenv [--nv] --bind ...` where apptainer is
installed, else Charliecloud's `ch-run` on the SIF mounted with squashfuse (sif/run.py).

- a witness run on this host (`envport witness`: `run_witnesses` holds the
  launcher's `session()`): the SIF is mounted ONCE, at
  `$TMPDIR/envport-sif-<run>-XXXXXX/rootfs` (/tmp without TMPDIR), and every call
  runs `ch-run` on that mount, so torch's libraries are read through FUSE
  and decompressed once per run, not once per call (bench/bench_sif.py:
  2.13x docker's time with a mount per call). Unmounted and removed at the end, also on an error, Ctrl-C or SIGTERM
  (turned into an interrupt while the mount is held); a SIGKILLed envport
  leaves nothing either (sif/run.py `mounted`: the holder dies with
  it, auto_unmount).
- the SIF goes through the trust gate and inspect's content checks first
  (`preflight`: sif_inspect.admitted), and every mount in this process is of
  the open file the gate judged (sif_run.mounted), never of the path again.
- outside a session (srun: one task per rank, on whichever node runs it) each
  call goes through one small bash wrapper and is self-contained: it opens
  the SIF's path on fd 3, goes on only when that is the file the gate judged
  (inode, size and ctime: sif/handle.py `identity`; a file renamed over the
  name, or written since, is refused), and mounts fd 3 itself
  at `rootfs` in a fresh 0700 `/tmp/envport-sif-<run>-XXXXXX` (a directory
  per call: two ranks on one node never share a mount), run, and unmount on
  the way out, also on SIGTERM/SIGINT/SIGHUP (a timeout, Ctrl-C, scancel);
  squashfuse runs with auto_unmount, so a squashfuse killed outright is
  unmounted too, and the Invocation's cleanup (and the batch script's EXIT
  trap) runs `sif_run.SWEEP_FN`: the mounts of this run that
  /proc/self/mountinfo lists under such a directory of this user's, never a
  glob, never through a symlink.
- every mount is `ro,nosuid,nodev` (sif_run.MOUNT_OPTIONS).
- both: the variables a launcher sets per rank (RANK, LOCAL_RANK, WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT; srun's wrapper exports them) are passed into the
  clean environment (`--set-env` for ch-run, `APPTAINERENV_*` for apptainer).

The witness folder is bound read-only at /mnt (ch-run can only bind onto a
directory the read-only image has), the weights read-only at the spec's paths
(ch-run under bwrap: sif_run.ch_run_argv).
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import uuid
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

from dataclasses import replace

from envport.core.proc import sigterm_interrupts
from envport.core.untrusted import shown
from envport.core.verdict import StepResult, Verdict
from envport.sif import run as sif_run
from envport.sif.handle import SifError
from envport.witness.launchers.base import WITNESS_DIR, Invocation, Launcher

PASS_THROUGH = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MNT = "@ENVPORT-SIF-MOUNT@"

# $1 runtime, $2 sif, $3 squashfuse's -o (sif_run.squashfuse_options), $4 where the mounts go (`task_mounts`),
# $5 the identity the gate judged (inode:size:ctime); then the runtime's argv (MNT stands for the mount).
TASK = r"""set -u
kind=$1 sif=$2 options=$3 base=$4 judged=$5; shift 5
for v in RANK LOCAL_RANK WORLD_SIZE MASTER_ADDR MASTER_PORT; do
  eval "val=\${$v-}"
  [ -n "$val" ] || continue
  if [ "$kind" = apptainer ]; then export "APPTAINERENV_$v=$val"; else pass="${pass-} --set-env=$v=$val"; fi
done
# The file opened once, here, and used only if it is the one the gate judged: a file renamed over the name
# after the check, or written since, is refused (exit 3), and the mount below reads this descriptor.
exec 3<"$sif" || { echo "envport-sif: cannot open $sif on $(hostname)" >&2; exit 3; }
now=$(stat -L -c '%i:%s:%.9Z' /proc/self/fd/3)
if [ "$now" != "$judged" ]; then
  echo "envport-sif: REFUSED [sif_changed] $sif on $(hostname) is not the file the trust gate judged" \
       "(inode:size:ctime $now, judged $judged): nothing was mounted or run" >&2
  exit 3
fi
if [ "$kind" = apptainer ]; then
  for a do shift; if [ "$a" = "$sif" ]; then set -- "$@" /proc/self/fd/3; else set -- "$@" "$a"; fi; done
  exec "$@"
fi
USER=${USER:-$(id -un)}  # ch-run refuses to start without it (batch jobs and CI have none)
export USER
# mktemp -d: a new 0700 directory of ours (another user can neither reach the image nor swap the mount point).
dir=$(mktemp -d "${base}XXXXXX") || exit 3
mnt=$dir/rootfs
cleanup() { { fusermount -u "$mnt" || umount "$mnt"; } 2>/dev/null; rmdir "$mnt" "$dir" 2>/dev/null; }
trap cleanup EXIT
mkdir -m 700 "$mnt" || exit 3
trap 'exit 143' TERM INT HUP
sq=$(command -v squashfuse_ll || command -v squashfuse) || { echo "envport-sif: no squashfuse on $(hostname)" >&2; exit 3; }
"$sq" -o "$options" /proc/self/fd/3 "$mnt" || { echo "envport-sif: $sq of $sif failed on $(hostname)" >&2; exit 3; }
n=0
until mountpoint -q "$mnt"; do n=$((n+1)); [ "$n" -lt 200 ] || exit 3; sleep 0.05; done
# The mount point replaces its placeholder, the rank's variables go just before it (after --unset-env).
for a do
  shift
  # shellcheck disable=SC2086
  if [ "$a" = '@ENVPORT-SIF-MOUNT@' ]; then set -- "$@" ${pass-} "$mnt"; else set -- "$@" "$a"; fi
done
"$@"
"""


class SifLauncher(Launcher):
    name = "apptainer"

    def __init__(self, sif: Path, python: str = "python3", gpus: bool = False,
                 mounts: Sequence[tuple[str, str]] = (), witness_dir: Path = WITNESS_DIR,
                 runtime: Optional[str] = None, missing_fix: str = ""):
        self.sif = Path(sif).absolute()
        self.python = python  # on the image's PATH once its env scripts ran (the venv comes first)
        self.gpus = gpus
        self.mounts = list(mounts)  # (host folder, path in the env): the weights, read-only
        self.witness_dir = Path(witness_dir)
        self.runtime = runtime or sif_run.runtime()
        self.missing_fix = missing_fix or "envport build NAME --target apptainer, or pass --sif FILE"
        self.prefix = f"{sif_run.MOUNT_PREFIX}{uuid.uuid4().hex[:10]}"
        self._gated = None  # the SIF through the trust gate (sif/gate.py), once preflight admitted it
        self._mnt: Optional[str] = None  # the run's one mount, while session() holds it

    def witness_path(self, script: str) -> str:
        return f"{sif_run.WITNESS_MOUNT}/{script}"

    def _binds(self) -> list[tuple[str, str]]:
        return [(str(self.witness_dir), sif_run.WITNESS_MOUNT)] + self.mounts

    def gated(self):
        """The SIF through the gate and inspect's content checks (`preflight` asks first; a call before it
        raises what the gate raises: SifError, TrustRefused)."""
        refused = self._admit()
        if refused is not None:
            raise SifError(refused.reason or "sif_refused", refused.detail)
        return self._gated

    def _admit(self) -> Optional[StepResult]:
        """None once the SIF passed the gate and inspect's content checks (kept: asked once a run), else the
        StepResult that refuses it."""
        if self._gated is None:
            from envport.sif.report import admitted

            checked = admitted(self.sif, step="launcher", fix=self.missing_fix)
            if isinstance(checked, StepResult):
                return checked
            self._gated = checked[0]
        return None

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """The SIF mounted once for the calls made meanwhile (ch-run only; raises sif_run.MountError)."""
        if self.runtime == "apptainer" or self._mnt is not None:
            yield
            return
        with sigterm_interrupts(), sif_run.mounted(self.gated(), prefix=f"{self.prefix}-") as mnt:
            self._mnt = str(mnt)
            try:
                yield
            finally:
                self._mnt = None

    def invocation(self, script: str, args: Sequence[str], env: Mapping[str, str]) -> Invocation:
        cmd = [self.python, self.witness_path(script), *args]
        if self._mnt is not None:
            return Invocation(sif_run.ch_run_argv(self._mnt, cmd, env=env, binds=self._binds()),
                              env=sif_run.ch_run_env(), label=self._mnt)
        gated = self.gated()
        if self.runtime == "apptainer":
            # The task reopens the path (another node cannot share this process's descriptor): TASK checks
            # it is the judged file and hands apptainer its fd 3 in place of the name.
            inner = sif_run.apptainer_argv(gated, cmd, env=env, nv=self.gpus, image=str(self.sif),
                                           binds=[(s, d, True) for s, d in self._binds()])
            options = ""
        else:
            inner = sif_run.ch_run_argv(MNT, cmd, env=env, binds=self._binds())
            options = sif_run.squashfuse_options(gated.partition.offset)
        argv = ["bash", "-c", TASK, "envport-sif", self.runtime, str(self.sif), options, self.task_mounts(),
                gated.file.identity, *inner]
        return Invocation(argv, env=sif_run.ch_run_env(), cleanup=[self.sweep_argv()], label=self.prefix)

    def task_mounts(self) -> str:
        """Where the per-call wrapper's mounts go: this path + XXXXXX, a 0700 directory, its `rootfs`."""
        return f"/tmp/{self.prefix}-"

    def sweep_line(self) -> str:
        """The shell line that unmounts what this launcher's per-call wrappers left (after SWEEP_FN)."""
        return f"envport_sif_sweep {shlex.quote(self.task_mounts())}"

    def sweep_argv(self) -> list[str]:
        return ["bash", "-c", f"{sif_run.SWEEP_FN}\n{self.sweep_line()}"]

    def preflight(self) -> Optional[StepResult]:
        refused = self._admit()
        if refused is not None:
            return replace(refused, detail=shown(refused.detail))
        absent = sif_run.missing_tools(self.runtime)
        if self.runtime == "ch-run" and shutil.which("mountpoint") is None:
            absent.append("mountpoint (util-linux)")
        if absent:
            pkgs = " ".join(t.split("(")[1].rstrip(")") for t in absent)
            return StepResult("launcher", Verdict.REFUSED, f"{', '.join(absent)} not found: witnesses run in "
                              "the SIF with ch-run where apptainer is absent", reason="missing_tool",
                              lines=[f"fix: apt-get install {pkgs}"])
        return None

    def describe(self) -> str:
        how = "apptainer exec --cleanenv" + (" --nv" if self.gpus else "") if self.runtime == "apptainer" \
            else f"ch-run ({sif_run.access_label()})"
        return f"{how} {self.sif.name}"

