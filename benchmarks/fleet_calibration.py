"""Wall time of a cluster calibration (onnx_light.fleet.calibrate_cluster) on a local Ray cluster.

Usage: python benchmarks/fleet_calibration.py [--cpus 1,2] [--kernels Add,Abs,...]
       [--element-type float] [--max-duration-ms MS]

Starts a local ``ray.cluster_utils.Cluster`` with one node per ``--cpus`` entry (all on this
machine), calibrates the selected keys on every node into a fresh cache file, and prints a
markdown table: the cluster's start, the calibration's wall time as the caller sees it, and
each node's own calibration time. Needs the ``ray`` extra.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ray
from ray.cluster_utils import Cluster

from onnx_light.fleet import calibrate_cluster
from onnx_light.tuning import default_registry
from onnx_light.tuning.api import select_keys

STORE_BYTES = 80 * 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", default="1,2", help="CPU count of each node (default 1,2)")
    parser.add_argument("--kernels", help="comma-separated kernel names (default: all)")
    parser.add_argument("--element-type", default="float", help="default float")
    parser.add_argument("--max-duration-ms", type=float, help="each node's budget (default 3 s/key)")
    args = parser.parse_args()
    cpus = [int(text) for text in args.cpus.split(",")]
    kernels = args.kernels.split(",") if args.kernels else None
    keys = select_keys(default_registry().snapshot(), kernels, args.element_type)

    started = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": cpus[0], "object_store_memory": STORE_BYTES, "include_dashboard": False})
    for count in cpus[1:]:
        cluster.add_node(num_cpus=count, object_store_memory=STORE_BYTES)
    ray.init(address=cluster.address, log_to_driver=False)
    start_s = time.perf_counter() - started
    try:
        with tempfile.TemporaryDirectory() as folder:
            result = calibrate_cluster(kernels=kernels, element_types=args.element_type,
                                       output=Path(folder) / "merged.txt",
                                       max_duration_ms=args.max_duration_ms)
    finally:
        ray.shutdown()
        cluster.shutdown()
    budget = "3 s per key" if args.max_duration_ms is None else f"{args.max_duration_ms:g} ms"
    print(f"# Cluster calibration, {datetime.date.today()}, {platform.node()}, ray {ray.__version__}\n")
    print(f"{len(keys)} key(s) ({args.element_type}), {len(cpus)} node(s) of {args.cpus} CPUs on this "
          f"machine, budget per node {budget}\n")
    print("| step | wall time (s) | entries | keys failed or skipped |")
    print("|---|---:|---:|---|")
    print(f"| cluster start | {start_s:.2f} | | |")
    print(f"| calibrate_cluster | {result['duration_s']:.2f} | {result['written']} | |")
    for node in result["nodes"]:
        lost = [f"{item['key']} ({item.get('error') or item.get('reason')})"
                for item in node["failed"] + node["skipped"]]
        print(f"| node of {node['cpus']} CPUs: {node['status']} | {node['duration_s']:.2f} "
              f"| {len(node['calibrated'])} | {'; '.join(lost) or '-'} |")


if __name__ == "__main__":
    main()
