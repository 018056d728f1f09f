"""The six docker-compose scenarios (docs/operations.md). Each takes the running `Cluster` and the
`Manifest` of files written so far, returns the list of what it checked, raises `Failed` when a
check does not hold, and puts every container it touched back (unpause, reconnect, start) before
it returns, pass or fail.

The faults land in the middle of a put: the put is fed through a pipe, the scenario reads the
pipeline of the block being written from `sluice fsck --json` (an open file lists its last
block's targets in pipeline order), injects the fault into one of those containers, and feeds
the rest while the client recovers.
"""

import os
import random
import threading
import time

from harness import DATANODES, MiB, SERVICES, Failed, StreamingPut, run, say, sha, wait_for

BLOCK = 4 * MiB
BIG = 40 * MiB + 12345  # ten full blocks and a partial one


class Manifest:
    """Every file the scenarios wrote and had acknowledged: path -> (length, sha256)."""

    def __init__(self):
        self.files = {}

    def add(self, path, data):
        self.files[path] = (len(data), sha(data))

    def check_all(self, cluster):
        for path, (length, digest) in sorted(self.files.items()):
            got = cluster.read(path)
            if (len(got), sha(got)) != (length, digest):
                raise Failed(f"{path}: read {len(got)} bytes sha {sha(got)}, "
                             f"expected {length} sha {digest}")
        return len(self.files)


def s1_put_get(c, manifest):
    """Put and get through the cluster from the host (and from a container), byte-exact."""
    checked = []
    files = {
        "/s1/empty": b"",
        "/s1/small": os.urandom(1000),
        "/s1/multi": os.urandom(2 * BLOCK + 12345),
    }
    for path, data in files.items():
        c.put(path, data, block_size=BLOCK)
        c.check_exact(path, data)
        manifest.add(path, data)
    checked.append(f"host put+get of {len(files)} files (0 B, 1000 B, 3 blocks) byte-exact")
    c.wait_replicated("/s1", 3, timeout=60)
    checked.append("fsck /s1 HEALTHY, 3 replicas per block")
    # A client inside the compose network, reaching the metadata service by name.
    image = c.compose_env["SLUICE_IMAGE"]
    inside = ["docker", "run", "--rm", "-i", "--network", c.network, image,
              "/bin/sluice", "--metadata", "metadata:8020"]
    data = os.urandom(BLOCK + 777)
    run(inside + ["put", "-", "/s1/from-container", "--block-size", str(BLOCK)], 120, input=data)
    got = run(inside + ["cat", "/s1/multi"], 120).stdout
    if got != files["/s1/multi"]:
        raise Failed(f"in-network cat of /s1/multi: {len(got)} bytes sha {sha(got)}")
    c.check_exact("/s1/from-container", data)
    manifest.add("/s1/from-container", data)
    checked.append("a client container on the network put and read by the service name; "
                   "the host read its file back exact")
    return checked


class Fault:
    """The DataNode a scenario injected its fault into (`victim`, the service, and `node`, its
    node id), so that its clean-up knows which container to restore even when the scenario
    fails half-way."""

    def __init__(self):
        self.victim = None
        self.node = None


def _fault_during_put(c, remote, position, inject, what, fault):
    """Starts a put of BIG bytes, injects `inject(service)` into the DataNode at `position` of
    the pipeline of block 2 when about 2 of its 4 MiB are fed and more is on the way
    (recording it in `fault`), and finishes the put. Returns (data, put seconds)."""
    put = StreamingPut(c, remote, BIG, BLOCK)
    try:
        put.feed(BLOCK + MiB)
        pipeline = put.pipeline(min_blocks=2)
        target = pipeline[position]
        victim = c.service_at(target["data_addr"])
        put.feed_rest_in_background(pace=0.1)
        put.wait_fed(BLOCK + 2 * MiB)
        say(f"    {what} {victim} ({target['node_id']} at {target['data_addr']}, #{position + 1} "
            f"of {' -> '.join(d['data_addr'] for d in pipeline)}) with {put.sent / MiB:.0f} MiB "
            f"fed")
        fault.victim, fault.node = victim, target["node_id"]
        inject(victim)
        rc, err, secs = put.finish(timeout=240)
    except BaseException:
        put.abort()
        raise
    if rc != 0:
        raise Failed(f"the put failed after {what} {victim}: exit {rc}: {err}")
    return put.data, secs


