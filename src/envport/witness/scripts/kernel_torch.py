"""torch's kernel witness: a seeded two-layer MLP forward pass on torch's device (kernel.py runs it).

The sentinel carries the device, output shape and a checksum.  On a GPU the
same pass also runs on the CPU and the two must agree, and the card's
capability is reported with torch's arch list so the caller can say why a "no
kernel image is available" happened.  Where CUDA is unavailable, torch's own
words come back (its "The NVIDIA driver on your system is too old (found
version 12080)" warning), not just "unavailable".
"""

import warnings

from frameworks import judge_output


def forward(torch, device):
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(8, 16, generator=gen)
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = model.to(device)
    with torch.no_grad():
        y = model(x.to(device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return y.detach().to("cpu")


def gpu_seen(rec):
    """Whether torch drives a GPU here; fills rec with torch's version, CUDA build and its CUDA warnings."""
    import torch

    rec["torch"] = torch.__version__
    rec["cuda"] = getattr(torch.version, "cuda", None)
    # torch says why CUDA is unavailable only as a warning, once, on the first probe.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cuda_ok = torch.cuda.is_available()
    said = ["%s" % w.message for w in caught if "cuda" in str(w.message).lower()]
    if said:
        rec["cuda_warnings"] = said
    return bool(cuda_ok)


def why_no_gpu(rec):
    why = ("a CUDA device was required but torch.cuda.is_available() is False "
           "(torch %s, built for CUDA %s)" % (rec.get("torch"), rec.get("cuda")))
    said = rec.get("cuda_warnings")
    return why + (": " + said[0] if said else "")


def run(rec, on_gpu):
    """The pass on the GPU (on_gpu) or the CPU; fills rec (device, shape, checksum, ok)."""
    import torch

    device = torch.device("cuda:0" if on_gpu else "cpu")
    rec["device"] = str(device)
    if on_gpu:
        rec["gpu"] = torch.cuda.get_device_name(device)
        rec["capability"] = list(torch.cuda.get_device_capability(device))
        rec["arch_list"] = list(torch.cuda.get_arch_list())
    y = forward(torch, device)
    rec["shape"] = list(y.shape)
    rec["dtype"] = str(y.dtype).replace("torch.", "")
    rec["checksum"] = round(float(y.double().sum()), 6)
    finite = bool(torch.isfinite(y).all())
    diff = None
    if on_gpu:
        diff = float((y - forward(torch, torch.device("cpu"))).abs().max())
    judge_output(rec, finite, y.shape, diff)
