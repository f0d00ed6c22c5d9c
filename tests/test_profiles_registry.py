"""Tests for processor profiles (profiles.py) and the registry (registry.py).

Every processor here is synthetic (``tuning_helpers.cpu``); nothing depends on the host.
"""

from __future__ import annotations

import json
import random
import sys
import threading

import pytest
from tuning_helpers import (
    CPU_NAMES,
    MIN_ELEMENTS,
    cpu,
    descriptor,
    fresh_registry,
    key,
    simple_schema,
)

from onnx_light.kernels import elementwise, gemm
from onnx_light.kernels import register as register_builtin
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.profiles import (
    SOURCES,
    ExactProcessor,
    InstructionSet,
    Match,
    Microarchitecture,
    ProcessorList,
    ProcessorProfile,
    profile_from_dict,
    selector_from_dict,
)
from onnx_light.tuning.registry import (
    AmbiguousProfileError,
    KernelTuningRegistry,
    PublishedProfile,
    UnknownKeyError,
)
from onnx_light.tuning.schema import KernelTuningSchema, Parameter

K = key()
ICELAKE = ExactProcessor("intel", 6, 106)
ZEN3 = ExactProcessor("amd", 25, 1)
AVX2 = InstructionSet(frozenset({"avx2"}))
AVX512 = InstructionSet(frozenset({"avx512f"}))


def profile(selector, value: int, k: KernelTuningKey = K, **kwargs) -> ProcessorProfile:
    return ProcessorProfile(k, selector, {MIN_ELEMENTS: value}, **kwargs)


def registry_with(*profiles: ProcessorProfile, keys=(K,)) -> KernelTuningRegistry:
    return fresh_registry([simple_schema(k) for k in keys], profiles=profiles)


def resolved(registry: KernelTuningRegistry, cpu_name: str, threads: int = 8, k=K, **changes):
    resolution = registry.snapshot().resolve(k, descriptor(cpu_name, threads, **changes))
    return resolution.source, resolution.values[MIN_ELEMENTS]


# --------------------------------------------------------------------------------------------
# Schemas in the registry
# --------------------------------------------------------------------------------------------


def test_register_returns_the_new_generation_and_lists_keys() -> None:
    registry = KernelTuningRegistry()
    assert registry.generation == 0
    b, a = key("Sub"), key("Add")
    assert registry.register([simple_schema(b), simple_schema(a)]) == 1
    assert registry.generation == 1
    assert registry.snapshot().keys() == (a, b)
    assert registry.snapshot().schema(a).key == a


def test_unknown_key_is_a_key_error_naming_registered_keys_of_that_kernel() -> None:
    registry = registry_with()
    with pytest.raises(KeyError) as info:
        registry.snapshot().schema(key(element_type="double"))
    assert isinstance(info.value, UnknownKeyError)
    assert "testlib/Add/portable[double]@cpu#1" in str(info.value)
    assert str(K) in str(info.value)  # the hint lists what exists for Add
    with pytest.raises(UnknownKeyError):
        registry.snapshot().resolve(key("Nope"), descriptor("zen3"))
    with pytest.raises(UnknownKeyError):
        registry.snapshot().schema("not a key")  # type: ignore[arg-type]


def test_duplicate_schema_in_one_batch_registers_nothing() -> None:
    registry = KernelTuningRegistry()
    other = key("Sub")
    with pytest.raises(ValueError, match="given twice"):
        registry.register([simple_schema(other), simple_schema(K), simple_schema(K, default=5)])
    assert registry.generation == 0
    assert registry.snapshot().keys() == ()


def test_duplicate_schema_across_batches_rejected() -> None:
    registry = registry_with()
    with pytest.raises(ValueError, match=r"already registered for \['testlib/Add/portable\[float\]"):
        registry.register([simple_schema(key("Sub")), simple_schema(K, default=7)])
    assert registry.generation == 1
    assert registry.snapshot().keys() == (K,)
    assert registry.snapshot().schema(K).defaults[MIN_ELEMENTS] == 1000


def test_element_types_implementations_and_abis_are_distinct_schemas() -> None:
    variants = {
        K: 10,
        key(element_type="double"): 20,
        key(element_type="bfloat16"): 30,
        key(implementation="blocked"): 40,
        key(tuning_abi=2): 50,
    }
    registry = KernelTuningRegistry()
    registry.register([simple_schema(k, default=v) for k, v in variants.items()])
    snapshot = registry.snapshot()
    assert len(snapshot.keys()) == 5
    cpu = descriptor("zen3")
    for k, v in variants.items():
        assert snapshot.resolve(k, cpu).values[MIN_ELEMENTS] == v
    # and profiles for one of them do not leak into the others
    registry.register(profiles=[profile(ZEN3, 99, key(element_type="double"))])
    snapshot = registry.snapshot()
    assert snapshot.resolve(key(element_type="double"), cpu).values[MIN_ELEMENTS] == 99
    assert snapshot.resolve(K, cpu).values[MIN_ELEMENTS] == 10
    assert snapshot.resolve(key(tuning_abi=2), cpu).values[MIN_ELEMENTS] == 50


