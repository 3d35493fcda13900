"""Witness: torch.distributed collectives and a DTensor round trip, hang-proof.

Two ways to run, same checks and sentinel lines:

  spawn     python dist.py --world-size 4 --checks collectives,dtensor --mesh 2,2
            This process picks one free port, starts the ranks with
            torch.multiprocessing (join=False) and watches them against a
            deadline.  A rank that dies ends the others at once; a group that
            outlives the deadline has EVERY rank's Python stack dumped
            (faulthandler on SIGUSR1) before it is killed.
  external  RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT/LOCAL_RANK (or Slurm's
            SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID) are already set by the
            launcher (srun, torchrun, a test): run just this rank.  A watchdog
            dumps this rank's stack and exits when the deadline passes, and
            SIGTERM (scancel, srun's kill) dumps it too.

Checks, each against exact analytic values on every rank (small integers in
float32 are exact under any reduction order):
  collectives  batch_isend_irecv ring (send/recv order by rank parity), all_reduce,
               all_gather (list form and the flat-tensor API this torch has),
               reduce_scatter (list form and flat), then a barrier.
  dtensor      init_device_mesh on the spec's mesh (1-D or square 2-D), Shard(0) /
               Shard(1) placements: to_local shapes and values, full_tensor round trip.

gloo on CPU, NCCL on GPUs (one rank a GPU: before NCCL starts, every rank
puts its GPU's UUID in the rendezvous store, and two ranks on one GPU fail with
the ranks, the GPU and the fix instead of NCCL's "Duplicate GPU detected").
Timeouts fire in order: the NCCL process groups' (DeviceMesh sub-groups too),
with TORCH_NCCL_BLOCKING_WAIT, well inside the group deadline, so a hang is an
error on the rank's sentinel line before the deadline dumps the stacks.
stdlib + torch only: this file is bind-mounted into built envs.
"""

import argparse
import datetime
import faulthandler
import inspect
import json
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings

# The deadline counts from here, so the parent's own `import torch` is inside it.
T_START = time.time()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envport_sentinel import WITNESS_ENV, emit, faults, free_port  # noqa: E402

CHUNK = 4  # elements each rank contributes; small, so a mismatch prints whole


def _install_stack_dumps(stack_file):
    # faulthandler writes from the signal handler itself, so it works while the
    # main thread is stuck inside a C++ collective.  SIGTERM chains to the
    # default action: dump, then die as asked.
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
    faulthandler.register(signal.SIGTERM, file=stack_file, all_threads=True, chain=True)


def _injected_hang(rank):
    # Test-only (ENVPORT_WITNESS_FAULT=hang:R): this frame is what the dump must show.
    sys.stderr.write("rank %d: injected hang\n" % rank)
    sys.stderr.flush()
    while True:
        time.sleep(1)


def _short(t):
    vals = t.detach().to("cpu").flatten().tolist()
    return vals[:16] + (["..."] if len(vals) > 16 else [])


class Checker:
    """Records each op: ok, the API used, and for a mismatch expected vs got."""

    def __init__(self, torch, rank, fault_list):
        self.torch = torch
        self.rank = rank
        self.ops = []
        self.wrong = {arg or "all_reduce" for kind, r, arg in fault_list if kind == "wrong" and r == rank}

    def check(self, op, got, expected, api=None, caught=()):
        if op in self.wrong:
            got = got + 1  # test-only: this rank reports a wrong value
        entry = {"op": op, "api": api or op}
        if tuple(got.shape) != tuple(expected.shape):
            entry.update(ok=False, expected_shape=list(expected.shape), got_shape=list(got.shape))
        elif not self.torch.equal(got.to("cpu"), expected.to("cpu")):
            entry.update(ok=False, expected=_short(expected), got=_short(got))
        else:
            entry["ok"] = True
        if caught:
            entry["warnings"] = ["%s: %s" % (w.category.__name__, w.message) for w in caught]
        self.ops.append(entry)

    def skip(self, op, why):
        self.ops.append({"op": op, "ok": True, "skipped": why})

    @property
    def failures(self):
        return [o for o in self.ops if not o["ok"]]


