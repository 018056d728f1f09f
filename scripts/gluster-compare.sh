#!/usr/bin/env bash
# GlusterFS replica-3 against `sluice put` (issue 15): one file (1 GiB of random bytes by
# default) written with 3 replicas and fsync before the command returns, on this machine,
# both sides on the same disk (the scratch directory), in alternated runs.
#
#   Gluster: glusterd started here, a replica-3 volume of three bricks (directories under
#            --dir, on this host's non-loopback address, `force` since they share a host and
#            the root file system), default volume options, mounted with the native FUSE
#            client; the file written by `dd if=SRC of=MNT/f bs=1M conv=fsync` (dd calls
#            fsync(2) on the file before it exits; the FUSE client's replicate translator
#            sends the FSYNC to all three bricks, each brick fsyncs its copy).
#   Sluice:  `sluice local` (metadata service + 3 DataNodes in one process, default
#            configuration: replication 3, 128 MiB blocks, sync.on.close) with its data under
#            --dir; the file written by `sluice put SRC /cmp/f` (each block fdatasynced on all
#            three DataNodes before its last packet is acknowledged; the file completed and
#            renamed in the namespace, flushed to disk, before put exits).
#
# Before every timed run, on both sides alike: the previous file is deleted (and, for Sluice,
# its replica files gone from disk), `sync; echo 1 > /proc/sys/vm/drop_caches`, then the source
# file is read back into the page cache (fincore shows how much of it is resident).
# Per run: wall seconds (MiB/s, MB/s) and CPU seconds (user + system) of every process
# involved, from /proc/PID/stat before and after (glusterd, the three glusterfsd bricks, the
# FUSE glusterfs client, the self-heal daemon; the `sluice local` process) plus the writing
# command's own (GNU time: dd, or the `sluice put` process). Kernel threads (writeback,
# kworkers) are counted on neither side. Each written copy is checked afterwards (untimed):
# size on every brick and content (cmp) of every brick's copy for Gluster; `fsck` HEALTHY and
# the content read back (`sluice cat | cmp`) for Sluice. At the end, also untimed, one 64 MiB
# write per side with each side's own per-replica fsync counters (Gluster's `volume profile`
# FSYNC per brick, Sluice's `sluice_datanode_fsyncs_total` per DataNode): the run fails if a
# replica did not fsync.
#
#   flock /work/bench.lock scripts/gluster-compare.sh [--pairs 3] [--dir DIR] [--size-mib 1024]
#       [--warmup 1] [--host ADDR] [--sluice BIN] [--keep]
#
# Needs root (mount, drop_caches, glusterd), /dev/fuse, and no glusterd already running.
# Installs glusterfs-server and glusterfs-client (apt-get) when absent.
set -euo pipefail
cd "$(dirname "$0")/.."

pairs=3
warmup=1
size_mib=1024
dir=
host=
keep=
bin="$(pwd)/target/release/sluice"
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --pairs) pairs="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --size-mib) size_mib="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --host) host="$2"; shift 2 ;;
    --sluice) bin="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gluster-compare: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
die() { echo "gluster-compare: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (mount, drop_caches, glusterd)"
[ -x "$bin" ] || die "$bin missing (cargo build --release --bin sluice)"
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || die "--pairs must be a positive integer"
[[ "$warmup" =~ ^[0-9]+$ ]] || die "--warmup must be a non-negative integer"

# --- GlusterFS packages ------------------------------------------------------------------
if ! command -v glusterd >/dev/null || ! [ -x /sbin/mount.glusterfs ] || ! [ -x /usr/bin/time ] ||
  ! command -v curl >/dev/null; then
  echo "installing glusterfs-server glusterfs-client time curl (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq glusterfs-server glusterfs-client time curl >/dev/null
fi
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
[ -e /dev/fuse ] || die "/dev/fuse missing: the Gluster FUSE client cannot mount"
if pgrep -x glusterd >/dev/null; then
  die "a glusterd is already running (pid $(pgrep -x glusterd | tr '\n' ' ')); this script starts and stops its own"
fi
if [ -z "$host" ]; then
  # Gluster refuses loopback brick addresses: this host's first non-loopback IPv4 address.
  host=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -m1 -E '^[0-9]+(\.[0-9]+){3}$' | grep -v '^127\.' || true)
  [ -n "$host" ] || die "no non-loopback IPv4 address found; pass --host ADDR"