def test_same_selector_on_different_keys_is_not_ambiguous() -> None:
    other = key(element_type="double")
    registry = registry_with(profile(ZEN3, 5), profile(ZEN3, 6, other), keys=(K, other))
    assert resolved(registry, "zen3") == ("exact_processor_profile", 5)
    assert resolved(registry, "zen3", k=other) == ("exact_processor_profile", 6)


# --------------------------------------------------------------------------------------------
# All-or-nothing batches and callbacks
# --------------------------------------------------------------------------------------------


def _noop_callback(*args, **kwargs) -> None:
    return None


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"profiles": [profile(ZEN3, 5, key("Unregistered"))]}, UnknownKeyError),
        ({"profiles": [ProcessorProfile(K, ZEN3, {MIN_ELEMENTS: 0})]}, ValueError),
        ({"profiles": [ProcessorProfile(K, ZEN3, {"nope": 1})]}, KeyError),
        ({"profiles": [ProcessorProfile(K, ZEN3, {MIN_ELEMENTS: "5"})]}, TypeError),
        ({"profiles": [profile(ICELAKE, 1), profile(ICELAKE, 2)]}, AmbiguousProfileError),
        ({"profiles": ["not a profile"]}, TypeError),
        ({"callbacks": {K: "not callable"}}, TypeError),
        ({"callbacks": {key("Unregistered"): _noop_callback}}, UnknownKeyError),
    ],
)
def test_a_bad_item_in_a_batch_registers_nothing(bad: dict, error: type) -> None:
    registry = KernelTuningRegistry()
    registry.register([simple_schema(key("Old"))])
    before = registry.snapshot()
    batch = {"schemas": [simple_schema(K)], "profiles": [profile(AVX2, 7)],
             "callbacks": {key("Old"): _noop_callback}}
    for name, items in bad.items():
        if name == "callbacks":
            batch[name] = {**batch[name], **items}
        else:
            batch[name] = [*batch[name], *items]
    with pytest.raises(error):
        registry.register(**batch)
    assert registry.snapshot() is before
    assert registry.generation == 1
    assert registry.snapshot().keys() == (key("Old"),)
    assert registry.snapshot().callback(key("Old")) is None
    assert registry.snapshot().profiles == {}


def test_callbacks_need_a_schema_and_schema_only_keys_have_none() -> None:
    registry = KernelTuningRegistry()
    calibrated, manual = key("Abs"), key("Gemm")
    registry.register([simple_schema(calibrated), simple_schema(manual)],
                      callbacks={calibrated: _noop_callback})
    snapshot = registry.snapshot()
    assert snapshot.callback(calibrated) is _noop_callback
    assert snapshot.callback(manual) is None
    with pytest.raises(UnknownKeyError):
        snapshot.callback(key("Missing"))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(callbacks={calibrated: _noop_callback})
    # a later batch may add a callback to an existing schema-only key
    registry.register(callbacks={manual: _noop_callback})
    assert registry.snapshot().callback(manual) is _noop_callback


def test_callback_may_come_with_its_schema_in_the_same_batch() -> None:
    registry = KernelTuningRegistry()
    registry.register([simple_schema(K)], callbacks={K: _noop_callback})
    assert registry.snapshot().callback(K) is _noop_callback


def test_profiles_may_be_registered_after_their_schema() -> None:
    registry = registry_with()
    registry.register(profiles=[profile(ZEN3, 3)])
    assert resolved(registry, "zen3") == ("exact_processor_profile", 3)


def test_profile_values_are_validated_and_completed_with_defaults() -> None:
    k = key("Gemm")
    schema = KernelTuningSchema(k, (Parameter("threshold", "int", 100, minimum=1),
                                    Parameter("mode", "str", "blas", choices=("blas", "rows")),
                                    Parameter("block", "int", 1, minimum=1)))
    registry = fresh_registry([schema], profiles=[ProcessorProfile(k, ZEN3, {"mode": "rows"})])
    values = registry.snapshot().resolve(k, descriptor("zen3")).values
    assert dict(values) == {"threshold": 100, "mode": "rows", "block": 1}
    with pytest.raises(ValueError, match="not one of"):
        registry.register(profiles=[ProcessorProfile(k, ICELAKE, {"mode": "columns"})])
    assert registry.generation == 1


# --------------------------------------------------------------------------------------------
# Resolution precedence
# --------------------------------------------------------------------------------------------


def test_sources_are_exactly_the_documented_strings() -> None:
    assert SOURCES == ("published_profile", "exact_processor_profile", "processor_list_profile",
                       "microarchitecture_profile", "instruction_set_profile", "portable_default")


def test_published_wins_over_exact_processor() -> None:
    registry = registry_with(profile(ICELAKE, 10, priority=100))
    here = descriptor("icelake", 8)
    registry.publish([PublishedProfile(K, here, {MIN_ELEMENTS: 1})])
    assert resolved(registry, "icelake", 8) == ("published_profile", 1)
    # only for the exact descriptor: another thread count or another stepping falls back
    assert resolved(registry, "icelake", 16) == ("exact_processor_profile", 10)
    assert resolved(registry, "icelake", 8, stepping=2) == ("exact_processor_profile", 10)


