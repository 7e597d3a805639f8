"""Start ``N`` local processes the way ``torchrun`` does, on the loopback interface.

For tests, benchmarks and quick experiments on one machine: every process gets
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a free
``MASTER_PORT`` chosen at run time, and ``GLOO_SOCKET_IFNAME=lo`` so that gloo's
traffic stays on loopback.  The whole group is killed when it outlives its deadline,
and when any rank fails the others are stopped after ``grace_s`` seconds.
Production launches use ``torchrun`` (see docs/distributed.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass


@dataclass
class RankResult:
    """Exit status and output of one rank (``returncode`` is ``None`` if it was killed)."""

    rank: int
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_local(
    argv: list[str],
    nprocs: int,
    timeout_s: float = 120.0,
    env: dict[str, str] | None = None,
    grace_s: float = 10.0,
) -> list[RankResult]:
    """Run ``python *argv`` as ranks ``0..nprocs-1`` of one group and wait for all.

    Args:
        argv: arguments after this interpreter (e.g. ``["-m", "pkg.worker", "--x"]``).
        nprocs: world size.
        timeout_s: deadline for the whole group; every rank still running is killed.
        env: extra environment variables (win over the defaults set here).
        grace_s: how long the others may still run once a rank has failed.
    """
    if int(nprocs) < 1:
        raise ValueError(f"nprocs must be at least 1, got {nprocs!r}")
    port = free_port()
    procs, files = [], []
    for rank in range(int(nprocs)):
        e = dict(os.environ)
        e.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nprocs),
            LOCAL_WORLD_SIZE=str(nprocs),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GLOO_SOCKET_IFNAME="lo",
        )
        e.update(env or {})
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        files.append((out, err))
        procs.append(subprocess.Popen([sys.executable, *argv], env=e, stdout=out, stderr=err))
    deadline = time.monotonic() + float(timeout_s)
    failed_at = None
    timed_out = [False] * len(procs)
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + grace_s):
                timed_out = [p.poll() is None for p in procs]  # killed below
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [
        RankResult(rank, None if late else p.returncode, _drain(out), _drain(err), late)
        for rank, (p, (out, err), late) in enumerate(zip(procs, files, timed_out, strict=True))
    ]


def _drain(f) -> str:
    """The text a rank wrote to the temporary file ``f``, which is then closed."""
    f.seek(0)
    with f:
        return f.read()
