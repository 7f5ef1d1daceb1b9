"""What real programs hold across a snapshot, in one process, reporting what it sees.

Each part runs in its own thread and records its progress and any error in STATE, which the
main thread writes to /workspace/status.json five times a second (renamed into place). The
tests read it before and after a snapshot, fork, suspend or move to another host, and check
that every part carried on and that nothing it holds changed.
"""

import ctypes
import hashlib
import json
import mmap
import os
import socket
import sqlite3
import struct
import sys
import threading
import time

WORKSPACE = "/workspace"
STATUS = os.path.join(WORKSPACE, "status.json")
WATCHED = os.path.join(WORKSPACE, "watched")
HEAP_MB = int(os.environ.get("HEAP_MB", "96"))
THREADS = 4

STATE = {"pid": os.getpid(), "errors": []}
LOCK = threading.Lock()


def record(**kv):
    with LOCK:
        STATE.update(kv)


def bump(key, by=1):
    with LOCK:
        STATE[key] = STATE.get(key, 0) + by


def fail(part, err):
    with LOCK:
        STATE["errors"].append(f"{part}: {err}")


def part(name):
    """Runs fn in a daemon thread; an exception is recorded, never silent."""

    def wrap(fn):
        def run():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - every failure is reported
                fail(name, repr(e))

        threading.Thread(target=run, name=name, daemon=True).start()
        return fn

    return wrap


