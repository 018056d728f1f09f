#!/usr/bin/env bash
# The HDD disk profile (docs/benchmarks.md, "HDD profile") for any process: the same cgroup v1
# limits `sluice bench --disk-profile hdd` gives its own cluster (client/cli/src/bench/
# disk_profile.rs; a test checks that the numbers agree), for a process cluster or a probe.
#
#   scripts/hdd-profile.sh run DIR -- CMD ARGS...   run CMD in a fresh cgroup throttling DIR's disk
#                                                   (e.g. sluice local --data DIR, or one
#                                                   sluice-datanode per DataNode)
#   scripts/hdd-profile.sh probe DIR                fio-style probe inside the profile: O_DIRECT
#                                                   1 MiB sequential and 4 KiB random reads and
#                                                   writes, measured against the configured limits
#   scripts/hdd-profile.sh probe-seek DIR [SLUICE]  the same kind of probe inside an hddfs mount
#                                                   (the hdd-seek profile's model, `SLUICE hddfs`,
#                                                   default ./target/release/sluice) under DIR,
#                                                   plus 2 and 16 interleaved buffered writers
#
# Needs root and the blkio and memory controllers at /sys/fs/cgroup. SLUICE_HDD_MEMORY (bytes,
# default 1 GiB) sets the memory limit. The cgroups (sluice-hdd-PID) are removed on exit.
set -euo pipefail

IOPS=170
BPS=150000000
MEMORY=${SLUICE_HDD_MEMORY:-1073741824}
CG=/sys/fs/cgroup

die() { echo "hdd-profile: $*" >&2; exit 1; }

# major:minor of the whole disk holding $1.
whole_disk() {
  local hex major minor sys
  hex=$(stat -c '%D' "$1") || die "cannot stat $1"
  major=$(( 0x$hex >> 8 )); minor=$(( 0x$hex & 0xff ))
  sys=/sys/dev/block/$major:$minor
  [ -e "$sys" ] || die "$1 is on $major:$minor, not a block device"
  if [ -e "$sys/partition" ]; then cat "$(readlink -f "$sys")/../dev"; else echo "$major:$minor"; fi
}

own() { awk -F: -v c="$1" '{ n = split($2, a, ","); for (i = 1; i <= n; i++) if (a[i] == c) print $3 }' /proc/self/cgroup; }

BLKIO_ORIGIN= MEMORY_ORIGIN= BLKIO= MEM=
cleanup() {
  [ -n "$BLKIO" ] || return 0
  echo $$ > "$BLKIO_ORIGIN/cgroup.procs" || true
  echo $$ > "$MEMORY_ORIGIN/cgroup.procs" || true
  rmdir "$BLKIO" "$MEM" || true
}

# Creates the cgroups for disk $1 and moves this shell into them.
enter() {
  local dev=$1 name=sluice-hdd-$$
  [ -e "$CG/blkio/cgroup.procs" ] && [ -e "$CG/memory/cgroup.procs" ] || die "no cgroup v1 blkio/memory at $CG"
  BLKIO_ORIGIN=$CG/blkio$(own blkio); MEMORY_ORIGIN=$CG/memory$(own memory)
  BLKIO=$CG/blkio/$name; MEM=$MEMORY_ORIGIN/$name
  mkdir "$BLKIO" "$MEM"
  trap cleanup EXIT
  for op in read write; do
    echo "$dev $IOPS" > "$BLKIO/blkio.throttle.${op}_iops_device"
    echo "$dev $BPS" > "$BLKIO/blkio.throttle.${op}_bps_device"
  done
  echo "$MEMORY" > "$MEM/memory.limit_in_bytes"
  echo $$ > "$BLKIO/cgroup.procs"
  echo $$ > "$MEM/cgroup.procs"
  echo "hdd-profile: $BLKIO and $MEM: $dev at $IOPS IOPS, $((BPS / 1000000)) MB/s, memory $MEMORY bytes" >&2
}

