"""The harness of the docker-compose scenarios: one compose project (metadata + dn1..dn4 from
the repository's docker-compose.yml) under a unique name, the host's `sluice` CLI pointed at
it, and the container faults (kill, pause, network disconnect, restart).

Python 3 standard library only. Every external command runs with a timeout; every wait polls a
condition against a deadline and says what it waited for when it gives up.
"""

import hashlib
import json
import os
import socket
import subprocess
import threading
import time
import urllib.request

DATANODES = ["dn1", "dn2", "dn3", "dn4"]
SERVICES = ["metadata"] + DATANODES
MiB = 1 << 20


class Failed(Exception):
    """A scenario's check did not hold."""


def say(msg):
    print(msg, flush=True)


def sha(data):
    return hashlib.sha256(data).hexdigest()[:16]


def free_port():
    """A TCP port on 127.0.0.1 nobody listens on right now (for the published ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, cond, timeout, interval=0.5):
    """Polls `cond()` until it returns a truthy value (returned) or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = cond()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 -- a probe failing is "not yet"
            last_error = e
        if time.monotonic() >= deadline:
            extra = f" (last error: {last_error})" if last_error else ""
            raise Failed(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


def run(cmd, timeout, env=None, check=True, input=None):
    """Runs a command, capturing its output; raises Failed on timeout or (with check) failure."""
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout, env=env, input=input)
    except subprocess.TimeoutExpired:
        raise Failed(f"timed out after {timeout}s: {' '.join(cmd)}") from None
    if check and p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip()
        raise Failed(f"exit {p.returncode}: {' '.join(cmd)}: {err}")
    return p


