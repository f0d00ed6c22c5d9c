"""Another kernel library uses the tuning core as onnx_light's kernels do.

``toylib`` lives here, outside ``onnx_light/kernels/``: one tunable kernel with its own key,
schema and calibration callback, registered in its own :class:`KernelTuningRegistry`. The
tests go through the public tuning API only, with the cache in a temporary folder, and check
that the process-wide registry and the default cache are never touched.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from onnx_light.tuning import (
    KernelTuningKey,
    KernelTuningRegistry,
    KernelTuningSchema,
    Parameter,
    apply_kernel_tuning_updates,
    calibrate_kernel_tuning,
    default_registry,
    execution_descriptor,
    inspect_kernel_tuning_cache,
    kernel_tuning_parameters,
    load_kernel_tuning_cache,
    propose_kernel_tuning_updates,
    reset_kernel_tuning_parameters,
    set_kernel_tuning_parameters,
)
from onnx_light.tuning.cache import CACHE_ENV
from onnx_light.tuning.calibration import CalibrationResult

LIBRARY = "toylib"
BLOCK = "block.elements"
PORTABLE_BLOCK = 1024
CALIBRATED_BLOCK = 256


def toy_key(element_type: str = "float") -> KernelTuningKey:
    return KernelTuningKey(LIBRARY, "ClipUnit", "blocked", element_type)


class ClipUnitKernel:
    """Clips to [0, 1] one block of ``block.elements`` at a time (the tunable value)."""

    def __init__(self, block: int, source: str = "given") -> None:
        self.block, self.source = block, source

    @classmethod
    def configured(cls, registry: KernelTuningRegistry, element_type: str = "float",
                   num_threads: int | None = None) -> ClipUnitKernel:
        """The kernel with the values ``registry`` resolves for this machine."""
        resolution = registry.snapshot().resolve(toy_key(element_type),
                                                 execution_descriptor(num_threads))
        return cls(int(resolution.values[BLOCK]), resolution.source)

    def run(self, x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        for start in range(0, x.size, self.block):
            np.clip(x[start:start + self.block], 0, 1, out=out[start:start + self.block])
        return out


RETURNED: list[CalibrationResult] = []


def calibrate_clip_unit(key, descriptor, budget) -> CalibrationResult:
    """A kernel-specific search with a modelled cost (no timing): checks every candidate's
    output against the unblocked one, keeps the cheapest. Returns a numpy integer, which the
    core normalises in its own copy of the result."""
    x = np.linspace(-1, 2, 4096, dtype=np.float32)
    expected = np.clip(x, 0, 1)
    costs = {}
    for block in (64, CALIBRATED_BLOCK, PORTABLE_BLOCK):
        assert np.array_equal(ClipUnitKernel(block).run(x), expected)
        costs[block] = x.size / block + block / 16  # per-block overhead + cache pressure
    best = min(costs, key=costs.__getitem__)
    result = CalibrationResult(key, {BLOCK: np.int64(best)}, portable_kept=False,
                               diagnostics=[f"{key}: block {best} of {sorted(costs)}"])
    RETURNED.append(result)
    return result


def toy_registry() -> KernelTuningRegistry:
    """toylib's registry: a float key with a callback and a schema-only double key."""
    registry = KernelTuningRegistry()
    schemas = [KernelTuningSchema(toy_key(t), (Parameter(BLOCK, "int", PORTABLE_BLOCK, minimum=1),))
               for t in ("float", "double")]
    registry.register(schemas=schemas, callbacks={toy_key("float"): calibrate_clip_unit})
    return registry


@pytest.fixture
def untouched_default(isolated_tuning: Path):
    """The test must leave the (fresh) default cache absent and the process-wide registry
    at its generation."""
    default_cache = isolated_tuning
    generation = default_registry().generation
    yield
    assert default_registry().generation == generation
    assert not default_cache.exists()
    assert not any(k.library == LIBRARY for k in default_registry().snapshot().schemas)


