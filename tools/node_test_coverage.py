"""How many of ONNX's node test cases onnx_light supports and passes, per operator.

Every case of ``onnx.backend.test.loader.load_model_tests(kind="node")`` (the models and
reference data onnx generates, or reads from test_data_set directories) is built as a
:class:`~onnx_light.runtime.RuntimeSession` when all its operators are in ``DECLARATIONS``
at the case's opsets (*supported*), run on each of its data sets and compared as ONNX's
backend runner compares (*passed*). With
``--onnxruntime`` every case also runs on onnxruntime in the same process. The cases of the
default domain and of ``ai.onnx.ml`` are counted; those of other domains only with
``--all-domains``.

The table has one row per operator (``ai.onnx.ml`` ones prefixed with their domain) and
counts a case under every operator its graph (and subgraphs) uses, so a row reads "cases
that need this operator"; the total row counts each case once, and a row per domain counts
the cases that use an operator of it. ``--failures`` lists the supported cases that fail with
the first line of their error.

The cases of the random number operators (:data:`DRAWN`) hold one draw of numpy's global
generator as expected output, which no implementation reproduces (onnx's own backend tests
exclude them): they pass when every output has the expected shape and type
(:func:`assert_same_kinds`); tests/test_random_draws.py checks the draws themselves.

Usage::

    python tools/node_test_coverage.py [--onnxruntime] [--failures] [--only OP ...]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner

from onnx_light.kernels import DECLARATIONS, random_draws
from onnx_light.runtime import RuntimeSession
from onnx_light.runtime.dispatch import ONNX_DOMAINS, canonical_domain, find_kernel

Outcome = str  # "pass" or the first line of the failure
Compare = Callable[[list[Any], list[Any], float, float], None]

#: The operators whose outputs are random draws: their cases compare shapes and types only.
DRAWN = frozenset(declaration.op_type for declaration in random_draws.DECLARATIONS)


def operators(graph: onnx.GraphProto) -> set[tuple[str, str]]:
    """The (domain, op_type) pairs of a graph and its subgraphs."""
    found = set()
    for node in graph.node:
        found.add((node.domain or "", node.op_type))
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found |= operators(attribute.g)
            for graph_value in attribute.graphs:
                found |= operators(graph_value)
    return found


def row_name(domain: str, op_type: str) -> str:
    """An operator's row: its name, prefixed with its domain outside the default one."""
    domain = canonical_domain(domain)
    return f"{domain}::{op_type}" if domain else op_type


def supported(model: onnx.ModelProto) -> bool:
    """Whether every operator of the model has an onnx_light kernel at the model's opset."""
    opsets = {entry.domain or "": entry.version for entry in model.opset_import}
    for domain, op_type in operators(model.graph):
        if not isinstance(find_kernel(DECLARATIONS, domain, op_type, opsets.get(domain)), type):
            return False
    return True


def _load(path: str, type_proto: onnx.TypeProto) -> Any:
    with open(path, "rb") as f:
        content = f.read()
    if type_proto.HasField("sequence_type"):
        sequence = onnx.SequenceProto()
        sequence.ParseFromString(content)
        return numpy_helper.to_list(sequence)
    if type_proto.HasField("optional_type"):
        optional = onnx.OptionalProto()
        optional.ParseFromString(content)
        return numpy_helper.to_optional(optional)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(content)
    return numpy_helper.to_array(tensor)


def _array(value: Any) -> Any:
    """A generated case's value: some are TensorProtos rather than arrays."""
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def data_sets(model: onnx.ModelProto, model_dir: str) -> list[tuple[list[Any], list[Any]]]:
    """The (inputs, expected outputs) of each test_data_set directory of a case."""
    sets = []
    for directory in sorted(glob.glob(os.path.join(model_dir, "test_data_set*"))):

        def files(prefix: str, values: Sequence[onnx.ValueInfoProto], where: str = directory) -> list[Any]:
            count = len(glob.glob(os.path.join(where, f"{prefix}_*.pb")))
            return [_load(os.path.join(where, f"{prefix}_{i}.pb"), values[i].type) for i in range(count)]

        sets.append((files("input", model.graph.input), files("output", model.graph.output)))
    return sets


def _onnx_light(model: onnx.ModelProto) -> Callable[[list[Any]], list[Any]]:
    session = RuntimeSession(model, num_threads=1)
    names = [value.name for value in session.get_inputs()]
    return lambda inputs: session.run(None, dict(zip(names, inputs, strict=False)))


def _onnxruntime(model: onnx.ModelProto) -> Callable[[list[Any]], list[Any]]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [value.name for value in session.get_inputs()]
    return lambda inputs: session.run(None, dict(zip(names, inputs, strict=False)))


def assert_same_kinds(expected: list[Any], actual: list[Any], rtol: float, atol: float) -> None:
    """Every output has the expected shape and dtype (values are not compared)."""
    assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
    for i, (mine, theirs) in enumerate(zip(actual, expected, strict=True)):
        assert (mine.shape, mine.dtype) == (theirs.shape, theirs.dtype), (
            f"output {i}: shape {mine.shape} and dtype {mine.dtype}, expected {theirs.shape} "
            f"and {theirs.dtype}"
        )