def test_exact_processor_wins_over_processor_list() -> None:
    registry = registry_with(profile(ProcessorList("intel", 6, frozenset({85, 106})), 20, priority=5),
                             profile(ICELAKE, 10))
    assert resolved(registry, "icelake") == ("exact_processor_profile", 10)
    assert resolved(registry, "skylake_avx512") == ("processor_list_profile", 20)


def test_exact_processor_wins_over_microarchitecture() -> None:
    registry = registry_with(profile(Microarchitecture("icelake"), 30, priority=5),
                             profile(ICELAKE, 10))
    assert resolved(registry, "icelake") == ("exact_processor_profile", 10)
    assert resolved(registry, "sapphirerapids") == ("microarchitecture_profile", 30)


def test_processor_list_wins_over_instruction_set() -> None:
    registry = registry_with(profile(InstructionSet(frozenset({"avx512f", "avx512bw"})), 40,
                                     priority=100),
                             profile(ProcessorList("amd", 25, frozenset({1, 17})), 20))
    assert resolved(registry, "zen4") == ("processor_list_profile", 20)
    assert resolved(registry, "icelake") == ("instruction_set_profile", 40)


def test_microarchitecture_wins_over_instruction_set() -> None:
    # a higher-priority ISA profile still loses to a microarchitecture profile
    registry = registry_with(profile(AVX2, 40, priority=1000),
                             profile(Microarchitecture("haswell"), 30, priority=-5))
    assert resolved(registry, "skylake") == ("microarchitecture_profile", 30)
    assert resolved(registry, "zen3") == ("instruction_set_profile", 40)


def test_instruction_set_wins_over_portable_default() -> None:
    registry = registry_with(profile(InstructionSet(frozenset({"sve"})), 40))
    assert resolved(registry, "neoverse_v1") == ("instruction_set_profile", 40)
    assert resolved(registry, "m1") == ("portable_default", 1000)


def test_higher_priority_exact_profile_cannot_be_beaten_by_less_specific_ones() -> None:
    registry = registry_with(profile(ICELAKE, 10, priority=-100),
                             profile(Microarchitecture("cascadelake"), 30, priority=100),
                             profile(ProcessorList("intel", 6, frozenset({106})), 20, priority=101),
                             profile(AVX512, 40, priority=100))
    assert resolved(registry, "icelake") == ("exact_processor_profile", 10)


def test_portable_default_when_nothing_matches() -> None:
    registry = registry_with(profile(ICELAKE, 10), profile(Microarchitecture("zen4"), 30),
                             profile(AVX512, 40))
    resolution = registry.snapshot().resolve(K, descriptor("zen3"))
    assert resolution.source == "portable_default"
    assert dict(resolution.values) == {MIN_ELEMENTS: 1000}
    assert resolution.profile is None


def test_resolution_carries_the_generation_and_the_profile() -> None:
    winner = profile(ZEN3, 5)
    registry = registry_with(winner)
    registry.register([simple_schema(key("Other"))])
    resolution = registry.snapshot().resolve(K, descriptor("zen3"))
    assert resolution.generation == registry.generation == 2
    assert resolution.profile == winner
    assert resolution.key == K
    assert json.loads(json.dumps(resolution.to_dict())) == {
        "key": str(K), "values": {MIN_ELEMENTS: 5}, "source": "exact_processor_profile",
        "generation": 2}


# --------------------------------------------------------------------------------------------
# Priority and ambiguity
# --------------------------------------------------------------------------------------------