def _first_api(dist, names):
    for name in names:
        fn = getattr(dist, name, None)
        if fn is not None:
            return name, fn
    return None, None


def _unsupported(exc):
    text = str(exc).lower()
    return any(s in text for s in ("does not support", "not supported", "not implemented", "unsupported"))


def run_collectives(torch, dist, rank, world, device, chk):
    # Over 80 lines on purpose: each collective is one record() call beside its analytic expected
    # value, read top to bottom in the order the ranks run them; split up, the order every rank must
    # share (a collective called out of order hangs the group) would hide across functions.
    def val(r):  # what rank r contributes
        return torch.full((CHUNK,), float(r + 1), device=device)

    def record(op, fn, expected_fn, api=None):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = fn()
        chk.check(op, got, expected_fn(), api=api, caught=caught)

    # Ring P2P.  Even ranks post send then recv, odd ranks recv then send, so
    # paired ranks never both block on send when a backend serializes them.
    if world > 1:
        def ring():
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            recv = torch.empty(CHUNK, device=device)
            send_op = dist.P2POp(dist.isend, val(rank) * 10, nxt)
            recv_op = dist.P2POp(dist.irecv, recv, prv)
            for work in dist.batch_isend_irecv([send_op, recv_op] if rank % 2 == 0 else [recv_op, send_op]):
                work.wait()
            return recv
        record("ring_p2p", ring, lambda: val((rank - 1) % world) * 10, api="batch_isend_irecv")
    else:
        chk.skip("ring_p2p", "world size 1 has no peer")

    def all_reduce():
        t = val(rank)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t
    record("all_reduce", all_reduce, lambda: torch.full((CHUNK,), world * (world + 1) / 2.0, device=device))

    gathered = lambda: torch.cat([val(r) for r in range(world)])  # noqa: E731

    def all_gather_list():
        outs = [torch.empty(CHUNK, device=device) for _ in range(world)]
        dist.all_gather(outs, val(rank))
        return torch.cat(outs)
    record("all_gather", all_gather_list, gathered)

    # The flat API was renamed over releases (_all_gather_base ->
    # all_gather_into_tensor -> all_gather_single); use the newest present so a
    # deprecated name never prints a FutureWarning.
    name, fn = _first_api(dist, ("all_gather_single", "all_gather_into_tensor", "_all_gather_base"))
    if fn is None:
        chk.skip("all_gather_flat", "this torch has no flat all_gather")
    else:
        def all_gather_flat():
            out = torch.empty(CHUNK * world, device=device)
            fn(out, val(rank))
            return out
        record("all_gather_flat", all_gather_flat, gathered, api=name)

    # reduce_scatter: rank r's input element j is (r+1)*(j+1); rank r keeps the
    # sum of chunk r, i.e. world*(world+1)/2 * (j+1) for j in its chunk.
    def rs_input():
        return torch.arange(1, CHUNK * world + 1, dtype=torch.float32, device=device) * float(rank + 1)

    def rs_expected():
        full = torch.arange(1, CHUNK * world + 1, dtype=torch.float32, device=device) * (world * (world + 1) / 2.0)
        return full[rank * CHUNK:(rank + 1) * CHUNK]

    def reduce_scatter_list():
        out = torch.empty(CHUNK, device=device)
        dist.reduce_scatter(out, list(rs_input().chunk(world)), op=dist.ReduceOp.SUM)
        return out
    try:
        record("reduce_scatter", reduce_scatter_list, rs_expected)
    except RuntimeError as exc:
        if not _unsupported(exc):
            raise
        chk.skip("reduce_scatter", "backend: %s" % str(exc).splitlines()[0])

    name, fn = _first_api(dist, ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base"))
    if fn is None:
        chk.skip("reduce_scatter_flat", "this torch has no flat reduce_scatter")
    else:
        def reduce_scatter_flat():
            out = torch.empty(CHUNK, device=device)
            fn(out, rs_input(), op=dist.ReduceOp.SUM)
            return out
        try:
            record("reduce_scatter_flat", reduce_scatter_flat, rs_expected, api=name)
        except RuntimeError as exc:
            if not _unsupported(exc):
                raise
            chk.skip("reduce_scatter_flat", "backend: %s" % str(exc).splitlines()[0])


def _dtensor_api():
    try:
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    except ImportError:  # torch < 2.4 kept it private
        from torch.distributed._tensor import Replicate, Shard, distribute_tensor
    try:
        from torch.distributed.device_mesh import init_device_mesh
    except ImportError:
        from torch.distributed._tensor.device_mesh import init_device_mesh
    return Replicate, Shard, distribute_tensor, init_device_mesh


def run_dtensor(torch, rank, world, device, mesh_shape, chk, timeout=None):
    """The round trip on `mesh_shape`; returns the mesh's per-dimension process groups."""
    Replicate, Shard, distribute_tensor, init_device_mesh = _dtensor_api()
    if len(mesh_shape) not in (1, 2) or (len(mesh_shape) == 2 and mesh_shape[0] != mesh_shape[1]):
        raise ValueError("mesh must be 1-D or square 2-D, got %s" % (mesh_shape,))
    size = 1
    for m in mesh_shape:
        size *= m
    if size != world:
        raise ValueError("mesh %s needs %d ranks, the group has %d" % (mesh_shape, size, world))
    mesh = init_device_mesh(device.type, tuple(mesh_shape))
    groups = [mesh.get_group(d) for d in range(len(mesh_shape))]
    if timeout is not None:
        import torch.distributed as dist
        _set_subgroup_timeouts(dist, groups, timeout)
    coord = mesh.get_coordinate()
    rows, cols = 4 * mesh_shape[0], 4 * mesh_shape[-1]
    glob = torch.arange(rows * cols, dtype=torch.float32, device=device).reshape(rows, cols)
    if len(mesh_shape) == 1:
        cases = [[Shard(0)], [Shard(1)], [Replicate()]]
    else:
        cases = [[Shard(0), Shard(1)], [Shard(1), Shard(0)], [Replicate(), Shard(1)]]
    for placements in cases:
        label = "".join(
            "S%d" % p.dim if isinstance(p, Shard) else "R" for p in placements)
        dt = distribute_tensor(glob, mesh, placements)
        expected = glob
        for mesh_dim, p in enumerate(placements):
            if isinstance(p, Shard):
                expected = expected.chunk(mesh_shape[mesh_dim], dim=p.dim)[coord[mesh_dim]]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            local = dt.to_local()
            full = dt.full_tensor()
        chk.check("to_local[%s]" % label, local, expected, api="DTensor.to_local", caught=caught)
        chk.check("full_tensor[%s]" % label, full, glob, api="DTensor.full_tensor")
    return groups


SHARE_FIX = ("fix: one rank per GPU: under Slurm `srun --gpus-per-task=1` (or no more tasks than "
             "--gpus), under torchrun --nproc-per-node <= the GPUs, and check CUDA_VISIBLE_DEVICES")
DUPLICATE_GPU = "Duplicate GPU detected"


def error_text(exc):
    """One line for a rank's error that keeps the reason.

    NCCL's exception text starts with where torch raised it ("NCCL error in:
    ...ProcessGroupNCCL.cpp:..., invalid usage ...") and puts the reason after a
    "Last error:" line; the first line alone says nothing about why.
    """
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = "%s: %s" % (type(exc).__name__, lines[0] if lines else "")
    for i, ln in enumerate(lines):
        if ln.startswith("Last error:"):
            rest = ln[len("Last error:"):].strip() or (lines[i + 1] if i + 1 < len(lines) else "")
            if rest:
                text += " | Last error: " + rest
            break
    return text


def error_fix(text):
    if DUPLICATE_GPU in text or "share GPU" in text:
        return SHARE_FIX
    return None


def shared_gpus(idents):
    """{rank: gpu id} -> [(ranks, gpu id)] for every GPU more than one rank sits on."""
    by_gpu = {}
    for rank in sorted(idents):
        by_gpu.setdefault(idents[rank], []).append(rank)
    return sorted(((ranks, gpu) for gpu, ranks in by_gpu.items() if len(ranks) > 1), key=lambda x: x[0])


def shared_gpu_message(groups):
    return "; ".join("ranks %s share GPU %s" % (", ".join(str(r) for r in ranks), gpu) for ranks, gpu in groups)


class SharedGpuError(RuntimeError):
    pass


def gpu_identity(torch, index):
    """This rank's GPU as nvidia-smi names it (GPU-<uuid>), else its PCI address."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return text if text.startswith("GPU-") else "GPU-" + text
    if hasattr(props, "pci_bus_id"):
        return "PCI %04x:%02x:%02x" % (props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
    return "cuda:%d" % index


def exchange_gpus(store, rank, world, ident):
    """Every rank's GPU through the rendezvous store; raises SharedGpuError naming who shares what."""
    store.set("envport/gpu/%d" % rank, ident)
    idents = {r: store.get("envport/gpu/%d" % r).decode("utf-8", "replace") for r in range(world)}
    store.set("envport/gpu-read/%d" % rank, "1")
    if rank == 0:
        # Rank 0 hosts the store: leaving before every rank has read the ids would turn
        # their SharedGpuError into "Connection reset by peer" and lose who shares what.
        try:
            store.wait(["envport/gpu-read/%d" % r for r in range(world)])
        except Exception:  # a rank that died meanwhile; the ids rank 0 has still decide
            pass
    groups = shared_gpus(idents)
    if groups:
        raise SharedGpuError(shared_gpu_message(groups))
    return idents


def pg_timeout_s(opts, backend):
    """NCCL's timeout sits well inside what is left of the deadline (which counts from import),
    so NCCL reports a hang itself; gloo keeps its own (the deadline's stack dump covers it)."""
    if backend != "nccl":
        return opts["gloo_timeout"]
    left = opts["deadline"] - (time.time() - T_START)
    inside = max(5.0, left / 2.0)
    return min(opts["nccl_timeout"], inside) if opts.get("nccl_timeout") else inside


def _set_subgroup_timeouts(dist, groups, timeout):
    """DeviceMesh sub-groups otherwise get torch's default (10 min NCCL, 30 min gloo)."""
    try:
        from torch.distributed.distributed_c10d import _set_pg_timeout
    except ImportError:  # older torch: the module defaults set before the mesh still apply
        return
    for group in groups:
        if group is not None:
            _set_pg_timeout(timeout, group)


def _group_timeout_s(torch, group, device):
    try:
        return group._get_backend(device).options._timeout.total_seconds()
    except Exception:  # not every torch/backend exposes it
        return None


def run_rank(rank, world, local_rank, opts, result_path=None):
    """One rank, both modes.  Returns True if every check on this rank passed."""
    # One try block holds a rank's whole life (group start, each check, barrier, teardown) so any failure,
    # wherever it happens, is reported on one sentinel line with the check it was in and the checks it
    # never reached; the steps of that life are the functions below.
    for key, value in WITNESS_ENV.items():
        os.environ.setdefault(key, value)
    fault_list = faults()
    t0 = time.time()
    checks = [c for c in opts["checks"].split(",") if c]
    base = _rank_base(rank, world, local_rank)
    done = set()
    current = checks[0] if checks else "collectives"
    try:
        import torch
        import torch.distributed as dist

        device, backend, ident = _rank_device(torch, opts, rank, local_rank, base, fault_list)
        timeout = datetime.timedelta(seconds=pg_timeout_s(opts, backend))
        base.update(backend=backend, device=str(device), torch=torch.__version__)
        host_group = _start_group(dist, rank, world, device, backend, ident, timeout, opts)
        _inject_rank_faults(fault_list, rank)
        results = []
        for check in checks:
            current = check
            rec = _run_check(torch, dist, check, rank, world, device, opts, base, fault_list, timeout)
            emit(rec)
            results.append(rec)
            done.add(check)
        dist.barrier(group=host_group)
        dist.destroy_process_group()
        ok = all(r["ok"] for r in results)
        _write_result(result_path, {"rank": rank, "ok": ok, "results": results})
        return ok
    except Exception as exc:
        _report_rank_failure(exc, base, checks, done, current, rank, t0, result_path)
        raise


def _rank_base(rank, world, local_rank):
    """The fields every sentinel line of this rank carries."""
    base = {"rank": rank, "world_size": world, "local_rank": local_rank, "pid": os.getpid()}
    # Which node this rank runs on, where a launcher across nodes says so (srun: SLURMD_NODENAME, NODE_RANK).
    if os.environ.get("SLURMD_NODENAME"):
        base["node"] = os.environ["SLURMD_NODENAME"]
    if os.environ.get("NODE_RANK", "").isdigit():
        base["node_rank"] = int(os.environ["NODE_RANK"])
    return base


def _rank_device(torch, opts, rank, local_rank, base, fault_list):
    """(device, backend, GPU identity or None): this rank's GPU and NCCL, else the CPU and gloo."""
    want = opts["device"]
    ident = None
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("a CUDA device was required but torch.cuda.is_available() is False")
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device, backend = torch.device("cuda", index), "nccl"
        ident = gpu_identity(torch, index)
        base.update(gpu=ident, capability=list(torch.cuda.get_device_capability(index)),
                    arch_list=list(torch.cuda.get_arch_list()))
    else:
        device, backend = torch.device("cpu"), "gloo"
    same = [r for kind, r, _ in fault_list if kind == "samegpu"]
    if same:  # test-only: rank R claims rank 0's GPU, so the check runs for real without GPUs
        ident = "GPU-envport-fake-%d" % (0 if rank in same else rank)
    return device, backend, ident


def _start_group(dist, rank, world, device, backend, ident, timeout, opts):
    """The process group, started once every rank's GPU is known to be its own; returns the host group
    the end-of-run barrier uses (None: the default group)."""
    # Our own rendezvous (env://, as init_process_group would do it) so the
    # GPU check below can use the store before NCCL starts.
    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
    store.set_timeout(timeout)
    if ident is not None:
        exchange_gpus(store, rank, world, ident)
    # Module defaults reach the sub-groups torch creates without a timeout (DeviceMesh's).
    import torch.distributed.distributed_c10d as c10d
    c10d.default_pg_timeout = timeout
    if backend == "nccl":
        c10d.default_pg_nccl_timeout = timeout
    init_kw = {}
    if backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
        init_kw["device_id"] = device  # binds the rank to its GPU: no guessing, eager NCCL init
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout, **init_kw)
    # The end-of-run handshake happens on the host with its own (gloo)
    # timeout, so a wedged GPU cannot stall it for the NCCL timeout.
    host_group = None
    if backend == "nccl":
        host_group = dist.new_group(backend="gloo",
                                    timeout=datetime.timedelta(seconds=opts["gloo_timeout"]))
    return host_group


