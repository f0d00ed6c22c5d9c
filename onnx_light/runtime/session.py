"""RuntimeSession: load a model once, configure every kernel once, run many times.

Construction is a sequence of named steps, each a module of its own, run once per session:

1. load and check the model (``runtime/loading.py``: the ONNX checker, shape inference);
2. dispatch builds each node's kernel for its operator, opset and element type
   (``runtime/dispatch.py``), from the session's declarations;
3. constant folding runs the nodes whose inputs are all fixed (``runtime/folding.py``);
4. fusion rewrites the steps left (``runtime/fusion.py``);
5. tuning: one registry snapshot resolves every key of the kernels that run, and each kernel
   is bound to the pool and configured with its values, the only configuration there is
   (``runtime/configuration.py``; the spec's steps 2-5);
6. kernels specialize for the plan's constant inputs (``Kernel.specialize``) and settle
   what they would decide on every run from the inferred shapes (``Kernel.settle``: Conv's
   algorithm and parallel plan);
7. the plan: bound steps over value slots, the hand-off copies and the branch groups
   (``runtime/plan.py``, ``runtime/branches.py``);
8. the memory plan: steps whose inputs are fixed for every run are prepared and write into
   buffers reused by lifetime (``runtime/arena.py``).

``run`` then calls the plan bound to one set of buffers (``runtime/execution.py``), or walks
it when a node hook is given. It never reads the registry or the cache, so publishing new
values later changes new sessions only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from ..kernels.base import Kernel, TensorSpec, numpy_dtype, quiet
from ..kernels.compiled import CACHE_ENV, compile_totals, load_numba
from ..kernels.declaration import KernelDeclaration
from ..kernels.spin import spin_loop
from ..kernels.team import team_loop
from ..parallel import BLAS, get_pool
from ..tuning.processor import execution_descriptor
from ..tuning.registry import KernelTuningRegistry, default_registry
from .arena import Arenas, plan_memory, prepare_steps
from .branches import Branches, group_branches
from .configuration import configure_kernels
from .contrib_types import adopt_default_domain_extensions, infer_contrib_types
from .dispatch import declaration_table, dispatch_graph
from .execution import BoundPlan, NodeHook, bind_plan, execute, run_bound
from .feeds import Feed, InvalidInputError, NodeArg, node_arg
from .folding import fold_constants
from .fusion import fuse as fuse_steps
from .loading import check_model, constant_arrays, load_model, skeleton, tensor_shape, value_types
from .plan import Handoff, NodeStep, memory_roots, plan_steps, static_shape, work_estimates
from .qdq import rewrite_qdq
from .subgraphs import outer_names
from .values import hand_over

__all__ = ["InvalidInputError", "NodeArg", "NodeHook", "RuntimeSession"]


logger = logging.getLogger("onnx_light")

#: A construction that compiles kernels for longer than this says so at WARNING level (shown
#: without any logging set up); shorter compilations are logged at INFO.
COMPILE_NOTICE_SECONDS = 1.0
#: How long (microseconds) the pool's threads spin, while a run is in progress, waiting for the
#: next parallel region or for its last block before they sleep (``ThreadPool.hot``): the
#: session's ``spin_us`` (docs/parallel.md, "Hot regions").
SPIN_US = 0.0
#: How long (microseconds) after a run of a multi-thread session an idle-priority thread per
#: worker keeps spinning; it spins during the whole run, so that no processor halts between
#: parallel regions (``ThreadPool.hot``'s ``awake_us``; 0: none): the session's ``awake_us``
#: (docs/parallel.md, "Keeping the processors awake").
AWAKE_US = 0.0
#: How long (microseconds) the native team's threads spin without a region, while a run is in
#: progress, before they sleep (``ThreadPool.hot``'s ``team_us``; 0: no team, the compiled
#: kernels open numba regions): the session's ``team_us`` (docs/parallel.md, "The native team").
TEAM_US = 300.0


def _report_compiles(count: int, seconds: float) -> None:
    """Say that building the session compiled ``count`` kernel functions in ``seconds``: a
    cost paid once per processor and numba version, since numba caches them on disk."""
    level = logging.WARNING if seconds >= COMPILE_NOTICE_SECONDS else logging.INFO
    logger.log(level, "compiled %d kernel function(s) for this processor in %.1f s while building "
               "the session; numba caches them in %s (set %s to move it), so later sessions load them",
               count, seconds, load_numba().config.CACHE_DIR, CACHE_ENV)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block, then resumed if it was running.

    Construction allocates tens of thousands of small objects (the model's messages, kernels,
    contexts, steps) and frees few of them: the collector's passes over them, and a full pass
    over the whole process now and then (50-100 ms here), would cost more than a small
    model's construction itself.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _steps_of(item: Any) -> Sequence[Any]:
    """The steps of a plan item: itself, or every step of a :class:`Branches` item."""
    if type(item) is Branches:
        return [step for branch in item.branches for step in branch]
    return (item,)


class RuntimeSession:
    """Runs one ONNX model on the CPU with kernels tuned for this processor.

    ``model`` is an ``onnx.ModelProto``, a path or serialized bytes.
    ``num_threads`` sets the effective thread count (default: the CPUs this
    process may use). ``registry`` defaults to the process-wide one. ``fuse``
    lets construction fuse operators (``runtime/fusion.py``: per-channel affine
    chains into convolutions, activations into their producers); False runs
    every node as the graph states, with the same results up to rounding.
    ``branches`` lets a run with several threads compute independent branches
    of the graph side by side, each on one thread (``runtime/branches.py``);
    the results are the same either way. ``fold`` lets construction run the
    nodes whose inputs are all constant once (constant folding); False leaves
    every node to the runs. ``declarations`` are the kernels dispatch chooses from
    (default: onnx_light's, ``kernels.DECLARATIONS``): a mapping ``(domain, op_type) -> declaration``
    or the declarations themselves, so that a session can run another kernel library's
    kernels (with ``registry=`` holding that library's schemas), alone or with ours
    (``{**kernels.DECLARATIONS, **mine}``).

    ``construction_seconds`` is what construction took, of which ``compile_seconds`` numba
    spent compiling ``compiled_functions`` kernel functions for this processor: only the first
    construction that uses a kernel, with numba's cache empty, compiles it (and says so in the
    ``onnx_light`` log); later ones load it from the cache.
    """

    def __init__(self, model: onnx.ModelProto | str | os.PathLike[str] | bytes, *,
                 num_threads: int | None = None,
                 registry: KernelTuningRegistry | None = None, fuse: bool = True,
                 branches: bool = True, fold: bool = True,
                 declarations: Mapping[str, KernelDeclaration] | Iterable[KernelDeclaration]
                 | None = None) -> None:
        started = time.perf_counter()
        compiles_before = compile_totals()
        with _collector_paused():
            self._construct(model, num_threads, registry, fuse, branches, fold, declarations)
            # The native team's loops, compiled (or loaded) now rather than in a run; only where
            # a kernel loaded numba: a session of numpy kernels has no compiled region to share.
            self._team = team_loop() if self.num_threads > 1 and "numba" in sys.modules else None
        self.construction_seconds = time.perf_counter() - started
        count, seconds = compile_totals()
        self.compiled_functions = count - compiles_before[0]
        self.compile_seconds = seconds - compiles_before[1]
        if self.compiled_functions:
            _report_compiles(self.compiled_functions, self.compile_seconds)

    def _construct(self, model: onnx.ModelProto | str | os.PathLike[str] | bytes,
                   num_threads: int | None, registry: KernelTuningRegistry | None, fuse: bool,
                   branches: bool, fold: bool,
                   declarations: Mapping[str, KernelDeclaration] | Iterable[KernelDeclaration] | None
                   ) -> None:
        """Steps 1 and 2 of the construction (see the module docstring), then the others."""
        model = load_model(model)
        if registry is not None and not isinstance(registry, KernelTuningRegistry):
            raise TypeError(f"registry must be a KernelTuningRegistry, got {type(registry).__name__}")
        table = declaration_table(declarations)
        for name, flag in (("fuse", fuse), ("branches", branches), ("fold", fold)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {type(flag).__name__}")
        model = adopt_default_domain_extensions(model)
        if fuse:  # QDQ groups become integer kernels (runtime/qdq.py); the caller's model is kept
            model = rewrite_qdq(model)
        checked = skeleton(model)
        inferred = infer_contrib_types(checked, check_model(checked), table)
        types = value_types(checked, inferred)
        self.descriptor = execution_descriptor(num_threads)
        self.num_threads = self.descriptor.num_threads
        self._pool = get_pool(self.num_threads)
        self.spin_us = SPIN_US
        self.awake_us = AWAKE_US
        self.team_us = TEAM_US
        if self.num_threads > 1 and (self.spin_us > 0 or self.awake_us > 0):
            spin_loop()  # compiled (or loaded) now rather than in a run
        graph = model.graph
        opsets = {entry.domain or "": entry.version for entry in model.opset_import}
        kernels, nested = dispatch_graph(graph, inferred.graph, opsets, types, table)
        self._inputs = list(graph.input)
        self._outputs = list(graph.output)
        self._build_plan(graph, kernels, nested, types, registry or default_registry(), fuse,
                         branches, fold)

    def _build_plan(self, graph: onnx.GraphProto, kernels: list[Kernel], nested: list[Kernel],
                    types: Mapping[str, onnx.TypeProto], registry: KernelTuningRegistry,
                    fuse: bool, branches: bool, fold: bool) -> None:
        """Steps 3-8 of the construction (see the module docstring), over value slots;
        ``nested``: the kernels of control-flow nodes' graphs, configured with the others."""
        self._nested = nested
        slots: dict[str, int] = {}

        def slot(name: str) -> int:
            return slots.setdefault(name, len(slots))

        constants = {slot(initializer.name): array
                     for initializer, array in zip(graph.initializer, constant_arrays(graph),
                                                   strict=True)}
        self._feed_slots = {info.name: slot(info.name) for info in graph.input}
        self._feeds = tuple(Feed.of(info, self._feed_slots[info.name]) for info in graph.input)
        self._required = [info.name for info in graph.input if slots[info.name] not in constants]
        every_step: list[NodeStep] = [
            (kernel, tuple(slot(name) if name else None
                           for name in (*node.input, *outer_names(kernel))),
             tuple(slot(name) if name else None for name in node.output))
            for node, kernel in zip(graph.node, kernels, strict=True)]
        self._output_slots = {info.name: slots[info.name] for info in graph.output
                              if info.name in slots}
        self._output_names = list(self._output_slots)
        missing = [info.name for info in graph.output if info.name not in slots]
        if missing:
            raise ValueError(f"graph outputs {missing} are produced by no node")
        shapes = {slots[name]: shape for name, value_type in types.items()
                  if name in slots and (shape := tensor_shape(value_type)) is not None}
        outputs_of = {id(kernel): node.output for node, kernel in zip(graph.node, kernels, strict=True)}

        def output_shapes(kernel: Kernel) -> list[list[int | str | None] | None]:
            return [shapes.get(slots[name]) for name in outputs_of[id(kernel)] if name]

        self._slots, self._constants = slots, constants
        steps, known = self._fold_and_fuse(every_step, output_shapes, shapes, fold, fuse)
        # Step 5: tuning, for the kernels of both plans.
        tuning_started = time.perf_counter()
        self._configuration = configure_kernels(
            [*(kernel for kernel, _, _ in (*steps, *every_step)), *nested], registry,
            self.descriptor, self._pool)
        self.generation = self._configuration.generation
        self.tuning_resolution_seconds = time.perf_counter() - tuning_started
        # Step 6: kernels may specialize for the inputs that are constant in the folded plan,
        # and settle what they decide from the inferred shapes once. A kernel specialized
        # for an initializer a feed may override (packed weights) holds its value: a run
        # that feeds it takes the unfolded plan, as for a folded value.
        overridable = set(self._feed_slots.values()) & set(self._constants)
        specialized = []
        for kernel, inputs, outputs in steps:
            chosen = kernel.specialize([None if s is None else known.get(s) for s in inputs])
            if chosen is not None:
                self._fold_sources |= overridable.intersection(inputs)
            specialized.append((chosen or kernel, inputs, outputs))
        steps = specialized
        self._steps = [(kernel.settle([static_shape(s, known, shapes) for s in inputs]) or kernel,
                        inputs, outputs) for kernel, inputs, outputs in steps]
        self._plans(every_step, known, shapes, branches)
        self._release_packed_constants()

    def _fold_and_fuse(self, every_step: list[NodeStep],
                       output_shapes: Callable[[Kernel], list[list[int | str | None] | None]],
                       shapes: Mapping[int, list[int | str | None]], fold: bool, fuse: bool
                       ) -> tuple[list[NodeStep], dict[int, np.ndarray]]:
        """Steps 3 and 4: the steps left to run and the values the folded plan starts with;
        sets the folded values, the initializers they depend on and the slot count."""
        constants = self._constants
        folding = fold_constants(every_step, constants,
                                 set(self._feed_slots.values()) & set(constants), output_shapes,
                                 fold, lambda slot: static_shape(slot, {}, shapes))
        steps, folded = folding.steps, dict(folding.folded)
        known = {**constants, **folded}
        self.folded_nodes = len(every_step) - len(steps)
        fold_sources = set(folding.sources(folded))
        self._num_slots = len(self._slots)
        unfused = len(steps)
        if fuse:
            def add_constant(array: np.ndarray) -> int:
                self._num_slots += 1
                return self._num_slots - 1

            fusion = fuse_steps(steps, known, set(self._output_slots.values()), shapes, add_constant)
            steps = fusion.steps
            folded.update(fusion.constants)
            known.update(fusion.constants)
            fold_sources.update(folding.sources(fusion.sources))
        self.fused_nodes = unfused - len(steps)
        self._folded = folded
        self._fold_sources = frozenset(fold_sources)
        return steps, known

    def _plans(self, every_step: list[NodeStep], known: Mapping[int, np.ndarray],
               shapes: Mapping[int, list[int | str | None]], branches: bool) -> None:
        """Steps 7 and 8: the plan with its hand-off and branch groups, and the memory plan
        (the plan without folding waits for a run that needs it: ``_unfolded``)."""
        steps, constants = self._steps, self._constants
        graph_outputs = list(self._output_slots.values())
        self._plan = plan_steps(steps, set(constants) | set(self._folded) | set(graph_outputs))
        self._handoff = Handoff.of(steps, graph_outputs)
        grouped = branches and self.num_threads > 1
        if grouped:
            self._plan = group_branches(self._plan, work_estimates(steps, known, shapes),
                                        self.num_threads)
        self.branch_groups = sum(type(item) is Branches for item in self._plan)
        self._plan_memory(steps, known, graph_outputs, shapes)
        self._unfolded_inputs = (every_step, shapes, grouped)

    def _release_packed_constants(self) -> None:
        """Let go of the initializers that every step of the plan reading them holds packed
        (product weights, kept again in panels): their slots get a stand-in of their shape
        and type that takes no memory (the packed kernels read only those), and the unfolded
        plan, whose kernels multiply them, gets them rebuilt from the panels on its first
        run (``_released``)."""
        readers: dict[int, list[tuple[Kernel, int]]] = {}
        for kernel, inputs, _ in self._steps:
            for position, s in enumerate(inputs):
                if s is not None:
                    readers.setdefault(s, []).append((kernel, position))
        kept = set(self._feed_slots.values()) | set(self._output_slots.values())
        self._released: dict[int, Callable[[], np.ndarray]] = {}
        for s, array in self._constants.items():
            rebuilds = [kernel.packed_input(position) for kernel, position in readers.get(s, ())]
            if s in kept or not rebuilds or None in rebuilds:
                continue
            self._released[s] = rebuilds[0]
            stand_in = np.broadcast_to(np.zeros((), array.dtype), array.shape)
            self._constants[s] = self._values[s] = self._values_unfolded[s] = stand_in

    @functools.cached_property
    def _unfolded(self) -> tuple[tuple[Any, ...], Handoff]:
        """The plan without folding and its hand-off, for runs that feed an initializer the
        folding used: planned on the first such run (most sessions never take it), with the
        released constants rebuilt."""
        for s, rebuild in self._released.items():
            self._constants[s] = self._values_unfolded[s] = rebuild()
        every_step, shapes, grouped = self._unfolded_inputs
        graph_outputs = list(self._output_slots.values())
        plan = plan_steps(every_step, set(self._constants) | set(graph_outputs))
        if grouped:
            plan = group_branches(plan, work_estimates(every_step, self._constants, shapes),
                                  self.num_threads)
        return plan, Handoff.of(every_step, graph_outputs)

    def _plan_memory(self, steps: Sequence[NodeStep], known: Mapping[int, np.ndarray],
                     graph_outputs: Sequence[int],
                     shapes: Mapping[int, Sequence[int | str | None]]) -> None:
        """Prepare the plan's steps whose inputs are fixed (contiguous constants, feeds the
        run checks fully, prepared steps' outputs) or inferred (``shapes``: other steps'
        outputs, checked on every run), give their outputs reused buffers, and set up the
        bound plans (``runtime/arena.py``, ``runtime/execution.py``)."""
        overridable = set(self._feed_slots.values())
        specs: dict[int, TensorSpec] = {
            s: (array.shape, array.dtype) for s, array in known.items()
            if s not in overridable and array.flags.c_contiguous and array.dtype.kind != "O"}
        for feed in self._feeds:  # an initializer listed as an input: its value must fit too
            default = known.get(feed.slot)
            if feed.spec is not None and (default is None or (
                    default.flags.c_contiguous and (default.shape, default.dtype) == feed.spec)):
                specs[feed.slot] = feed.spec
        inferred: dict[int, TensorSpec] = {}
        for kernel, _, outputs in steps:
            for s, element_type in zip(outputs, kernel.ctx.output_types, strict=False):
                shape = static_shape(s, {}, shapes)
                if shape is not None and element_type:
                    inferred[s] = (shape, numpy_dtype(element_type))
        self._plan, writes = prepare_steps(self._plan, specs, inferred)
        read_by_prepared = {s for item in self._plan if getattr(item, "prepared", None) is not None
                            for s in item.inputs}
        self._feeds = tuple(dataclasses.replace(feed, contiguous=feed.slot in read_by_prepared)
                            if isinstance(feed, Feed) else feed for feed in self._feeds)
        self._required_names = frozenset(self._required)
        self._required_feeds = tuple(feed for feed in self._feeds if feed.name in self._required_names)
        # A run's values start as a copy of these: the constants (and the folded values for
        # the plan that uses them), then an omitted input's slot that stays None.
        self._values_unfolded: list[Any] = [None] * (self._num_slots + 1)
        for s, array in self._constants.items():
            self._values_unfolded[s] = array
        self._values = self._values_unfolded.copy()
        for s, array in self._folded.items():
            self._values[s] = array
        reads = [sorted({s for step in _steps_of(item) for s in step.inputs if s is not None})
                 for item in self._plan]
        memory = plan_memory(writes, reads, memory_roots(steps), set(graph_outputs))
        self.arena_bytes = memory.nbytes
        self._bound_handoff = Handoff.of(steps, graph_outputs, reused=memory.assignment)
        none_slot = self._num_slots  # every run's values end with one slot that stays None
        self._arenas: Arenas[BoundPlan] = Arenas(
            lambda: bind_plan(self._plan, memory.allocate(), memory.assignment, none_slot,
                              self._pool))

    def folded_values(self) -> dict[str, np.ndarray]:
        """The values of the graph computed once at construction (constant folding), by
        name: read-only arrays, the same for every run that overrides no initializer."""
        return {name: self._folded[s] for name, s in self._slots.items() if s in self._folded}

    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs a caller feeds (initializers excluded)."""
        return [node_arg(info) for info in self._inputs if info.name in self._required]

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs."""
        return [node_arg(info) for info in self._outputs]

    def tuning_report(self) -> list[dict[str, Any]]:
        """Per tunable step of the plan that runs (after folding, fusion and specialization;
        a fused step carries its first node's name), then per tunable kernel of the graphs of
        control-flow nodes: the node's name, key, values, their source and the generation."""
        return self._configuration.report([*(kernel for kernel, _, _ in self._steps),
                                           *self._nested])

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], *,
            node_hook: NodeHook | None = None) -> list[np.ndarray]:
        """Compute ``output_names`` (all outputs when None) from ``input_feed``.

        Same signature and return type as ``onnxruntime.InferenceSession.run``; as there,
        the outputs share memory with no feed, no constant and no other output, and the
        feeds are never written (docs/reliability.md lists the feeds accepted). A sequence
        is fed and returned as a list of arrays, an optional as its element or None.
        ``node_hook(node_name, op_type)``, when given, is called before each step of the
        plan on the thread that runs it (a fused step carries the name of its first node);
        it may raise to stop the run, and returns None or a callable to call once the step
        is done (profiling and ``RunOptions.terminate`` in ``onnx_light.InferenceSession``).
        """
        if not isinstance(input_feed, Mapping):
            raise TypeError(f"input_feed must be a dict of name -> array, "
                            f"got {type(input_feed).__name__}")
        if isinstance(output_names, str):
            raise TypeError(f"output_names must be a list of names or None, got the string "
                            f"{output_names!r}")
        if output_names is None:
            names = self._output_names
        else:
            names = list(output_names)
            unknown_outputs = [n for n in names if n not in self._output_slots]
            if unknown_outputs:
                raise InvalidInputError(f"unknown output(s) {unknown_outputs}; "
                                        f"outputs: {list(self._output_slots)}")
        feed_slots = self._feed_slots
        if not input_feed.keys() <= feed_slots.keys():
            unknown = [n for n in input_feed if n not in feed_slots]
            defaults = len(feed_slots) - len(self._required)
            also = f" ({defaults} initializer(s) listed as graph inputs may also be fed)" \
                if defaults else ""
            raise InvalidInputError(f"unknown input(s) {unknown}; inputs: {self._required}{also}")
        if not self._required_names <= input_feed.keys():
            missing = [n for n in self._required if n not in input_feed]
            raise InvalidInputError(f"missing input(s) {missing}")
        plan, handoff = self._plan, self._handoff
        if len(input_feed) == len(self._required):  # the usual run: no initializer overridden
            values = self._values.copy()
            for feed in self._required_feeds:
                values[feed.slot] = feed.check(input_feed[feed.name])
        else:
            fed = set()
            values = self._values.copy()
            for feed in self._feeds:
                if feed.name in input_feed:
                    fed.add(feed.slot)
                    values[feed.slot] = feed.check(input_feed[feed.name])
            if fed & self._fold_sources:  # a default the folding used is overridden
                plan, handoff = self._unfolded
                unfolded = self._values_unfolded.copy()
                for s in fed:
                    unfolded[s] = values[s]
                values = unfolded
        # One BLAS thread by default; a kernel that wants BLAS's own threads raises the
        # count for its call (at most the session's thread count) and restores it.
        threaded = self.num_threads > 1
        hot = threaded and (self.spin_us > 0 or self.awake_us > 0)
        team = self._team if self.team_us > 0 else None
        with BLAS.scope(1), quiet(), self._pool.hot(self.spin_us, spin_loop() if hot else None,
                                                    self.awake_us, team, self.team_us):
            if plan is self._plan and node_hook is None:  # the steady state: the bound plan
                bound = self._arenas.take()
                try:
                    run_bound(bound, values)
                finally:
                    self._arenas.give(bound)
                handoff = self._bound_handoff
            else:
                execute(plan, values, self._pool, node_hook)
        # The caller gets arrays of its own: a copy of each output that may share memory with
        # a feed, a constant or an output before it, and of any read-only one.
        slots = [self._output_slots[n] for n in names]
        copies = handoff.every if output_names is None else handoff.copies(slots)
        return [hand_over(values[s], copy) for s, copy in zip(slots, copies, strict=True)]