def test_priority_breaks_ties_at_equal_specificity() -> None:
    registry = registry_with(profile(ICELAKE, 1), profile(ICELAKE, 2, priority=1),
                             profile(AVX2, 3, priority=2), profile(AVX512, 4, priority=1))
    assert resolved(registry, "icelake") == ("exact_processor_profile", 2)
    assert resolved(registry, "skylake_avx512") == ("instruction_set_profile", 3)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(profile(ICELAKE, 1), profile(ICELAKE, 2), id="same exact processor"),
        pytest.param(profile(ExactProcessor("Intel", 6, 106), 1), profile(ICELAKE, 2),
                     id="vendor case"),
        pytest.param(profile(ICELAKE, 1), profile(ICELAKE, 1), id="same profile twice"),
        pytest.param(profile(ProcessorList("intel", 6, frozenset({85, 106})), 1),
                     profile(ProcessorList("intel", 6, frozenset({106, 143})), 2),
                     id="overlapping processor lists"),
        pytest.param(profile(AVX2, 1), profile(AVX512, 2), id="isa with equal feature counts"),
        pytest.param(profile(InstructionSet(frozenset({"avx2", "fma"})), 1),
                     profile(InstructionSet(frozenset({"avx512f", "avx512bw"}),
                                            frozenset({"neon"})), 2),
                     id="isa exclusion that does not separate"),
        pytest.param(profile(Microarchitecture("cascadelake"), 1),
                     profile(Microarchitecture("cannonlake"), 2),
                     id="common descendant icelake at equal distance"),
        pytest.param(profile(Microarchitecture("haswell"), 1),
                     profile(Microarchitecture("haswell", include_descendants=False), 2),
                     id="same microarchitecture"),
        pytest.param(profile(ProcessorList("intel", 6, frozenset({106})), 1),
                     profile(Microarchitecture("icelake"), 2),
                     id="processor list and microarchitecture of one vendor"),
        pytest.param(profile(ProcessorList("amd", 25, frozenset({1})), 1),
                     profile(Microarchitecture("x86_64_v3"), 2),
                     id="processor list and generic microarchitecture"),
        pytest.param(profile(ICELAKE, 1, threads=(1, 8)), profile(ICELAKE, 2, threads=(8, 16)),
                     id="thread ranges sharing 8"),
        pytest.param(profile(ICELAKE, 1), profile(ICELAKE, 2, threads=(4, 4)),
                     id="any thread count overlaps a range"),
    ],
)
def test_ambiguous_profiles_rejected(first: ProcessorProfile, second: ProcessorProfile) -> None:
    registry = registry_with(first)
    before = registry.snapshot()
    with pytest.raises(AmbiguousProfileError, match="could tie") as info:
        registry.register(profiles=[second])
    assert isinstance(info.value, ValueError)
    assert str(K) in str(info.value)
    assert registry.snapshot() is before
    # in one batch as well
    with pytest.raises(AmbiguousProfileError):
        registry_with(first, second)
    # and a different priority settles it
    distinct = ProcessorProfile(second.key, second.selector, second.values, second.threads,
                                priority=second.priority + 1)
    registry.register(profiles=[distinct])
    assert registry.generation == before.generation + 1


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(profile(ICELAKE, 1), profile(ExactProcessor("intel", 6, 85), 2),
                     id="different exact processors"),
        pytest.param(profile(ProcessorList("intel", 6, frozenset({85})), 1),
                     profile(ProcessorList("intel", 6, frozenset({106, 143})), 2),
                     id="disjoint processor lists"),
        pytest.param(profile(ProcessorList("intel", 6, frozenset({85})), 1),
                     profile(ProcessorList("amd", 6, frozenset({85})), 2),
                     id="lists of different vendors"),
        pytest.param(profile(AVX2, 1), profile(InstructionSet(frozenset({"avx512f", "avx512bw"})), 2),
                     id="isa with different feature counts"),
        pytest.param(profile(InstructionSet(frozenset({"avx2"}), frozenset({"avx512f"})), 1),
                     profile(AVX512, 2), id="isa separated by an excluded feature"),
        pytest.param(profile(Microarchitecture("haswell"), 1), profile(Microarchitecture("skylake"), 2),
                     id="ancestor and descendant"),
        pytest.param(profile(Microarchitecture("cascadelake"), 1),
                     profile(Microarchitecture("cannonlake", include_descendants=False), 2),
                     id="descendants excluded on one side"),
        pytest.param(profile(Microarchitecture("zen3"), 1), profile(Microarchitecture("icelake"), 2),
                     id="unrelated microarchitectures"),
        pytest.param(profile(ProcessorList("amd", 25, frozenset({1})), 1),
                     profile(Microarchitecture("icelake"), 2),
                     id="processor list and microarchitecture of other vendors"),
        pytest.param(profile(ICELAKE, 1, threads=(1, 7)), profile(ICELAKE, 2, threads=(8, 16)),
                     id="disjoint thread ranges"),
        pytest.param(profile(ICELAKE, 1), profile(ProcessorList("intel", 6, frozenset({106})), 2),
                     id="different specificity"),
    ],
)
def test_unambiguous_profiles_accepted(first: ProcessorProfile, second: ProcessorProfile) -> None:
    registry = registry_with(first, second)
    assert registry.generation == 1
    assert len(registry.snapshot().profiles[K]) == 2


def test_common_descendant_check_covers_cascadelake_and_cannonlake_with_priorities() -> None:
    registry = registry_with(profile(Microarchitecture("cascadelake"), 1),
                             profile(Microarchitecture("cannonlake"), 2, priority=1))
    assert resolved(registry, "icelake") == ("microarchitecture_profile", 2)
    assert resolved(registry, "cascadelake") == ("microarchitecture_profile", 1)


def test_isa_profiles_separated_by_exclusion_resolve_to_each_side() -> None:
    registry = registry_with(profile(InstructionSet(frozenset({"avx2"}), frozenset({"avx512f"})), 1),
                             profile(AVX512, 2))
    assert resolved(registry, "zen3") == ("instruction_set_profile", 1)
    assert resolved(registry, "icelake") == ("instruction_set_profile", 2)
    assert resolved(registry, "neoverse_v1") == ("portable_default", 1000)


def test_more_required_features_rank_higher() -> None:
    registry = registry_with(profile(AVX2, 1, priority=9),
                             profile(InstructionSet(frozenset({"avx2", "fma"})), 2))
    assert resolved(registry, "haswell") == ("instruction_set_profile", 2)
    assert resolved(registry, "haswell", features=frozenset({"avx2"})) == ("instruction_set_profile", 1)


# --------------------------------------------------------------------------------------------
# Microarchitecture profiles and thread ranges
# --------------------------------------------------------------------------------------------