fi

# --- scratch directory and clean-up --------------------------------------------------------
if [ -z "$dir" ]; then
  dir=$(mktemp -d "$(pwd)/gluster-compare.XXXXXX")
else
  [ ! -e "$dir" ] || [ -z "$(ls -A "$dir")" ] || die "--dir $dir must be absent or empty"
  mkdir -p "$dir"
fi
dir=$(cd "$dir" && pwd)
vol="sluicecmp$$"
mnt="$dir/mnt"
src="$dir/src.bin"
glusterd_pid=
vol_created=
sluice_pid=
cleanup() {
  set +e
  if [ -n "$sluice_pid" ]; then
    kill -INT "$sluice_pid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$sluice_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$sluice_pid" 2>/dev/null; wait "$sluice_pid" 2>/dev/null
  fi
  if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt" || umount -l "$mnt"; fi
  if [ -n "$vol_created" ]; then
    gluster --mode=script volume stop "$vol" force >/dev/null
    gluster --mode=script volume delete "$vol" >/dev/null
  fi
  if [ -n "$glusterd_pid" ]; then
    kill "$glusterd_pid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$glusterd_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  # Any brick, self-heal or client process of this script's volume still alive.
  for p in $(vol_pids); do kill "$p" 2>/dev/null; done
  if [ -z "$keep" ]; then
    if mountpoint -q "$mnt" 2>/dev/null; then
      echo "gluster-compare: $mnt still mounted, $dir left in place" >&2
    else
      rm -rf "$dir"
    fi
  else
    echo "kept $dir"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Processes of this script's volume: glusterfsd bricks (--volfile-id VOL.HOST.PATH), the
# self-heal daemon (shd/VOL) and the FUSE client (--volfile-id=/VOL), by command line.
vol_pids() {
  local p comm
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    case "$comm" in glusterfs|glusterfsd) ;; *) continue ;; esac
    tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qE "(volfile-id[= ]/?|shd/)$vol([. ]|$)" && echo "$p"
  done
}
# "label pid" lines for every process whose CPU is counted on the Gluster side.
gluster_procs() {
  local p cmd
  echo "glusterd $glusterd_pid"
  for p in $(vol_pids); do
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline")
    case "$cmd" in
      *--process-name\ brick*) echo "brick $p" ;;
      *--process-name\ fuse*) echo "client $p" ;;
      *--process-name\ glustershd*) echo "shd $p" ;;
      *) echo "other $p" ;;
    esac
  done
}
tck=$(getconf CLK_TCK)
# CPU seconds (utime + stime, all threads) of one pid.
cpu_of() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo "gone"; return; }
  s=${s##*) }
  awk -v t="$tck" '{ printf "%.2f", ($12 + $13) / t }' <<<"$s"
}
now() { echo "$EPOCHREALTIME"; }

# --- the binary: one copy for the whole run (a rebuild of $bin mid-run changes nothing) -----
bin_src=$bin
bin_info="$(sha256sum "$bin" | cut -c1-16), built $(date -u -r "$bin" '+%Y-%m-%d %H:%M:%S UTC')"
cp "$bin" "$dir/sluice-bin"
bin="$dir/sluice-bin"

# --- source file --------------------------------------------------------------------------
echo "generating $size_mib MiB of random bytes: $src"
head -c "$((size_mib << 20))" /dev/urandom >"$src"
bytes=$((size_mib << 20))