class Cluster:
    """A compose project of the repository's docker-compose.yml."""

    def __init__(self, root, project, compose_cmd, sluice_bin, image, log_dir):
        self.root = root
        self.project = project
        self.compose_cmd = compose_cmd
        self.sluice_bin = sluice_bin
        self.log_dir = log_dir
        self.rpc_port = free_port()
        self.http_port = free_port()
        self.network = f"{project}_sluice"
        # What compose substitutes into docker-compose.yml: short liveness intervals so that
        # dead DataNodes are noticed within seconds, short timeouts so a stalled one is too.
        self.compose_env = dict(
            os.environ,
            SLUICE_IMAGE=image,
            SLUICE_RPC_PORT=str(self.rpc_port),
            SLUICE_HTTP_PORT=str(self.http_port),
            SLUICE_METADATA__DATANODE__STALE__INTERVAL="4s",
            SLUICE_METADATA__DATANODE__DEAD__INTERVAL="10s",
            SLUICE_METADATA__LEASE__SOFT__LIMIT="10s",
            SLUICE_METADATA__LEASE__HARD__LIMIT="30s",
            SLUICE_DATANODE__HEARTBEAT__INTERVAL="1s",
            # The same socket timeout as the client's: ack timeouts grow by pipeline position
            # (a quarter of 8 s per DataNode below), so the DataNode right above a stalled one
            # gives up first and its error ack names the stalled node.
            SLUICE_DATANODE__SOCKET__TIMEOUT="8s",
            RUST_LOG=os.environ.get("SLUICE_TEST_RUST_LOG", "info"),
        )
        # The CLI on the host sees only its own settings, not the services' ones above.
        self.cli_env = {
            k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")
        }
        self.cli_env.update(
            SLUICE_METADATA=f"127.0.0.1:{self.rpc_port}",
            SLUICE_CLIENT__SOCKET__TIMEOUT="8s",
            SLUICE_CLIENT__RPC__TIMEOUT="10s",
            RUST_LOG="error",
        )
        self._ids = {}

    # ---- compose and containers -------------------------------------------------------------

    def compose(self, *args, timeout=120, check=True):
        cmd = self.compose_cmd + [
            "-f", os.path.join(self.root, "docker-compose.yml"), "-p", self.project, *args
        ]
        return run(cmd, timeout, env=self.compose_env, check=check)

    def up(self):
        self.compose("up", "-d", timeout=180)
        self.wait_healthy(SERVICES, timeout=120)

    def down(self):
        self.compose("down", "-v", "--remove-orphans", "-t", "5", timeout=180, check=False)

    def save_logs(self, name):
        os.makedirs(self.log_dir, exist_ok=True)
        path = os.path.join(self.log_dir, f"{self.project}-{name}.log")
        p = self.compose("logs", "--no-color", "-t", timeout=60, check=False)
        with open(path, "wb") as f:
            f.write(p.stdout + p.stderr)
        return path

    def cid(self, service):
        """The container id of a service (stable across restarts of the container)."""
        if service not in self._ids:
            out = self.compose("ps", "-q", service, timeout=30).stdout.decode().strip()
            if not out:
                raise Failed(f"no container for {service}")
            self._ids[service] = out.splitlines()[0]
        return self._ids[service]

    def docker(self, *args, timeout=60, check=True):
        return run(["docker", *args], timeout, check=check)

    def inspect(self, service):
        out = self.docker("inspect", self.cid(service)).stdout
        return json.loads(out)[0]

    def ip(self, service):
        nets = self.inspect(service)["NetworkSettings"]["Networks"]
        net = nets.get(self.network)
        return net["IPAddress"] if net else None

    def health(self, service):
        state = self.inspect(service)["State"]
        if state.get("Paused"):
            return "paused"
        if not state.get("Running"):
            return state.get("Status", "?")
        return state.get("Health", {}).get("Status", "running")

    def wait_healthy(self, services=SERVICES, timeout=90):
        def all_healthy():
            states = {s: self.health(s) for s in services}
            self._last_states = states
            return all(v == "healthy" for v in states.values())

        try:
            wait_for(f"{', '.join(services)} healthy", all_healthy, timeout, interval=1)
        except Failed as e:
            raise Failed(f"{e}; states: {getattr(self, '_last_states', {})}") from None

    def service_at(self, data_addr):
        """The DataNode service whose container has the IP of `data_addr` (`ip:port`)."""
        host = data_addr.rsplit(":", 1)[0]
        for s in DATANODES:
            if self.ip(s) == host:
                return s
        raise Failed(f"no DataNode container has the address {data_addr}")

    def dn_status(self, service, timeout=5):
        """A DataNode's `/status` document, fetched from the host at its container IP."""
        url = f"http://{self.ip(service)}:9864/status"
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())

    # ---- the sluice CLI on the host ---------------------------------------------------------

    def sluice(self, *args, timeout=120, check=True, input=None):
        return run([self.sluice_bin, *args], timeout, env=self.cli_env, check=check, input=input)

    def put(self, remote, data, block_size=None, timeout=120):
        args = ["put", "-", remote]
        if block_size:
            args += ["--block-size", str(block_size)]
        self.sluice(*args, input=data, timeout=timeout)

    def read(self, remote, timeout=120):
        return self.sluice("cat", remote, timeout=timeout).stdout

    def fsck(self, path):
        p = self.sluice("fsck", path, "--json", timeout=60, check=False)
        try:
            return json.loads(p.stdout)
        except json.JSONDecodeError:
            err = p.stderr.decode(errors="replace").strip()
            raise Failed(f"fsck {path}: {err or 'no JSON'}") from None

    def check_exact(self, remote, data):
        got = self.read(remote)
        if got != data:
            raise Failed(
                f"{remote}: read {len(got)} bytes sha {sha(got)}, wrote {len(data)} sha {sha(data)}"
            )

    def wait_replicated(self, path, replicas=3, timeout=120, without=None):
        """Waits until fsck says HEALTHY and every block of every file under `path` has exactly
        `replicas` live replicas, none on the DataNode whose node id is `without` (a node that
        was taken away: its replicas must have been copied elsewhere); returns the report."""

        def done():
            r = self.fsck(path)
            blocks = [b for f in r["files"] for b in f["blocks"]]
            counts = sorted({len(b["locations"]) for b in blocks})
            on_gone = sum(1 for b in blocks for d in b["locations"] if d["node_id"] == without)
            self._last_fsck = (r["health"], counts, on_gone)
            ok = r["health"] == "Healthy" and counts == [replicas] and on_gone == 0
            return r if ok else None

        what = f"{path} HEALTHY with {replicas} replicas"
        if without:
            what += f", none on {without}"
        try:
            return wait_for(what, done, timeout, 1)
        except Failed as e:
            health, counts, on_gone = getattr(self, "_last_fsck", ("?", [], 0))
            raise Failed(f"{e}; last fsck: {health}, replica counts {counts}, "
                         f"{on_gone} replicas still on {without}") from None

    def node_state(self, node_id):
        """The metadata service's view of a DataNode (`Live`, `Stale`, `Dead`), or None."""
        report = json.loads(self.sluice("report", "--json", timeout=30).stdout)
        for d in report["datanodes"]:
            if d["id"]["node_id"] == node_id:
                return d["state"]
        return None