def test_microarchitecture_profile_applies_to_descendants_and_nearer_ancestors_win() -> None:
    registry = registry_with(profile(Microarchitecture("haswell"), 1))
    assert resolved(registry, "skylake") == ("microarchitecture_profile", 1)
    assert resolved(registry, "icelake") == ("microarchitecture_profile", 1)
    assert resolved(registry, "zen3") == ("portable_default", 1000)
    registry.register(profiles=[profile(Microarchitecture("skylake"), 2)])
    assert resolved(registry, "skylake") == ("microarchitecture_profile", 2)
    assert resolved(registry, "icelake") == ("microarchitecture_profile", 2)
    assert resolved(registry, "haswell") == ("microarchitecture_profile", 1)
    assert resolved(registry, "broadwell") == ("microarchitecture_profile", 1)  # skylake's parent


def test_nearer_ancestor_wins_even_with_lower_priority() -> None:
    registry = registry_with(profile(Microarchitecture("zen2"), 1, priority=50),
                             profile(Microarchitecture("zen3"), 2, priority=-50))
    assert resolved(registry, "zen4") == ("microarchitecture_profile", 2)
    assert resolved(registry, "zen3") == ("microarchitecture_profile", 2)
    assert resolved(registry, "zen2") == ("microarchitecture_profile", 1)


def test_exact_microarchitecture_ranks_above_a_descendant_match() -> None:
    registry = registry_with(profile(Microarchitecture("skylake_avx512"), 1, priority=10),
                             profile(Microarchitecture("cascadelake", include_descendants=False), 2))
    assert resolved(registry, "cascadelake") == ("microarchitecture_profile", 2)
    assert resolved(registry, "icelake") == ("microarchitecture_profile", 1)


def test_include_descendants_false_applies_only_to_the_target_itself() -> None:
    registry = registry_with(profile(Microarchitecture("haswell", include_descendants=False), 1))
    assert resolved(registry, "haswell") == ("microarchitecture_profile", 1)
    assert resolved(registry, "skylake") == ("portable_default", 1000)
    assert resolved(registry, "broadwell") == ("portable_default", 1000)


def test_arm_and_apple_microarchitectures() -> None:
    registry = registry_with(profile(Microarchitecture("neoverse_n1"), 1),
                             profile(Microarchitecture("m1"), 2))
    assert resolved(registry, "neoverse_v1") == ("microarchitecture_profile", 1)
    assert resolved(registry, "m1") == ("microarchitecture_profile", 2)
    assert resolved(registry, "zen3") == ("portable_default", 1000)


def test_unknown_processor_microarchitecture_matches_nothing_specific() -> None:
    registry = registry_with(profile(Microarchitecture("x86_64"), 1))
    assert resolved(registry, "zen3") == ("microarchitecture_profile", 1)
    assert resolved(registry, "zen3", microarchitecture="unknown") == ("portable_default", 1000)


def test_thread_ranges_select_profiles() -> None:
    registry = registry_with(profile(ZEN3, 1, threads=(1, 4)), profile(ZEN3, 2, threads=(5, 64)),
                             profile(Microarchitecture("zen3"), 3))
    assert resolved(registry, "zen3", 1) == ("exact_processor_profile", 1)
    assert resolved(registry, "zen3", 4) == ("exact_processor_profile", 1)
    assert resolved(registry, "zen3", 5) == ("exact_processor_profile", 2)
    assert resolved(registry, "zen3", 64) == ("exact_processor_profile", 2)
    assert resolved(registry, "zen3", 65) == ("microarchitecture_profile", 3)


# --------------------------------------------------------------------------------------------
# Selector and profile construction
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: ExactProcessor("", 6, 106), ValueError),
        (lambda: ExactProcessor("intel", -1, 106), ValueError),
        (lambda: ExactProcessor("intel", 6, True), ValueError),
        (lambda: ExactProcessor("intel", None, 106), ValueError),
        (lambda: ProcessorList("intel", 6, frozenset()), ValueError),
        (lambda: ProcessorList("intel", 6, frozenset({1, -2})), ValueError),
        (lambda: Microarchitecture("not_a_target"), ValueError),
        (lambda: InstructionSet("avx2"), TypeError),
        (lambda: InstructionSet(frozenset()), ValueError),
        (lambda: InstructionSet(frozenset({"avx2"}), frozenset({"avx2"})), ValueError),
        (lambda: profile(ZEN3, 1, threads=(0, 4)), ValueError),
        (lambda: profile(ZEN3, 1, threads=(5, 4)), ValueError),
        (lambda: profile(ZEN3, 1, threads=(True, 4)), ValueError),
        (lambda: profile(ZEN3, 1, threads=("1", 4)), ValueError),
        (lambda: profile(ZEN3, 1, priority=True), TypeError),
        (lambda: profile(ZEN3, 1, priority=1.5), TypeError),
        (lambda: ProcessorProfile("key", ZEN3, {}), TypeError),
        (lambda: ProcessorProfile(K, "zen3", {}), TypeError),
    ],
)
def test_selector_and_profile_validation(build, error: type) -> None:
    with pytest.raises(error):
        build()


def test_vendor_is_normalised_to_lower_case() -> None:
    assert ExactProcessor("Intel", 6, 106) == ICELAKE
    assert ProcessorList("AMD", 25, frozenset({1})).vendor == "amd"


