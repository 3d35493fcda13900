"""JAX's kernel witness: a seeded jit-compiled two-layer MLP on JAX's default backend (kernel.py runs it).

JAX compiles through XLA for whatever backend its jaxlib (and a CUDA plugin,
where installed) provides; the pass below is jit-compiled, so an OK proves
XLA compiled and ran code on that device, not only that `import jax` works.
On a GPU the same pass also runs on JAX's CPU device and the two must agree;
the card's compute capability comes from JAX's own device object.  Values are
read back with tolist() so the checksum needs nothing beyond jax itself.
"""

from frameworks import GPU_PLATFORMS, judge_output


def _mlp(jax, jnp):
    def forward(params, x):
        (w1, b1), (w2, b2) = params
        return jnp.dot(jax.nn.relu(jnp.dot(x, w1) + b1), w2) + b2

    return jax.jit(forward)


def _inputs(jax, jnp):
    k = jax.random.split(jax.random.PRNGKey(1234), 5)
    x = jax.random.normal(k[0], (8, 16), dtype=jnp.float32)
    params = ((jax.random.normal(k[1], (16, 32), dtype=jnp.float32) * 0.25,
               jax.random.normal(k[2], (32,), dtype=jnp.float32) * 0.1),
              (jax.random.normal(k[3], (32, 4), dtype=jnp.float32) * 0.25,
               jax.random.normal(k[4], (4,), dtype=jnp.float32) * 0.1))
    return params, x


def _values(y):
    """The output as nested Python floats (tolist: no numpy needed to read it)."""
    return y.tolist()


def _flat(rows):
    return [float(v) for row in rows for v in row]


def gpu_seen(rec):
    """Whether JAX's default backend is a GPU; fills rec with jax's version, backend and the card."""
    import jax

    rec["jax"] = jax.__version__
    try:
        import jaxlib

        rec["jaxlib"] = getattr(jaxlib, "__version__", None)
    except Exception:
        pass
    rec["backend"] = jax.default_backend()
    if rec["backend"] not in GPU_PLATFORMS:
        return False
    dev = jax.devices()[0]
    rec["gpu"] = getattr(dev, "device_kind", str(dev))
    cc = getattr(dev, "compute_capability", None)
    if cc:
        rec["capability"] = [int(p) for p in str(cc).split(".")[:2]]
    return True


def why_no_gpu(rec):
    return ("a GPU was required but JAX's default backend is %r (jax %s, jaxlib %s): a CPU-only jaxlib, or no "
            "CUDA plugin (jax[cuda12]) for this driver" % (rec.get("backend"), rec.get("jax"), rec.get("jaxlib")))


def _run_on(jax, jnp, device):
    params, x = _inputs(jax, jnp)
    params, x = jax.device_put((params, x), device)
    y = _mlp(jax, jnp)(params, x)
    y.block_until_ready()
    return y


def run(rec, on_gpu):
    """The pass on JAX's GPU (on_gpu) or its CPU device; fills rec (device, shape, checksum, ok)."""
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0] if on_gpu else jax.devices("cpu")[0]
    rec["device"] = "%s:%d" % (device.platform, device.id)
    y = _run_on(jax, jnp, device)
    rows = _values(y)
    flat = _flat(rows)
    rec["shape"] = list(y.shape)
    rec["dtype"] = str(y.dtype)
    rec["checksum"] = round(sum(flat), 6)
    finite = all(v == v and abs(v) != float("inf") for v in flat)
    diff = None
    if on_gpu:
        ref = _flat(_values(_run_on(jax, jnp, jax.devices("cpu")[0])))
        diff = max(abs(a - b) for a, b in zip(flat, ref))
    judge_output(rec, finite, y.shape, diff)
