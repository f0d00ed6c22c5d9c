"""Compiled kernels: Python functions that numba compiles for this processor on first use.

``@compiled`` marks a kernel function for numba's ``njit`` without importing numba: the
decorator only records the function and its options, and numba is imported (and the function
compiled for the argument types it meets) when a session first asks for it. ``import
onnx_light`` therefore stays free of numba and LLVM; a session that runs only numpy kernels
never loads them.

Every compiled function is ``nogil`` (the intra-op pool's threads run them in parallel) and
cached on disk by numba, in a folder of onnx_light's user cache directory named after the
numba version (``$ONNX_LIGHT_NUMBA_CACHE`` or numba's own ``$NUMBA_CACHE_DIR`` override it).
numba keys each cached entry by the source file, the argument types and the target machine
(LLVM's triple, processor name and features), so another processor or another numba version
compiles anew instead of loading code built for something else. numba checks only the file of
the function it compiles, though, not those of the kernels and intrinsics the function inlines
from other modules: the folder therefore has one subfolder per version of the kernels' sources
(:func:`kernel_sources_digest`), so that a change to any kernel module compiles anew.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["CACHE_ENV", "WIDE_VECTORS", "CompiledConstant", "CompiledFunction", "CompiledIntrinsic",
           "clock_without_compilation", "close_sum_loop", "compile_totals", "compiled", "fused_multiply_add",
           "kernel_sources_digest", "load_numba", "max_threads", "numba_cache_dir", "prange",
           "process_compile_seconds", "read_only", "target_features", "target_flags", "use_threads",
           "vector_bytes", "vector_lanes", "wide_vectors"]

#: Environment variable naming the folder for numba's compiled-code cache.
CACHE_ENV = "ONNX_LIGHT_NUMBA_CACHE"

#: Options every compiled kernel gets; a kernel may add to them (``fastmath``, ``parallel``).
DEFAULT_OPTIONS = {"nogil": True, "cache": True, "error_model": "numpy", "boundscheck": False}

_load_lock = threading.Lock()


def kernel_sources_digest(root: Path = Path(__file__).parent) -> str:
    """A digest of the Python sources under ``root`` (this package: the compiled kernels and
    every module whose code they inline), names and contents."""
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def numba_cache_dir(numba_version: str) -> Path:
    """The folder numba caches compiled kernels in: in the override, or in one folder per
    numba version, the subfolder of the kernels' sources (:func:`kernel_sources_digest`)."""
    override = os.environ.get(CACHE_ENV) or os.environ.get("NUMBA_CACHE_DIR")
    if override:
        base = Path(override).expanduser()
    else:
        import platformdirs

        base = Path(platformdirs.user_cache_dir("onnx_light")) / f"numba-{numba_version}"
    return base / f"sources-{kernel_sources_digest()}"


#: The OpenMP wait policy numba's threads get unless the user set one: threads that sleep
#: between parallel regions instead of spinning, which on a loaded machine turned a region
#: into milliseconds and took cores from the next kernels (docs/parallel.md, docs/gemm.md).
OMP_WAIT_POLICY = "PASSIVE"


@functools.cache
def load_numba() -> ModuleType:
    """Import numba once, pointing its cache at :func:`numba_cache_dir`, giving OpenMP
    :data:`OMP_WAIT_POLICY` (read when numba first starts its threads) and starting the
    clock of :func:`compile_totals`."""
    with _load_lock:
        os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)
        import numba
        from numba.core import event

        numba.config.CACHE_DIR = str(numba_cache_dir(numba.__version__))
        event.register("numba:compile", _compile_clock(event.Listener)())
        event.register("numba:compiler_lock", _compiler_lock_clock(event.Listener)())
        return numba


@functools.cache
def _thread_count_functions() -> tuple[Callable[[], int], Callable[[int], Any]]:
    """numba's get and set of the calling thread's thread count: the threading layer's own
    functions where numba has them (0.1-0.2 us a call here, against 0.9-1.5 us for its public
    ones, which check and launch the layer every time), its public ones else. numba's threads
    are launched first: the layer's functions exist from then on."""
    numba = load_numba()
    numba.get_num_threads()
    try:
        from numba.np.ufunc import parallel

        return parallel._get_num_threads, parallel._set_num_threads
    except (ImportError, AttributeError):
        return numba.get_num_threads, numba.set_num_threads


