"""The shared crossover search of the tuning core, with simulated clocks (no hardware timing)."""

from __future__ import annotations

import pytest

from onnx_light.tuning import calibration
from onnx_light.tuning.calibration import (
    Budget,
    CalibrationFailure,
    ConfigurationMeasurement,
    configuration_search,
    crossover_search,
    measure_interleaved,
    stable_crossover,
)
from onnx_light.tuning.keys import KernelTuningKey

KEY = KernelTuningKey("test", "Fake", "portable", "float")
PORTABLE = {"parallel.minimum_elements": 65536}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeProblem:
    """Serial costs ``size`` ns; the candidate costs ``overhead + size / speedup`` ns."""

    cases = ("equal", "scalar")

    def __init__(self, clock, overhead_ns=50_000.0, speedup=2.0, wrong_at=None, noise=None,
                 bytes_per_element=12):
        self.clock, self.overhead, self.speedup = clock, overhead_ns, speedup
        self.wrong_at, self.noise, self.bytes = wrong_at, noise, bytes_per_element
        self.made = []
        self.calls = 0

    def input_bytes(self, size, case):
        return size * self.bytes

    def make_inputs(self, size, case):
        self.made.append((size, case))
        return size

    def _jitter(self):
        self.calls += 1
        return 1.0 if self.noise is None else self.noise(self.calls)

    def serial(self, size):
        self.clock.now += size * 1e-9 * self._jitter()
        return ("out", size)

    def candidate(self, size):
        self.clock.now += (self.overhead + size / self.speedup) * 1e-9 * self._jitter()
        return ("wrong", size) if size == self.wrong_at else ("out", size)

    def same_output(self, a, b):
        return a == b


def search(problem, clock, **kwargs):
    budget = kwargs.pop("budget", Budget(max_duration_s=1e6, max_threads=2))
    return crossover_search(KEY, problem, "parallel.minimum_elements", PORTABLE, budget,
                            timer=clock, **kwargs)


def test_crossover_is_where_candidate_wins_from_there_up():
    clock = Clock()
    # candidate wins when size/2 + 50_000 < size / 1.05, i.e. from about 2^17
    result = search(FakeProblem(clock), clock)
    assert result.crossover == 1 << 17
    assert result.values == {"parallel.minimum_elements": 1 << 17}
    assert not result.portable_kept
    sizes = sorted({m.size for m in result.measurements})
    assert sizes == [1 << e for e in range(12, 23)]
    assert {m.case for m in result.measurements} == {"equal", "scalar"}
    assert all(m.candidate_wins == (m.size >= 1 << 17) for m in result.measurements)
    assert all(m.samples == 7 for m in result.measurements)


def test_no_crossover_keeps_portable_value_with_diagnostic():
    clock = Clock()
    result = search(FakeProblem(clock, speedup=1.01), clock)
    assert result.crossover is None and result.portable_kept
    assert result.values == PORTABLE
    assert "portable value kept" in result.diagnostics[-1]


def test_one_winning_size_is_not_enough():
    clock = Clock()
    result = search(FakeProblem(clock), clock, sizes=[1 << 12, 1 << 13, 1 << 20])
    assert result.crossover is None  # only the last size wins
    result = search(FakeProblem(clock), clock, sizes=[1 << 12, 1 << 19, 1 << 20])
    assert result.crossover == 1 << 19


def test_a_loss_above_early_wins_moves_the_crossover_up():
    assert stable_crossover([(1, False), (2, True), (4, True), (8, False), (16, True),
                             (32, True)]) == 16
    assert stable_crossover([(1, True), (2, True), (4, False)]) is None
    assert stable_crossover([]) is None


def test_wrong_candidate_output_fails_before_timing():
    clock = Clock()
    problem = FakeProblem(clock, wrong_at=1 << 14)
    with pytest.raises(CalibrationFailure, match="size 16384, case 'equal'"):
        search(problem, clock)


def test_one_thread_keeps_portable_without_measuring():
    clock = Clock()
    problem = FakeProblem(clock)
    result = search(problem, clock, budget=Budget(max_duration_s=10, max_threads=1))
    assert result.portable_kept and result.values == PORTABLE
    assert problem.made == [] and result.measurements == []
    assert "only 1 thread" in result.diagnostics[0]


def test_memory_budget_checked_before_allocating():
    clock = Clock()
    problem = FakeProblem(clock)
    result = search(problem, clock, budget=Budget(max_duration_s=1e6, max_memory_bytes=1000,
                                                  max_threads=2))
    assert problem.made == [] and result.measurements == []
    assert result.portable_kept
    assert "memory budget" in result.diagnostics[-1]


