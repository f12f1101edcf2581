"""IFEC fabric testbed: Python package over the native module ifec._native.

The native module holds thin bindings; conveniences (pcap helpers, plots, defaults) live here.
"""

from ifec._native import (  # noqa: F401
    ECH_PORT,
    ROCEV2_PORT,
    compute_icrc,
    parse_frame,
    sample_frames,
    write_sample_pcap,
)
from ifec._native import (  # noqa: F401
    Cluster,
    IfecCollectives,
    IfecError,
    OpStatus,
    Topology,
    fare_plane_gbps,
    load_topology,
    make_fat_tree,
    make_superpod,
    parse_topology,
)
from ifec import collectives, endpoint, pcap, sim  # noqa: F401