class StreamingPut:
    """`sluice put - REMOTE` fed through a pipe, so that a fault lands in the middle of a put:
    write a head, learn the pipeline of the block being written, inject the fault, then feed the
    rest at a steady pace while the client recovers."""

    def __init__(self, cluster, remote, total, block_size, chunk=MiB):
        self.cluster = cluster
        self.remote = remote
        self.parent = remote.rsplit("/", 1)[0] or "/"
        self.data = os.urandom(total)
        self.block_size = block_size
        self.chunk = chunk
        self.sent = 0
        self.feeder = None
        self.feed_error = None
        args = [cluster.sluice_bin, "put", "-", remote, "--block-size", str(block_size)]
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=cluster.cli_env,
        )
        self.started = time.monotonic()

    def feed(self, upto):
        while self.sent < upto:
            n = min(self.chunk, upto - self.sent)
            self.proc.stdin.write(self.data[self.sent:self.sent + n])
            self.sent += n
        self.proc.stdin.flush()

    def pipeline(self, min_blocks=2, timeout=60):
        """The pipeline of the block being written (from fsck of the open file), in order, as
        DatanodeId documents (`node_id`, `data_addr`, ...)."""

        def last_block():
            r = self.cluster.fsck(self.parent)
            for f in r["files"]:
                if f["under_construction"] and f["path"].startswith(self.remote):
                    if len(f["blocks"]) >= min_blocks and len(f["blocks"][-1]["locations"]) == 3:
                        return f["blocks"][-1]["locations"]
            return None

        return wait_for(f"the pipeline of block {min_blocks} of {self.remote}", last_block, timeout)

    def feed_rest_in_background(self, pace=0.05):
        """Feeds what is left, one chunk every `pace` seconds, then closes stdin."""

        def feeder():
            try:
                while self.sent < len(self.data):
                    self.feed(min(self.sent + self.chunk, len(self.data)))
                    time.sleep(pace)
                self.proc.stdin.close()
            except (BrokenPipeError, OSError) as e:
                self.feed_error = e

        self.feeder = threading.Thread(target=feeder, daemon=True)
        self.feeder.start()

    def wait_fed(self, upto, timeout=60):
        wait_for(f"{upto} bytes fed", lambda: self.sent >= upto or self.feed_error, timeout, 0.05)

    def finish(self, timeout=180):
        """Waits for the put (the feeder closes its stdin); returns (exit code, stderr,
        seconds)."""
        if self.feeder is None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.abort()
            raise Failed(f"put {self.remote} did not finish within {timeout}s") from None
        if self.feeder:
            self.feeder.join(timeout=5)
        err = self.proc.stderr.read().decode(errors="replace").strip()
        return self.proc.returncode, err, time.monotonic() - self.started

    def abort(self):
        """Kills the put if it still runs (cleanup after a failed scenario)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.feeder:
            self.feeder.join(timeout=5)
