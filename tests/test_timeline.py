"""Engine timelines (src/opentrn/timeline.py): the recorder, the Perfetto trace, the
picture, and ``--trace`` / ``--timeline`` / ``--model`` of ``opentrn run``. That the RTL's
timeline equals the cycle model's, event for event, on every library kernel and both
simulators, is asserted with the core's runs in tests/test_sim_core.py."""

import json

import numpy as np
import pytest
from matplotlib import image

from opentrn import config, cycle_model, kernels, timeline
from opentrn.cli import main
from opentrn.sim import runner
from opentrn.sim.core import run_programs
from opentrn.timeline import ENGINES, Burst, Instruction, Recorder, Timeline, Wait

from .conftest import require_simulator

TINY = config.preset("tiny")


def _gemm_relu(m, k, n, seed=3):
    rng = np.random.default_rng(seed)
    a = kernels.random_inputs(rng, (m, k), "int8")
    b = kernels.random_inputs(rng, (k, n), "int8")
    bias = kernels.random_bias(rng, m, "int8", 4000)
    program, _ = kernels.gemm_bias_relu(TINY, a.T.copy(), b, bias, multiplier=1, shift=8)
    return program


def test_recorder_pairs_events_into_instructions_waits_runs_and_bursts():
    recorder = Recorder()
    recorder.cycle(1, issued=[(0, "DMA", 0)], read=(1, 16), busy=["dma"])
    recorder.cycle(2, issued=[(0, "DMA", 64)], waiting=[(1, 2, 3)], busy=["dma"],
                   read=(0, 4))
    recorder.cycle(3, retired=[0], waiting=[(1, 2, 3)], read_last=1, write=8)
    # The same instruction waits on: one wait; another value: a second one.
    recorder.cycle(5, waiting=[(1, 2, 4)], busy=["tensor"], read_last=0)
    recorder.cycle(6, retired=[0], issued=[(1, "MATMUL", 96)], write_response=True,
                   busy=["tensor"])
    result = recorder.finish(7)
    assert result == Timeline(
        cycles=7,
        instructions=[Instruction(0, "DMA", 0, 1, 3), Instruction(0, "DMA", 64, 2, 6)],
        waits=[Wait(1, 2, 5, 2, 3), Wait(1, 5, 6, 2, 4)],
        busy={"dma": [(1, 3)], "tensor": [(5, 8)], "activation": []},
        bursts=[Burst(1, False, 16, 1, 4), Burst(0, False, 4, 2, 6),
                Burst(0, True, 8, 3, 7)])
    # The MATMUL handed over in cycle 6 never completed: not an instruction of the run.
    assert result.busy_cycles("tensor") == 3
    assert Timeline.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    with pytest.raises(ValueError, match="cycle=6: cycles must increase"):
        recorder.cycle(6)


def test_trace_is_perfetto_json_whose_slices_add_up_to_the_counters():
    program = _gemm_relu(16, 24, 12)
    counters, recorded = cycle_model.predict_timeline(program)
    assert counters == cycle_model.predict(program)
    trace = json.loads(json.dumps(timeline.trace_events(recorded, clock_hz=TINY.clock_hz)))
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {f"{engine} {lane}" for engine in ENGINES
                     for lane in ("instructions", "semaphore waits", "busy")}
    us = 1e6 / TINY.clock_hz
    cycles = {}
    for event in events:
        assert event["ph"] in "MXbe" and event["pid"] == 1
        if event["ph"] == "X":
            assert event["dur"] > 0
            cycles.setdefault((event["tid"], event["name"]), 0)
            cycles[event["tid"], event["name"]] += round(event["dur"] / us)
    # The busy slices are the busy counters, cycle for cycle.
    for engine, name in enumerate(ENGINES):
        assert cycles[10 * (engine + 1) + 2, "busy"] == counters[f"{name}_busy"]
        assert trace["otherData"]["busy_cycles"][name] == counters[f"{name}_busy"]
    # An engine's instruction slices follow one another without overlapping; every
    # instruction of the program completed (END included).
    for engine in range(len(ENGINES)):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                       if e["ph"] == "X" and e["tid"] == 10 * (engine + 1))
        assert all(end <= next_start + 1e-9
                   for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))
    assert len(recorded.instructions) == sum(program.instruction_counts.values())
    # Every burst begins and ends.
    begins = sorted(e["id"] for e in events if e["ph"] == "b")
    assert begins == sorted(e["id"] for e in events if e["ph"] == "e") == \
        list(range(len(recorded.bursts)))


def _pixels_of(picture, colour):
    return np.all(np.abs(picture[..., :3] - np.array(colour)) < 1.5 / 255, axis=-1)


