"""Stress the kernel tuning cache with concurrent processes and with writers killed mid-write.

Concurrency (``--writers``, ``--updates``, ``--readers``): writer processes update one cache
file through ``set_kernel_tuning_parameters``, alternating between an identity of their own
(a new thread count each time) and one identity shared by all; reader processes parse the
file and call ``inspect_kernel_tuning_cache`` in a loop. Afterwards every own update must be
in the file, the shared identity must hold an update that no other update began after
(last writer wins), and every read must have parsed completely.

Crash safety (``--kills``): a writer updating the file version after version (``--padding``
other entries make each write longer) is killed with SIGKILL after a random delay, again and
again; after each kill the file must be exactly the last complete version or the next one,
and the lock (an flock on ``<path>.lock``) must be free at once.

Usage::

    nice -n 19 python tools/cache_stress.py --writers 8 --updates 100 --readers 4 --kills 500

Prints a JSON report; exit status 1 when anything was lost, partial or blocked.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import _cache_processes as processes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--updates", type=int, default=100, help="updates per writer")
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--padding", type=int, default=300, help="other entries in the killed file")
    parser.add_argument("--window-ms", type=float,
                        help="the kill comes after a random delay up to this (default: the time "
                             "of three updates)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    report = {}
    with tempfile.TemporaryDirectory() as folder:
        if args.writers:
            report["concurrency"] = processes.run_stress(Path(folder) / "concurrent.txt", args.writers,
                                                       args.updates, args.readers, timeout=3600)
            print(json.dumps({"concurrency": report["concurrency"]}, indent=2), flush=True)
        if args.kills:
            report["crashes"] = processes.kill_writers(
                Path(folder) / "killed.txt", args.kills, args.padding,
                None if args.window_ms is None else args.window_ms / 1000, args.seed)
            report["crashes"]["padding_entries"] = args.padding
            print(json.dumps({"crashes": report["crashes"]}, indent=2), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    failed = any(part["problems"] for part in report.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
