"""onnx_light.fleet on a real local Ray cluster: calibration across nodes of different CPU
counts merged into one cache, a node lost during calibration, and batch inference on Ray Data.

All "nodes" of ``ray.cluster_utils.Cluster`` run on this machine, so their processors are
the same and their descriptors differ by thread count (their CPU counts) only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from onnx_light.cli import main  # noqa: E402
from onnx_light.fleet import Predictor, calibrate_cluster  # noqa: E402
from onnx_light.runtime import RuntimeSession  # noqa: E402
from onnx_light.tuning.cache import read_cache  # noqa: E402

# Ray Data warns of its own deprecated settings when it reads its context.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")

NODE_CPUS = (1, 2)  # the head node's, then the worker node's
STORE = 80 * 1024 * 1024
KERNELS = ["Add", "Abs"]
BUDGET_MS = 1000  # per node, for both keys: a small share of a busy machine is enough


@pytest.fixture(scope="module")
def cluster():
    local = Cluster(initialize_head=True, head_node_args={
        "num_cpus": NODE_CPUS[0], "object_store_memory": STORE, "include_dashboard": False})
    for cpus in NODE_CPUS[1:]:
        local.add_node(num_cpus=cpus, object_store_memory=STORE)
    ray.init(address=local.address, log_to_driver=False)
    yield local
    ray.shutdown()
    local.shutdown()


@pytest.fixture(scope="module")
def calibrated(cluster, tmp_path_factory):
    output = tmp_path_factory.mktemp("fleet") / "merged.txt"
    seen = []
    report = calibrate_cluster(kernels=KERNELS, element_types="float", output=output,
                               max_duration_ms=BUDGET_MS, progress=seen.append)
    return output, report, seen


def merged_entries(path: Path) -> list[dict]:
    return [line.record for line in read_cache(path).lines]


def test_every_node_calibrates_at_its_cpu_count_into_one_entry_per_descriptor(calibrated):
    output, report, seen = calibrated
    assert sorted(n["cpus"] for n in report["nodes"]) == sorted(NODE_CPUS)
    assert [n["status"] for n in report["nodes"]] == ["ok"] * len(NODE_CPUS), report["nodes"]
    assert {n["node_id"] for n in seen} == {n["node_id"] for n in report["nodes"]}  # progress
    for node in report["nodes"]:
        assert node["descriptor"]["num_threads"] == node["cpus"]
        assert len(node["calibrated"]) == 2, (node["failed"], node["skipped"])
    entries = merged_entries(output)
    identities = [(e["key"], json.dumps(e["descriptor"], sort_keys=True)) for e in entries]
    assert len(identities) == len(set(identities)) == 2 * len(NODE_CPUS) == report["written"]
    assert {e["descriptor"]["num_threads"] for e in entries} == set(NODE_CPUS)
    assert all(e["provenance"]["origin"] == "calibrated" for e in entries)


def test_calibrating_again_measures_only_what_the_file_lacks(cluster, calibrated):
    output, _, _ = calibrated
    before = output.read_text()
    again = calibrate_cluster(kernels=KERNELS, element_types="float", output=output,
                              max_duration_ms=BUDGET_MS)
    assert again["written"] == 0 and output.read_text() == before
    assert all(len(n["covered"]) == 2 and n["calibrated"] == [] for n in again["nodes"])


def test_a_fresh_process_resolves_each_descriptors_values_from_the_merged_file(calibrated):
    output, _, _ = calibrated
    expected = {(e["key"], e["descriptor"]["num_threads"]): e["values"] for e in merged_entries(output)}
    probe = (
        "import json, sys\n"
        "import onnx_light as ol\n"
        f"KERNELS = {KERNELS!r}\n"
        "found = {}\n"
        "for n in (1, 2, 5):\n"
        "    ol.load_kernel_tuning_cache(sys.argv[1], num_threads=n)\n"
        "    for r in ol.kernel_tuning_parameters(KERNELS, 'float', num_threads=n, path=sys.argv[1]):\n"
        "        found[f\"{r['key']} {n}\"] = [r['cached_values'], r['active_values'], r['active_source']]\n"
        "print(json.dumps(found))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(output)], capture_output=True, text=True,
                          timeout=120, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for (key, threads), values in expected.items():
        cached, active, source = found[f"{key} {threads}"]
        assert cached == values and active == values and source == "published_profile", \
            (key, threads, source)
    for key, _ in expected:  # no node had 5 CPUs: no entry, the portable values
        assert found[f"{key} 5"][0] is None and found[f"{key} 5"][2] != "published_profile"


def small_model() -> bytes:
    bias = numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "B"], ["S"]), helper.make_node("Abs", ["S"], ["Y"])],
        "fleet", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 8])], [bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_the_predictors_thread_count_follows_the_cpus_ray_gives_it(cluster):
    @ray.remote
    def threads_of(model: bytes) -> int:
        return Predictor(model).num_threads

    model = small_model()
    for cpus in (1, 2):
        assert ray.get(threads_of.options(num_cpus=cpus).remote(model)) == cpus
    assert Predictor(model, num_threads=3).num_threads == 3  # an explicit count wins


def test_a_ray_data_pipeline_gives_the_outputs_of_a_local_session(cluster, calibrated):
    output, _, _ = calibrated
    rng = np.random.default_rng(19)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    model = small_model()
    dataset = ray.data.from_items([{"id": i, "X": x[i]} for i in range(len(x))])
    results = dataset.map_batches(Predictor, fn_constructor_kwargs={"model": model, "cache": str(output)},
                                  num_cpus=1, concurrency=2, batch_size=64,
                                  batch_format="numpy").take_all()
    assert len(results) == len(x)
    got = np.stack([row["Y"] for row in sorted(results, key=lambda row: row["id"])])
    expected = RuntimeSession(model).run(None, {"X": x})[0]
    np.testing.assert_array_equal(got, expected)


def documented_example() -> str:
    """The Ray Data example of docs/fleet.md: the Python block of its batch inference section."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "fleet.md").read_text(encoding="utf-8")
    section = text.split("## Batch inference on Ray Data", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_example_runs(cluster, calibrated, tmp_path):
    output, _, _ = calibrated
    (tmp_path / "model.onnx").write_bytes(small_model())
    (tmp_path / "fleet-cache.txt").write_bytes(output.read_bytes())
    env = {**os.environ, "RAY_ADDRESS": cluster.address}
    done = subprocess.run([sys.executable, "-c", documented_example()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1000 rows, columns ['Y', 'id']" in done.stdout  # the inputs are fed, not passed on


def test_the_command_line_calibrates_a_cluster_into_its_output(cluster, tmp_path):
    output = tmp_path / "cli.txt"
    done = subprocess.run(
        [sys.executable, "-m", "onnx_light", "tune-kernels", "--apply", "--ray", cluster.address,
         "--output", str(output), "--kernel", "Abs", "--element-type", "float",
         "--max-duration-ms", str(BUDGET_MS)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(": 1 key(s) calibrated, 0 covered already") == len(NODE_CPUS), done.stderr
    assert f"{len(NODE_CPUS)} node(s), 0 failed or timed out: {len(NODE_CPUS)} entry(ies) merged " \
        f"into {output}" in done.stdout
    assert {e["descriptor"]["num_threads"] for e in merged_entries(output)} == set(NODE_CPUS)


@pytest.mark.parametrize(("argv", "message"), [
    (["--ray", "auto"], "--ray calibrates the nodes of a cluster: it needs --apply"),
    (["--apply", "--output", "x.txt"], "--output names the merged cache of a cluster calibration"),
    (["--apply", "--ray", "auto", "--threads", "2"], "--threads does not apply to --ray"),
])
def test_the_command_line_rejects_options_a_cluster_calibration_does_not_take(argv, message, capsys):
    assert main(["tune-kernels", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def blocked_node(cluster):
    """A third node of 3 CPUs, one of them held, so that a calibration task (which takes all
    three) waits on it: a node that does not answer."""
    node = cluster.add_node(num_cpus=3, object_store_memory=STORE)
    cluster.wait_for_nodes()
    blocker = ray.remote(num_cpus=1)(threading.Event).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote()
    ray.get(blocker.is_set.remote())
    yield node  # the actor lives as long as its handle: until the tests that need it are done
    del blocker


def test_a_node_that_does_not_answer_in_time_is_reported(blocked_node, calibrated, tmp_path):
    output = tmp_path / "merged.txt"
    output.write_bytes(calibrated[0].read_bytes())  # the other nodes have nothing to measure
    outcome = calibrate_cluster(kernels=KERNELS, element_types="float", output=output,
                                max_duration_ms=BUDGET_MS, timeout_s=8)
    by_cpus = {n["cpus"]: n for n in outcome["nodes"]}
    assert by_cpus[3]["status"] == "timed out" and "8 s" in by_cpus[3]["error"], by_cpus[3]
    assert all(by_cpus[c]["status"] == "ok" and len(by_cpus[c]["covered"]) == 2 for c in NODE_CPUS)
    assert outcome["written"] == 0 and output.read_bytes() == calibrated[0].read_bytes()


def test_a_node_lost_during_calibration_is_reported_and_the_others_are_kept(cluster, blocked_node,
                                                                            tmp_path):
    output, finished, outcome = tmp_path / "merged.txt", threading.Semaphore(0), {}

    def calibrate() -> None:
        outcome.update(calibrate_cluster(kernels=KERNELS, element_types="float", output=output,
                                         max_duration_ms=BUDGET_MS, timeout_s=120,
                                         progress=lambda _: finished.release()))

    worker = threading.Thread(target=calibrate)
    worker.start()
    for _ in NODE_CPUS:  # the other nodes are done; the blocked node's task still waits on it
        assert finished.acquire(timeout=120)
    cluster.remove_node(blocked_node)
    worker.join(timeout=150)
    assert not worker.is_alive()
    by_cpus = {n["cpus"]: n for n in outcome["nodes"]}
    assert by_cpus[3]["status"] == "failed" and by_cpus[3]["error"], by_cpus[3]
    assert all(by_cpus[c]["status"] == "ok" for c in NODE_CPUS)
    assert {e["descriptor"]["num_threads"] for e in merged_entries(output)} == set(NODE_CPUS)
    assert outcome["written"] == 2 * len(NODE_CPUS)