def s2_kill_first(c, manifest):
    """docker kill the first DataNode of the pipeline mid-put; the put completes, the file reads
    back exact, fsck reaches HEALTHY with 3 replicas after re-replication."""
    fault = Fault()
    try:
        data, secs = _fault_during_put(
            c, "/s2/big", 0, lambda s: c.docker("kill", c.cid(s)), "kill", fault)
        checked = [f"put of {len(data)} B completed in {secs:.1f}s after docker kill "
                   f"{fault.victim}"]
        c.check_exact("/s2/big", data)
        manifest.add("/s2/big", data)
        checked.append("read back byte-exact")
        t = time.monotonic()
        c.wait_replicated("/s2/big", 3, timeout=150, without=fault.node)
        state = c.node_state(fault.node)
        checked.append(f"fsck HEALTHY with 3 live replicas per block, none on {fault.victim}, "
                       f"{time.monotonic() - t:.0f}s later (re-replication; {fault.victim} "
                       f"{state})")
        return checked
    finally:
        if fault.victim:
            c.docker("start", c.cid(fault.victim), check=False)
            c.wait_healthy([fault.victim], timeout=90)


def s3_pause_middle(c, manifest):
    """docker pause a DataNode (the middle of the pipeline) mid-write; the write completes."""
    fault = Fault()
    try:
        data, secs = _fault_during_put(
            c, "/s3/big", 1, lambda s: c.docker("pause", c.cid(s)), "pause", fault)
        checked = [f"put of {len(data)} B completed in {secs:.1f}s with {fault.victim} paused"]
        c.check_exact("/s3/big", data)
        manifest.add("/s3/big", data)
        checked.append("read back byte-exact (while still paused)")
        return checked
    finally:
        if fault.victim:
            c.docker("unpause", c.cid(fault.victim), check=False)
            c.wait_healthy([fault.victim], timeout=90)


def _replica_balance(c):
    """(replicas on all DataNodes' disks in any state, 3 x blocks in the namespace). With no
    write under way they are equal once every excess or stale replica has been deleted."""
    r = c.fsck("/")
    blocks = sum(len(f["blocks"]) for f in r["files"])
    on_disk = sum(sum(c.dn_status(s)["replicas"].values()) for s in DATANODES)
    return on_disk, 3 * blocks


def s4_disconnect(c, manifest):
    """docker network disconnect a DataNode mid-write, reconnect it: nothing acknowledged is
    lost and the excess replicas it brings back are cleaned up."""
    fault = Fault()
    cut = {}

    def disconnect(s):
        cut["cid"], cut["ip"] = c.cid(s), c.ip(s)
        c.docker("network", "disconnect", "-f", c.network, cut["cid"])

    try:
        data, secs = _fault_during_put(c, "/s4/big", 2, disconnect, "disconnect", fault)
        victim, ip = fault.victim, cut["ip"]
        checked = [f"put of {len(data)} B completed in {secs:.1f}s with {victim} cut off"]
        c.check_exact("/s4/big", data)
        manifest.add("/s4/big", data)
        checked.append("read back byte-exact while cut off")
        t = time.monotonic()
        c.wait_replicated("/s4/big", 3, timeout=150, without=fault.node)
        checked.append(f"re-replicated to 3 live replicas, none on {victim}, "
                       f"{time.monotonic() - t:.0f}s after the put, while {victim} was away "
                       f"({c.node_state(fault.node)})")
        c.docker("network", "connect", c.network, cut["cid"])
        now = c.ip(victim)
        if now != ip:
            raise Failed(f"{victim} came back with IP {now}, not {ip}: its registration is stale")
        c.wait_healthy([victim], timeout=90)
        wait_for(f"{victim} Live again", lambda: c.node_state(fault.node) == "Live", 60)
        checked.append(f"{victim} reconnected with its IP {ip}, registered and Live again")
        c.wait_replicated("/s4/big", 3, timeout=90)

        def balanced():
            have, want = _replica_balance(c)
            cut["balance"] = (have, want)
            cut.setdefault("first", have)
            return have == want

        try:
            wait_for("replicas on the DataNodes == 3 x blocks", balanced, 120, 1)
        except Failed as e:
            states = {s: c.dn_status(s)["replicas"] for s in DATANODES}
            raise Failed(f"{e}; on disk, expected: {cut.get('balance', '?')}; {states}") from None
        have, want = cut["balance"]
        checked.append(f"no excess replicas: on the DataNodes' disks {cut['first']} replicas at "
                       f"the first look after the reconnect, then {have} = 3 x {want // 3} blocks "
                       f"in the namespace; fsck 3 per block")
        c.check_exact("/s4/big", data)
        checked.append("read back byte-exact after the reconnect")
        return checked
    finally:
        if "cid" in cut and c.ip(fault.victim) is None:
            c.docker("network", "connect", c.network, cut["cid"], check=False)
        if fault.victim:
            c.wait_healthy([fault.victim], timeout=90)