@pytest.mark.parametrize("shape", [(8, 12, 8), (32, 64, 64)], ids=["short", "demo"])
def test_the_picture_shows_every_engine_busy_as_the_counters_say(shape, tmp_path):
    """Look at the PNG as a user does: in each engine's busy row the pixels of its colour
    cover its share of the cycle axis, as its busy counter says (to a pixel per busy run:
    the edges of a run fall inside pixels), and each engine's instructions are drawn."""
    program = _gemm_relu(*shape)
    counters, recorded = cycle_model.predict_timeline(program)
    path = tmp_path / "timeline.png"
    layout = timeline.render(recorded, path, title="test")
    assert layout["busy"] == {name: counters[f"{name}_busy"] for name in ENGINES}
    picture = image.imread(path)
    first, last = (round(x) for x in layout["x"])
    width = last - first
    assert picture.shape[1] == 1600 and width > 1000
    rows = layout["rows"]
    assert list(rows) == list(timeline.ROWS)
    assert [rows[row] for row in timeline.ROWS] == sorted(rows.values())
    for name in ENGINES:
        line = picture[rows[f"{name} busy"], first:last]
        drawn = int(_pixels_of(line, timeline.BUSY_COLOURS[name]).sum())
        expected = counters[f"{name}_busy"] / counters["cycles"] * width
        runs = len(recorded.busy[name])
        assert abs(drawn - expected) <= runs + 1, (name, drawn, expected, runs)
        assert drawn > 0
        # Its instructions row is not empty, and its busy row has nothing of another
        # engine's colour.
        instructions = picture[rows[f"{name} instructions"], first:last, :3]
        assert np.any(np.all(instructions < 0.99, axis=-1)), name
        for other in ENGINES:
            if other != name:
                assert not _pixels_of(line, timeline.BUSY_COLOURS[other]).any()


def test_run_model_writes_the_trace_and_picture_without_simulating(tmp_path, capsys):
    trace, picture = tmp_path / "t" / "run.json", tmp_path / "run.png"
    argv = ["run", "gemm", "--m", "9", "--k", "20", "--n", "7", "--model", "--json",
            "--trace", str(trace), "--timeline", str(picture)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == "cycle model" and report["trace"] == str(trace)
    assert report["timeline"] == str(picture) and picture.stat().st_size > 10_000
    events = json.loads(trace.read_text())
    assert events["otherData"]["source"] == "the cycle model"
    assert events["otherData"]["cycles"] == report["counters"]["cycles"]
    assert main(["run", "gemm", "--model", "--waves", str(tmp_path / "w.vcd")]) == 2
    assert "--waves: the cycle model has no waves" in capsys.readouterr().err
    assert main(["run", "gemm", "--model", "--trace", str(tmp_path)]) == 2
    assert f"--trace={tmp_path}: is a directory" in capsys.readouterr().err


def test_a_timeline_the_build_cannot_show_is_refused_by_name(tmp_path, capsys):
    """A hierarchical Verilator core with the axi HBM makes only its ports public: refused
    before any build, naming the option."""
    require_simulator("verilator")
    argv = ["run", "gemm", "--preset", "small", "--set", "pe_rows=16", "--set", "pe_cols=16",
            "--set", "sbuf_partitions=16", "--sim", "verilator", "--hbm", "axi"]
    assert main([*argv, "--timeline", str(tmp_path / "t.png")]) == 2
    assert ("--timeline: the hierarchical Verilator build of a 16x16 core with --hbm axi "
            "shows its ports only") in capsys.readouterr().err


@pytest.mark.sim
def test_rtl_and_model_traces_are_the_same_event_for_event(tmp_path, capsys):
    """``opentrn run ... --trace`` on the RTL and with ``--model`` write the same events:
    a kernel too large to simulate is profiled on the model as it would run."""
    sim = runner.long_run_simulator()
    require_simulator(sim)
    shape = ["gemm-relu", "--m", "6", "--k", "40", "--n", "9"]
    paths = {source: tmp_path / f"{source}.json" for source in ("rtl", "model")}
    assert main(["run", *shape, "--sim", sim, "--json", "--trace", str(paths["rtl"])]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["trace"] == str(paths["rtl"])
    assert main(["run", *shape, "--model", "--json", "--trace", str(paths["model"])]) == 0
    capsys.readouterr()
    rtl, model = (json.loads(paths[source].read_text()) for source in ("rtl", "model"))
    assert rtl["traceEvents"] == model["traceEvents"]
    assert rtl["otherData"]["source"] == f"the RTL ({sim})"
    assert rtl["otherData"]["busy_cycles"] == report["engine_busy"]


@pytest.mark.sim
def test_a_hierarchical_core_gives_the_models_timeline():
    """A core of 256 processing elements, which Verilator builds hierarchically (only the
    signals the bench reads are public): bit-exact, and its timeline is the model's."""
    require_simulator("verilator")
    cfg = config.preset("small").replace(pe_rows=16, pe_cols=16, sbuf_partitions=16)
    assert runner.build_info(runner.build(cfg, "core_with_memory", "verilator"))["hierarchical"]
    rng = np.random.default_rng(5)
    a = kernels.random_inputs(rng, (16, 32), "int8")
    b = kernels.random_inputs(rng, (32, 16), "int8")
    program, expected = kernels.gemm(cfg, a.T.copy(), b)
    (outcome,), _ = run_programs([program], sim="verilator", timeline=True)
    assert np.array_equal(program.read_outputs(outcome.hbm)["c"], expected["c"])
    counters, recorded = cycle_model.predict_timeline(program)
    assert outcome.counters == counters
    assert outcome.timeline == recorded
