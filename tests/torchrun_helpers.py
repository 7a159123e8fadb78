"""Launching the 2-rank gloo tests (test_fsdp.py, test_update.py) so that load on the machine cannot
break them, only slow them down.

- `--standalone`: torchrun's rendezvous binds port 0 itself. A port picked free beforehand and bound
  later (free_port() then `--master-port`) can be taken in between by any other test's server: the
  run then fails or, worse, meets another run's store.
- GLOO_SOCKET_IFNAME=lo: gloo's pairs on loopback, not on whatever interface the host name resolves to.
- PYTHONFAULTHANDLER / TORCH_SHOW_CPP_STACKTRACES: a rank that aborts prints every thread's Python
  stack and the C++ one, so the failure message says where it was (the abort seen once under load
  said only "SIGABRT").
- OMP_NUM_THREADS=1: two ranks on a shared 2-core machine, no oversubscription.
The workers themselves end with a barrier before destroy_process_group, so no rank tears down its
connections while the other may still use them, and call die_with_parent() first: torchrun starts
each rank in a session of its own, so killing torchrun's process group on a timeout left the ranks
running (stuck in a collective until gloo's 30-minute timeout), holding the output pipes open, and
the test's communicate() after the kill waited for them: a hang reported as nothing at all.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

HERE = Path(__file__).parent
# Generous: a hang is what this catches, and a loaded 2-core machine made a ~40 s run take ~100 s.
TIMEOUT_S = 400


def torchrun(script: str, *args: str, ranks: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        str(HERE / script),
        *map(str, args),
    ]


TORCHRUN_ENV = {
    "OMP_NUM_THREADS": "1",
    "GLOO_SOCKET_IFNAME": "lo",
    "PYTHONFAULTHANDLER": "1",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
}


def torchrun_env() -> dict[str, str]:
    """The environment, TORCHRUN_ENV, and this folder on PYTHONPATH (the workers import the tests)."""
    pythonpath = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, **TORCHRUN_ENV, "PYTHONPATH": pythonpath}


def die_with_parent() -> None:
    """This process gets SIGKILL when its parent (torchrun) dies (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() == 1:  # the parent died before the call: nobody would kill us
        os._exit(1)