def test_a_foreign_library_tunes_through_the_public_api(tmp_path: Path, untouched_default) -> None:
    registry = toy_registry()
    cache = tmp_path / "toy-cache.txt"
    options = {"path": cache, "num_threads": 1, "registry": registry}

    records = kernel_tuning_parameters("ClipUnit", **options)
    assert [r["key"] for r in records] == [str(toy_key("float")), str(toy_key("double"))]
    assert [r["calibratable"] for r in records] == [True, False]
    assert all(r["active_values"] == {BLOCK: PORTABLE_BLOCK} for r in records)
    assert ClipUnitKernel.configured(registry, num_threads=1).block == PORTABLE_BLOCK

    proposal = propose_kernel_tuning_updates("ClipUnit", **options)
    assert proposal["missing_calibratable"] == [str(toy_key("float"))]
    assert [m["key"] for m in proposal["missing_schema_only"]] == [str(toy_key("double"))]
    RETURNED.clear()
    applied = apply_kernel_tuning_updates(proposal, path=cache, registry=registry)
    assert applied["failed"] == [] and [r["values"] for r in applied["applied"]] == [
        {BLOCK: CALIBRATED_BLOCK}]
    (returned,) = RETURNED  # the callback's own result is as it returned it
    assert type(returned.values[BLOCK]) is np.int64
    kernel = ClipUnitKernel.configured(registry, num_threads=1)
    assert (kernel.block, kernel.source) == (CALIBRATED_BLOCK, "published_profile")
    assert str(toy_key("float")) in cache.read_text()

    manual = set_kernel_tuning_parameters("ClipUnit", "double", {BLOCK: 512}, **options)
    assert manual["previous"] == {BLOCK: PORTABLE_BLOCK} and manual["values"] == {BLOCK: 512}
    assert ClipUnitKernel.configured(registry, "double", num_threads=1).block == 512

    # A new process of toylib: a fresh registry loads both profiles from the cache.
    reloaded = toy_registry()
    report = load_kernel_tuning_cache(cache, num_threads=1, registry=reloaded)
    assert report["loaded"] == 2 and report["status"] == "ok"
    assert inspect_kernel_tuning_cache(cache, num_threads=1, registry=reloaded)["counts"] == {
        "loaded": 2}
    assert ClipUnitKernel.configured(reloaded, num_threads=1).block == CALIBRATED_BLOCK

    reset = reset_kernel_tuning_parameters("ClipUnit", **options)
    assert reset["cache_update"]["removed"] == 2
    assert ClipUnitKernel.configured(registry, num_threads=1).block == PORTABLE_BLOCK
    assert ClipUnitKernel.configured(reloaded, num_threads=1).block == CALIBRATED_BLOCK  # its own registry


def test_calibrate_publishes_in_the_given_registry_only(tmp_path: Path, untouched_default) -> None:
    registry = toy_registry()
    before = registry.generation
    report = calibrate_kernel_tuning("ClipUnit", num_threads=1, path=tmp_path / "c.txt",
                                     registry=registry)
    assert [r["values"] for r in report["calibrated"]] == [{BLOCK: CALIBRATED_BLOCK}]
    assert report["unsupported"] == [str(toy_key("double"))]
    assert report["generation"] == registry.generation == before + 1


def test_the_default_registry_does_not_know_the_foreign_library(untouched_default) -> None:
    with pytest.raises(KeyError, match="unknown kernel ClipUnit"):
        kernel_tuning_parameters("ClipUnit", library=LIBRARY)


def test_without_library_a_kernel_of_two_libraries_is_ambiguous(tmp_path: Path,
                                                                 untouched_default) -> None:
    """``library=None`` selects every library's matching keys; a single-key function then
    asks for ``library=`` instead of picking one."""
    registry = toy_registry()
    other = KernelTuningKey("otherlib", "ClipUnit", "blocked", "float")
    registry.register(schemas=[KernelTuningSchema(other, (Parameter(BLOCK, "int", 8),))])
    options = {"path": tmp_path / "c.txt", "num_threads": 1, "registry": registry}
    assert len(kernel_tuning_parameters("ClipUnit", "float", **options)) == 2
    with pytest.raises(ValueError, match="pass library="):
        set_kernel_tuning_parameters("ClipUnit", "float", {BLOCK: 4}, **options)
    done = set_kernel_tuning_parameters("ClipUnit", "float", {BLOCK: 4}, library="otherlib",
                                        **options)
    assert done["key"] == str(other)
    assert not os.path.exists(os.environ[CACHE_ENV])


def test_registry_must_be_a_registry(untouched_default) -> None:
    with pytest.raises(TypeError, match="registry must be a KernelTuningRegistry, got dict"):
        kernel_tuning_parameters(registry={})
