#!/usr/bin/env python3
"""Creates N small files (default 10,000) under DIR, deterministic from a seed:
100 files per directory, sizes 0..16 KiB (most inline-sized), a few larger."""
import os
import random
import sys

def main():
    dest = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
    rng = random.Random(42)
    blob = rng.randbytes(1 << 20)
    for i in range(count):
        d = os.path.join(dest, f"d{i // 100:04d}")
        if i % 100 == 0:
            os.makedirs(d, exist_ok=True)
        r = rng.random()
        size = rng.randint(0, 2048) if r < 0.6 else rng.randint(2049, 16384) if r < 0.97 else rng.randint(16385, 1 << 20)
        off = rng.randint(0, len(blob) - size)
        with open(os.path.join(d, f"f{i:06d}"), "wb") as f:
            f.write(blob[off:off + size])

if __name__ == "__main__":
    main()
