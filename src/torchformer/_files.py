"""Telling the temporary file of a killed writer from one still being written.

Checkpoints (:mod:`torchformer.train.checkpoint`) and downloads (:mod:`torchformer.data.download`) are written to a
temporary file that is renamed into place when complete. A process killed mid-write (``kill -9``, a power cut)
cannot clean up, so the temporary file's name records who writes it, host and process id, and the next writer
removes the leftovers that are surely dead, never a live writer's file.
"""

from __future__ import annotations

import os
import re
import socket
import time
from typing import Optional

# A temporary file nobody has written to for this long is abandoned, whoever wrote it: the rule for files of other
# machines sharing the folder (whose process ids mean nothing here) and for files whose name records no writer.
STALE_AFTER_S = 24 * 3600


def host_tag() -> str:
    """This machine's name, reduced to letters, digits and "_" (so that "-" can separate the parts of a name)."""
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:64] or "host"


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (True when that cannot be told)."""
    if pid == os.getpid():
        return True  # another thread of this very process may be writing
    if os.name == "nt":
        return True  # on Windows os.kill(pid, 0) would terminate the process: there, only the age rule applies
    try:
        os.kill(pid, 0)  # signal 0 checks that the process exists and sends nothing
    except (ProcessLookupError, OverflowError):  # no such process (a number too large cannot be one)
        return False
    except OSError:
        return True  # e.g. PermissionError: it exists, it belongs to another user
    return True


def is_stale(host: Optional[str], pid: Optional[int], mtime: float) -> bool:
    """Whether a temporary file written by ``pid`` on ``host`` (``None``: unknown), last modified at ``mtime``,
    is a dead writer's leftover: its process is gone from this machine, or nobody wrote to it for a day."""
    dead = host == host_tag() and pid is not None and not process_alive(pid)
    return dead or time.time() - mtime > STALE_AFTER_S
