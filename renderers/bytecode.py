"""The command every recipe runs after a pip phase whose bytecode is compiled at build (`compiles_after`).

One `python -c` line, embedded as it is by the Dockerfile, the .def's %post and the venv/SSH script, so
every target compiles the same way; it lives here, among the renderers, so that a change to it changes
the renderer digest and with it every env's content hash.

It writes the same bytes on every build of the same tree, on any host (issue 39: two cold SIF builds of
demo-cpu differed in `_distutils_hack/__pycache__/__init__.cpython-311.pyc`):

- It compiles only what is stale: a .py without a .pyc, or whose .pyc is not the one py_compile would
  write now.  `compileall.compile_dir` rewrote every hash-based .pyc on every phase (its up-to-date check
  reads only timestamp headers), yet kept a timestamp .pyc the importer had written.  That is what moved
  `_distutils_hack`: a phase that reinstalls setuptools leaves it without bytecode, the next interpreter
  imports it at startup (distutils-precedence.pth) and writes a timestamp .pyc holding the install time,
  which compileall then judged up to date.  So the .pyc's header must be exactly what py_compile picks:
  checked-hash with the source's hash when SOURCE_DATE_EPOCH is set (as the SIF builder sets it), else a
  timestamp one with the source's mtime and size (the importer's own check).
- The stale files are compiled in sorted order, cut into COMPILE_CHUNKS contiguous chunks (balanced by
  source bytes), each by a fresh `python -S -m compileall` with PYTHONHASHSEED=0.  marshal's output
  depends on the process that writes it (FLAG_REF follows reference counts, which follow what that
  process compiled before; before 3.11, frozenset constants follow the string hash): a worker pool
  hands a file to whichever process is free, so two builds compiled one file after different histories
  (measured here on torch's tree: one .pyc of 5,446 differed between two runs).  A fixed chunk count
  makes each file's process history a function of the tree alone, not of the host's core count; the
  chunks run os.cpu_count() at a time.  `-S`: the compiling process imports nothing from the env.
- As pip does, a file that does not compile is left as it is (compileall exits 1 for it); any other exit
  of a compiling process fails the step.
"""

from __future__ import annotations

# 8: compiling torch's purelib (5,446 files) on 2 cores, the CPU time grows with the number of
# processes (user 12.6-13.1 s with 8 chunks, 14.6-15.1 s with 16, 15.7-17.7 s with 32; compileall's
# pool of 2: 13.1-14.4 s); more chunks would pay only on hosts with more than 8 cores.
COMPILE_CHUNKS = 8

_STATEMENTS = (
    "import itertools, os, struct, subprocess, sys, sysconfig",
    "from concurrent.futures import ThreadPoolExecutor",
    "from importlib.util import MAGIC_NUMBER, cache_from_source, source_hash",
    # py_compile's own choice of header: checked-hash (flags 3) under SOURCE_DATE_EPOCH, else timestamp.
    'hashed = bool(os.environ.get("SOURCE_DATE_EPOCH"))',
    'want = lambda py: MAGIC_NUMBER + (struct.pack("<I", 3) + source_hash(open(py, "rb").read()) if hashed'
    ' else struct.pack("<3I", 0, int(os.stat(py).st_mtime) & 0xFFFFFFFF, os.stat(py).st_size & 0xFFFFFFFF))',
    'have = lambda pyc: open(pyc, "rb").read(16) if os.path.isfile(pyc) else b""',
    'root = sysconfig.get_path("purelib")',
    "stale = [p for p in sorted(os.path.join(d, f) for d, _, fs in os.walk(root)"
    ' if "__pycache__" not in d.split(os.sep) for f in fs if f.endswith(".py"))'
    " if os.path.isfile(p) and have(cache_from_source(p)) != want(p)]",
    "before = list(itertools.accumulate(map(os.path.getsize, stale), initial=0))",
    f"chunks = [c for c in ([p for p, b in zip(stale, before) if b * {COMPILE_CHUNKS} // (before[-1] + 1) == k]"
    f" for k in range({COMPILE_CHUNKS})) if c]",
    'run = lambda c: subprocess.run([sys.executable, "-S", "-m", "compileall", "-f", "-qq", "-i", "-"],'
    ' input=b"\\n".join(map(os.fsencode, c)), env=dict(os.environ, PYTHONHASHSEED="0")).returncode',
    'sys.exit(next((f"compiling bytecode: python -m compileall exited {rc}"'
    " for rc in ThreadPoolExecutor(os.cpu_count()).map(run, chunks) if rc not in (0, 1)), 0))",
)
COMPILE_SITE_PACKAGES = "; ".join(_STATEMENTS)
