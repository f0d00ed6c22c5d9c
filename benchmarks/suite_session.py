"""Section 4 of the suite: session overhead on chains of small nodes.

Two chains of N nodes (100 by default), each with the same model of one node: ``add/relu``,
``Add(x, C)`` and ``Relu`` alternating on a few floats (16 by default), and ``matmul/add``,
``MatMul(x, W)`` with W 8x8 and ``Add(x, B)`` alternating on 1x8 floats
(``node_overhead.chain``), run interleaved in onnx_light's ``RuntimeSession`` (fused, and
unfused), onnxruntime (same ``intra_op_num_threads``, sequential, no spinning) and
``onnx.reference.ReferenceEvaluator``. Per node: the N-node run divided by N, and the marginal
cost ``(t_N - t_1) / (N - 1)`` that leaves out the per-run cost. A second group of the same
rounds times the pieces of one onnx_light node of the first chain (``kernel.run`` alone, the
numpy call alone, the ``np.errstate`` block that float arithmetic kernels run under), and
cProfile shows where one run of it goes.
"""

from __future__ import annotations

import cProfile
import pstats
from typing import Any

import node_overhead
import numpy as np
import onnx
from _common import (
    Context,
    SectionResult,
    Table,
    elementwise_crossover,
    interleaved,
    log,
    onnxruntime_session,
    section,
)
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light import RuntimeSession

# "onnx_light unfused": fuse=False, every node a step (fusion runs each Relu inside its Add).
RUNTIMES = ("onnx_light", "onnx_light unfused", "onnxruntime", "reference")
CHAINS = ("add/relu", "matmul/add")


def chain_model(nodes: int, elements: int) -> onnx.ModelProto:
    """``nodes`` nodes alternating Add(previous, C) and Relu, on ``elements`` floats."""
    constant = numpy_helper.from_array(np.linspace(-0.5, 0.5, elements, dtype=np.float32), "C")
    graph_nodes, previous = [], "X"
    for index in range(nodes):
        name = "Y" if index == nodes - 1 else f"t{index}"
        if index % 2 == 0:
            graph_nodes.append(helper.make_node("Add", [previous, "C"], [name], name=f"add{index}"))
        else:
            graph_nodes.append(helper.make_node("Relu", [previous], [name], name=f"relu{index}"))
        previous = name
    graph = helper.make_graph(graph_nodes, f"chain{nodes}",
                              [helper.make_tensor_value_info("X", T.FLOAT, [elements])],
                              [helper.make_tensor_value_info("Y", T.FLOAT, [elements])], [constant])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def _profile(session: RuntimeSession, feeds: dict[str, np.ndarray], runs: int, nodes: int) -> Table:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        session.run(None, feeds)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    total = sum(entry[2] for entry in stats.values())
    rows = sorted(((entry[2], entry[1], function) for function, entry in stats.items()), reverse=True)
    table = Table(f"Where one onnx_light run of the {nodes}-node chain goes (cProfile over {runs} runs, "
                  "own time per function; the profiler inflates every call, so read the shares):",
                  ["function", "calls per run", "own time per run (us)", "share of profiled time"],
                  ratios=("share of profiled time",))
    for own, calls, (filename, line, name) in rows[:12]:
        where = f"{name} ({filename.rsplit('/', 1)[-1]}:{line})" if line else name
        table.add(where, calls / runs, own / runs * 1e6, own / total)
    return table