@pytest.mark.parametrize(
    "selector",
    [ICELAKE, ProcessorList("amd", 25, frozenset({1, 17})), Microarchitecture("zen3"),
     Microarchitecture("haswell", include_descendants=False), AVX2,
     InstructionSet(frozenset({"avx2", "fma"}), frozenset({"avx512f"}))],
)
def test_selector_and_profile_data_round_trip(selector) -> None:
    data = json.loads(json.dumps(selector.to_dict()))
    assert selector_from_dict(data) == selector
    original = profile(selector, 5, threads=(2, 8), priority=3, provenance={"origin": "measured"})
    again = profile_from_dict(json.loads(json.dumps(original.to_dict())), origin="x.json#0")
    assert again == original
    assert again.origin == "x.json#0" and dict(again.provenance) == {"origin": "measured"}


@pytest.mark.parametrize(
    "data",
    [{}, {"cpu": {}}, {"exact_processor": {"vendor": "intel"}},
     {"exact_processor": {"vendor": "intel", "family": 6, "model": 1, "stepping": 2}},
     {"instruction_set": {"required": "avx2"}}, {"microarchitecture": "zen3"},
     {"microarchitecture": {"name": "zen3"}, "instruction_set": {"required": ["avx2"]}}],
)
def test_selector_from_bad_data(data) -> None:
    with pytest.raises(ValueError, match="selector"):
        selector_from_dict(data)


# --------------------------------------------------------------------------------------------
# explain()
# --------------------------------------------------------------------------------------------


def _explained_registry() -> KernelTuningRegistry:
    registry = registry_with(
        profile(ExactProcessor("amd", 25, 1), 1),
        profile(Microarchitecture("haswell"), 2),
        profile(Microarchitecture("skylake"), 3),
        profile(AVX2, 4),
        profile(InstructionSet(frozenset({"sve", "neon"})), 5),
        profile(ExactProcessor("intel", 6, 94), 6, threads=(1, 2)),
    )
    registry.publish([PublishedProfile(K, descriptor("skylake", 4), {MIN_ELEMENTS: 7})])
    return registry


def test_explain_names_the_winner_and_a_reason_for_every_other_candidate() -> None:
    explained = _explained_registry().snapshot().explain(K, descriptor("skylake", 8))
    json.dumps(explained)
    assert explained["source"] == "microarchitecture_profile"
    assert explained["values"] == {MIN_ELEMENTS: 3}
    assert "skylake" in explained["winner"]
    candidates = explained["candidates"]
    assert len(candidates) == 7
    winners = [c for c in candidates if c["applies"]]
    assert [c["profile"] for c in winners] == [explained["winner"]]
    reasons = {c["profile"]: c["reason"] for c in candidates}
    assert all(reasons.values())

    def reason(prefix: str) -> str:
        (found,) = [r for p, r in reasons.items() if p.startswith(prefix)]
        return found

    assert reason("published_profile for intel family 6 model 94") == (
        "descriptor differs in num_threads")
    assert "not amd family 25 model 1" in reason("exact_processor_profile [amd")
    assert "outranked by the winner" in reason("microarchitecture_profile [haswell")
    assert "outranked by the winner" in reason("instruction_set_profile [avx2]")
    assert "lacks neon, sve" in reason("instruction_set_profile [neon+sve]")
    assert "outside the range 1..2" in reason("exact_processor_profile [intel family 6 model 94]")


def test_explain_published_winner_and_portable_default() -> None:
    snapshot = _explained_registry().snapshot()
    explained = snapshot.explain(K, descriptor("skylake", 4))
    assert explained["source"] == "published_profile"
    assert explained["winner"].startswith("published_profile for ")
    assert explained["values"] == {MIN_ELEMENTS: 7}
    assert sum(c["applies"] for c in explained["candidates"]) == 1
    assert next(c for c in explained["candidates"] if c["applies"])["reason"] == "exact descriptor match"
    portable = snapshot.explain(K, descriptor("m1"))
    assert portable["source"] == "portable_default"
    assert portable["winner"] is None
    assert not any(c["applies"] for c in portable["candidates"])


def test_explain_does_not_mention_excluded_descendants_as_matching() -> None:
    registry = registry_with(profile(Microarchitecture("haswell", include_descendants=False), 1))
    explained = registry.snapshot().explain(K, descriptor("skylake"))
    assert explained["candidates"][0]["applies"] is False
    assert "descendants are excluded" in explained["candidates"][0]["reason"]


@pytest.mark.parametrize("cpu_name", CPU_NAMES)
def test_explain_never_raises_and_agrees_with_resolve(cpu_name: str) -> None:
    snapshot = _explained_registry().snapshot()
    odd = [descriptor(cpu_name, threads) for threads in (1, 2, 4, 8, 1024)]
    odd += [descriptor(cpu_name, microarchitecture="unknown", vendor="unknown", family=None,
                       model=None, features=frozenset())]
    for execution in odd:
        explained = snapshot.explain(K, execution)
        json.dumps(explained)
        resolution = snapshot.resolve(K, execution)
        assert explained["source"] == resolution.source
        assert explained["values"] == dict(resolution.values)
        assert all(c["reason"] for c in explained["candidates"])
        assert sum(c["applies"] for c in explained["candidates"]) == (explained["winner"] is not None)


# --------------------------------------------------------------------------------------------
# Generations
# --------------------------------------------------------------------------------------------