# --- Gluster: glusterd, volume, mount --------------------------------------------------------
mkdir -p "$dir/bricks" "$mnt" "$dir/sluice"
/usr/sbin/glusterd -p "$dir/glusterd.pid"
for _ in $(seq 1 100); do [ -s "$dir/glusterd.pid" ] && break; sleep 0.1; done
glusterd_pid=$(cat "$dir/glusterd.pid")
for _ in $(seq 1 100); do gluster --mode=script volume list >/dev/null 2>&1 && break; sleep 0.2; done
gluster --mode=script volume create "$vol" replica 3 \
  "$host:$dir/bricks/b1" "$host:$dir/bricks/b2" "$host:$dir/bricks/b3" force >/dev/null
vol_created=1
gluster --mode=script volume start "$vol" >/dev/null
mount -t glusterfs "$host:/$vol" "$mnt"
for _ in $(seq 1 50); do mountpoint -q "$mnt" && break; sleep 0.1; done
mountpoint -q "$mnt" || die "mount -t glusterfs $host:/$vol $mnt failed"

# --- Sluice: sluice local ------------------------------------------------------------------
"$bin" local --data "$dir/sluice/data" --datanodes 3 --port 0 --http-port 0 \
  >"$dir/sluice/local.out" 2>"$dir/sluice/local.log" &
sluice_pid=$!
ready=
for _ in $(seq 1 600); do
  ready=$(grep -m1 '^{"ready":"local"' "$dir/sluice/local.out" 2>/dev/null || true)
  [ -n "$ready" ] && break
  kill -0 "$sluice_pid" 2>/dev/null || { cat "$dir/sluice/local.log" >&2; die "sluice local exited"; }
  sleep 0.1
done
[ -n "$ready" ] || die "sluice local not ready after 60 s"
rpc=$(sed -E 's/.*"rpc":"([^"]+)".*/\1/' <<<"$ready")
mapfile -t dn_http < <(grep -oE '"datanode-[0-9]+-http":"[^"]+"' <<<"$ready" | cut -d'"' -f4)
sl() { "$bin" --metadata "$rpc" "$@"; }

# --- set-up report -------------------------------------------------------------------------
echo
echo "== set-up"
echo "machine:   $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "disk:      $dir on $(df --output=source,fstype "$dir" | tail -1 | tr -s ' ') (bricks and Sluice data alike)"
echo "source:    $src, $size_mib MiB from /dev/urandom, made once, read into the page cache before every run"
echo "gluster:   $(glusterfs --version | head -1); volume $vol: replica 3, bricks $host:$dir/bricks/b{1,2,3} (force)"
gluster volume info "$vol" | sed -n '/Options Reconfigured/,$p' | sed '/^$/d; s/^/           /'
echo "           (the options above are what 'volume create' sets by itself for a replica volume; none set here)"
echo "           defaults that bear on the write path:"
gluster volume get "$vol" all | grep -E '^(performance\.(write-behind|write-behind-window-size|flush-behind|strict-write-ordering|client-io-threads|io-thread-count)|cluster\.(ensure-durability|eager-lock|full-lock|quorum-type)|storage\.(batch-fsync-delay-usec|batch-fsync-mode|linux-aio|o-direct)|network\.ping-timeout) ' \
  | awk '{ printf "             %s = %s\n", $1, $2 }'
echo "           mount: $(findmnt -n -o SOURCE,FSTYPE,OPTIONS "$mnt")"
echo "sluice:    $("$bin" --version), copied from $bin_src (sha256 $bin_info)"
echo "           sluice local --data $dir/sluice/data --datanodes 3 (metadata RPC $rpc), default configuration"
env | grep '^SLUICE_' | sed 's/^/           environment: /' || echo "           no SLUICE_* environment variables"
echo "gluster:   dd if=SRC of=$mnt/f bs=1M conv=fsync"
echo "sluice:    sluice --metadata $rpc put SRC /cmp/f"