def test_memory_budget_stops_at_the_first_size_too_big():
    clock = Clock()
    problem = FakeProblem(clock)
    result = search(problem, clock, budget=Budget(max_duration_s=1e6,
                                                  max_memory_bytes=12 * (1 << 18), max_threads=2))
    assert max(size for size, _ in problem.made) == 1 << 18
    assert result.crossover == 1 << 17  # wins at 2^17 and 2^18, the largest sizes measured
    assert any("stopped early" in d for d in result.diagnostics)


def test_duration_budget_stops_measuring():
    clock = Clock()
    problem = FakeProblem(clock)
    result = search(problem, clock, budget=Budget(max_duration_s=0.05, max_threads=2))
    assert result.duration_s < 0.05 + 0.05  # at most one size past the budget
    assert max(m.size for m in result.measurements) < 1 << 22
    assert any("duration budget" in d for d in result.diagnostics)


def test_noisy_sizes_are_measured_again_and_not_trusted():
    clock = Clock()
    problem = FakeProblem(clock, noise=lambda n: 1.0 if n % 3 else 4.0)
    result = search(problem, clock, sizes=[1 << 20, 1 << 21])
    assert all(m.repeats == 3 for m in result.measurements)
    assert all(not m.candidate_wins and "spread" in m.note for m in result.measurements)
    assert result.portable_kept


def test_measure_interleaved_alternates_and_reports_medians():
    clock = Clock()
    order = []

    def slow():
        order.append("a")
        clock.now += 1e-3

    def fast():
        order.append("b")
        clock.now += 1e-4

    (a_median, a_spread), (b_median, b_spread) = measure_interleaved(
        [slow, fast], samples=5, timer=clock)
    assert a_median == pytest.approx(1e-3) and b_median == pytest.approx(1e-4)
    assert a_spread == pytest.approx(0.0) and b_spread == pytest.approx(0.0)
    # after one estimation call each, samples alternate a-block, b-block
    assert order[:2] == ["a", "b"] and order[2] == "a" and "b" in order[3:5]


@pytest.mark.parametrize("kwargs", [{"max_duration_s": 0}, {"max_memory_bytes": 0},
                                    {"max_threads": 0}, {"max_threads": True}])
def test_budget_validation(kwargs):
    with pytest.raises(ValueError):
        Budget(**kwargs)


class FakeConfigurations:
    """Each case's cost depends on the configuration's ``tile``: a table of nanoseconds."""

    def __init__(self, clock, costs, wrong_tile=None):
        self.clock, self.costs, self.wrong_tile = clock, costs, wrong_tile
        self.cases = tuple(costs)

    def work(self, case):
        return 1000

    def input_bytes(self, case):
        return 100

    def make_inputs(self, case):
        return case

    def run(self, values, case):
        self.clock.now += self.costs[case][values["tile"]] * 1e-9
        return "bad" if values["tile"] == self.wrong_tile else case

    def same_output(self, a, b):
        return a == b


def configuration(costs, candidates=({"tile": 2}, {"tile": 4}), **kwargs):
    clock = Clock()
    problem = FakeConfigurations(clock, costs, kwargs.pop("wrong_tile", None))
    budget = kwargs.pop("budget", Budget(max_duration_s=1e6, max_threads=2))
    return configuration_search(KEY, problem, {"tile": 1}, list(candidates), budget, timer=clock,
                                **kwargs)


def test_configuration_search_adopts_the_best_gain():
    result = configuration({"a": {1: 1000, 2: 800, 4: 600}, "b": {1: 1000, 2: 900, 4: 700}})
    assert result.values == {"tile": 4} and not result.portable_kept
    assert {m.candidate for m in result.measurements} == {"tile=2", "tile=4"}
    assert "adopted tile=4" in result.diagnostics[-1]



def test_configuration_measurements_keep_the_work_and_the_portable_time_apart():
    result = configuration({"a": {1: 1000, 2: 800, 4: 600}})
    measured = {m.candidate: m for m in result.measurements}
    assert all(isinstance(m, ConfigurationMeasurement) for m in measured.values())
    tile4 = measured["tile=4"]
    assert (tile4.case, tile4.work, tile4.samples) == ("a", 1000, 5)
    assert tile4.portable_median_s == pytest.approx(1000e-9)
    assert tile4.candidate_median_s == pytest.approx(600e-9)
    assert tile4.speedup == pytest.approx(1000 / 600) and tile4.candidate_wins
    assert set(tile4.to_dict()) == {
        "case", "work", "candidate", "portable_median_s", "portable_spread",
        "candidate_median_s", "candidate_spread", "samples", "speedup", "candidate_wins"}