@functools.cache
def max_threads() -> int:
    """The most threads a numba region can use (``NUMBA_NUM_THREADS``, the cores by default)."""
    return int(load_numba().config.NUMBA_NUM_THREADS)


def use_threads(threads: int) -> None:
    """Make numba's next parallel regions on the calling thread use ``threads`` threads (1 to
    :func:`max_threads`): numba keeps the count per thread, and a region inside a compiled
    call cannot change it without losing the disk cache. Launches numba's threads."""
    get, set_ = _thread_count_functions()
    if get() != threads:
        set_(threads)


_compiles = threading.local()  # per thread: functions compiled, seconds, nesting depth, start


class _ProcessCompileTime:
    """Wall-clock seconds during which at least one thread of the process held or waited for
    numba's compiler lock (compiling, loading compiled code from the disk cache, saving it):
    intervals on two threads at once count once, so that a clock subtracting it never runs
    backwards."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compiling = 0
        self._since = 0.0
        self._seconds = 0.0

    def start(self) -> None:
        with self._lock:
            if self._compiling == 0:
                self._since = time.perf_counter()
            self._compiling += 1

    def end(self) -> None:
        with self._lock:
            self._compiling -= 1
            if self._compiling == 0:
                self._seconds += time.perf_counter() - self._since

    def seconds(self) -> float:
        with self._lock:
            ongoing = time.perf_counter() - self._since if self._compiling else 0.0
            return self._seconds + ongoing


_process_compiling = _ProcessCompileTime()


def compile_totals() -> tuple[int, float]:
    """The functions numba compiled on the calling thread so far and the seconds it took
    (a function loaded from numba's disk cache is not compiled, and counts nothing)."""
    return getattr(_compiles, "count", 0), getattr(_compiles, "seconds", 0.0)


def read_only(array: Any) -> Any:
    """``array`` itself if it is read-only, else a read-only view of it. numba compiles one
    form of a kernel per writeable flag of each array argument, and a session's constants and
    feeds are read-only while computed values are not: a compiled call passes what it only
    reads through this, so that its construction-time warm-up and every run meet one form
    (a session's first run then compiles nothing, docs/architecture.md)."""
    if not array.flags.writeable:
        return array
    view = array.view()
    view.flags.writeable = False
    return view


def process_compile_seconds() -> float:
    """The wall-clock seconds so far during which any thread of this process was in numba's
    compiler (compiling, or loading or saving the disk cache)."""
    return _process_compiling.seconds()


def clock_without_compilation() -> float:
    """A monotonic clock in seconds that stands still while numba compiles, or loads compiled
    code, on any thread of the process: what a calibration times its measurements and budget
    with, so that a cold compile cache costs it no candidates, including the compilations a
    parallel candidate triggers on the pool's threads (reported as the result's
    ``setup_s``)."""
    return time.perf_counter() - _process_compiling.seconds()


def _compile_clock(listener: type) -> type:
    """A numba event listener (``listener`` is numba's base class) adding the time of each
    outermost compilation to the compiling thread's :func:`compile_totals`."""

    class CompileClock(listener):  # type: ignore[misc, valid-type]
        def on_start(self, event: Any) -> None:
            depth = getattr(_compiles, "depth", 0)
            if depth == 0:
                _compiles.started = time.perf_counter()
            _compiles.depth = depth + 1

        def on_end(self, event: Any) -> None:
            _compiles.depth -= 1
            _compiles.count = getattr(_compiles, "count", 0) + 1
            if _compiles.depth == 0:
                _compiles.seconds = (getattr(_compiles, "seconds", 0.0)
                                     + time.perf_counter() - _compiles.started)

    return CompileClock


def _compiler_lock_clock(listener: type) -> type:
    """A numba event listener for its compiler lock (taken around every compilation, cache
    load and cache save) feeding :func:`process_compile_seconds`."""

    class CompilerLockClock(listener):  # type: ignore[misc, valid-type]
        def on_start(self, event: Any) -> None:
            _process_compiling.start()

        def on_end(self, event: Any) -> None:
            _process_compiling.end()

    return CompilerLockClock


class CompiledFunction:
    """A Python kernel function and the numba options it is compiled with, compiled on demand.

    Calling it compiles on first use for the argument types given. Hot paths take
    :attr:`dispatcher` once (at configuration) and call that directly: numba's dispatcher
    without this wrapper's attribute lookup.
    """

    def __init__(self, function: Callable[..., Any], options: dict[str, Any]) -> None:
        self.function = function
        self.options = {**DEFAULT_OPTIONS, **options}
        functools.update_wrapper(self, function)

    @functools.cached_property
    def dispatcher(self) -> Any:
        """numba's dispatcher for the function (imports numba on first access)."""
        return load_numba().njit(**self.options)(_calling_dispatchers(self.function))

    def __call__(self, *args: Any) -> Any:
        return self.dispatcher(*args)

    def __repr__(self) -> str:
        return f"<compiled kernel {self.function.__module__}.{self.function.__qualname__}>"


def target_features() -> str:
    """The LLVM features of numba's target machine (``+avx2,+fma,...``: what compiled
    kernels are built for; loads numba)."""
    load_numba()
    from numba.core.registry import cpu_target

    return str(cpu_target.target_context.codegen()._tm_features)


@functools.cache
def target_flags() -> frozenset[str]:
    """The names of the features numba's target machine has (``avx2``, ``fma``, ``avx512f``,
    ...: :func:`target_features` without the signs); empty where numba does not load."""
    try:
        features = target_features()
    except ImportError:
        return frozenset()
    return frozenset(flag[1:] for flag in features.split(",") if flag.startswith("+"))


class CompiledIntrinsic:
    """A numba intrinsic (LLVM code a compiled kernel inlines) built by ``build(numba)`` when
    a kernel calling it is first compiled, so that defining one imports no numba. Only
    compiled kernels call it."""

    def __init__(self, build: Callable[[ModuleType], Any], name: str) -> None:
        self.build, self.name = build, name

    @functools.cached_property
    def dispatcher(self) -> Any:
        """numba's intrinsic (imports numba on first access)."""
        return self.build(load_numba())

    def __repr__(self) -> str:
        return f"<compiled intrinsic {self.name}>"


class CompiledConstant:
    """A value compiled kernels read as a constant, ``compute()`` called when the first kernel
    reading it compiles: a value chosen by the processor numba compiles for (a vector width),
    which importing a module must not ask LLVM for. numba's disk cache keys compiled code by
    the processor's name and features, not by the values of globals, so ``compute`` must
    depend on nothing else. Python code reads :attr:`value`."""

    def __init__(self, compute: Callable[[], Any], name: str) -> None:
        self.compute, self.name = compute, name

    @functools.cached_property
    def value(self) -> Any:
        """The value (computed on first access)."""
        return self.compute()

    def __repr__(self) -> str:
        return f"<compiled constant {self.name}>"


#: The LLVM function attribute :func:`wide_vectors` sets: LLVM's x86 back end otherwise keeps
#: vectorized loops to 256-bit vectors on processors with AVX-512 (Ice Lake's tuning), half
#: the lanes onnxruntime's float32 kernels use; on processors without 512-bit vectors it
#: changes nothing (docs/elementwise.md measures it).
WIDE_VECTORS = '"prefer-vector-width"="512"'


@functools.cache
def _build_wide_vectors(numba: ModuleType) -> Any:
    """The intrinsic marking the calling kernel's LLVM function with :data:`WIDE_VECTORS`."""
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def wide_vectors(typingctx: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            # llvmlite's attribute set accepts only LLVM's keyword attributes: a string
            # attribute goes into the underlying set, which llvmlite prints as it is.
            set.add(builder.function.attributes, WIDE_VECTORS)
            return context.get_dummy_value()
        return types.none(), codegen

    return wide_vectors


#: Called first in a compiled kernel, lets LLVM vectorize its loops with 512-bit vectors
#: where the processor has them (the values are those of narrower vectors: each lane computes
#: the same operations; only a reduction that a kernel lets LLVM reassociate adds in another
#: order).
wide_vectors = CompiledIntrinsic(_build_wide_vectors, "wide_vectors")


@functools.cache
def _build_fused_multiply_add(numba: ModuleType) -> Any:
    """The intrinsic ``fused_multiply_add(x, y, z)``: ``x * y + z`` of one float type rounded
    once (LLVM's ``llvm.fma``: one instruction with FMA, exact in software without it)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def fused_multiply_add(typingctx: Any, x: Any, y: Any, z: Any) -> Any:
        if not (isinstance(x, types.Float) and x == y == z):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            value = context.get_value_type(signature.return_type)
            name = "llvm.fma.f32" if value == ir.FloatType() else "llvm.fma.f64"
            function = cgutils.get_or_insert_function(builder.module,
                                                      ir.FunctionType(value, [value] * 3), name)
            return builder.call(function, list(args))

        return x(x, y, z), codegen

    return fused_multiply_add


#: ``x * y + z`` rounded once, in a compiled kernel (the three of one float type): the
#: arithmetic of kernels that match another library's FMA instructions bit for bit; LLVM
#: vectorizes it like any other operation.
fused_multiply_add = CompiledIntrinsic(_build_fused_multiply_add, "fused_multiply_add")


@functools.cache
def vector_bytes() -> int:
    """The width of the host's widest vector registers that LLVM may use, in bytes: 64 with
    AVX-512F, 32 with AVX (the kernels that write explicit vectors size them by it; another
    processor compiles anew, numba's cache being keyed by the processor's features). The
    features are numba's target machine's (:func:`target_features`), which a generic target
    (``NUMBA_CPU_NAME=generic``) narrows below the host's."""
    flags = target_flags()
    return 64 if "avx512f" in flags else 32 if "avx" in flags else 16


@functools.cache
def _build_vector_lanes(numba: ModuleType) -> Any:
    """The intrinsic ``vector_lanes(array)``: how many of the array's elements one vector of
    :func:`vector_bytes` holds, a constant of the compiled code."""
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def vector_lanes(typingctx: Any, array: Any) -> Any:
        if not isinstance(array, types.Array):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            size = context.get_abi_sizeof(context.get_value_type(signature.args[0].dtype))
            return ir.Constant(ir.IntType(64), max(1, vector_bytes() // size))

        return types.uintp(array), codegen

    return vector_lanes


#: The number of an array's elements in one host vector (:func:`vector_bytes`), in a compiled
#: kernel: the one code path of explicit-vector kernels for every vector width.
vector_lanes = CompiledIntrinsic(_build_vector_lanes, "vector_lanes")


def close_sum_loop(builder: Any, counter: Any, limit: Any, sums: list[Any], updated: list[Any],
                   initial: list[Any], entry: Any, loop: Any, done: Any) -> list[Any]:
    """Closes a counted loop of accumulators written in LLVM IR (an intrinsic's codegen): the
    counter's next value and the accumulators' back edges (``sums`` are their phis,
    ``updated`` this iteration's values), the branch back to ``loop`` while the next value
    is below ``limit``, then, in ``done``, each accumulator's value after the loop (its
    ``initial`` value when the loop was entered from ``entry``, else the last iteration's)."""
    following = builder.add(counter, counter.type(1))
    body_end = builder.block
    counter.add_incoming(following, body_end)
    for phi, value in zip(sums, updated, strict=True):
        phi.add_incoming(value, body_end)
    builder.cbranch(builder.icmp_signed("<", following, limit), loop, done)
    builder.position_at_end(done)
    totals = []
    for before, value in zip(initial, updated, strict=True):
        phi = builder.phi(value.type)
        phi.add_incoming(before, entry)
        phi.add_incoming(value, body_end)
        totals.append(phi)
    return totals


def prange(*arguments: int) -> range:
    """numba's ``prange`` inside a compiled kernel (a kernel module imports this name instead
    of numba's, so that importing it does not import numba); ``range`` when called from Python."""
    return range(*arguments)


def _calling_dispatchers(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with globals in which other compiled kernels are numba dispatchers.

    numba compiles a call to another compiled kernel only if the name resolves to a
    dispatcher; the module's own globals hold the lazy wrappers. The stand-in
    :func:`prange` becomes numba's own, a :class:`CompiledConstant` its value. The copy keeps
    the code object, so numba's disk cache still finds the function by its file and line.
    """
    names = function.__code__.co_names
    calls = {name: value.dispatcher for name, value in function.__globals__.items()
             if name in names and isinstance(value, CompiledFunction | CompiledIntrinsic)}
    calls.update({name: load_numba().prange for name, value in function.__globals__.items()
                  if name in names and value is prange})
    calls.update({name: value.value for name, value in function.__globals__.items()
                  if name in names and isinstance(value, CompiledConstant)})
    if not calls:
        return function
    copy = types.FunctionType(function.__code__, {**function.__globals__, **calls},
                              function.__name__, function.__defaults__, function.__closure__)
    functools.update_wrapper(copy, function)
    del copy.__wrapped__
    return copy


def compiled(function: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Mark ``function`` as a compiled kernel; ``@compiled`` or ``@compiled(fastmath=True)``."""
    if function is None:
        return lambda f: CompiledFunction(f, options)
    return CompiledFunction(function, options)
