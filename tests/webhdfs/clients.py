#!/usr/bin/env python3
"""Drives a running Sluice cluster through WebHDFS with HdfsCLI (`hdfs`) and fsspec's
`webhdfs` filesystem, and checks every byte and listing against the `sluice` command.

    clients.py --http 127.0.0.1:9870 --rpc 127.0.0.1:8020 --sluice target/debug/sluice --tmp DIR

Exit status 0 when every check passed. Run by tests/webhdfs/run (which sets up the virtualenv
and the cluster).
"""

import argparse
import hashlib
import os
import subprocess
import sys
import zlib

import fsspec
import requests
from hdfs import InsecureClient
from hdfs.util import HdfsError

FAILED = []
MIB = 1024 * 1024


def check(name, cond, detail=""):
    print(("ok    " if cond else "FAIL  ") + name + (f" ({detail})" if detail and not cond else ""))
    if not cond:
        FAILED.append(name)


class Sluice:
    """The `sluice` command against the same cluster."""

    def __init__(self, binary, rpc):
        self.binary, self.rpc = binary, rpc

    def run(self, *args):
        return subprocess.run([self.binary, "--metadata", self.rpc, *args],
                              check=True, capture_output=True).stdout

    def cat(self, path):
        return self.run("cat", path)

    def names(self, path):
        """The entry names `sluice ls` prints for a directory."""
        out = self.run("ls", path).decode()
        return sorted(line.split()[-1].rsplit("/", 1)[-1] for line in out.splitlines()
                      if line.strip() and not line.startswith("Found "))

    def length(self, path):
        """The length `sluice stat` prints."""
        for line in self.run("stat", path).decode().splitlines():
            key, _, value = line.strip().partition(":")
            if key == "length":
                return int(value.split()[0])
        raise ValueError(f"sluice stat {path}: no length")

    def exists(self, path):
        return subprocess.run([self.binary, "--metadata", self.rpc, "stat", path],
                              capture_output=True).returncode == 0


def data(n, seed):
    out, block = bytearray(), hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:n])


def hdfscli(args, sl):
    c = InsecureClient(f"http://{args.http}", user="ann")
    local = os.path.join(args.tmp, "up.bin")
    body = data(3 * MIB + 123, 1)
    with open(local, "wb") as f:
        f.write(body)
    c.makedirs("/hc/dir")
    check("hdfscli makedirs", c.status("/hc/dir")["type"] == "DIRECTORY")
    c.upload("/hc/dir/up.bin", local)
    check("hdfscli upload byte-exact (sluice cat)", sl.cat("/hc/dir/up.bin") == body)
    c.upload("/hc/dir/up.bin", local, overwrite=True)
    check("hdfscli upload overwrite", sl.cat("/hc/dir/up.bin") == body)
    down = os.path.join(args.tmp, "down.bin")
    c.download("/hc/dir/up.bin", down, overwrite=True)
    with open(down, "rb") as f:
        check("hdfscli download byte-exact", f.read() == body)
    c.write("/hc/dir/small.txt", data=b"hello ", overwrite=True)
    c.write("/hc/dir/small.txt", data=b"webhdfs\n", append=True)
    check("hdfscli write + write(append=True)", sl.cat("/hc/dir/small.txt") == b"hello webhdfs\n")
    check("hdfscli list = sluice ls", sorted(c.list("/hc/dir")) == sl.names("/hc/dir"),
          f"{c.list('/hc/dir')} vs {sl.names('/hc/dir')}")
    st = c.status("/hc/dir/up.bin")
    check("hdfscli status = sluice stat", st["type"] == "FILE"
          and st["length"] == len(body) == sl.length("/hc/dir/up.bin"), str(st))
    check("hdfscli status missing (strict=False)", c.status("/hc/none", strict=False) is None)
    with c.read("/hc/dir/up.bin", offset=MIB - 5, length=1000) as r:
        check("hdfscli ranged read", r.read() == body[MIB - 5:MIB + 995])
    cs = c.content("/hc")
    check("hdfscli content summary",
          cs["length"] == len(body) + 14 and cs["fileCount"] == 2 and cs["directoryCount"] == 2,
          str(cs))
    ck = c.checksum("/hc/dir/up.bin")
    check("hdfscli checksum = CRC32C of the bytes",
          ck["algorithm"] == "COMPOSITE-CRC32C" and int(ck["bytes"], 16) == crc32c(body), str(ck))
    c.rename("/hc/dir/small.txt", "/hc/moved.txt")
    check("hdfscli rename", sl.cat("/hc/moved.txt") == b"hello webhdfs\n"
          and not sl.exists("/hc/dir/small.txt"))
    try:
        c.rename("/hc/nothing", "/hc/x")
        check("hdfscli rename of a missing path fails", False)
    except HdfsError:
        check("hdfscli rename of a missing path fails", True)
    c.delete("/hc/dir", recursive=True)
    check("hdfscli delete -r", not sl.exists("/hc/dir"))
    try:
        c.status("/hc/dir")
        check("hdfscli status of a deleted path raises", False)
    except HdfsError as e:
        check("hdfscli status of a deleted path raises", "does not exist" in str(e), str(e))

    big = os.path.join(args.tmp, "big.bin")
    body = data(100 * MIB, 2)
    with open(big, "wb") as f:
        f.write(body)
    c.upload("/hc/big.bin", big)
    big_down = os.path.join(args.tmp, "big.down")
    c.download("/hc/big.bin", big_down, overwrite=True)
    with open(big_down, "rb") as f:
        check("hdfscli 100 MiB upload/download byte-exact", f.read() == body)
    check("100 MiB byte-exact by sluice cat", sl.cat("/hc/big.bin") == body)