def _inject_rank_faults(fault_list, rank):
    # Test-only (ENVPORT_WITNESS_FAULT=crash:R, hang:R): injected once the group is up, so the other ranks
    # meet a dead or stuck peer inside a collective, as a real failure would show itself.
    for kind, r, _ in fault_list:
        if r == rank and kind == "crash":
            sys.stderr.write("rank %d: injected crash\n" % rank)
            sys.stderr.flush()
            os._exit(13)
        if r == rank and kind == "hang":
            _injected_hang(rank)


def _run_check(torch, dist, check, rank, world, device, opts, base, fault_list, timeout):
    """One check on this rank: its sentinel record (ok, each op, the failures, its own time)."""
    t = time.time()
    chk = Checker(torch, rank, fault_list)
    extra = {}
    if check == "collectives":
        run_collectives(torch, dist, rank, world, device, chk)
    elif check == "dtensor":
        import torch.distributed.distributed_c10d as c10d
        groups = run_dtensor(torch, rank, world, device, opts["mesh"], chk, timeout)
        extra["timeouts_s"] = {"default": _group_timeout_s(torch, c10d._get_default_group(), device),
                               "mesh": [_group_timeout_s(torch, g, device) for g in groups]}
    else:
        raise ValueError("unknown check %r" % check)
    rec = dict(base, check=check, ok=not chk.failures, ops=chk.ops,
               failures=chk.failures, seconds=round(time.time() - t, 3), **extra)
    if check == "dtensor":
        rec["mesh"] = opts["mesh"]
    return rec