def session_overhead(ctx: Context) -> SectionResult:
    """Section 4."""
    config = ctx.config
    n, elements = config.chain_length, config.chain_elements
    with section(4, f"Session overhead: chains of {n} small nodes") as result:
        x = np.linspace(-1, 1, elements, dtype=np.float32)
        feeds = {"X": x}
        chain_feeds = {"add/relu": feeds,
                       "matmul/add": {"X": np.linspace(-1, 1, node_overhead.ELEMENTS,
                                                       dtype=np.float32).reshape(1, -1)}}
        runs: dict[str, Any] = {}
        sessions = {}
        for kind in CHAINS:
            for nodes in (1, n):
                model = (chain_model(nodes, elements) if kind == "add/relu"
                         else node_overhead.chain(kind, nodes))
                light = RuntimeSession(model, num_threads=config.threads)
                unfused = RuntimeSession(model, num_threads=config.threads, fuse=False)
                ort = onnxruntime_session(model, config.threads)
                reference = ReferenceEvaluator(model)
                given = chain_feeds[kind]
                expected = reference.run(None, given)[0]
                for name, runner in (("onnx_light", light), ("onnx_light unfused", unfused),
                                     ("onnxruntime", ort), ("reference", reference)):
                    np.testing.assert_allclose(runner.run(None, given)[0], expected, rtol=1e-5,
                                               atol=1e-5)
                    runs[f"{kind}/{name}/{nodes}"] = lambda r=runner, f=given: r.run(None, f)
                if kind == "add/relu":
                    sessions[nodes] = light
        # The pieces of one onnx_light node, in the same rounds.
        case = elementwise_crossover.Case("Add", T.FLOAT, "equal")
        add = elementwise_crossover.build(case)
        add.bind(ctx.pool)
        relu = elementwise_crossover.build(elementwise_crossover.Case("Relu", T.FLOAT, "unary"))
        relu.bind(ctx.pool)
        c = np.linspace(-0.5, 0.5, elements, dtype=np.float32)

        def errstate() -> None:
            with np.errstate(all="ignore"):
                pass

        pieces_fns = {
            "Add kernel.run": lambda: add.run(x, c),
            "Relu kernel.run": lambda: relu.run(x),
            "np.add(x, c)": lambda: np.add(x, c),
            "np.maximum(x, 0)": lambda: np.maximum(x, 0),
            "with np.errstate(all='ignore')": errstate,
        }
        # Cheap to measure: three times the rounds, five times longer samples.
        medians = interleaved({"runs": runs, "pieces": pieces_fns}, 3 * config.rounds,
                              5 * config.sample_s, log)
        m = medians["runs"]
        per_node = {f"{kind}/{r}": m[f"{kind}/{r}/{n}"] / n for kind in CHAINS for r in RUNTIMES}
        marginal = {f"{kind}/{r}": (m[f"{kind}/{r}/{n}"] - m[f"{kind}/{r}/1"]) / max(n - 1, 1)
                    for kind in CHAINS for r in RUNTIMES}
        table = Table(f"Median run time and cost per node (us); add/relu on {elements} float32 elements, "
                      f"matmul/add on 1x{node_overhead.ELEMENTS}:",
                      ["chain", "runtime", "1-node run (us)", f"{n}-node run (us)", "per node (us)",
                       "marginal per node (us)", "per node / onnxruntime", "per node / onnx_light"],
                      ratios=("per node / onnxruntime", "per node / onnx_light"))
        for kind in CHAINS:
            for r in RUNTIMES:
                key = f"{kind}/{r}"
                table.add(kind, r, m[f"{key}/1"] * 1e6, m[f"{key}/{n}"] * 1e6, per_node[key] * 1e6,
                          marginal[key] * 1e6, per_node[key] / per_node[f"{kind}/onnxruntime"],
                          per_node[key] / per_node[f"{kind}/onnx_light"])
        pieces = Table("The pieces of one onnx_light node, timed alone in the same rounds (us per call):",
                       ["call", "median (us)", "/ onnx_light per node"], ratios=("/ onnx_light per node",))
        for name, seconds in medians["pieces"].items():
            pieces.add(name, seconds * 1e6, seconds / per_node["add/relu/onnx_light"])
        result.tables = [table, pieces, _profile(sessions[n], feeds, max(10, config.rounds * 5), n)]
        result.data = {"per_node": per_node, "marginal": marginal, "medians": medians}
    return result