def comparison(model: onnx.ModelProto) -> Compare:
    """How a case's outputs are compared: by shape and type for random draws, else as onnx's
    backend runner compares them."""
    drawn = any(op_type in DRAWN for domain, op_type in operators(model.graph) if not domain)
    return assert_same_kinds if drawn else Runner.assert_similar_outputs


def run_case(
    build: Callable[[onnx.ModelProto], Callable[[list[Any]], list[Any]]],
    model: onnx.ModelProto,
    sets: list[tuple[list[Any], list[Any]]],
    rtol: float,
    atol: float,
) -> Outcome:
    """``"pass"`` when every data set matches within the case's tolerances
    (:func:`comparison`), else why not."""
    compare = comparison(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = build(model)
            for inputs, expected in sets:
                compare(expected, list(run(inputs)), rtol, atol)
    except Exception as error:  # every failure is an outcome to count
        text = str(error).strip().splitlines()
        return f"{type(error).__name__}: {text[0][:160] if text else ''}"
    return "pass"


@dataclass
class Row:
    cases: int = 0
    supported: int = 0
    passed: int = 0
    peer_passed: int = 0
    failures: list[tuple[str, Outcome]] = field(default_factory=list)


def measure(
    only: Sequence[str] = (), all_domains: bool = False, peer: bool = False
) -> tuple[dict[str, Row], Row]:
    """Per operator and in total: cases, supported, passed (and onnxruntime's passes)."""
    rows: dict[str, Row] = {}
    total = Row()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    for case in cases:
        if case.model_dir is None:  # generated in memory by onnx's node test case modules
            model = case.model
            sets = [
                ([_array(v) for v in inputs], [_array(v) for v in outputs])
                for inputs, outputs in case.data_sets
            ]
        else:
            model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
            sets = data_sets(model, case.model_dir)
        ops = operators(model.graph)
        if not all_domains and any(domain not in ONNX_DOMAINS for domain, _ in ops):
            continue
        names = sorted({row_name(domain, op_type) for domain, op_type in ops})
        if only and not set(only) & {op_type for _, op_type in ops}:
            continue
        domains = sorted({f"TOTAL {canonical_domain(domain) or 'ai.onnx'}" for domain, _ in ops})
        ours = run_case(_onnx_light, model, sets, case.rtol, case.atol) if supported(model) else None
        theirs = run_case(_onnxruntime, model, sets, case.rtol, case.atol) if peer else None
        for row in (total, *(rows.setdefault(name, Row()) for name in (*names, *domains))):
            row.cases += 1
            row.supported += ours is not None
            row.passed += ours == "pass"
            row.peer_passed += theirs == "pass"
            if ours not in (None, "pass"):
                row.failures.append((case.name, ours))
    return rows, total


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def table(rows: dict[str, Row], total: Row, peer: bool) -> str:
    """The per-operator table, then the total, as aligned text."""
    header = ["operator", "kernel", "cases", "supported", "passed"] + (["onnxruntime"] if peer else [])
    lines = [header]
    implemented = {row_name(domain, op_type) for domain, op_type in DECLARATIONS}
    operators_rows = sorted(name for name in rows if not name.startswith("TOTAL "))
    for name in operators_rows:
        row = rows[name]
        lines.append(
            [name, "yes" if name in implemented else "-", str(row.cases), str(row.supported), str(row.passed)]
            + ([str(row.peer_passed)] if peer else [])
        )
    domain_rows = [(name, rows[name], "") for name in sorted(rows) if name.startswith("TOTAL ")]
    for name, row, kernels in [*domain_rows, ("TOTAL", total, f"{len(DECLARATIONS)} ops")]:
        lines.append(
            [
                name,
                kernels,
                str(row.cases),
                f"{row.supported} ({_percent(row.supported, row.cases).strip()})",
                f"{row.passed} ({_percent(row.passed, row.cases).strip()})",
            ]
            + ([f"{row.peer_passed} ({_percent(row.peer_passed, row.cases).strip()})"] if peer else [])
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnxruntime", action="store_true", help="also run every case on onnxruntime")
    parser.add_argument("--failures", action="store_true", help="list the supported cases that fail")
    parser.add_argument(
        "--all-domains",
        action="store_true",
        help="include the domains other than the default one and ai.onnx.ml",
    )
    parser.add_argument(
        "--only", nargs="*", default=(), metavar="OP", help="only the cases that use one of these operators"
    )
    args = parser.parse_args(argv)
    rows, total = measure(args.only, args.all_domains, args.onnxruntime)
    print(table(rows, total, args.onnxruntime))
    if args.failures:
        print("\nfailing supported cases:")
        for name, outcome in sorted({f for row in rows.values() for f in row.failures}):
            print(f"  {name}: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