def _report_rank_failure(exc, base, checks, done, current, rank, t0, result_path):
    """The failure on the sentinel line of the check it happened in; every check not reached fails too.
    Called from the except block, so the traceback is the failure's."""
    lines = traceback.format_exc().splitlines()
    rec = dict(base, check=current, ok=False, error=error_text(exc),
               traceback=lines[-15:], seconds=round(time.time() - t0, 3))
    fix = error_fix(rec["error"])
    if fix:
        rec["fix"] = fix
    emit(rec)
    for check in checks:  # the checks never reached fail too, visibly
        if check not in done and check != current:
            emit(dict(base, check=check, ok=False, error="not run: rank %d failed in %s" % (rank, current)))
    _write_result(result_path, {"rank": rank, "ok": False, "error": rec["error"]})


def _exit_now(code):
    """Leave without running C++ static destructors.

    Every verdict is on its sentinel line and the group is destroyed by now, yet
    torch's teardown of gloo/DTensor threads at interpreter exit sometimes aborts
    ("terminate called without an active exception", SIGABRT; seen once in ~20
    CI runs on 2 cores), which would turn a passing rank into a failing one.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _write_result(path, data):
    if path:
        with open(path, "w") as f:
            json.dump(data, f)


def _spawn_entry(local_rank, world, opts, stack_dir):
    # Runs in each spawned rank.  Spawn mode puts all ranks on this host, so
    # the local rank is the global rank.
    rank = local_rank
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world))
    stack_file = open(os.path.join(stack_dir, "stack-rank%d.txt" % rank), "w")
    _install_stack_dumps(stack_file)
    # Backstop if the parent itself is killed: no orphan rank outlives it by much.
    faulthandler.dump_traceback_later(opts["deadline"] + 15, exit=True, file=stack_file)
    try:
        ok = run_rank(rank, world, rank, opts, os.path.join(stack_dir, "result-rank%d.json" % rank))
    except Exception:
        # Already reported on the sentinel line.  No sys.exit: the NCCL group is
        # still alive, and its teardown at interpreter exit can hang or SIGABRT,
        # leaving the parent to wait out the deadline.
        _exit_now(1)
    _exit_now(0 if ok else 1)


def _wait_for_dumps(stack_dir, ranks, limit=3.0):
    """Give the signalled ranks a moment to write their stacks (sizes stop growing)."""
    end = time.time() + limit
    last = None
    while time.time() < end:
        sizes = [os.path.getsize(os.path.join(stack_dir, "stack-rank%d.txt" % r))
                 if os.path.exists(os.path.join(stack_dir, "stack-rank%d.txt" % r)) else 0 for r in ranks]
        if all(sizes) and sizes == last:
            return
        last = sizes
        time.sleep(0.2)


def _group_device(world, opts):
    """opts with device cpu or cuda as the GPUs torch sees allow; None where --device cuda cannot be held."""
    import torch

    if not (opts["device"] == "cuda" or (opts["device"] == "auto" and torch.cuda.is_available())):
        return dict(opts, device="cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count >= world:
        return dict(opts, device="cuda")
    if opts["device"] == "cuda":
        emit({"check": "group", "ok": False, "world_size": world, "outcome": "no_gpus",
              "error": "world size %d needs %d GPUs, torch sees %d" % (world, world, count)})
        return None
    return dict(opts, device="cpu")  # auto: fewer GPUs than ranks -> gloo on CPU


def _watch(ctx, deadline):
    """(outcome, note) once every rank ended, one failed, or the deadline passed."""
    # grace_period (torch >= 2.2) bounds how long join waits before it kills
    # the peers of a failed rank; older torch kills them at once.
    import inspect
    join_kw = {"grace_period": 1.0} if "grace_period" in inspect.signature(ctx.join).parameters else {}
    while True:
        if any(p.exitcode not in (None, 0) for p in ctx.processes):
            return "rank_failed", ""
        left = deadline - time.time()
        if left <= 0:
            return "deadline", ""
        try:
            if ctx.join(timeout=min(1.0, left), **join_kw):
                return "ok", ""
        except Exception as exc:  # ProcessExitedException/ProcessRaisedException: join ended the rest
            return "rank_failed", str(exc).splitlines()[0]


def _stop_alive(procs, stack_dir):
    """Ask the ranks still running for their stacks (SIGUSR1), then kill them; the ranks that were alive."""
    alive = [i for i, p in enumerate(procs) if p.is_alive()]
    for i in alive:
        try:
            os.kill(procs[i].pid, signal.SIGUSR1)
        except OSError:
            pass
    if alive:
        _wait_for_dumps(stack_dir, alive)
    for i in alive:
        if procs[i].is_alive():
            procs[i].kill()
    return alive


def _read_ranks(stack_dir, world):
    """({rank: its result file}, {rank: its faulthandler stack}) as the ranks left them."""
    results, stacks = {}, {}
    for r in range(world):
        path = os.path.join(stack_dir, "result-rank%d.json" % r)
        if os.path.exists(path):
            with open(path) as f:
                results[r] = json.load(f)
        spath = os.path.join(stack_dir, "stack-rank%d.txt" % r)
        if os.path.exists(spath) and os.path.getsize(spath):
            with open(spath, errors="replace") as f:
                stacks[str(r)] = f.read()
    return results, stacks


def _group_note(outcome, note, exitcodes, results, alive, opts):
    if outcome == "rank_failed":
        # The rank that started it usually died without a result (a crash);
        # its peers then fail with "connection reset" and did write one.
        died = [r for r, c in enumerate(exitcodes) if c not in (0, None, -signal.SIGKILL)]
        silent = [r for r in died if r not in results]
        origin = silent or died
        if origin:
            note = "rank %d exited with code %s first%s" % (
                origin[0], exitcodes[origin[0]], "; its peers then failed" if len(died) > 1 else "")
    elif outcome == "deadline":
        note = "the group did not finish within %ss; ranks %s were still running and were killed" % (
            opts["deadline"], alive)
    return note


def _remove_dir(path):
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)


def spawn_group(world, opts):
    """Start `world` ranks here, watch them, report one group line.  Returns the exit code."""
    import torch.multiprocessing as mp

    t0 = T_START
    opts = _group_device(world, opts)
    if opts is None:
        return 1
    for key, value in WITNESS_ENV.items():
        os.environ.setdefault(key, value)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    stack_dir = tempfile.mkdtemp(prefix="envport-dist-")
    ctx = mp.start_processes(_spawn_entry, args=(world, opts, stack_dir), nprocs=world,
                             join=False, start_method="spawn")
    procs = ctx.processes
    outcome, note = _watch(ctx, t0 + opts["deadline"])
    alive = _stop_alive(procs, stack_dir) if outcome != "ok" else []
    for p in procs:
        p.join(10)
    exitcodes = [p.exitcode for p in procs]
    results, stacks = _read_ranks(stack_dir, world)
    failed = sorted(r for r in range(world) if not results.get(r, {}).get("ok"))
    ok = outcome == "ok" and not failed and all(c == 0 for c in exitcodes)
    note = _group_note(outcome, note, exitcodes, results, alive, opts)
    for r, text in sorted(stacks.items()):
        sys.stderr.write("----- rank %s Python stack (faulthandler) -----\n%s" % (r, text))
    sys.stderr.flush()
    emit({"check": "group", "ok": ok, "world_size": world, "checks": opts["checks"].split(","),
          "device": opts["device"], "outcome": outcome, "note": note, "exitcodes": exitcodes,
          "failed_ranks": failed, "stacks": stacks, "seconds": round(time.time() - t0, 3),
          "master_port": int(os.environ["MASTER_PORT"])})
    _remove_dir(stack_dir)
    return 0 if ok else 1


def _external_identity():
    env = os.environ
    rank = env.get("RANK", env.get("SLURM_PROCID"))
    world = env.get("WORLD_SIZE", env.get("SLURM_NTASKS"))
    local = env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
    if rank is None or world is None:
        return None
    return int(rank), int(world), int(local)


def run_external(opts):
    ident = _external_identity()
    if ident is None:
        sys.stderr.write("external launch needs RANK and WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS)\n")
        return 2
    rank, world, local_rank = ident
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    os.environ.setdefault("LOCAL_RANK", str(local_rank))
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        sys.stderr.write("external launch needs %s set by the launcher\n" % " and ".join(missing))
        return 2
    if opts["world_size"] and opts["world_size"] != world:
        emit({"check": "group", "ok": False, "rank": rank, "world_size": world, "outcome": "usage",
              "error": "--world-size %d but the launcher started %d ranks" % (opts["world_size"], world)})
        return 2
    _install_stack_dumps(sys.stderr)
    faulthandler.dump_traceback_later(max(1.0, opts["deadline"] - (time.time() - T_START)), exit=True,
                                      file=sys.stderr)
    try:
        ok = run_rank(rank, world, local_rank, opts)
    except Exception:
        return 1
    finally:
        faulthandler.cancel_dump_traceback_later()
    return 0 if ok else 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checks", default="collectives", help="comma list: collectives,dtensor")
    ap.add_argument("--world-size", type=int, default=0, help="ranks to spawn (spawn mode)")
    ap.add_argument("--mesh", default="", help="DTensor mesh, e.g. 4 or 2,2 (default: 1-D of the world size)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--launch", choices=["auto", "spawn", "external"], default="auto",
                    help="auto: external when RANK/WORLD_SIZE (or SLURM_PROCID) are set, else spawn")
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds for the whole group")
    ap.add_argument("--gloo-timeout", type=float, default=120.0, help="gloo process-group timeout (s)")
    ap.add_argument("--nccl-timeout", type=float, default=0.0,
                    help="NCCL process-group timeout (s); default: half of what is left of the deadline")
    args = ap.parse_args(argv)
    bad = [c for c in args.checks.split(",") if c and c not in ("collectives", "dtensor")]
    if bad:
        ap.error("unknown check(s): %s" % ", ".join(bad))
    return args


def main(argv=None):
    args = parse_args(argv)
    launch = args.launch
    if launch == "auto":
        launch = "external" if _external_identity() is not None else "spawn"
    world = args.world_size
    if launch == "external":
        ident = _external_identity()
        world = ident[1] if ident else world
    if world < 1:
        world = 2
    mesh = [int(x) for x in args.mesh.split(",") if x] if args.mesh else [world]
    opts = {"checks": args.checks, "world_size": args.world_size, "mesh": mesh, "device": args.device,
            "deadline": args.deadline, "gloo_timeout": args.gloo_timeout, "nccl_timeout": args.nccl_timeout}
    if launch == "external":
        return run_external(opts)
    return spawn_group(world, opts)


if __name__ == "__main__":
    _exit_now(main())
