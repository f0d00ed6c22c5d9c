"""onnxruntime's Python API over :class:`~onnx_light.RuntimeSession`: switching is one import.

``InferenceSession``, ``SessionOptions``, ``RunOptions``, ``GraphOptimizationLevel``,
``ExecutionMode`` and ``get_available_providers`` have onnxruntime's names, signatures,
defaults and behaviours where onnx_light has the feature, and accept (and ignore) the
options it has no use for, so that a script written for onnxruntime runs unchanged after
``import onnx_light as ort``. What is mapped and what is ignored is listed in docs/api.rst.
``RuntimeSession`` stays the native API and knows nothing of this module.
"""

from __future__ import annotations

import copy
import enum
import logging
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx import numpy_helper

from .profiling import PROVIDER, Profiler, profile_file_name
from .runtime.feeds import NodeArg, node_arg
from .runtime.loading import load_model
from .runtime.session import NodeHook, RuntimeSession

__all__ = ["ExecutionMode", "GraphOptimizationLevel", "InferenceSession", "ModelMetadata",
           "RunOptions", "RunTerminatedError", "SessionOptions", "get_available_providers",
           "get_device"]

logger = logging.getLogger("onnx_light")

# onnxruntime's severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal (-1: unchanged).
LOG_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR,
              4: logging.CRITICAL}


class GraphOptimizationLevel(enum.IntEnum):
    """What construction may change in the graph (onnxruntime's names and values)."""

    ORT_DISABLE_ALL = 0  # nothing folded or fused
    ORT_ENABLE_BASIC = 1  # constant folding
    ORT_ENABLE_EXTENDED = 2  # constant folding and fusions
    ORT_ENABLE_LAYOUT = 3  # as extended: onnx_light has no layout transformations
    ORT_ENABLE_ALL = 99  # as extended