# --- one timed run -------------------------------------------------------------------------
# Before each run, on both sides: sync, drop the page cache, read the source back in.
prepare() {
  sync
  echo 1 >/proc/sys/vm/drop_caches
  cat "$src" >/dev/null
  resident=$(fincore -nb -o RES "$src" 2>/dev/null | awk '{ printf "%.0f%%", 100 * $1 / '"$bytes"' }' || echo "?")
}
# Sets: wall cpu_total cpu_detail (label=seconds ...), for the side's processes and command.
timed() { # timed SIDE COMMAND...
  local side=$1; shift
  local procs=() before=() after=() t0 t1 i label p tfile="$dir/time.out"
  if [ "$side" = gluster ]; then
    mapfile -t procs < <(gluster_procs)
  else
    procs=("local $sluice_pid")
  fi
  for i in "${!procs[@]}"; do before[i]=$(cpu_of "${procs[i]#* }"); done
  t0=$(now)
  /usr/bin/time -f '%U %S' -o "$tfile" "$@"
  t1=$(now)
  for i in "${!procs[@]}"; do after[i]=$(cpu_of "${procs[i]#* }"); done
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
  cpu_detail=
  declare -A by=()
  for i in "${!procs[@]}"; do
    label=${procs[i]%% *}
    [ "${after[i]}" != gone ] || { echo "  warning: ${procs[i]} exited during the run" >&2; continue; }
    by[$label]=$(awk -v s="${by[$label]:-0}" -v a="${before[i]}" -v b="${after[i]}" 'BEGIN { printf "%.2f", s + b - a }')
  done
  by[cmd]=$(awk '{ printf "%.2f", $1 + $2 }' "$tfile")
  cpu_total=0
  for label in glusterd brick client shd other local cmd; do
    [ -n "${by[$label]:-}" ] || continue
    cpu_detail+="$label=${by[$label]} "
    cpu_total=$(awk -v s="$cpu_total" -v x="${by[$label]}" 'BEGIN { printf "%.2f", s + x }')
  done
}

run_gluster() {
  rm -f "$mnt/f"
  prepare
  timed gluster dd if="$src" of="$mnt/f" bs=1M conv=fsync status=none
  local b
  for b in 1 2 3; do
    [ "$(stat -c %s "$dir/bricks/b$b/f")" = "$bytes" ] || die "gluster: brick b$b holds $(stat -c %s "$dir/bricks/b$b/f") bytes"
    cmp "$src" "$dir/bricks/b$b/f" || die "gluster: brick b$b's copy differs"
  done
  rm -f "$mnt/f"
}
run_sluice() {
  prepare
  timed sluice "$bin" --metadata "$rpc" put "$src" /cmp/f
  sl fsck /cmp/f | grep -q HEALTHY || { sl fsck /cmp/f >&2; die "sluice: fsck /cmp/f is not HEALTHY"; }
  sl cat /cmp/f | cmp - "$src" || die "sluice: /cmp/f differs from the source"
  sl rm /cmp/f >/dev/null
  # The DataNodes delete replicas on the metadata service's command: wait until they are gone.
  local i
  for i in $(seq 1 300); do
    [ -z "$(find "$dir/sluice/data" -name 'blk_*' -print -quit)" ] && return 0
    sleep 0.2
  done
  die "sluice: replica files still on disk 60 s after rm"
}

mib() { awk -v w="$1" -v n="$bytes" 'BEGIN { printf "%.1f", n / 1048576 / w }'; }
mb() { awk -v w="$1" -v n="$bytes" 'BEGIN { printf "%.1f", n / 1e6 / w }'; }
per_gib() { awk -v c="$1" -v n="$bytes" 'BEGIN { printf "%.2f", c / (n / 1073741824) }'; }

