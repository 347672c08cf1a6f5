#!/usr/bin/env python3
"""ubtrfs benchmarks side by side with the kernel, in one run (issue 7).

Usually started through bench/run.sh, which installs what is missing and
builds. Every workload runs on ubtrfs and on its peers in the same run,
alternating the order, REPS repetitions; the result is the median with the
spread (min..max). Each workload writes docs/bench/<name>.json (raw values,
medians, ratios, checks, ubtrfs statistics) and docs/bench/<name>.png
(gnuplot), and docs/bench/summary.md collects the tables.

    bench/run.py [--quick] [--reps N] [--threads T] [--out DIR] [workload ...]
    workloads: create mkfs delete dbench (default: all)

A full run of all four workloads into docs/bench also rewrites the part of
docs/BENCHMARKS.md between its "bench/run.py: begin/end" markers. --quick
writes to BUILD/bench-quick unless --out says otherwise.

Every ubtrfs image is checked with `btrfs check --readonly` after its run; a
failed check is recorded in the JSON and printed. Rows that need root or
loop mounts are skipped with a note when those are unavailable.
"""
import argparse
import datetime
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLIENT_TXT = "/usr/share/dbench/client.txt"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, check=True, **kw):
    """Runs cmd (a list); returns CompletedProcess with text output."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return r


def summarize(values):
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def is_mounted(path):
    return subprocess.run(["mountpoint", "-q", path]).returncode == 0


def wait_mounted(path, proc, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        if is_mounted(path):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"mount of {path} exited early ({proc.returncode}): {proc.stderr.read()[-800:]}")
        time.sleep(0.02)
    raise RuntimeError(f"{path} not mounted after {timeout} s")


KNOWN_WORKLOADS = ["create", "mkfs", "delete", "dbench"]
# A workload's part of summary.md.
SECTION_RE = re.compile(r"<!-- workload: (\w+) -->\n(.*?)<!-- end workload: \1 -->\n", re.S)


class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.build = os.path.abspath(args.build)
        self.ubtrfs = os.path.join(self.build, "ubtrfs")
        self.mkfs = os.path.join(self.build, "mkfs.ubtrfs")
        self.lib_bench = os.path.join(self.build, "lib_bench")
        self.nullfs = os.path.join(self.build, "nullfs")
        for b in (self.ubtrfs, self.mkfs, self.lib_bench, self.nullfs):
            if not os.access(b, os.X_OK):
                sys.exit(f"run.py: {b} is missing; bench/run.sh builds it")
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="ubtrfs-bench.", dir=args.workdir)
        self.reps = args.reps or (2 if self.quick else 3)
        self.threads = args.threads
        self.root = os.geteuid() == 0
        self.loop_ok, self.loop_note = self.probe_loop()
        self.fuse_ok = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None
        self.have_stats_cmd = run([self.ubtrfs, "stats", "--help"], check=False).returncode == 0
        self.summary = {}  # workload -> its tables and figures, in order
        self.current = None  # the workload running now
        self.machine = self.describe_machine()

    # ---- environment ----
    def probe_loop(self):
        if not self.root:
            return False, "not root: loop and tmpfs mounts skipped"
        img = os.path.join(self.work, "probe.img")
        mnt = os.path.join(self.work, "probe")
        os.makedirs(mnt)
        try:
            run(["truncate", "-s", "128M", img])
            run(["mkfs.ext4", "-q", "-F", img])
            run(["mount", "-o", "loop", img, mnt])
            run(["umount", mnt])
            return True, ""
        except RuntimeError as e:
            return False, f"loop mounts unavailable ({e}): kernel rows skipped"
        finally:
            os.unlink(img)
            os.rmdir(mnt)

    def describe_machine(self):
        cpu = "unknown"
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        mem = 0
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = int(line.split()[1]) // 1024
        def version(cmd):
            r = run(cmd, check=False)
            return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else "?"
        commit = run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], check=False).stdout.strip()
        dirty = run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], check=False).stdout.strip()
        return {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu, "cores": os.cpu_count(), "mem_mib": mem,
            "kernel": os.uname().release,
            "load_at_start": open("/proc/loadavg").read().split()[:3],
            "host_fs_of_images": run(["df", "-T", self.work], check=False).stdout.splitlines()[-1].split()[1],
            "ubtrfs_commit": commit + ("+local changes" if dirty else ""),
            "build": run(["grep", "-m1", "CMAKE_BUILD_TYPE:", os.path.join(self.build, "CMakeCache.txt")],
                         check=False).stdout.strip().split("=")[-1],
            "fs_mark": "fsmark 3.3 (Debian)", "dbench": version(["dbench", "--help"]),
            "btrfs_progs": version(["mkfs.btrfs", "--version"]),
            "e2fsprogs": version(["sh", "-c", "mkfs.ext4 -V 2>&1"]),
            "libfuse": run(["pkg-config", "--modversion", "fuse3"], check=False).stdout.strip(),
        }

    def note_load(self):
        return open("/proc/loadavg").read().split()[:3]

    # ---- ubtrfs images and mounts ----
    def check_image(self, img):
        """btrfs check --readonly; returns (clean, message)."""
        r = run(["btrfs", "check", "--readonly", img], check=False)
        if r.returncode == 0:
            return True, "clean"
        log(f"  !! btrfs check {img} failed:\n{(r.stdout + r.stderr)[-1500:]}")
        return False, (r.stdout + r.stderr)[-1500:]

    def mount_ubtrfs(self, img, mnt):
        os.makedirs(mnt, exist_ok=True)
        errf = open(os.path.join(self.work, "mount.stderr"), "w+")
        p = subprocess.Popen([self.ubtrfs, "mount", img, mnt, "-f", "-o", "stats"], stdout=subprocess.DEVNULL,
                             stderr=errf, text=True)
        p.errfile = errf
        try:
            wait_mounted(mnt, None)
        except RuntimeError:
            p.kill()
            errf.seek(0)
            raise RuntimeError(f"ubtrfs mount failed: {errf.read()[-800:]}")
        return p

    def unmount_ubtrfs(self, mnt, proc):
        """Unmounts and waits for the daemon (its final commit); returns its request counters."""
        run(["fusermount3", "-u", mnt])
        rc = proc.wait(timeout=600)
        proc.errfile.seek(0)
        err = proc.errfile.read()
        proc.errfile.close()
        if rc != 0:
            raise RuntimeError(f"ubtrfs mount exited {rc}: {err[-800:]}")
        m = re.search(r"requests: (.*)", err)
        return m.group(1).strip() if m else err.strip()[-400:]

    def mount_nullfs(self, mnt):
        os.makedirs(mnt, exist_ok=True)
        errf = open(os.path.join(self.work, "nullfs.stderr"), "w+")
        p = subprocess.Popen([self.nullfs, mnt, "-f", "-o", "default_permissions"], stdout=subprocess.DEVNULL,
                             stderr=errf, text=True, env={**os.environ, "NULLFS_STATS": "1"})
        p.errfile = errf
        try:
            wait_mounted(mnt, None)
        except RuntimeError:
            p.kill()
            errf.seek(0)
            raise RuntimeError(f"nullfs mount failed: {errf.read()[-800:]}")
        return p

    def unmount_nullfs(self, mnt, proc):
        """Unmounts; returns the request counters nullfs prints at exit."""
        run(["fusermount3", "-u", mnt])
        proc.wait(timeout=60)
        proc.errfile.seek(0)
        err = proc.errfile.read()
        proc.errfile.close()
        m = re.search(r"requests: (.*)", err)
        return m.group(1).strip() if m else err.strip()[-400:]

    def mkfs_kernel(self, kind, img, size="8G"):
        if os.path.exists(img):
            os.unlink(img)
        run(["truncate", "-s", size, img])
        if kind == "btrfs":
            run(["mkfs.btrfs", "-q", "-f", img])
        else:
            # One inode per 4 KiB: the full create run keeps 600,000 files (the default ratio gives 524,288).
            run(["mkfs.ext4", "-q", "-F", "-i", "4096", img])

    # ---- create: fs_mark ----
    def fs_mark(self, mnt, n, size, loops):
        dirs = []
        for t in range(self.threads):
            d = os.path.join(mnt, f"d{t}")
            os.makedirs(d, exist_ok=True)
            dirs += ["-d", d]
        cmd = ["fs_mark", "-S", "0", "-s", str(size), "-n", str(n), "-t", str(self.threads), "-L", str(loops),
               "-k"] + dirs
        r = run(cmd)
        rates, counts = [], []
        in_table = False
        for line in r.stdout.splitlines():
            if line.strip().startswith("FSUse%"):
                in_table = True
                continue
            if in_table and line.strip():
                f = line.split()
                if len(f) >= 5:
                    rates.append(float(f[3]))
        if len(rates) != loops:
            raise RuntimeError(f"fs_mark output not understood:\n{r.stdout[-1500:]}")
        files = n * self.threads
        # The run's rate: all files over the sum of the loops' times.
        return files * loops / sum(files / x for x in rates), rates

    def workload_create(self, size):
        n = (2500 if size == 0 else 800) if self.quick else (100000 if size == 0 else 20000)
        loops = 3
        name = f"create-{size}"
        # The full 0-byte run keeps 600,000 files per file system (about 6 minutes a repetition here): 2 repetitions
        # unless --reps says otherwise.
        reps = self.reps if (self.quick or self.args.reps or size) else 2
        log(f"== {name}: fs_mark -S 0 -s {size} -n {n} -t {self.threads} -L {loops} -k, {reps} reps")
        # The library commits at the end of each loop (fs_mark -S 0 never syncs): on a committer thread while the
        # next loop's workers go on ("ubtrfs library", an application's usual shape), and for comparison with the
        # workers waiting for each commit.
        targets = ["ubtrfs library", "ubtrfs library, commit inline", "ubtrfs FUSE", "do-nothing FUSE", "kernel btrfs",
                   "ext4", "tmpfs"]
        notes = {}
        if not self.fuse_ok:
            notes["ubtrfs FUSE"] = notes["do-nothing FUSE"] = "no /dev/fuse or fusermount3"
        if not self.loop_ok:
            notes["kernel btrfs"] = notes["ext4"] = self.loop_note
        if not self.root:
            notes["tmpfs"] = "not root"
        raw = {t: [] for t in targets}
        loops_raw = {t: [] for t in targets}
        checks, stats, requests, errors = [], [], [], {t: [] for t in targets}
        null_requests = []
        for rep in range(reps):
            order = targets[rep % len(targets):] + targets[:rep % len(targets)]
            for t in order:
                if t in notes:
                    continue
                img = os.path.join(self.work, "c.img")
                mnt = os.path.join(self.work, "cmnt")
                os.makedirs(mnt, exist_ok=True)
                try:
                    if t.startswith("ubtrfs library"):
                        if os.path.exists(img):
                            os.unlink(img)
                        run([self.ubtrfs, "mkfs", "-q", "--size", "8G", img])
                        r = run([self.lib_bench, "create", img, "--threads", str(self.threads), "--files", str(n),
                                 "--loops", str(loops), "--size", str(size),
                                 "--commit", "inline" if t.endswith("inline") else "behind"])
                        j = json.loads(r.stdout)
                        rate, rates = j["files_per_sec"], [x["files_per_sec"] for x in j["loops"]]
                        stats.append(j["stats"])
                        checks.append({"target": t, "rep": rep, "clean": self.check_image(img)[0]})
                    elif t == "ubtrfs FUSE":
                        if os.path.exists(img):
                            os.unlink(img)
                        run([self.ubtrfs, "mkfs", "-q", "--size", "8G", img])
                        p = self.mount_ubtrfs(img, mnt)
                        try:
                            rate, rates = self.fs_mark(mnt, n, size, loops)
                        finally:
                            req = self.unmount_ubtrfs(mnt, p)
                        requests.append(req)
                        checks.append({"target": t, "rep": rep, "clean": self.check_image(img)[0]})
                    elif t == "do-nothing FUSE":
                        p = self.mount_nullfs(mnt)
                        try:
                            rate, rates = self.fs_mark(mnt, n, size, loops)
                        finally:
                            null_requests.append(self.unmount_nullfs(mnt, p))
                    elif t in ("kernel btrfs", "ext4"):
                        self.mkfs_kernel("btrfs" if t == "kernel btrfs" else "ext4", img)
                        run(["mount", "-o", "loop", img, mnt])
                        try:
                            rate, rates = self.fs_mark(mnt, n, size, loops)
                        finally:
                            run(["umount", mnt])
                    else:  # tmpfs
                        run(["mount", "-t", "tmpfs", "-o", "size=8G", "tmpfs", mnt])
                        try:
                            rate, rates = self.fs_mark(mnt, n, size, loops)
                        finally:
                            run(["umount", mnt])
                    raw[t].append(rate)
                    loops_raw[t].append(rates)
                    log(f"  rep {rep + 1} {t}: {rate:,.0f} files/s (loops: {', '.join(f'{x:,.0f}' for x in rates)})")
                except (RuntimeError, json.JSONDecodeError, subprocess.TimeoutExpired) as e:
                    errors[t].append(str(e)[-600:])
                    log(f"  rep {rep + 1} {t}: FAILED: {str(e)[-600:]}")
                    if t.startswith("ubtrfs") and os.path.exists(img):
                        if is_mounted(mnt):
                            run(["umount", "-l", mnt], check=False)
                        checks.append({"target": t, "rep": rep, "clean": self.check_image(img)[0],
                                       "after_failure": True})
                finally:
                    if os.path.exists(img):
                        os.unlink(img)
        rows = {t: {**summarize(raw[t]), "values": raw[t], "loops": loops_raw[t], "errors": errors[t],
                    "skipped": notes.get(t)} for t in targets}
        # Issue 24's bars: the library 5x kernel btrfs for empty files, 4x for 4 KiB ones.
        lib_target = 5.0 if size == 0 else 4.0
        ratios = self.ratios(rows, [("ubtrfs library", "kernel btrfs", lib_target),
                                    ("ubtrfs library, commit inline", "kernel btrfs", None),
                                    ("ubtrfs FUSE", "do-nothing FUSE", 0.9), ("ubtrfs FUSE", "kernel btrfs", None)])
        result = {"workload": name, "unit": "files/s", "higher_is_better": True,
                  "command": f"fs_mark -S 0 -s {size} -n {n} -t {self.threads} -L {loops} -k -d D0 .. -d D{self.threads - 1}",
                  "library_command": f"lib_bench create IMG --threads {self.threads} --files {n} --loops {loops} --size {size} "
                                     "--commit behind|inline",
                  "rows": rows, "ratios": ratios, "checks": checks, "fuse_requests_at_unmount": requests,
                  "ubtrfs_stats": stats,
                  "ubtrfs_stats_mount": ("see `ubtrfs stats`" if self.have_stats_cmd else
                                         "TODO: no `ubtrfs stats` for a mount yet; FUSE request counters "
                                         "(mount -o stats) are in fuse_requests_at_unmount")}
        result["fuse_requests_per_file"] = self.requests_per_file(requests, n * self.threads * loops)
        result["nullfs_requests_at_unmount"] = null_requests
        result["nullfs_requests_per_file"] = self.requests_per_file(null_requests, n * self.threads * loops)
        result["reps"] = reps
        self.emit(name, result, f"fs_mark create, {size}-byte files ({self.threads} threads, {n:,} files each x {loops} loops)")

    def requests_per_file(self, requests, files):
        """FUSE requests per created file from the mount's counters (ubtrfs mount -o stats)."""
        if not requests:
            return None
        counts = {}
        for op in requests[-1].split(", "):
            f = op.rsplit(" ", 1)
            if len(f) == 2 and f[1].isdigit():
                counts[f[0]] = int(f[1])
        per = {k: round(v / files, 3) for k, v in counts.items() if v >= files / 100}
        per["total"] = round(sum(counts.values()) / files, 3)
        return per

    # ---- image build ----
    def make_trees(self):
        trees = os.path.join(self.work, "trees")
        empty = os.path.join(trees, "empty")
        per_dir = 800 if self.quick else 12500
        for d in range(16):
            p = os.path.join(empty, f"d{d:02d}")
            os.makedirs(p)
            for i in range(per_dir):
                open(os.path.join(p, f"f{i:06d}"), "w").close()
        mixed = os.path.join(trees, "mixed")
        count = 1600 if self.quick else 20000
        rng = random.Random(7)
        blob = rng.randbytes(64 * 1024)
        total = 0
        for i in range(count):
            d = os.path.join(mixed, f"d{i // 200:03d}")
            if i % 200 == 0:
                os.makedirs(d)
            size = rng.randint(0, 64 * 1024)
            off = rng.randint(0, len(blob) - size)
            with open(os.path.join(d, f"f{i:06d}"), "wb") as f:
                f.write(blob[off:off + size])
            total += size
        return [("empty", empty, f"{16 * per_dir:,} empty files in 16 directories"),
                ("mixed", mixed, f"{count:,} files of 0-64 KiB in {count // 200} directories ({total / 2**20:.0f} MiB)")]

    def timed(self, cmd):
        tf = os.path.join(self.work, "time.out")
        r = run(["/usr/bin/time", "-f", "%e %M %U %S", "-o", tf] + cmd, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        e, m, u, s = open(tf).read().split()[-4:]
        return {"seconds": float(e), "peak_rss_kib": int(m), "user": float(u), "sys": float(s)}

    def workload_mkfs(self):
        trees = self.make_trees()
        for tname, tree, desc in trees:
            name = f"mkfs-{tname}"
            log(f"== {name}: {desc}, {self.reps} reps")
            # mkfs.ubtrfs: ubtrfs's mkfs program, as mkfs.btrfs is btrfs-progs'
            # (`ubtrfs mkfs` makes the same image with more code mapped).
            targets = ["mkfs.ubtrfs --rootdir", "mkfs.btrfs --rootdir", "mkfs.ext4 -d"]
            raw = {t: [] for t in targets}
            errors = {t: [] for t in targets}
            checks = []
            img = os.path.join(self.work, "m.img")
            for rep in range(self.reps):
                order = targets[rep % 3:] + targets[:rep % 3]
                for t in order:
                    if t == "mkfs.ext4 -d" and tname == "empty" and rep > 0 and not self.quick and not self.args.reps:
                        continue  # about 4 minutes for 200,000 files here: one run is enough to place it
                    if os.path.exists(img):
                        os.unlink(img)
                    run(["sync"])
                    try:
                        if t == "mkfs.ubtrfs --rootdir":
                            m = self.timed([self.mkfs, "-q", "--size", "4G", "--rootdir", tree, img])
                            ok, msg = self.check_image(img)
                        elif t == "mkfs.btrfs --rootdir":
                            run(["truncate", "-s", "4G", img])
                            m = self.timed(["mkfs.btrfs", "-q", "-f", "--rootdir", tree, img])
                            ok, msg = self.check_image(img)
                        else:
                            run(["truncate", "-s", "4G", img])
                            m = self.timed(["mkfs.ext4", "-q", "-F", "-d", tree, img])
                            r = run(["e2fsck", "-fn", img], check=False)
                            ok, msg = r.returncode == 0, (r.stdout + r.stderr)[-600:]
                        checks.append({"target": t, "rep": rep, "clean": ok})
                        if not ok:
                            raise RuntimeError(f"image check failed: {msg}")
                        raw[t].append(m)
                        log(f"  rep {rep + 1} {t}: {m['seconds']:.2f} s, {m['peak_rss_kib'] / 1024:.0f} MiB peak, "
                            f"CPU {m['user']:.2f}+{m['sys']:.2f} s, check clean")
                    except RuntimeError as e:
                        errors[t].append(str(e)[-600:])
                        log(f"  rep {rep + 1} {t}: FAILED: {str(e)[-600:]}")
            if os.path.exists(img):
                os.unlink(img)
            rows = {}
            for t in targets:
                rows[t] = {**summarize([x["seconds"] for x in raw[t]]), "values": raw[t], "errors": errors[t],
                           "peak_rss_kib": summarize([x["peak_rss_kib"] for x in raw[t]]),
                           "cpu_seconds": summarize([x["user"] + x["sys"] for x in raw[t]])}
            ratios = self.ratios(rows, [("mkfs.ubtrfs --rootdir", "mkfs.btrfs --rootdir", 10.0),
                                        ("mkfs.ubtrfs --rootdir", "mkfs.ext4 -d", None)], lower_is_better=True)
            a, b = rows["mkfs.ubtrfs --rootdir"]["peak_rss_kib"]["median"], rows["mkfs.btrfs --rootdir"]["peak_rss_kib"]["median"]
            ratios.append({"what": "peak memory: ubtrfs / mkfs.btrfs", "ratio": (a / b) if a and b else None,
                           "target": "<= 1.0", "met": (a <= b) if a and b else None})
            result = {"workload": name, "unit": "s", "higher_is_better": False, "tree": desc,
                      "command": "mkfs.ubtrfs -q --size 4G --rootdir TREE IMG | mkfs.btrfs -q -f --rootdir TREE IMG "
                                 "| mkfs.ext4 -q -F -d TREE IMG (4 GiB sparse image), under /usr/bin/time",
                      "rows": rows, "ratios": ratios, "checks": checks}
            self.emit(name, result, f"image build: {desc}")
            shutil.rmtree(tree)

    # ---- parallel delete ----
    def workload_delete(self):
        ndirs = 4
        per_dir = 4000 if self.quick else 50000
        name = "delete"
        desc = f"{ndirs} directories x {per_dir:,} empty files, one worker per directory"
        log(f"== {name}: {desc}, {self.reps} reps")
        tree = os.path.join(self.work, "deltree")
        for d in range(ndirs):
            p = os.path.join(tree, f"d{d}")
            os.makedirs(p)
            for i in range(per_dir):
                open(os.path.join(p, f"f{i:06d}"), "w").close()
        targets = ["ubtrfs library", "ubtrfs FUSE (rm -rf)", "kernel btrfs (rm -rf)"]
        notes = {}
        if not self.fuse_ok:
            notes["ubtrfs FUSE (rm -rf)"] = "no /dev/fuse or fusermount3"
        if not self.loop_ok:
            notes["kernel btrfs (rm -rf)"] = self.loop_note
        raw = {t: [] for t in targets}
        errors = {t: [] for t in targets}
        checks, stats, requests = [], [], []
        img = os.path.join(self.work, "d.img")
        mnt = os.path.join(self.work, "dmnt")
        os.makedirs(mnt, exist_ok=True)
        total = ndirs * (per_dir + 1)
        # The library row is retried after a failure (up to 3 x REPS attempts, every failure counted in
        # the table): concurrent removals through the library abort now and then (see docs/BENCHMARKS.md).
        attempts = {t: 0 for t in targets}
        for rep in range(3 * self.reps):
            order = targets[rep % len(targets):] + targets[:rep % len(targets)]
            for t in order:
                if t in notes or len(raw[t]) >= self.reps or (rep >= self.reps and t != "ubtrfs library"):
                    continue
                attempts[t] += 1
                if os.path.exists(img):
                    os.unlink(img)
                run([self.ubtrfs, "mkfs", "-q", "--size", "4G", "--rootdir", tree, img])
                run(["sync"])
                try:
                    if t.startswith("ubtrfs library"):
                        cmd = [self.lib_bench, "delete", img, "--threads", str(ndirs)]
                        r = run(cmd + [f"/d{d}" for d in range(ndirs)])
                        j = json.loads(r.stdout)
                        sec = j["seconds"]
                        if j["removed"] != total:
                            raise RuntimeError(f"removed {j['removed']} entries, expected {total}")
                        stats.append(j["stats"])
                    else:
                        kernel = t.startswith("kernel")
                        p = None
                        if kernel:
                            run(["mount", "-o", "loop", img, mnt])
                        else:
                            p = self.mount_ubtrfs(img, mnt)
                        t0 = time.monotonic()
                        rms = [subprocess.Popen(["rm", "-rf", os.path.join(mnt, f"d{d}")], stderr=subprocess.PIPE,
                                                text=True) for d in range(ndirs)]
                        failed = [(rm.wait(), rm.stderr.read()) for rm in rms]
                        left = os.listdir(mnt)
                        if kernel:
                            run(["umount", mnt])
                        else:
                            requests.append(self.unmount_ubtrfs(mnt, p))
                        sec = time.monotonic() - t0
                        bad = [e for rc, e in failed if rc != 0]
                        if bad or left:
                            raise RuntimeError(f"rm -rf failed: {bad[:1]} left: {left[:5]}")
                    ok, _ = self.check_image(img)
                    checks.append({"target": t, "rep": rep, "clean": ok})
                    raw[t].append(sec)
                    log(f"  attempt {attempts[t]} {t}: {sec:.2f} s ({total / sec:,.0f} entries/s){'' if ok else ' CHECK FAILED'}")
                except (RuntimeError, json.JSONDecodeError) as e:
                    if is_mounted(mnt):
                        run(["umount", "-l", mnt], check=False)
                    errors[t].append(str(e)[-600:])
                    log(f"  attempt {attempts[t]} {t}: FAILED: {str(e)[-600:]}")
                    if t.startswith("ubtrfs"):  # what a failed run leaves must still be a clean image
                        checks.append({"target": t, "rep": rep, "clean": self.check_image(img)[0],
                                       "after_failure": True})
        if os.path.exists(img):
            os.unlink(img)
        shutil.rmtree(tree)
        rows = {t: {**summarize(raw[t]), "values": raw[t], "errors": errors[t], "skipped": notes.get(t)}
                for t in targets}
        ratios = self.ratios(rows, [("ubtrfs library", "kernel btrfs (rm -rf)", 3.0),
                                    ("ubtrfs FUSE (rm -rf)", "kernel btrfs (rm -rf)", None)], lower_is_better=True)
        result = {"workload": name, "unit": "s", "higher_is_better": False, "tree": desc,
                  "command": f"{ndirs} x rm -rf MNT/dK at once, then unmount (timed: removal and the unmount's "
                             f"commit); library: lib_bench delete IMG --threads {ndirs} /d0 .. /d{ndirs - 1} "
                             "(removal and Commit()); every image made by ubtrfs mkfs --rootdir",
                  "rows": rows, "ratios": ratios, "checks": checks, "ubtrfs_stats": stats,
                  "attempts": attempts, "fuse_requests_at_unmount": requests}
        self.emit(name, result, f"parallel delete: {desc}")

    # ---- dbench ----
    def workload_dbench(self):
        secs = 4 if self.quick else 30
        reps = 1 if self.quick else min(self.reps, 2)
        name = "dbench"
        log(f"== {name}: dbench -c client.txt -t {secs} 4, {reps} reps")
        targets = ["ubtrfs FUSE", "do-nothing FUSE", "kernel btrfs"]
        notes = {}
        if not os.path.exists(CLIENT_TXT):
            sys.exit(f"run.py: {CLIENT_TXT} missing (Debian's dbench package)")
        if not self.fuse_ok:
            notes["ubtrfs FUSE"] = notes["do-nothing FUSE"] = "no /dev/fuse or fusermount3"
        if not self.loop_ok:
            notes["kernel btrfs"] = self.loop_note
        raw = {t: [] for t in targets}
        errors = {t: [] for t in targets}
        checks, requests, null_requests = [], [], []
        img = os.path.join(self.work, "db.img")
        mnt = os.path.join(self.work, "dbmnt")
        os.makedirs(mnt, exist_ok=True)
        for rep in range(reps):
            order = targets[rep % 3:] + targets[:rep % 3]
            for t in order:
                if t in notes:
                    continue
                p = None
                try:
                    if t == "ubtrfs FUSE":
                        if os.path.exists(img):
                            os.unlink(img)
                        run([self.ubtrfs, "mkfs", "-q", "--size", "8G", img])
                        p = self.mount_ubtrfs(img, mnt)
                    elif t == "do-nothing FUSE":
                        p = self.mount_nullfs(mnt)
                    else:
                        self.mkfs_kernel("btrfs", img)
                        run(["mount", "-o", "loop", img, mnt])
                    try:
                        r = run(["dbench", "-c", CLIENT_TXT, "-D", mnt, "-t", str(secs), "4"],
                                timeout=secs * 10 + 120)
                    finally:
                        if t == "ubtrfs FUSE":
                            requests.append(self.unmount_ubtrfs(mnt, p))
                        elif t == "do-nothing FUSE":
                            null_requests.append(self.unmount_nullfs(mnt, p))
                        else:
                            run(["umount", mnt])
                    m = re.search(r"Throughput ([0-9.]+) MB/sec", r.stdout)
                    if not m:
                        raise RuntimeError(f"dbench output not understood:\n{r.stdout[-1500:]}")
                    mbs = float(m.group(1))
                    if t == "ubtrfs FUSE":
                        checks.append({"target": t, "rep": rep, "clean": self.check_image(img)[0]})
                    raw[t].append(mbs)
                    log(f"  rep {rep + 1} {t}: {mbs:.1f} MB/s")
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    if is_mounted(mnt):
                        run(["fusermount3", "-u", mnt] if "FUSE" in t else ["umount", mnt], check=False)
                    errors[t].append(str(e)[-800:])
                    log(f"  rep {rep + 1} {t}: FAILED: {str(e)[-800:]}")
        if os.path.exists(img):
            os.unlink(img)
        rows = {t: {**summarize(raw[t]), "values": raw[t], "errors": errors[t], "skipped": notes.get(t)}
                for t in targets}
        ratios = self.ratios(rows, [("ubtrfs FUSE", "kernel btrfs", None), ("ubtrfs FUSE", "do-nothing FUSE", None)])
        result = {"workload": name, "unit": "MB/s", "higher_is_better": True,
                  "command": f"dbench -c {CLIENT_TXT} -D MNT -t {secs} 4", "rows": rows, "ratios": ratios,
                  "checks": checks, "fuse_requests_at_unmount": requests, "nullfs_requests_at_unmount": null_requests}
        result["reps"] = reps
        self.emit(name, result, f"dbench, 4 clients, {secs} s (client.txt)")

    # ---- results ----
    def ratios(self, rows, pairs, lower_is_better=False):
        out = []
        for a, b, target in pairs:
            ma, mb = rows[a]["median"], rows[b]["median"]
            r = None
            if ma and mb:
                r = (mb / ma) if lower_is_better else (ma / mb)
            out.append({"what": f"{a} vs {b}", "ratio": r, "target": f">= {target}" if target else None,
                        "met": (r >= target) if (r is not None and target) else None})
        return out

    def emit(self, name, result, title):
        result.update({"title": title, "mode": "quick" if self.quick else "full", "reps": result.get("reps", self.reps),
                       "machine": self.machine, "load_at_end": self.note_load()})
        with open(os.path.join(self.out, f"{name}.json"), "w") as f:
            json.dump(result, f, indent=1)
        self.plot(name, result)
        self.table(name, result)
        self.latency(name, result)

    def plot(self, name, result):
        if not shutil.which("gnuplot"):
            log("  gnuplot missing: no plot")
            return
        rows = [(t, r) for t, r in result["rows"].items() if r["median"] is not None]
        if not rows:
            return
        dat = os.path.join(self.work, f"{name}.dat")
        with open(dat, "w") as f:
            for i, (t, r) in enumerate(rows):
                f.write(f"{i} \"{t}\" {r['median']} {r['min']} {r['max']}\n")
        png = os.path.join(self.out, f"{name}.png")
        better = "higher is better" if result["higher_is_better"] else "lower is better"
        script = f"""
set terminal pngcairo size 900,480 noenhanced font ",10"
set output '{png}'
set title "{result['title']}\\nmedian of up to {result['reps']} runs, bars: min..max; {better}; {result['machine']['date']}"
set ylabel "{result['unit']}"
set style fill solid 0.6 border -1
set boxwidth 0.6
set yrange [0:*]
set xrange [-0.6:{len(rows) - 0.4}]
set grid ytics
set xtics rotate by -15
plot '{dat}' using 1:3:xtic(2) with boxes lc rgb "#4477aa" notitle, \\
     '' using 1:3:4:5 with yerrorbars lc rgb "black" pt 0 notitle, \\
     '' using 1:3:(sprintf("{'%.0f' if result['unit'] == 'files/s' else '%.3g'}", $3)) with labels offset 0,0.8 notitle
"""
        r = run(["gnuplot"], check=False, input=script)
        if r.returncode != 0:
            log(f"  gnuplot failed: {r.stderr[-400:]}")

    def latency(self, name, result):
        """Latency histograms (unit ns) of the last in-process ubtrfs run: a table and a log2 plot."""
        snaps = [x for x in result.get("ubtrfs_stats") or [] if x.get("histograms")]
        if not snaps:
            if "ubtrfs_stats" in result:
                self.summary.setdefault(self.current, []).append("- ubtrfs latency histograms: none recorded by this build "
                                    "(CollectStats() returned no histograms)\n")
            return
        hs = {k: h for k, h in snaps[-1]["histograms"].items() if h["unit"] == "ns" and h["count"]}
        if not hs:
            return
        lines = ["ubtrfs latency (in-process, last repetition; log2 buckets, so p50/p99 are bucket upper bounds):", "",
                 "| histogram | count | mean | p50 <= | p99 <= | max |", "|---|---:|---:|---:|---:|---:|"]
        def us(v):
            return f"{v / 1000:,.1f} µs" if v < 10**7 else f"{v / 1e6:,.1f} ms"
        for k, h in sorted(hs.items(), key=lambda kv: -kv[1]["count"]):
            lines.append(f"| {k} | {h['count']:,} | {us(h['mean'])} | {us(h['p50_le'])} | {us(h['p99_le'])} | {us(h['max'])} |")
        lines.append("")
        if not shutil.which("gnuplot"):
            self.summary.setdefault(self.current, []).append("\n".join(lines))
            return
        top = sorted(hs.items(), key=lambda kv: -kv[1]["count"])[:8]
        plots = []
        for i, (k, h) in enumerate(top):
            dat = os.path.join(self.work, f"{name}-lat{i}.dat")
            with open(dat, "w") as f:
                for b, c in enumerate(h["log2_buckets"]):
                    if b and c:
                        f.write(f"{2 ** b} {c}\n")
            plots.append(f"'{dat}' using 1:2 with linespoints title '{k}'")
        png = os.path.join(self.out, f"{name}-latency.png")
        script = f"""
set terminal pngcairo size 900,480 noenhanced font ",10"
set output '{png}'
set title "ubtrfs latency, {result['title']}\\nlog2 buckets (x: bucket upper bound)"
set logscale x 2
set logscale y 10
set format x "%.0s%c"
set xlabel "latency, ns (log2 buckets)"
set ylabel "operations"
set grid
plot {', '.join(plots)}
"""
        r = run(["gnuplot"], check=False, input=script)
        if r.returncode != 0:
            log(f"  gnuplot (latency) failed: {r.stderr[-400:]}")
        else:
            lines += [f"![ubtrfs latency, {result['title']}](@IMG@{name}-latency.png)", ""]
        self.summary.setdefault(self.current, []).append("\n".join(lines))
        print("\n".join(lines), flush=True)

    def table(self, name, result):
        unit = result["unit"]
        lines = [f"### {result['title']}", "", f"`{result['command']}`", ""]
        if os.path.exists(os.path.join(self.out, f"{name}.png")):
            lines += [f"![{result['title']}](@IMG@{name}.png)", ""]
        extra = "peak RSS (median) | CPU s (median) |" if name.startswith("mkfs") else ""
        lines.append(f"| target | median {unit} | min | max | runs | {extra}")
        lines.append("|---|---:|---:|---:|---:|" + ("---:|---:|" if extra else ""))
        for t, r in result["rows"].items():
            if r.get("skipped"):
                lines.append(f"| {t} | skipped: {r['skipped']} | | | |" + (" | |" if extra else ""))
                continue
            fmt = (lambda v: f"{v:,.0f}") if unit == "files/s" else (lambda v: f"{v:,.2f}")
            if r["median"] is None:
                cells = "failed | | |"
            else:
                cells = f"{fmt(r['median'])} | {fmt(r['min'])} | {fmt(r['max'])} |"
            fails = f" ({len(r['errors'])} failed)" if r["errors"] else ""
            row = f"| {t} | {cells} {r['n']}{fails} |"
            if extra:
                pk, cpu = r["peak_rss_kib"]["median"], r["cpu_seconds"]["median"]
                row += f" {pk / 1024:.0f} MiB |" if pk else " |"
                row += f" {cpu:.2f} |" if cpu is not None else " |"
            lines.append(row)
        lines.append("")
        for q in result["ratios"]:
            if q["ratio"] is None:
                lines.append(f"- {q['what']}: n/a")
            else:
                met = "" if q["met"] is None else (" — target met" if q["met"] else " — **target not met**")
                tgt = f" (target {q['target']})" if q["target"] else ""
                lines.append(f"- {q['what']}: **{q['ratio']:.2f}x**{tgt}{met}")
        for key, what in (("fuse_requests_per_file", "the ubtrfs mount"),
                          ("nullfs_requests_per_file", "the do-nothing FUSE fs")):
            rpf = result.get(key)
            if rpf:
                lines.append(f"- FUSE requests per created file on {what}: " +
                             ", ".join(f"{k} {v:g}" for k, v in rpf.items()))
        bad = [c for c in result.get("checks", []) if not c["clean"]]
        nchk = len(result.get("checks", []))
        if nchk:
            lines.append(f"- image checks: {nchk - len(bad)} of {nchk} clean")
        lines.append("")
        self.summary.setdefault(self.current, []).append("\n".join(lines))
        print("\n".join(lines), flush=True)

    def finish(self, workloads):
        """Writes summary.md: one section per workload, each saying which run made it. A run of some
        workloads replaces their sections and keeps the others as the last run of each wrote them."""
        path = os.path.join(self.out, "summary.md")
        run_line = (f"Mode: {'quick' if self.quick else 'full'}, up to {self.reps} repetitions (runs column); "
                    f"{self.machine['cpu']}, {self.machine['cores']} cores, {self.machine['mem_mib']} MiB, kernel "
                    f"{self.machine['kernel']}, ubtrfs {self.machine['ubtrfs_commit']} ({self.machine['build']}); "
                    f"{self.machine['date']}; load average at start {' '.join(self.machine['load_at_start'])}, "
                    f"at end {' '.join(self.note_load())}.")
        sections = {}
        if os.path.exists(path):
            for m in SECTION_RE.finditer(open(path).read()):
                sections[m.group(1)] = m.group(2)
        for w in workloads:
            body = [f"_{w}: {run_line}_", ""]
            if self.loop_note:
                body.append(f"Note: {self.loop_note}\n")
            sections[w] = "\n".join(body + self.summary.get(w, [])).replace("@IMG@", "") + "\n"
        order = [w for w in KNOWN_WORKLOADS if w in sections] + [w for w in sections if w not in KNOWN_WORKLOADS]
        head = [f"<!-- written by bench/run.py; each workload's section says which run made it -->", ""]
        text = "\n".join(head + [f"<!-- workload: {w} -->\n{sections[w]}<!-- end workload: {w} -->\n" for w in order])
        with open(path, "w") as f:
            f.write(text)
        log(f"results: {self.out}/*.json, *.png, summary.md")
        # A run into docs/bench of every workload also refreshes the generated part of docs/BENCHMARKS.md.
        doc = os.path.join(ROOT, "docs", "BENCHMARKS.md")
        begin, end = "<!-- bench/run.py: begin -->", "<!-- bench/run.py: end -->"
        if self.out == os.path.join(ROOT, "docs", "bench") and os.path.exists(doc):
            old = open(doc).read()
            if begin in old and end in old and len(workloads) == len(KNOWN_WORKLOADS) and not self.quick:
                # the images sit beside summary.md, in docs/bench/
                in_doc = re.sub(r"\]\(([^/()]+\.png)\)", r"](bench/\1)", text)
                new = old[:old.index(begin) + len(begin)] + "\n" + in_doc + "\n" + old[old.index(end):]
                with open(doc, "w") as f:
                    f.write(new)
                log(f"updated the generated section of {doc}")

    def cleanup(self):
        for m in ("cmnt", "dmnt", "dbmnt"):
            p = os.path.join(self.work, m)
            if os.path.isdir(p) and is_mounted(p):
                run(["umount", "-l", p], check=False)
        shutil.rmtree(self.work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 repetitions (under two minutes)")
    ap.add_argument("--reps", type=int, default=0, help="repetitions (default 3, quick 2)")
    ap.add_argument("--threads", type=int, default=2, help="fs_mark / library create threads (default 2)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build-bench"), help="build directory")
    ap.add_argument("--out", default=None,
                    help="where JSON, PNG and summary go (default: docs/bench; with --quick: BUILD/bench-quick)")
    ap.add_argument("--workdir", default="/var/tmp", help="where images and trees are made")
    ap.add_argument("workloads", nargs="*", help="create mkfs delete dbench (default: all)")
    args = ap.parse_args()
    workloads = args.workloads or KNOWN_WORKLOADS
    for w in workloads:
        if w not in KNOWN_WORKLOADS:
            ap.error(f"unknown workload '{w}' (known: {' '.join(KNOWN_WORKLOADS)})")
    if args.threads < 1 or args.threads > 64:
        ap.error("--threads must be 1..64")
    if args.reps < 0:
        ap.error("--reps must be positive")
    if args.out is None:
        args.out = os.path.join(args.build, "bench-quick") if args.quick else os.path.join(ROOT, "docs", "bench")
    b = Bench(args)
    t0 = time.time()
    try:
        for w in workloads:
            b.current = w
            if w == "create":
                b.workload_create(0)
                b.workload_create(4096)
            elif w == "mkfs":
                b.workload_mkfs()
            elif w == "delete":
                b.workload_delete()
            elif w == "dbench":
                b.workload_dbench()
        b.finish(workloads)
    finally:
        b.cleanup()
    log(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