def pattern(seed, size):
    """Deterministic bytes, so a heap's content can be checked after a restore."""
    block = hashlib.sha256(seed.encode()).digest() * 4096
    return (block * (size // len(block) + 1))[:size]


def heap_worker(i):
    size = HEAP_MB * 1024 * 1024 // THREADS
    heap = bytearray(pattern(f"heap{i}", size))
    want = hashlib.sha256(heap).hexdigest()
    while True:
        # Touch every page, then check it all: a restore must bring back every byte.
        for off in range(0, size, 4096):
            heap[off] ^= 0xFF
            heap[off] ^= 0xFF
        if hashlib.sha256(heap).hexdigest() != want:
            fail(f"heap{i}", "content changed")
            return
        bump(f"heap{i}_rounds")
        time.sleep(0.05)


for i in range(THREADS):
    part(f"heap{i}")(lambda i=i: heap_worker(i))


@part("sqlite")
def sqlite_writer():
    path = os.path.join(WORKSPACE, "db.sqlite")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS t (batch INTEGER, n INTEGER)")
    reader = sqlite3.connect(path, isolation_level=None)
    batch = 0
    while True:
        batch += 1
        # A transaction that stays open for two seconds: a snapshot lands inside one.
        db.execute("BEGIN IMMEDIATE")
        for n in range(20):
            db.execute("INSERT INTO t VALUES (?, ?)", (batch, n))
            record(sqlite_open_batch=batch, sqlite_open_rows=n + 1)
            time.sleep(0.1)
        db.execute("COMMIT")
        committed = reader.execute("SELECT COUNT(*), COUNT(DISTINCT batch) FROM t").fetchone()
        if committed[0] != committed[1] * 20:
            fail("sqlite", f"a batch is partly committed: {committed}")
            return
        record(sqlite_committed_batches=committed[1])
        if batch % 5 == 0:
            check = reader.execute("PRAGMA integrity_check").fetchone()[0]
            if check != "ok":
                fail("sqlite", f"integrity_check: {check}")
                return


def echo_child(sock_fd, pipe_w):
    """The child: reads numbers from the unix socket, answers n+1 through the pipe."""
    s = socket.socket(fileno=sock_fd)
    while True:
        data = s.recv(8)
        if len(data) != 8:
            os._exit(0)
        (n,) = struct.unpack("<q", data)
        os.write(pipe_w, struct.pack("<q", n + 1))


@part("ipc")
def ipc():
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pipe_r, pipe_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        parent.close()
        os.close(pipe_r)
        echo_child(child.detach(), pipe_w)
    child.close()
    os.close(pipe_w)
    record(ipc_child=pid)
    n = 0
    while True:
        parent.sendall(struct.pack("<q", n))
        got = b""
        while len(got) < 8:
            chunk = os.read(pipe_r, 8 - len(got))
            if not chunk:
                fail("ipc", "the child's pipe closed")
                return
            got += chunk
        (answer,) = struct.unpack("<q", got)
        if answer != n + 1:
            fail("ipc", f"sent {n}, got {answer}")
            return
        n += 1
        record(ipc_round_trips=n)
        time.sleep(0.05)


IN_CREATE, IN_CLOSE_WRITE, IN_MOVED_TO = 0x100, 0x8, 0x80


@part("inotify")
def inotify():
    libc = ctypes.CDLL(None, use_errno=True)
    os.makedirs(WATCHED, exist_ok=True)
    fd = libc.inotify_init1(0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    if libc.inotify_add_watch(fd, WATCHED.encode(), IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO) < 0:
        raise OSError(ctypes.get_errno(), "inotify_add_watch")
    record(inotify_seen=[])
    while True:
        buf = os.read(fd, 4096)
        off = 0
        while off < len(buf):
            _wd, mask, _cookie, length = struct.unpack_from("iIII", buf, off)
            name = buf[off + 16 : off + 16 + length].rstrip(b"\0").decode()
            off += 16 + length
            if mask & IN_CREATE:
                with LOCK:
                    STATE["inotify_seen"].append(name)


@part("sleepers")
def sleepers():
    # Many short sleeps, and each tick's clocks: a long suspend shows as one long gap.
    ticks, last_wall, last_mono = 0, time.time(), time.monotonic()
    while True:
        time.sleep(0.25)
        wall, mono = time.time(), time.monotonic()
        ticks += 1
        with LOCK:
            STATE["sleep_ticks"] = ticks
            STATE["sleep_max_wall_gap"] = max(STATE.get("sleep_max_wall_gap", 0), wall - last_wall)
            STATE["sleep_max_mono_gap"] = max(STATE.get("sleep_max_mono_gap", 0), mono - last_mono)
            STATE["wall"] = wall
            STATE["mono"] = mono
        last_wall, last_mono = wall, mono


@part("long_sleep")
def long_sleep():
    # Sleeps of 8 s, which a suspend interrupts: each must still end, once. The start of the
    # last one that ended tells which sleep that was.
    while True:
        started, start = time.time(), time.monotonic()
        record(long_sleep_started=started)
        time.sleep(8)
        record(long_sleep_ended=started, long_sleep_last=time.monotonic() - start)
        bump("long_sleeps_done")


@part("files")
def files():
    # An unlinked temporary file in the root filesystem and in /tmp, and a file in /dev/shm
    # mapped into memory: all three must keep their content.
    held = []
    for where in (WORKSPACE, "/tmp"):
        path = os.path.join(where, f"unlinked-{os.getpid()}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        data = pattern(where, 1024 * 1024)
        os.write(fd, data)
        os.unlink(path)
        held.append((fd, data))
    shm_path = "/dev/shm/workload"
    shm_data = pattern("shm", 4 * 1024 * 1024)
    with open(shm_path, "wb") as f:
        f.write(shm_data)
    shm_fd = os.open(shm_path, os.O_RDWR)
    shm_map = mmap.mmap(shm_fd, len(shm_data))
    while True:
        for fd, data in held:
            if os.pread(fd, len(data), 0) != data:
                fail("files", "an unlinked file's content changed")
                return
        if shm_map[:] != shm_data:
            fail("files", "the mapped /dev/shm file changed")
            return
        with open(shm_path, "rb") as f:
            if f.read() != shm_data:
                fail("files", "the /dev/shm file changed")
                return
        bump("files_checks")
        time.sleep(0.2)


def main():
    # The counter lives only here: a restore that lost memory would start it again.
    counter = 0
    while True:
        counter += 1
        with LOCK:
            STATE["counter"] = counter
            STATE["threads"] = threading.active_count()
            snapshot = json.dumps(STATE)
        with open(STATUS + ".tmp", "w") as f:
            f.write(snapshot)
        os.replace(STATUS + ".tmp", STATUS)
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