echo
echo "== runs (alternated: Sluice, then Gluster, in every pair; warm-up pairs are not counted)"
printf '%-9s %-8s %8s %9s %8s %9s %8s  %s\n' pair side wall_s MiB/s MB/s CPU_s CPU/GiB "CPU by process (s), source resident"
results=()
total=$((warmup + pairs))
for n in $(seq 1 "$total"); do
  if [ "$n" -le "$warmup" ]; then name="warm-$n"; else name=$((n - warmup)); fi
  run_sluice
  s_wall=$wall; s_cpu=$cpu_total
  printf '%-9s %-8s %8s %9s %8s %9s %8s  %s\n' "$name" sluice "$wall" "$(mib "$wall")" "$(mb "$wall")" \
    "$cpu_total" "$(per_gib "$cpu_total")" "${cpu_detail}src=$resident"
  run_gluster
  g_wall=$wall; g_cpu=$cpu_total
  printf '%-9s %-8s %8s %9s %8s %9s %8s  %s\n' "$name" gluster "$wall" "$(mib "$wall")" "$(mb "$wall")" \
    "$cpu_total" "$(per_gib "$cpu_total")" "${cpu_detail}src=$resident"
  ratio=$(awk -v s="$s_wall" -v g="$g_wall" 'BEGIN { printf "%.2f", g / s }')
  echo "          sluice/gluster MB/s: ${ratio}x   (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  [ "$n" -le "$warmup" ] || results+=("$name $(mb "$s_wall") $(mb "$g_wall") $ratio $(per_gib "$s_cpu") $(per_gib "$g_cpu")")
done

# --- summary -------------------------------------------------------------------------------
echo
echo "== summary ($pairs pairs, $size_mib MiB, 3 replicas, fsync before the command returns)"
echo "| pair | Sluice MB/s | Gluster MB/s | Sluice / Gluster | Sluice CPU s/GiB | Gluster CPU s/GiB |"
echo "| --- | --- | --- | --- | --- | --- |"
for r in "${results[@]}"; do
  read -r p a b c d e <<<"$r"
  echo "| $p | $a | $b | ${c}x | $d | $e |"
done
stat_line() { # column label
  printf '%s\n' "${results[@]}" | awk -v k="$1" '{ print $k }' | sort -g |
    awk -v l="$2" '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
      printf "%-26s min %7.2f  median %7.2f  max %7.2f\n", l, v[1], m, v[NR] }'
}
stat_line 2 "Sluice MB/s"
stat_line 3 "Gluster MB/s"
stat_line 4 "Sluice / Gluster (x)"
stat_line 5 "Sluice CPU s/GiB"
stat_line 6 "Gluster CPU s/GiB"

# --- untimed check: the fsync reaches every replica ----------------------------------------
# One more, small write on each side, with each side's own per-replica counters: Gluster's
# volume profile (every brick must receive an FSYNC; profiling is off during the timed runs),
# Sluice's DataNode metric sluice_datanode_fsyncs_total (block and metadata file per replica).
echo
echo "== check (untimed): fsyncs per replica for one 64 MiB file on each side"
gluster --mode=script volume profile "$vol" start >/dev/null
gluster --mode=script volume profile "$vol" info clear >/dev/null
dd if="$src" of="$mnt/fsync-check" bs=1M count=64 conv=fsync status=none
gluster --mode=script volume profile "$vol" info incremental |
  awk '/^Brick:/ { b = $2 } / FSYNC$/ { print "  gluster brick " b ": " $(NF - 1) " FSYNC"; n++ }
       END { if (n != 3) { print "  expected an FSYNC on 3 bricks, saw " n + 0; exit 1 } }'
gluster --mode=script volume profile "$vol" stop >/dev/null
rm -f "$mnt/fsync-check"
fsyncs() { curl -sSf "http://$1/metrics" | awk '$1 == "sluice_datanode_fsyncs_total" { print $2 }'; }
declare -A fs0=()
for h in "${dn_http[@]}"; do fs0[$h]=$(fsyncs "$h"); done
head -c 64M "$src" | sl put - /cmp/fsync-check
for h in "${dn_http[@]}"; do
  d=$(awk -v a="${fs0[$h]}" -v b="$(fsyncs "$h")" 'BEGIN { print b - a }')
  echo "  sluice DataNode (http $h): $d fsyncs"
  [ "$d" -ge 2 ] || die "sluice: DataNode $h did not fsync the replica"
done
sl rm /cmp/fsync-check >/dev/null
