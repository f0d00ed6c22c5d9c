"""Fuzz RuntimeSession with mutated models: the small Add + Relu + MatMul model and the light
models shipped with onnx (``onnx/backend/test/data/light/*.onnx``).

Each case mutates one model (bit flips, overwritten, inserted or cut bytes, or one to three
field changes of the parsed model: operator types, removed, swapped or duplicated nodes,
rewired inputs, attribute values, initializer dimensions and data, input element types and
shapes, opsets, domains, IR versions), builds a session from the bytes and runs it on random
inputs of the declared types. Cases run one at a time in a worker process limited to
``--memory-gb`` of address space, with ``--timeout`` seconds per case, so that a crash or a
hang is seen, counted and the worker restarted.

Outcomes: ``ran``; ``construction: <error type>`` or ``run: <error type>``; ``MemoryError``
(a mutated shape larger than the address space limit); ``timeout``; ``crash (exit N)``. The
allowed error types are ValueError and its subclasses (KernelError, InvalidInputError,
UnsupportedOperatorError) and TypeError; anything else is listed as unexpected.

Usage::

    nice -n 19 python tools/model_fuzz.py --cases 2000 [--models small light_squeezenet ...]

Exit status 1 when a case crashed, hung or raised an unexpected error type.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import _model_fuzzing as fuzzing


def allowed(outcome: str) -> bool:
    return outcome in ("ran", "MemoryError") or (
        outcome.startswith(("construction: ", "run: ")) and not outcome.endswith("(unexpected)"))


def main(argv: list[str] | None = None) -> int:
    models = ["small", *(p.stem for p in fuzzing.light_model_paths())]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2000, help="cases in all, spread over the models")
    parser.add_argument("--models", nargs="+", default=models, choices=models, metavar="MODEL")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first case")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--memory-gb", type=float, default=4.0, help="address space of the worker")
    parser.add_argument("--replay", type=int, help="run the case of this seed on each model")
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args(argv)
    import os

    os.environ["RELIABILITY_MEMORY_LIMIT"] = str(int(args.memory_gb * (1 << 30)))
    worker = fuzzing.ModelWorker(args.timeout)
    counts: dict[str, collections.Counter[str]] = {m: collections.Counter() for m in args.models}
    unexpected = []
    samples: dict[str, list[str]] = collections.defaultdict(list)
    started = time.monotonic()
    seeds = [args.replay] if args.replay is not None else range(args.seed, args.seed + args.cases)
    try:
        for model in args.models:  # the unmutated model runs
            result = worker.run(model, -1)
            if result["outcome"] != "ran":
                unexpected.append({"model": model, "seed": -1, **result})
        for number, seed in enumerate(seeds):
            model = args.models[number % len(args.models)] if args.replay is None else None
            for name in [model] if model else args.models:
                result = worker.run(name, seed)
                counts[name][result["outcome"]] += 1
                if len(samples[result["outcome"]]) < 5:
                    samples[result["outcome"]].append(f"{name} seed {seed}: {result['detail']}: "
                                                      f"{result.get('message', '')}")
                if not allowed(result["outcome"]):
                    unexpected.append({"model": name, "seed": seed, **result})
                    print(f"UNEXPECTED {name} seed {seed}: {result}", flush=True)
                elif args.replay is not None:
                    print(f"{name} seed {seed}: {result}")
    finally:
        worker.close()
    totals: collections.Counter[str] = collections.Counter()
    for counter in counts.values():
        totals.update(counter)
    summary = {
        "cases": sum(totals.values()),
        "seconds": round(time.monotonic() - started, 1),
        "outcomes": dict(totals.most_common()),
        "by_model": {m: dict(c.most_common()) for m, c in counts.items()},
        "samples": dict(samples),
        "unexpected": len(unexpected),
        "unexpected_cases": unexpected[:50],
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "by_model"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