class ExecutionMode(enum.IntEnum):
    """Whether independent branches of the graph run side by side (``RuntimeSession``'s
    ``branches``)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class RunTerminatedError(RuntimeError):
    """A run stopped because its ``RunOptions.terminate`` was set."""


def get_available_providers() -> list[str]:
    """The execution providers this build has: the CPU one only."""
    return [PROVIDER]


def get_device() -> str:
    """The device onnx_light runs on."""
    return "CPU"


class _Options:
    """Attributes of fixed names and types, as onnxruntime's option objects have: a name
    that is not one of them (a typo) raises AttributeError, a value of another type
    TypeError."""

    __slots__ = ("_config",)
    _DEFAULTS: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        object.__setattr__(self, "_config", {})
        for name, default in self._DEFAULTS.items():
            object.__setattr__(self, name, default)

    def __setattr__(self, name: str, value: Any) -> None:
        kind = type(self)
        if name not in kind._DEFAULTS:
            import difflib  # only for the message

            close = difflib.get_close_matches(name, kind._DEFAULTS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise AttributeError(f"{kind.__name__!r} object has no attribute {name!r}{hint}")
        expected = type(kind._DEFAULTS[name])
        if type(value) is not expected and not (expected is int and isinstance(value, int)
                                                and not isinstance(value, bool)):
            raise TypeError(f"{kind.__name__}.{name} must be {expected.__name__}, "
                            f"got {type(value).__name__} {value!r}")
        object.__setattr__(self, name, value)

    def __copy__(self) -> _Options:
        duplicate = type(self)()
        for name in self._DEFAULTS:
            object.__setattr__(duplicate, name, getattr(self, name))
        duplicate._config.update(self._config)
        return duplicate

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._DEFAULTS)
        return f"{type(self).__name__}({fields})"

    def _add_entry(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError("config entries are str key -> str value")
        self._config[key] = value

    def _get_entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise KeyError(f"no config entry {key!r}; entries: {sorted(self._config)}") from None


SESSION_DEFAULTS: dict[str, Any] = {
    "enable_cpu_mem_arena": True,  # ignored: numpy allocates
    "enable_mem_pattern": True,  # ignored
    "enable_mem_reuse": True,  # ignored: runs free each value after its last use
    "enable_profiling": False,
    "execution_mode": ExecutionMode.ORT_SEQUENTIAL,
    "graph_optimization_level": GraphOptimizationLevel.ORT_ENABLE_ALL,
    "inter_op_num_threads": 0,  # ignored: branches share the intra-op threads
    "intra_op_num_threads": 0,
    "log_severity_level": -1,
    "log_verbosity_level": 0,  # ignored
    "logid": "",
    "optimized_model_filepath": "",
    "profile_file_prefix": "onnx_light_profile_",
    "use_deterministic_compute": False,  # ignored: runs are deterministic anyway
    "use_per_session_threads": True,  # ignored: sessions of one thread count share a pool
}


class SessionOptions(_Options):
    """onnxruntime's ``SessionOptions``: what each attribute maps to is in docs/api.rst."""

    __slots__ = tuple(SESSION_DEFAULTS)
    _DEFAULTS = SESSION_DEFAULTS

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Store a configuration entry (kept for ``get_session_config_entry``, not used)."""
        self._add_entry(key, value)

    def get_session_config_entry(self, key: str) -> str:
        """A configuration entry stored with ``add_session_config_entry``."""
        return self._get_entry(key)


RUN_DEFAULTS: dict[str, Any] = {
    "log_severity_level": -1,
    "log_verbosity_level": 0,  # ignored
    "logid": "",  # the run's tag in its log messages
    "only_execute_path_to_fetches": False,  # ignored: every node of the plan runs
    "terminate": False,
}


class RunOptions(_Options):
    """onnxruntime's ``RunOptions``; ``terminate`` may be set from another thread and
    stops the run before its next node."""

    __slots__ = tuple(RUN_DEFAULTS)
    _DEFAULTS = RUN_DEFAULTS

    def add_run_config_entry(self, key: str, value: str) -> None:
        """Store a configuration entry (kept for ``get_run_config_entry``, not used)."""
        self._add_entry(key, value)

    def get_run_config_entry(self, key: str) -> str:
        """A configuration entry stored with ``add_run_config_entry``."""
        return self._get_entry(key)


@dataclass(frozen=True)
class ModelMetadata:
    """onnxruntime's ``ModelMetadata``: the model's own fields."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


def _log_level(value: int, where: str) -> int | None:
    if value == -1:
        return None
    if value not in LOG_LEVELS:
        raise ValueError(f"{where}.log_severity_level must be -1 (unchanged) or 0-4 "
                         f"(verbose, info, warning, error, fatal), got {value}")
    return LOG_LEVELS[value]


def _providers(providers: Sequence[Any] | None,
               provider_options: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """onnxruntime's selection: names not available here are warned about and skipped, and
    the CPU provider is used whatever the list holds."""
    if providers is None:
        return [PROVIDER]
    if isinstance(providers, (str, bytes)):
        raise TypeError(f"providers must be a list of names, got the string {providers!r}; "
                        f"write [{providers!r}]")
    providers = list(providers)
    if provider_options is not None:
        if any(isinstance(p, tuple) for p in providers):
            raise ValueError("provider options are given both in 'providers' tuples and in "
                             "'provider_options'")
        if len(provider_options) != len(providers):
            raise ValueError(f"'providers' ({len(providers)}) and 'provider_options' "
                             f"({len(provider_options)}) should be the same length")
    seen = set()
    for entry in providers:
        name, options = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, {})
        if not isinstance(name, str) or not isinstance(options, Mapping):
            raise TypeError(f"a provider is a name or a (name, options dict) pair, got {entry!r}")
        if name in seen:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=3)
        elif name != PROVIDER:
            warnings.warn(f"Specified provider '{name}' is not in available provider names. "
                          f"Available providers: '{', '.join(get_available_providers())}'",
                          stacklevel=3)
        seen.add(name)
    return [PROVIDER]


