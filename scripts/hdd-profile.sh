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
  *) die "usage: $0 run DIR -- CMD ARGS... | probe DIR" ;;
esac