def crc32c(b):
    """CRC32C (Castagnoli), bitwise table version (no extra package)."""
    table = crc32c.table
    crc = 0xFFFFFFFF
    for byte in b:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


crc32c.table = _table()


def fsspec_checks(args, sl):
    host, port = args.http.rsplit(":", 1)
    fs = fsspec.filesystem("webhdfs", host=host, port=int(port), user="bob")
    fs.makedirs("/fs/a/b", exist_ok=True)
    check("fsspec makedirs", fs.isdir("/fs/a/b"))
    subprocess.run([sl.binary, "--metadata", sl.rpc, "put", os.path.join(args.tmp, "up.bin"),
                    "/fs/a/put.bin"], check=True, capture_output=True)
    with open(os.path.join(args.tmp, "up.bin"), "rb") as f:
        body = f.read()
    info = fs.info("/fs/a/put.bin")
    check("fsspec info", info["type"] == "file" and info["size"] == len(body), str(info))
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/fs/a", detail=False))
    check("fsspec ls = sluice ls", names == sl.names("/fs/a"), f"{names}")
    with fs.open("/fs/a/put.bin", "rb") as f:
        f.seek(2 * MIB + 7)
        check("fsspec ranged read", f.read(5000) == body[2 * MIB + 7:2 * MIB + 5007])
    check("fsspec cat byte-exact", fs.cat("/fs/a/put.bin") == body)
    check("fsspec exists (missing)", not fs.exists("/fs/none"))
    cs = fs.content_summary("/fs")
    check("fsspec content summary", cs["length"] == len(body) and cs["fileCount"] == 1, str(cs))
    check("fsspec checksum (ukey)", fs.ukey("/fs/a/put.bin") is not None)
    fs.mv("/fs/a/put.bin", "/fs/moved.bin")
    check("fsspec mv", sl.cat("/fs/moved.bin") == body and not sl.exists("/fs/a/put.bin"))
    # fsspec writes every file as CREATE of an empty file, then one APPEND per ~5 MiB buffer.
    body = data(13 * MIB + 77, 3)
    with fs.open("/fs/written.bin", "wb") as f:
        for i in range(0, len(body), 1_000_003):
            f.write(body[i:i + 1_000_003])
    check("fsspec write (CREATE + APPENDs) byte-exact", sl.cat("/fs/written.bin") == body)
    check("fsspec written size = sluice stat",
          fs.info("/fs/written.bin")["size"] == len(body) == sl.length("/fs/written.bin"))
    fs.pipe_file("/fs/small.txt", b"tiny")
    check("fsspec pipe_file", sl.cat("/fs/small.txt") == b"tiny")
    # Not fs.open(path, "ab"): fsspec's own "ab" mode never sets its upload location and fails
    # before sending anything (fsspec/implementations/webhdfs.py), whatever the server.
    base = f"http://{args.http}/webhdfs/v1"
    r = requests.post(f"{base}/fs/small.txt?op=APPEND&noredirect=true")
    loc = r.json()["Location"] if r.status_code == 200 else None
    r = requests.post(loc, data=b" and appended") if loc else r
    check("APPEND (noredirect, then POST to the Location)",
          r.status_code == 200 and sl.cat("/fs/small.txt") == b"tiny and appended", r.text)
    fs.rm("/fs", recursive=True)
    check("fsspec rm -r", not sl.exists("/fs"))


def curl_like(args):
    base = f"http://{args.http}/webhdfs/v1"
    r = requests.get(f"{base}/nope?op=LISTSTATUS")
    check("404 RemoteException", r.status_code == 404
          and r.json()["RemoteException"]["exception"] == "FileNotFoundException")
    r = requests.get(f"{base}/?op=NOPE")
    check("400 for an unknown op", r.status_code == 400)
    r = requests.get(f"{base}/x?op=OPEN&offset=-1")
    check("400 for a negative offset", r.status_code == 400)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--rpc", required=True)
    p.add_argument("--sluice", required=True)
    p.add_argument("--tmp", required=True)
    args = p.parse_args()
    sl = Sluice(args.sluice, args.rpc)
    curl_like(args)
    hdfscli(args, sl)
    fsspec_checks(args, sl)
    print(f"{len(FAILED)} failed" + (": " + ", ".join(FAILED) if FAILED else ""))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
