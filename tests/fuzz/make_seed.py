#!/usr/bin/env python3
"""Converts an image file into the fuzz input encoding of fuzz_image.h.

    make_seed.py IMAGE OUT [--ops HEX] [--flags N]

Only the non-zero bytes are kept, as runs (a zero gap of 32 bytes or more
ends a run); holes of a sparse image are skipped without reading them.
"""
import argparse
import os
import re
import struct
import sys

GAP = 32          # zero bytes that end a run
MAX_RUN = 0xFFF0  # the u16 length field, kept a multiple of 16


def data_ranges(fd, size):
    """(start, end) of the data regions of a sparse file."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:
            return
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, min(end, size)
        pos = end


NONZERO = re.compile(rb"[^\x00]+(?:\x00{0,%d}[^\x00]+)*" % (GAP - 1))


def runs(buf, base):
    """Non-zero runs of buf (base is 16-aligned) as (16-aligned offset, bytes)."""
    for m in NONZERO.finditer(buf):
        start = m.start() - m.start() % 16
        end = m.end()
        while start < end:
            piece_end = min(end, start + MAX_RUN)
            yield base + start, bytes(buf[start:piece_end])
            start = piece_end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("image")
    ap.add_argument("out")
    ap.add_argument("--ops", default="", help="operation script for image_write_fuzz, as hex")
    ap.add_argument("--flags", type=int, default=0)
    a = ap.parse_args()
    ops = bytes.fromhex(a.ops)
    size = os.path.getsize(a.image)
    if size % 4096:
        sys.exit("image size is not a multiple of 4096")
    out = [struct.pack("<IBBH", size // 4096, a.flags, 0, len(ops)), ops]
    fd = os.open(a.image, os.O_RDONLY)
    try:
        for start, end in data_ranges(fd, size):
            # Read in 1 MiB pieces aligned to 16 bytes; a run crossing a piece
            # boundary is simply split in two records.
            pos = start - start % 16
            while pos < end:
                n = min(1 << 20, end - pos)
                buf = os.pread(fd, n, pos)
                for off, data in runs(buf, pos):
                    out.append(struct.pack("<IH", off // 16, len(data)))
                    out.append(data)
                pos += n
    finally:
        os.close(fd)
    with open(a.out, "wb") as f:
        f.write(b"".join(out))


if __name__ == "__main__":
    main()