class CreateStream:
    """Small-file creates, one `sluice put` each, in a thread; remembers what was acked."""

    def __init__(self, c):
        self.c = c
        self.acked = {}
        self.failed = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        i = 0
        while not self.stop.is_set():
            path = f"/s5/f{i:05d}"
            data = os.urandom(random.randint(1, 8192))
            try:
                p = self.c.sluice("put", "-", path, input=data, timeout=60, check=False)
                ok, why = p.returncode == 0, p.stderr.decode(errors="replace").strip()
            except Failed as e:  # a put that hangs is not acknowledged either
                ok, why = False, str(e)
            if ok:
                self.acked[path] = data
            else:
                self.failed.append((path, why))
            i += 1

    def wait_more(self, n, timeout=90):
        target = len(self.acked) + n
        wait_for(f"{n} more acknowledged creates", lambda: len(self.acked) >= target, timeout, 0.2)


def s5_metadata_restart(c, manifest):
    """Restart (then kill and start) the metadata container during a stream of small-file
    creates; every acknowledged create exists afterwards, byte-exact."""
    stream = CreateStream(c)
    stream.thread.start()
    meta = c.cid("metadata")
    try:
        stream.wait_more(15)
        t = time.monotonic()
        c.docker("restart", "-t", "10", meta, timeout=60)
        stream.wait_more(15)
        restart_gap = time.monotonic() - t
        t = time.monotonic()
        c.docker("kill", meta)
        c.docker("start", meta)
        stream.wait_more(15)
        kill_gap = time.monotonic() - t
    finally:
        stream.stop.set()
        stream.thread.join(timeout=90)
        c.docker("start", meta, check=False)
    for path, why in stream.failed[:3]:
        say(f"    not acknowledged: {path}: {why}")
    c.wait_healthy(SERVICES, timeout=90)
    for path, data in sorted(stream.acked.items()):
        c.check_exact(path, data)
        manifest.add(path, data)
    return [
        f"{len(stream.acked)} creates acknowledged, {len(stream.failed)} refused while the "
        f"service was away; creates resumed {restart_gap:.1f}s after docker restart and "
        f"{kill_gap:.1f}s after docker kill + start",
        f"all {len(stream.acked)} acknowledged files exist and read back byte-exact",
    ]


def s6_restart_datanodes(c, manifest):
    """docker-compose restart of all DataNodes; every file is still readable."""
    for path, size in [("/s6/multi", 2 * BLOCK + 7), ("/s6/one", 1)]:
        data = os.urandom(size)
        c.put(path, data, block_size=BLOCK)
        manifest.add(path, data)
    before = {s: c.ip(s) for s in DATANODES}
    t = time.monotonic()
    c.compose("restart", "-t", "10", *DATANODES, timeout=180)
    c.wait_healthy(SERVICES, timeout=120)
    took = time.monotonic() - t
    after = {s: c.ip(s) for s in DATANODES}
    moved = [s for s in DATANODES if before[s] != after[s]]
    n = manifest.check_all(c)
    return [
        f"all DataNodes restarted and registered again in {took:.1f}s"
        + (f" ({', '.join(moved)} came back on new IPs)" if moved else ""),
        f"every file written so far ({n}) reads back byte-exact",
    ]


SCENARIOS = [
    ("1", "put and get, byte-exact", s1_put_get),
    ("2", "docker kill the first DataNode mid-put", s2_kill_first),
    ("3", "docker pause a DataNode mid-write", s3_pause_middle),
    ("4", "network disconnect a DataNode mid-write, reconnect", s4_disconnect),
    ("5", "restart the metadata container during creates", s5_metadata_restart),
    ("6", "docker-compose restart of all DataNodes", s6_restart_datanodes),
]
