#!/usr/bin/env python3
"""Creates N tiny files under DIR: DIR/<i // 1000>/f<i>, each "file <i>\\n"
repeated 1 + i % 3 times (inline-sized), for the snapshot and receive benches."""
import os
import sys


def main():
    dest, count = sys.argv[1], int(sys.argv[2])
    for i in range(count):
        sub = os.path.join(dest, str(i // 1000))
        if i % 1000 == 0:
            os.mkdir(sub)
        with open(os.path.join(sub, "f%d" % i), "w") as f:
            f.write(("file %d\n" % i) * (1 + i % 3))


if __name__ == "__main__":
    main()
