"""What the command line's subcommands share: JSON and values output, warnings."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import tuning
from .terminal import terminal_width, wrap_words


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def _format_values(values: dict[str, Any] | None) -> str:
    if values is None:
        return "-"
    return " ".join(f"{name}={value}" for name, value in values.items())


def _warn(message: str) -> None:
    print("\n".join(wrap_words(f"warning: {message}", terminal_width(), indent="  ")),
          file=sys.stderr)


def _warn_about_threads(args: argparse.Namespace) -> None:
    threads = getattr(args, "threads", None)
    available = tuning.effective_thread_count()
    if threads is not None and threads > available:
        _warn(f"--threads {threads} is more than the {available} CPU(s) this process may use "
              f"(its effective thread count, see '{args.prog} cpu'): the extra threads share "
              f"CPUs, so runs are slower and calibrations describe a machine this is not")
