"""IFEC fabric testbed: Python package over the native module ifec._native.

The native module holds thin bindings; conveniences (pcap helpers, plots, defaults) live here. The names below are
loaded on first use, so the pure-Python tools (`python3 -m ifec.gpu_profile`, which needs only PyTorch) run on a
GPU machine where the native module was never built.
"""

import importlib

_NATIVE = ("ECH_PORT", "ROCEV2_PORT", "compute_icrc", "parse_frame", "sample_frames", "write_sample_pcap", "Cluster",
           "IfecCollectives", "IfecError", "OpStatus", "Topology", "fare_plane_gbps", "load_topology",
           "make_deepseek_fabric", "make_fat_tree", "make_superpod", "parse_topology")
_SUBMODULES = ("collectives", "endpoint", "moe", "pcap", "sim")


def _native_module():
    try:
        return importlib.import_module("ifec._native")
    except ImportError as e:
        raise ImportError(f"ifec: the native module ifec._native is not importable ({e}): run ./ifec build and put "
                          "build/python on PYTHONPATH (ifec.gpu_profile runs without it)") from e


def __getattr__(name):
    if name in _NATIVE:
        value = getattr(_native_module(), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"ifec.{name}")
    else:
        raise AttributeError(f"module 'ifec' has no attribute '{name}'")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NATIVE) | set(_SUBMODULES))