# The probe itself, one python3 process inside the cgroup (no process start per request):
# O_DIRECT from a page-aligned (mmap) buffer; the buffered sequential read starts cold
# (fsync + POSIX_FADV_DONTNEED) and shows what the kernel's readahead requests achieve.
PROBE_PY='
import mmap, os, random, sys, time
path, blocks, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
size, MiB = blocks << 20, 1 << 20
def charged():
    with open(sys.argv[4]) as f:
        return sum(int(l.split()[2]) for l in f if l.split()[:1] == [sys.argv[5]] and l.split()[1] in ("Read", "Write"))
def row(name, n, nbytes, t, r0, unit):
    v = nbytes / t / 1e6 if unit == "MB/s" else n / t
    print("%-36s %9.1f %-4s %9d %-4s %9d" % (name, v, unit, int(sys.argv[7] if unit == "IOPS" else sys.argv[6]) // (1 if unit == "IOPS" else 1000000), unit, charged() - r0))
buf = mmap.mmap(-1, MiB); buf.write(os.urandom(MiB)); small = mmap.mmap(-1, 4096)
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
r0, t0 = charged(), time.time()
for i in range(blocks): os.pwritev(fd, [buf], i * MiB)
os.fsync(fd); row("write 1 MiB O_DIRECT sequential", blocks, size, time.time() - t0, r0, "MB/s")
r0, t0 = charged(), time.time()
for i in range(blocks): os.preadv(fd, [buf], i * MiB)
row("read 1 MiB O_DIRECT sequential", blocks, size, time.time() - t0, r0, "MB/s")
for name, op in (("read 4 KiB O_DIRECT random", os.preadv), ("write 4 KiB O_DIRECT random", os.pwritev)):
    r0, t0, n = charged(), time.time(), 0
    while time.time() - t0 < secs:
        op(fd, [small], random.randrange(size // 4096) * 4096); n += 1
    row(name, n, n * 4096, time.time() - t0, r0, "IOPS")
os.close(fd)
fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
r0, t0 = charged(), time.time()
while os.read(fd, 4 * MiB): pass
row("read 4 MiB calls buffered, cold", blocks, size, time.time() - t0, r0, "MB/s")
os.close(fd); os.unlink(path)
'

probe() {
  local dir=$1 dev
  dev=$(whole_disk "$dir"); enter "$dev"
  printf '%-36s %14s %14s %9s\n' probe measured configured requests
  python3 -c "$PROBE_PY" "$dir/hdd-probe.$$" 256 3 "$BLKIO/blkio.throttle.io_serviced" "$dev" "$BPS" "$IOPS"
}

# The hdd-seek probe: one python3 process on the hddfs mount; after each row the model's
# counters (its stats file, rewritten twice a second) give the requests, seeks and mean
# request size the row cost; "model" is what the model's formulas give for that pattern.
PROBE_SEEK_PY='
import json, mmap, os, random, sys, threading, time
mnt, stats = sys.argv[1], sys.argv[2]
MiB, CAP, RATE = 1 << 20, 1e12, 150e6
def seek(d): return 1e-3 + 15e-3 * min(d / CAP, 1) ** 0.5
def st():
    time.sleep(0.7)
    with open(stats) as f: return json.load(f)
def row(name, v, unit, model, a, b):
    req = (b["reads"] + b["writes"]) - (a["reads"] + a["writes"])
    by = (b["read_bytes"] + b["write_bytes"]) - (a["read_bytes"] + a["write_bytes"])
    print("%-44s %8.1f %-4s %8.1f %-4s %8d %7d %9.0f" % (name, v, unit, model, unit, req, b["seeks"] - a["seeks"], by / max(req, 1) / 1024))
big = mmap.mmap(-1, MiB); big.write(os.urandom(MiB)); small = mmap.mmap(-1, 4096)
path = os.path.join(mnt, "seq"); blocks = 256
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
a, t0 = st(), time.time()
for i in range(blocks): os.pwritev(fd, [big], i * MiB)
os.fsync(fd); t = time.time() - t0
row("write 1 MiB O_DIRECT sequential", blocks / t * 1.048576, "MB/s", RATE / 1e6, a, st())
a, t0 = st(), time.time()
for i in range(blocks): os.preadv(fd, [big], i * MiB)
t = time.time() - t0
row("read 1 MiB O_DIRECT sequential", blocks / t * 1.048576, "MB/s", RATE / 1e6, a, st())
def rand(name, span, secs=4):
    a, t0, n = st(), time.time(), 0
    while time.time() - t0 < secs:
        os.preadv(fd, [small], random.randrange(span // 4096) * 4096); n += 1
    # mean seek over uniform random pairs in the span: E[sqrt(|x-y|)] = 8/15 sqrt(span)
    model = 1 / (1e-3 + 15e-3 * (8 / 15) * (span / CAP) ** 0.5 + 4.167e-3 + 4096 / RATE)
    row(name, n / (time.time() - t0), "IOPS", model, a, st())
rand("read 4 KiB O_DIRECT random, 256 MiB file", blocks * MiB)
os.ftruncate(fd, int(0.9 * CAP))
rand("read 4 KiB O_DIRECT random, 900 GB sparse", int(0.9 * CAP))
os.close(fd); os.unlink(path)
def writers(n, per=64 * MiB, piece=64 << 10):
    data = os.urandom(piece)
    def one(i):
        f = os.open(os.path.join(mnt, "w%d-%d" % (n, i)), os.O_WRONLY | os.O_CREAT, 0o600)
        for _ in range(per // piece): os.write(f, data)
        os.fsync(f); os.close(f)
    a, t0 = st(), time.time()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts: t.start()
    for t in ts: t.join()
    t = time.time() - t0
    # one writer: the platter rate; more: what the model gives if every 64 KiB write reached
    # the disk interleaved with the others (a short seek + half a turn each)
    model = RATE / 1e6 if n == 1 else piece / (seek(n * 136 * MiB / 2) + 4.167e-3 + piece / RATE) / 1e6
    row("%d writers x 64 MiB, 64 KiB writes, fsync" % n, n * per / t / 1e6, "MB/s", model, a, st())
    for i in range(n): os.unlink(os.path.join(mnt, "w%d-%d" % (n, i)))
writers(1)
writers(2)
writers(16)
'

probe_seek() {
  local dir=$1 sluice=${2:-./target/release/sluice} pid
  [ -x "$sluice" ] || die "no $sluice: build it (cargo build --release -p sluice-cli --bins)"
  mkdir -p "$dir/backing" "$dir/mnt"
  # The daemon stops (and unmounts) when its standard input closes: keep a pipe open to it.
  exec 3> >("$sluice" hddfs --backing "$dir/backing" --mount "$dir/mnt" --stats "$dir/stats.json")
  for _ in $(seq 100); do [ -e "$dir/stats.json" ] && break; sleep 0.1; done
  [ -e "$dir/stats.json" ] || die "hddfs did not start"
  printf '%-44s %13s %13s %8s %7s %9s\n' probe measured model requests seeks 'KiB/req'
  python3 -c "$PROBE_SEEK_PY" "$dir/mnt" "$dir/stats.json" || true
  exec 3>&-
  for _ in $(seq 100); do mountpoint -q "$dir/mnt" || break; sleep 0.1; done
  rm -rf "$dir/backing" "$dir/stats.json"; rmdir "$dir/mnt" || true
}

case "${1:-}" in
  run)
    [ $# -ge 4 ] && [ "$3" = "--" ] || die "usage: $0 run DIR -- CMD ARGS..."
    dir=$2; shift 3
    enter "$(whole_disk "$dir")"
    "$@"
    ;;
  probe)
    [ $# -eq 2 ] || die "usage: $0 probe DIR"
    probe "$2"
    ;;
  probe-seek)
    [ $# -ge 2 ] && [ $# -le 3 ] || die "usage: $0 probe-seek DIR [SLUICE]"
    probe_seek "$2" "${3:-}"
    ;;
  *) die "usage: $0 run DIR -- CMD ARGS... | probe DIR | probe-seek DIR [SLUICE]" ;;
esac