def test_configuration_search_no_regression_rule():
    # tile=4 is much faster on a but 20% slower on b: rejected; tile=2 wins instead
    result = configuration({"a": {1: 1000, 2: 900, 4: 300}, "b": {1: 1000, 2: 950, 4: 1200}})
    assert result.values == {"tile": 2}


def test_configuration_search_minimum_gain_keeps_portable():
    result = configuration({"a": {1: 1000, 2: 990, 4: 980}})
    assert result.portable_kept and result.values == {"tile": 1}
    assert "portable kept" in result.diagnostics[-1]


def test_configuration_search_rejects_wrong_output():
    with pytest.raises(CalibrationFailure, match="tile=4 gives a different result on case 'a'"):
        configuration({"a": {1: 1000, 2: 800, 4: 600}}, wrong_tile=4)


def test_configuration_search_needs_the_whole_corpus():
    result = configuration({"a": {1: 1000, 2: 500, 4: 500}, "b": {1: 1000, 2: 500, 4: 500}},
                           budget=Budget(max_duration_s=1e-9, max_threads=2))
    assert result.portable_kept
    assert "corpus not covered" in result.diagnostics[-1]


def test_reports_of_both_searches_plot_and_print(tmp_path):
    pytest.importorskip("matplotlib")
    from onnx_light.cli_tune import _speedup_at_crossover
    from onnx_light.plotting import plot_calibration

    clock = Clock()
    crossover = search(FakeProblem(clock), clock).to_dict()
    configured = configuration({"a": {1: 1000, 2: 800, 4: 600}}).to_dict()
    figure = plot_calibration([crossover, configured], str(tmp_path / "both.png"))
    first, second = figure.axes[:2]
    assert first.get_xlabel() == "output elements"
    assert second.get_xlabel() == "work (multiply-adds)"
    portable = next(line for line in second.lines if line.get_label() == "portable (a)")
    assert list(portable.get_xdata()) == [1000, 1000]
    assert list(portable.get_ydata()) == pytest.approx([1000e-9, 1000e-9])
    assert _speedup_at_crossover(crossover).endswith("x")
    assert _speedup_at_crossover(configured) == "-"


class PricedConfigurations(FakeConfigurations):
    """Making a case's inputs costs 10 ns per byte; each case has ``nbytes`` of inputs."""

    def __init__(self, clock, costs, nbytes):
        super().__init__(clock, costs)
        self.nbytes, self.made = nbytes, []

    def input_bytes(self, case):
        return self.nbytes[case]

    def make_inputs(self, case):
        self.made.append(case)
        self.clock.now += self.nbytes[case] * 1e-8
        return case


def test_configuration_search_does_not_start_a_measurement_past_its_budget():
    # One call of each of the three configurations of case b costs 0.3 s: measuring it takes
    # about 6 rounds, far more than the 0.5 s the budget has left after validating it.
    costs = {"a": {1: 1e6, 2: 1e6, 4: 1e6}, "b": {1: 1e8, 2: 1e8, 4: 1e8}}
    result = configuration(costs, budget=Budget(max_duration_s=1.0, max_threads=2))
    assert {m.case for m in result.measurements} == {"a"}
    assert result.duration_s < 1.0
    assert "measuring case b would take about" in result.diagnostics[-1]


def test_configuration_search_projects_the_cost_of_making_inputs():
    clock = Clock()
    costs = {"a": {1: 1000, 2: 1000, 4: 1000}, "b": {1: 1000, 2: 1000, 4: 1000}}
    problem = PricedConfigurations(clock, costs, {"a": 20 << 20, "b": 100 << 20})
    result = configuration_search(KEY, problem, {"tile": 1}, [{"tile": 2}, {"tile": 4}],
                                  Budget(max_duration_s=1.0, max_threads=2), timer=clock)
    assert problem.made == ["a"]  # b's inputs would take about 1.05 s to make: never made
    assert "making the inputs of case b would take about 1.05 s" in result.diagnostics[-1]


def test_crossover_search_does_not_start_a_measurement_past_its_budget():
    clock = Clock()
    problem = FakeProblem(clock)
    budget = Budget(max_duration_s=0.05, max_threads=2)
    result = search(problem, clock, budget=budget)
    assert result.duration_s <= budget.max_duration_s + 2 * max(problem.made)[0] * 1e-9
    assert any("would take about" in d for d in result.diagnostics)


def test_projected_measurement_counts_the_estimates_and_the_samples():
    assert calibration.projected_measurement_s(0.1, 2, samples=5) == pytest.approx(
        0.1 + 5 * (0.1 + 2 * calibration.SAMPLE_TARGET_S))
