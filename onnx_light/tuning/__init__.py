"""The tuning core (the spec's onnx_core): keys, schemas, processor detection,
profiles, registry generations, the cache file and the public functions.

It imports nothing else of onnx_light, so another kernel library can use it
exactly as ours does.
"""

from .api import (
    apply_kernel_tuning_updates,
    calibrate_kernel_tuning,
    default_kernel_tuning_cache_path,
    export_kernel_tuning_profile,
    inspect_kernel_tuning_cache,
    kernel_tuning_parameters,
    load_kernel_tuning_cache,
    propose_kernel_tuning_updates,
    reset_kernel_tuning_parameters,
    set_kernel_tuning_parameters,
)
from .keys import KernelTuningKey, element_type_code, element_type_name
from .processor import (
    CpuDescriptor,
    CpuExecutionDescriptor,
    detect_cpu,
    effective_thread_count,
    execution_descriptor,
)
from .profiles import (
    ExactProcessor,
    InstructionSet,
    Microarchitecture,
    ProcessorList,
    ProcessorProfile,
)
from .registry import (
    AmbiguousProfileError,
    KernelTuningRegistry,
    PublishedProfile,
    RegistrySnapshot,
    Resolution,
    UnknownKeyError,
    default_registry,
)
from .schema import KernelTuningSchema, Parameter, TuningValidationError

__all__ = [
    "AmbiguousProfileError",
    "CpuDescriptor",
    "CpuExecutionDescriptor",
    "ExactProcessor",
    "InstructionSet",
    "KernelTuningKey",
    "KernelTuningRegistry",
    "KernelTuningSchema",
    "Microarchitecture",
    "Parameter",
    "ProcessorList",
    "ProcessorProfile",
    "PublishedProfile",
    "RegistrySnapshot",
    "Resolution",
    "TuningValidationError",
    "UnknownKeyError",
    "apply_kernel_tuning_updates",
    "calibrate_kernel_tuning",
    "default_kernel_tuning_cache_path",
    "default_registry",
    "detect_cpu",
    "effective_thread_count",
    "element_type_code",
    "element_type_name",
    "execution_descriptor",
    "export_kernel_tuning_profile",
    "inspect_kernel_tuning_cache",
    "kernel_tuning_parameters",
    "load_kernel_tuning_cache",
    "propose_kernel_tuning_updates",
    "reset_kernel_tuning_parameters",
    "set_kernel_tuning_parameters",
]