def test_every_change_bumps_the_generation_and_failures_do_not() -> None:
    registry = KernelTuningRegistry()
    here = descriptor("zen3")
    steps = [
        lambda: registry.register([simple_schema(K)]),
        lambda: registry.register(profiles=[profile(ZEN3, 5)]),
        lambda: registry.register(callbacks={K: _noop_callback}),
        lambda: registry.publish([PublishedProfile(K, here, {MIN_ELEMENTS: 3})]),
        lambda: registry.publish([PublishedProfile(K, here, {MIN_ELEMENTS: 4})]),
        lambda: registry.forget([K]),
        lambda: registry.forget(),
    ]
    for expected, step in enumerate(steps, start=1):
        assert step() == expected
        assert registry.generation == expected
    failures = [
        (lambda: registry.register([simple_schema(K)]), ValueError),
        (lambda: registry.register(profiles=[profile(ZEN3, 5)]), AmbiguousProfileError),
        (lambda: registry.publish([PublishedProfile(K, here, {MIN_ELEMENTS: 0})]), ValueError),
        (lambda: registry.publish([PublishedProfile(K, here, {})]), ValueError),
        (lambda: registry.publish([PublishedProfile(key("Nope"), here, {MIN_ELEMENTS: 3})]),
         UnknownKeyError),
        (lambda: registry.publish([{"key": K}]), TypeError),
    ]
    for step, error in failures:
        with pytest.raises(error):
            step()
        assert registry.generation == len(steps)


def test_publish_is_all_or_nothing_and_replaces_same_identities() -> None:
    other = key("Sub")
    registry = registry_with(keys=(K, other))
    a, b = descriptor("zen3", 4), descriptor("zen3", 8)
    registry.publish([PublishedProfile(K, a, {MIN_ELEMENTS: 1}),
                      PublishedProfile(K, b, {MIN_ELEMENTS: 2})])
    generation = registry.generation
    with pytest.raises(ValueError):
        registry.publish([PublishedProfile(other, a, {MIN_ELEMENTS: 9}),
                          PublishedProfile(K, a, {MIN_ELEMENTS: -1})])
    assert registry.generation == generation
    assert resolved(registry, "zen3", 4, k=other)[0] == "portable_default"
    assert registry.publish([PublishedProfile(K, a, {MIN_ELEMENTS: 5})]) == generation + 1
    snapshot = registry.snapshot()
    assert len(snapshot.published_profiles()) == 2
    assert resolved(registry, "zen3", 4) == ("published_profile", 5)
    assert resolved(registry, "zen3", 8) == ("published_profile", 2)


def test_published_values_are_validated_copies() -> None:
    import numpy as np

    registry = registry_with()
    values = {MIN_ELEMENTS: np.int64(12)}
    registry.publish([PublishedProfile(K, descriptor("zen3"), values)])
    values[MIN_ELEMENTS] = 99
    stored = registry.snapshot().published_profile(K, descriptor("zen3"))
    assert dict(stored.values) == {MIN_ELEMENTS: 12}
    assert type(stored.values[MIN_ELEMENTS]) is int
    with pytest.raises(TypeError):
        stored.values[MIN_ELEMENTS] = 1  # type: ignore[index]


def test_forget_by_key_and_by_descriptor() -> None:
    other = key("Sub")
    registry = registry_with(keys=(K, other))
    a, b = descriptor("zen3", 4), descriptor("zen3", 8)
    everything = [PublishedProfile(k, d, {MIN_ELEMENTS: 3}) for k in (K, other) for d in (a, b)]
    registry.publish(everything)
    registry.forget([K], a)
    remaining = {(p.key, p.descriptor) for p in registry.snapshot().published_profiles()}
    assert remaining == {(K, b), (other, a), (other, b)}
    registry.forget(descriptor=b)
    assert {(p.key, p.descriptor) for p in registry.snapshot().published_profiles()} == {(other, a)}
    registry.publish(everything)
    registry.forget([other])
    assert {p.key for p in registry.snapshot().published_profiles()} == {K}
    registry.forget()
    assert registry.snapshot().published_profiles() == ()
    assert registry.snapshot().keys() == (K, other)  # schemas stay


def test_a_copy_is_independent_of_its_original() -> None:
    registry = registry_with(profile(ZEN3, 5))
    here = descriptor("zen3")
    registry.publish([PublishedProfile(K, here, {MIN_ELEMENTS: 1})])
    bare, full = registry.copy(published=False), registry.copy()
    assert bare.generation == full.generation == registry.generation
    assert bare.snapshot().published_profiles() == ()
    assert bare.snapshot().resolve(K, here).values == {MIN_ELEMENTS: 5}  # the shipped profile
    assert full.snapshot().resolve(K, here).values == {MIN_ELEMENTS: 1}
    bare.publish([PublishedProfile(K, here, {MIN_ELEMENTS: 2})])
    full.register([simple_schema(key("Sub"))])
    assert registry.snapshot().resolve(K, here).values == {MIN_ELEMENTS: 1}
    assert registry.snapshot().keys() == (K,)
    registry.forget()
    assert bare.snapshot().resolve(K, here).values == {MIN_ELEMENTS: 2}