def _node_names(graph: onnx.GraphProto) -> Iterator[str]:
    """Every value name the nodes of ``graph`` and of their subgraphs read."""
    for node in graph.node:
        yield from node.input
        for attribute in node.attribute:
            for subgraph in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                yield from _node_names(subgraph)


def optimized_model(model: onnx.ModelProto, folded: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` with constant folding applied: the nodes whose outputs are all in ``folded``
    removed, and the folded values the other nodes or the graph outputs read stored as
    initializers (initializers nothing reads any more are left out)."""
    graph = model.graph
    nodes = [n for n in graph.node
             if not any(n.output) or not all(o in folded for o in n.output if o)]
    result = onnx.ModelProto()
    result.CopyFrom(model)
    target = result.graph
    del target.node[:]
    target.node.extend(nodes)
    needed = set(_node_names(target)) | {info.name for info in graph.output}
    del target.initializer[:]
    target.initializer.extend(t for t in graph.initializer if t.name in needed)
    present = {t.name for t in target.initializer}
    target.initializer.extend(numpy_helper.from_array(np.asarray(value), name)
                              for name, value in folded.items()
                              if name in needed and name not in present)
    kept = [info for info in graph.value_info if info.name not in folded]
    del target.value_info[:]
    target.value_info.extend(kept)
    return result


class InferenceSession:
    """onnxruntime's ``InferenceSession`` over :class:`~onnx_light.RuntimeSession`.

    ``path_or_bytes`` is a path (str or ``os.PathLike``) or a serialized model, as for
    onnxruntime; an ``onnx.ModelProto`` is accepted too (onnxruntime refuses one: give
    ``model.SerializeToString()`` to code that must run on both). Thread safety: ``run``
    may be called from many threads at once on one session (their outputs are bitwise
    those of serial runs).
    """

    def __init__(self, path_or_bytes: str | bytes | os.PathLike[str] | onnx.ModelProto,
                 sess_options: SessionOptions | None = None,
                 providers: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
                 provider_options: Sequence[dict[str, Any]] | None = None,
                 **kwargs: Any) -> None:
        unknown = set(kwargs) - {"disabled_optimizers"}
        if unknown:
            raise TypeError(f"InferenceSession() got unexpected keyword argument(s) {sorted(unknown)}")
        options = SessionOptions() if sess_options is None else sess_options
        if not isinstance(options, SessionOptions):
            raise TypeError(f"sess_options must be an onnx_light.SessionOptions, "
                            f"got {type(options).__name__}")
        self._options = copy.copy(options)
        self._providers = _providers(providers, provider_options)
        level = _log_level(options.log_severity_level, "SessionOptions")
        if level is not None:
            logger.setLevel(level)
        self._verbose = options.log_severity_level == 0
        threads = options.intra_op_num_threads
        if threads < 0:
            raise ValueError(f"SessionOptions.intra_op_num_threads must be 0 (default) or "
                             f"positive, got {threads}")
        self._profiler = Profiler() if options.enable_profiling else None
        started = time.perf_counter_ns()
        model = load_model(path_or_bytes)
        loaded = time.perf_counter_ns()
        optimization = options.graph_optimization_level
        self._session = RuntimeSession(
            model, num_threads=threads or None,
            fold=optimization >= GraphOptimizationLevel.ORT_ENABLE_BASIC,
            fuse=optimization >= GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            branches=options.execution_mode == ExecutionMode.ORT_PARALLEL)
        if self._profiler is not None:
            loading = "model_loading_array" if isinstance(
                path_or_bytes, (bytes, bytearray, memoryview, onnx.ModelProto)) else "model_loading_uri"
            self._profiler.session_event(loading, started, loaded)
            self._profiler.session_event("session_initialization", loaded)
        graph = model.graph
        self._metadata = ModelMetadata(
            producer_name=model.producer_name, graph_name=graph.name, domain=model.domain,
            description=model.doc_string, graph_description=graph.doc_string,
            version=model.model_version,
            custom_metadata_map={p.key: p.value for p in model.metadata_props})
        initializers = {t.name for t in graph.initializer}
        self._overridable = [node_arg(info) for info in graph.input if info.name in initializers]
        if options.optimized_model_filepath:
            self._write_optimized(model, options.optimized_model_filepath)

    def _write_optimized(self, model: onnx.ModelProto, path: str) -> None:
        """The graph after constant folding (unchanged where a feed may override an
        initializer, or IR < 4 would need every new initializer declared as an input)."""
        foldable = model.ir_version >= 4 and not self._overridable
        written = optimized_model(model, self._session.folded_values() if foldable else {})
        try:
            onnx.save(written, path)
        except (OSError, ValueError) as exc:
            raise OSError(f"optimized model not written to {path!r}: {exc}") from None

    def get_providers(self) -> list[str]:
        """The providers the session uses: ``["CPUExecutionProvider"]``."""
        return list(self._providers)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Options per provider; the CPU provider takes none."""
        return {name: {} for name in self._providers}

    def set_providers(self, providers: Sequence[Any] | None = None,
                      provider_options: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Choose providers as the constructor does (the CPU one is always used)."""
        self._providers = _providers(providers, provider_options)

    def get_session_options(self) -> SessionOptions:
        """A copy of the options the session was made with."""
        return copy.copy(self._options)

    def get_modelmeta(self) -> ModelMetadata:
        """The model's producer, graph name, domain, descriptions, version and metadata."""
        return self._metadata

    def get_inputs(self) -> list[NodeArg]:
        """The inputs a caller feeds (name, ``tensor(<type>)``, shape)."""
        return self._session.get_inputs()

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs (name, ``tensor(<type>)``, shape as declared)."""
        return self._session.get_outputs()

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers that are also graph inputs (IR < 4 models): defaults a feed may replace."""
        return list(self._overridable)

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started (ns since the epoch), or 0 when the session does not profile."""
        return 0 if self._profiler is None else self._profiler.start_time_ns

    def _hook(self, run_options: RunOptions | None) -> NodeHook | None:
        """The node hook of one run: terminate, profile and log per node as asked, or None."""
        profiler = self._profiler
        run_level = -1 if run_options is None else run_options.log_severity_level
        verbose = self._verbose if run_level < 0 else run_level == 0
        if run_options is None and profiler is None and not verbose:
            return None
        tag = "" if run_options is None else run_options.logid

        def hook(name: str, op_type: str) -> Any:
            if run_options is not None and run_options.terminate:
                raise RunTerminatedError(f"run {tag!r} terminated before node {name!r}: "
                                         "RunOptions.terminate is set")
            if verbose:
                logger.debug("run %r: node %r (%s)", tag, name, op_type)
            return None if profiler is None else profiler.node_hook(name, op_type)

        return hook

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: RunOptions | None = None) -> list[np.ndarray]:
        """Compute ``output_names`` (all outputs when None or empty) from ``input_feed``;
        raises :class:`RunTerminatedError` when ``run_options.terminate`` is or gets set."""
        if run_options is not None:
            if not isinstance(run_options, RunOptions):
                raise TypeError(f"run_options must be an onnx_light.RunOptions, "
                                f"got {type(run_options).__name__}")
            _log_level(run_options.log_severity_level, "RunOptions")
            if run_options.terminate:
                raise RunTerminatedError(f"run {run_options.logid!r} not started: "
                                         "RunOptions.terminate is set")
        profiler = self._profiler
        started = time.perf_counter_ns()
        outputs = self._session.run(output_names or None, input_feed,
                                    node_hook=self._hook(run_options))
        if profiler is not None:
            profiler.session_event("model_run", started)
        return outputs

    def end_profiling(self) -> str:
        """Stop profiling and write the Chrome-trace JSON; returns its file name ("" when the
        session does not profile or profiling has ended)."""
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return ""
        name = profile_file_name(self._options.profile_file_prefix, profiler.start_time_ns)
        return profiler.write(name)
