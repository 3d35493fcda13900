"""Write demo-cpu's weight: 1024 seeded float32 values (4096 bytes), stdlib only.

It stands in for a model's own downloader, which is what a spec's `source`
command calls: it writes into the directory its env var names
(DEMO_WEIGHTS), straight to the final file name, as real downloaders do.
The bytes are the same on every machine, so the spec can pin them.

    DEMO_WEIGHTS=/some/dir python3 demo_weight.py
"""

import os
import random
import struct
import sys

N_VALUES = 1024
SEED = 20240611


def main() -> int:
    root = os.environ.get("DEMO_WEIGHTS")
    if not root:
        print("demo_weight.py: DEMO_WEIGHTS is not set; it names the directory to write into", file=sys.stderr)
        return 3
    rng = random.Random(SEED)
    data = struct.pack(f"<{N_VALUES}f", *(rng.uniform(-1.0, 1.0) for _ in range(N_VALUES)))
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "tiny.f32"), "wb") as f:
        f.write(data)
    print(f"demo_weight.py: wrote {len(data)} bytes to {os.path.join(root, 'tiny.f32')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