def test_snapshot_is_unchanged_by_later_publications() -> None:
    registry = registry_with(profile(ZEN3, 5))
    here = descriptor("zen3")
    old = registry.snapshot()
    registry.publish([PublishedProfile(K, here, {MIN_ELEMENTS: 1})])
    registry.register([simple_schema(key("Sub"))], profiles=[profile(AVX2, 9, key("Sub"))])
    registry.publish([PublishedProfile(K, here, {MIN_ELEMENTS: 2})])
    resolution = old.resolve(K, here)
    assert (resolution.source, resolution.values[MIN_ELEMENTS], resolution.generation) == (
        "exact_processor_profile", 5, 1)
    assert old.generation == 1
    assert old.keys() == (K,)
    assert old.published_profiles() == ()
    new = registry.snapshot().resolve(K, here)
    assert (new.source, new.values[MIN_ELEMENTS], new.generation) == ("published_profile", 2, 4)
    with pytest.raises(TypeError):
        old.schemas[key("X")] = None  # type: ignore[index]


def test_concurrent_publish_and_resolve_from_eight_threads() -> None:
    registry = registry_with(profile(Microarchitecture("zen3"), 77))
    base = registry.generation
    rounds, workers = 25, 8
    barrier = threading.Barrier(workers)
    generations: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(index: int) -> None:
        rng = random.Random(index)
        mine = []
        try:
            barrier.wait()
            for step in range(rounds):
                published = PublishedProfile(K, descriptor("zen3", index + 1),
                                             {MIN_ELEMENTS: 1000 * index + step + 1})
                mine.append(registry.publish([published]))
                snapshot = registry.snapshot()
                seen = snapshot.resolve(K, descriptor("zen3", rng.randint(1, workers)))
                assert seen.generation == snapshot.generation
                assert seen.source in ("published_profile", "microarchitecture_profile")
                own = snapshot.resolve(K, descriptor("zen3", index + 1))
                assert own.values[MIN_ELEMENTS] >= 1000 * index + step + 1  # ours or later
        except BaseException as exc:  # reported below
            errors.append(exc)
        generations[index] = mine

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    every = [g for mine in generations.values() for g in mine]
    assert len(every) == rounds * workers
    assert len(set(every)) == len(every)
    assert sorted(every) == list(range(base + 1, base + 1 + rounds * workers))
    for mine in generations.values():
        assert mine == sorted(mine)
    assert registry.generation == base + rounds * workers
    final = registry.snapshot()
    for index in range(workers):
        resolution = final.resolve(K, descriptor("zen3", index + 1))
        assert resolution.values[MIN_ELEMENTS] == 1000 * index + rounds
    assert final.resolve(K, descriptor("zen3", workers + 1)).values[MIN_ELEMENTS] == 77


# --------------------------------------------------------------------------------------------
# The built-in library's registration
# --------------------------------------------------------------------------------------------


def test_builtin_schemas_register_into_a_fresh_registry() -> None:
    registry = KernelTuningRegistry()
    register_builtin(registry)
    keys = registry.snapshot().keys()
    expected = {str(s.key) for s in (*elementwise.tuning_schemas(), *gemm.tuning_schemas())}
    assert expected <= {str(k) for k in keys}
    assert "onnx_light/Add/portable[float]@cpu#1" in expected
    assert "onnx_light/Add/portable[double]@cpu#1" in expected
    assert "onnx_light/Not/portable[bool]@cpu#1" in expected
    assert "onnx_light/Gemm/portable[bfloat16]@cpu#2" in expected
    with pytest.raises(ValueError, match="already registered"):
        register_builtin(registry)
    # every shipped profile resolves to values its schema accepts, on every synthetic processor
    snapshot = registry.snapshot()
    for k in keys:
        for name in CPU_NAMES:
            values = snapshot.resolve(k, descriptor(name)).values
            assert snapshot.schema(k).validate(values) == dict(values)


def test_selectors_answer_with_a_rank_or_a_reason() -> None:
    zen3 = cpu("zen3")
    matched = ZEN3.match(zen3)
    assert matched == Match.ranked(3, 0) and matched.applies and matched.reason == ""
    for selector, reason in [
        (ICELAKE, "processor is amd family 25 model 1, not intel family 6 model 106"),
        (ProcessorList("amd", 25, frozenset({17})), "not in amd family 25 models [17]"),
        (Microarchitecture("zen4"), "microarchitecture zen3 is not zen4 nor descends from it"),
        (Microarchitecture("zen2", include_descendants=False), "descendants are excluded"),
        (AVX512, "processor lacks avx512f"),
    ]:
        refused = selector.match(zen3)
        assert not refused.applies and refused.rank is None and reason in refused.reason
    assert Microarchitecture("zen2").match(zen3) == Match.ranked(2, -1)
    assert AVX2.match(zen3).rank == (1, 1)
    profile = ProcessorProfile(K, ZEN3, {MIN_ELEMENTS: 5}, threads=(2, 4))
    assert profile.match(zen3, 8) == Match.refused("8 threads outside the range 2..4")
    assert profile.match(zen3, 3).applies


@pytest.mark.parametrize(("rank", "reason"), [(None, ""), ((1, 0), "both")])
def test_a_match_has_a_rank_or_a_reason_not_both(rank, reason) -> None:
    with pytest.raises(ValueError, match="either a rank or a reason"):
        Match(rank, reason)
