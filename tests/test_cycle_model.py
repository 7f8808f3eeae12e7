"""The cycle model (``opentrn.cycle_model``) against the core RTL's performance counters:
equal, counter for counter, on random GEMM, GEMM + bias + ReLU and MLP shapes in every input
format of the build; and its fast path against it. The kernels of tests/test_sim_core.py and
the CLI's demo are compared there (the same equality)."""

import importlib

import numpy as np
import pytest

from opentrn import config, cycle_model, kernels, numerics, projection, schedule
from opentrn.config import ConfigError
from opentrn.golden.core import Core as GoldenCore
from opentrn.isa import Fault, Opcode, encode
from opentrn.kernel import FORMAT_DTYPES, Kernel, Pattern
from opentrn.sim.core import run_images, run_programs

from .conftest import SIM_BUILDS, TRN3_16, require_simulator

#: The builds of the random-kernel runs: the two simulation presets, and tiny with a 4-byte
#: bus (four bus beats per instruction word, 4-byte SBUF words: an int32 or FP32 result
#: completes a word, so the activation unit's write queue fills whenever the DMA takes the
#: SBUF's write port): the model's timing follows the configuration, not only the presets'.
BUILDS = {"tiny": config.preset("tiny"), "small": config.preset("small"),
          "tiny-bus4": config.preset("tiny").replace(dma_bus_bytes=4),
          # The FP datapath in stages (tests/conftest.py): the latencies follow
          # pe_multiply_stages, pe_add_stages (the rows' skew, the reload guard),
          # activation_input_stages, activation_multiply_stages, activation_add_stages and
          # psum_add_stages (the waits of accumulates too: test_accumulates_wait_for_the_
          # psum_adder) and sbuf_input_stages; the fpga preset, with one multiply stage and
          # one input stage of the array and of the SBUF, is predicted exactly on the
          # simulated board (tests/test_board.py).
          "tiny-staged": SIM_BUILDS["tiny-staged"],
          # The fast weight loads: a fresh tile every max(N, M + 1); with two columns a beat
          # into three banks (on in trn2/trn3), every max(N, M / 2), here with the rows
          # two cycles apart (an add stage: the loads' rows are skewed as the vectors'), a
          # register in front of the array (the loads pass it with the vectors) and one at
          # each SBUF partition (SBUF reads answered 2 cycles after their grant, as on the
          # fpga preset).
          "tiny-fast": config.preset("tiny").replace(fast_weight_load=1),
          "tiny-fast2": config.preset("tiny").replace(fast_weight_load=2, pe_add_stages=1,
                                                      pe_input_stages=1, sbuf_input_stages=1)}
#: Random kernels per build: (build, simulator, count, largest dimension). The builds other
#: than tiny run on Icarus (one Verilator build per configuration is more than the suite's
#: budget, as for the block testbenches) with shapes small enough for its speed.
RANDOM_RUNS = [("tiny", "verilator", 30, 48), ("small", "icarus", 22, 24),
               ("tiny-bus4", "icarus", 6, 20), ("tiny-staged", "icarus", 5, 20),
               ("tiny-fast", "icarus", 6, 20), ("tiny-fast2", "icarus", 8, 20)]


@pytest.mark.sim
@pytest.mark.parametrize("build, sim, count, largest", RANDOM_RUNS,
                         ids=[f"{b}-{s}" for b, s, _, _ in RANDOM_RUNS])
def test_predicted_counters_equal_the_rtls_on_random_kernels(build, sim, count, largest):
    """Every performance counter (cycles, the engines' busy and wait cycles, DMA bytes,
    MACs) predicted equals the RTL's, on shapes that are and are not multiples of the
    array, in every format of the build."""
    require_simulator(sim)
    cfg = BUILDS[build]
    rng = np.random.default_rng(606 + len(build))
    jobs = [kernels.random_kernel(cfg, rng, largest=largest) for _ in range(count)]
    images = [(program.hbm, program.programs) for _, program in jobs]
    jobs += [(label, None) for label, _ in _hand_written(cfg)]
    images += [image for _, image in _hand_written(cfg)]
    outcomes, _ = run_images(cfg, images, sim=sim)
    for (label, _), (hbm, pointers), outcome in zip(jobs, images, outcomes, strict=True):
        assert cycle_model.simulate(cfg, hbm, pointers) == outcome.counters, label
        # The default watchdog's bound (sim/core.py) is above every real run.
        assert cycle_model.upper_bound(cfg, hbm, pointers) > outcome.counters["cycles"], label


@pytest.mark.sim
def test_predicted_counters_equal_the_rtls_with_a_fixed_hbm_latency():
    """An HBM that answers every burst a fixed number of cycles later (sim/hbm.py's
    ``latency=(L, L)``) is modelled exactly too."""
    sim = "verilator"
    require_simulator(sim)
    cfg = config.preset("tiny")
    rng = np.random.default_rng(77)
    jobs = [kernels.random_kernel(cfg, rng, largest=40) for _ in range(6)]
    latency = 23
    outcomes, _ = run_programs([program for _, program in jobs], sim=sim,
                               latency=(latency, latency))
    for (label, program), outcome in zip(jobs, outcomes, strict=True):
        assert cycle_model.predict(program, latency=latency) == outcome.counters, label
        assert outcome.counters["cycles"] > cycle_model.predict(program)["cycles"], label
        assert cycle_model.upper_bound(cfg, program.hbm, program.programs,
                                       latency=latency) > outcome.counters["cycles"], label


def _run_like_the_golden_machine_and_the_model(cfg, programs, sim="icarus"):
    """Runs ``programs`` on the core RTL of ``cfg``; asserts each one's HBM image equal to
    the golden machine's (no fault) and its counters and timeline equal to the cycle
    model's, event for event; returns ``[(program, outcome)]``."""
    require_simulator(sim)
    outcomes, _ = run_images(cfg, [(p.hbm, p.programs) for p in programs], sim=sim,
                             timeline=True)
    golden = GoldenCore(cfg)
    for program, outcome in zip(programs, outcomes, strict=True):
        reference = golden.run(program.hbm, program.programs)
        assert outcome.fault == reference.fault == Fault.NONE, program.name
        assert np.array_equal(outcome.hbm, reference.hbm[:len(program.hbm)]), program.name
        predicted, timeline = cycle_model.predict_timeline(program)
        assert predicted == outcome.counters, program.name
        assert timeline == outcome.timeline, program.name
    return list(zip(programs, outcomes, strict=True))


def _random_values(dtype, rng, shape):
    """Random int8 values, or normal values rounded to the float format ``dtype``."""
    if dtype == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    return rng.standard_normal(shape).astype(np.float32).astype(FORMAT_DTYPES[dtype])


def _accumulates_in_flight(cfg, dtype, rng):
    """A kernel whose matmuls accumulate into PSUM entries still in the PSUM's adder when
    ``psum_add_stages`` > 0: two 16-vector matmuls queue the one-vector matmuls behind them,
    the first of those into the last entry of the second, the others into one entry."""
    rows, cols, n = cfg.pe_rows, cfg.pe_cols, cfg.moving_max
    element = FORMAT_DTYPES[dtype]

    k = Kernel(cfg, f"accumulates in flight ({dtype})")
    a = k.input("a", _random_values(dtype, rng, (rows, cols)))
    x = k.input("x", _random_values(dtype, rng, (rows, 2 * n)))
    out_type = np.int32 if dtype == "int8" else np.float32
    first_out = k.output("first", (cols, n), out_type)
    second_out = k.output("second", (cols, n), out_type)
    stationary = k.sbuf(rows, cols * element.itemsize)
    moving = k.sbuf(rows, 2 * n * element.itemsize)
    first, second = k.psum(n), k.psum(n)
    k.dma(stationary[:, :], a[:, :])
    k.dma(moving[:, :], x[:, :])
    k.load_stationary(stationary[:, :], dtype=dtype)
    size = element.itemsize
    k.matmul(first[:, 0:n], moving[:, 0:n * size])
    k.matmul(second[:, 0:n], moving[:, n * size:2 * n * size])
    k.matmul(second[:, n - 1:n], moving[:, 0:size], accumulate=True)
    for j in range(6):
        k.matmul(first[:, 3:4], moving[:, (j + 1) * size:(j + 2) * size], accumulate=True)
    k.dma(first_out[:, :], first[:, 0:n])
    k.dma(second_out[:, :], second[:, 0:n])
    return k.build()


@pytest.mark.sim
def test_accumulates_wait_for_the_psum_adder():
    """With ``psum_add_stages = P`` (``tiny-staged``: 4) a moving vector that accumulates
    into a PSUM entry a vector of the last ``P`` cycles went to waits: the results equal the
    golden machine's, bit for bit (int8 and BF16), and the cycle model's timeline equals the
    RTL's, event for event, the vector after the second 16-vector matmul (into its last
    entry) entering ``P + 1`` cycles after that matmul's last."""
    cfg = BUILDS["tiny-staged"]
    rng = np.random.default_rng(5)
    programs = [_accumulates_in_flight(cfg, dtype, rng) for dtype in ("int8", "bf16")]
    for program, outcome in _run_like_the_golden_machine_and_the_model(cfg, programs):
        runs = outcome.timeline.busy["tensor"]
        # The two 16-vector matmuls back to back, then the one-vector matmul into the last
        # entry, held until P + 1 cycles after that entry's vector.
        assert runs[0][1] - runs[0][0] == 2 * cfg.moving_max, (program.name, runs)
        assert runs[1][0] - runs[0][1] == cfg.psum_add_stages, (program.name, runs)


def _activation_beside_a_dma(cfg, dtype, rng):
    """A kernel whose ACTIVATE writes a 4-byte result a cycle (int32 or FP32) while the DMA
    writes a long HBM -> SBUF copy: both want the SBUF's write port in most cycles."""
    rows, cols, n = cfg.pe_rows, cfg.pe_cols, cfg.moving_max
    element = FORMAT_DTYPES[dtype]
    size = element.itemsize

    k = Kernel(cfg, f"activation beside a DMA ({dtype})")
    a = k.input("a", _random_values(dtype, rng, (rows, cols)))
    x = k.input("x", _random_values(dtype, rng, (rows, n)))
    fill_bytes = 64 * cfg.dma_bus_bytes
    fill = k.input("fill", rng.integers(-128, 128, (rows, fill_bytes)).astype(np.int8))
    out = "int32" if dtype == "int8" else "fp32"
    y = k.output("y", (cols, n), np.int32 if dtype == "int8" else np.float32)
    filled_out = k.output("filled", (rows, fill_bytes), np.int8)
    stationary, moving = k.sbuf(rows, cols * size), k.sbuf(rows, n * size)
    results, filled = k.sbuf(rows, 4 * n), k.sbuf(rows, fill_bytes)
    psum = k.psum(n)
    k.dma(stationary[:, :], a[:, :])
    k.dma(moving[:, :], x[:, :])
    k.load_stationary(stationary[:, :], dtype=dtype)
    k.matmul(psum[:, 0:n], moving[:, :])
    k.dma(filled[:, :], fill[:, :])
    k.activation(results[0:cols, :], psum[:, 0:n], out=out)
    k.dma(y[:, :], results[0:cols, :])
    k.dma(filled_out[:, :], filled[:, :])
    return k.build()


@pytest.mark.sim
def test_activation_results_queue_while_the_dma_writes_the_sbuf():
    """On a 4-byte bus (``tiny-bus4``) each int32 or FP32 result completes an SBUF word, and
    the DMA's copy into the SBUF takes the write port every other cycle (round robin): the
    activation unit queues up to ``WRITE_SLOTS`` completed words and its engine stalls only
    when they are all waiting. The results equal the golden machine's, bit for bit, and the
    cycle model's timeline equals the RTL's, event for event, the engine's runs broken by
    the shared port."""
    cfg = BUILDS["tiny-bus4"]
    rng = np.random.default_rng(9)
    programs = [_activation_beside_a_dma(cfg, dtype, rng) for dtype in ("int8", "bf16")]
    for program, outcome in _run_like_the_golden_machine_and_the_model(cfg, programs):
        # The engine stalled on the write port: its 16 vectors in more than one run.
        runs = outcome.timeline.busy["activation"]
        assert sum(end - start for start, end in runs) == cfg.moving_max, (program.name, runs)
        assert len(runs) > 1, (program.name, runs)


def test_the_default_watchdog_is_above_a_long_programs_cycles():
    """SBUF-to-SBUF copies: a long run from a small image (the old watchdog, 50,000 cycles
    plus 8 per non-zero image byte, called such a run a hang at 56,424 of its 83,589
    cycles). The bound from its instructions is above its predicted cycles at every
    latency, and the watchdog adds back-pressure and a margin to it."""
    from opentrn.sim.core import WATCHDOG_SLACK, watchdog_cycles
    cfg = config.preset("tiny")
    k = Kernel(cfg, "copies")
    data = k.input("data", np.zeros((4, 2048), np.uint8))
    out = k.output("out", (4, 2048), np.uint8)
    first, second = k.sbuf(4, 2048), k.sbuf(4, 2048)
    k.dma(first, data)
    for _ in range(10):
        k.dma(second, first)
        k.dma(first, second)
    k.dma(out, first)
    program = k.build()
    for latency in (0, 20):
        bound = cycle_model.upper_bound(cfg, program.hbm, program.programs, latency=latency)
        assert bound > cycle_model.predict(program, latency=latency)["cycles"] > 20_000
    assert watchdog_cycles(cfg, program.hbm, program.programs, latency=(3, 20),
                           backpressure=0.5) == 2 * bound + WATCHDOG_SLACK


def _hand_written(cfg):
    """Programs the kernel API does not write: ``[(label, (hbm, pointers))]``."""
    end = encode(Opcode.END)
    load = encode(Opcode.LOAD_STATIONARY, rows=cfg.pe_rows, cols=cfg.pe_cols)
    k = Kernel(cfg, "copy")
    x = k.input("x", np.arange(cfg.pe_rows * 4, dtype=np.int8).reshape(cfg.pe_rows, 4))
    y = k.output("y", (cfg.pe_rows, 4), np.int8)
    tile = k.sbuf(cfg.pe_rows, 4)
    k.dma(tile[:, 0:4], x[:, :])
    k.dma(y[:, :], tile[:, 0:4])
    copy = k.build()
    # The paths the library kernels do not take: a PSUM -> HBM DMA, an activation from the
    # SBUF (int8, with a bias), SBUF -> SBUF and HBM -> HBM copies at odd offsets.
    k = Kernel(cfg, "paths")
    rows, cols = cfg.pe_rows, cfg.pe_cols
    a = k.input("a", np.arange(rows * cols, dtype=np.int8).reshape(rows, cols))
    x = k.input("x", np.arange(rows * 11, dtype=np.int8).reshape(rows, 11))
    bias = k.input("bias", np.arange(cols, dtype=np.int32).reshape(cols, 1))
    acc = k.output("acc", (cols, 11), np.int32)
    y = k.output("y", (cols, 9), np.int8)
    z = k.output("z", (rows, 11), np.int8)
    stationary, moving, out = k.sbuf(rows, cols), k.sbuf(rows, 16), k.sbuf(rows, 24)
    bias_tile = k.sbuf(rows, 4)
    psum = k.psum(11)
    k.dma(stationary[:, 0:cols], a[:, :])
    k.dma(moving[:, 0:11], x[:, :])
    k.dma(bias_tile[0:cols, 0:4], bias[:, :])
    k.load_stationary(stationary[:, 0:cols])
    k.matmul(psum[:, 0:11], moving[:, 0:11])
    k.dma(acc[:, :], psum[:, 0:11])
    k.activation(out[0:cols, 3:12], moving[0:cols, 1:10], function="relu", multiplier=3,
                 shift=1, bias=bias_tile[0:cols, 0:4])
    k.dma(y[:, :], out[0:cols, 3:12])
    k.dma(out[:, 13:24], moving[:, 0:11])
    k.dma(z[:, :], x[:, :])
    paths = k.build()
    return [
        ("three ENDs", _program([end, end, end])),
        ("a load and a 3-vector matmul of zeros", _program(
            [end, load + encode(Opcode.MATMUL, n=3) + end, end])),
        ("NOPs with waits and signals across engines", _program([
            encode(Opcode.NOP, signal=1, signal_sem=0) + end,
            encode(Opcode.NOP, wait=1, wait_sem=0, wait_value=1, signal=1, signal_sem=1)
            + end,
            encode(Opcode.NOP, wait=1, wait_sem=1, wait_value=1) + end])),
        ("a DMA copy through the SBUF", (copy.hbm, copy.programs)),
        ("PSUM to HBM, activation from the SBUF, buffer and HBM copies",
         (paths.hbm, paths.programs)),
    ]


def _program(streams):
    """An HBM image of three raw streams at 0x0, 0x1000, 0x2000."""
    hbm = np.zeros(0x3000, np.uint8)
    for index, code in enumerate(streams):
        hbm[index * 0x1000:index * 0x1000 + len(code)] = np.frombuffer(code, np.uint8)
    return hbm, (0x0, 0x1000, 0x2000)


def test_programs_outside_the_model_are_refused():
    """A program that would fault has no prediction: an illegal opcode, and a deadlock
    (the RTL's DEADLOCK fault) are refused with the reason, not timed."""
    cfg = config.preset("tiny")
    end = encode(Opcode.END)
    hbm, pointers = _program([encode(Opcode.MATMUL, n=1), end, end])
    with pytest.raises(cycle_model.ModelError, match="illegal opcode at pc=0"):
        cycle_model.simulate(cfg, hbm, pointers)
    wait = encode(Opcode.NOP, wait=1, wait_sem=0, wait_value=1)
    hbm, pointers = _program([end, wait + end, end])
    with pytest.raises(cycle_model.ModelError, match="deadlock"):
        cycle_model.simulate(cfg, hbm, pointers)


# -- the fast path ---------------------------------------------------------------------------

#: Shapes both the instruction-level model and the fast path run, on tiny and small (the
#: larger ones on small only, where they take fewer cycles of the model;
#: benchmarks/cycle_model_accuracy.py compares them all on both).
FAST_SHAPES = [(1, 1, 1), (16, 16, 16), (7, 13, 29), (64, 64, 64)]
LARGE_SHAPES = [(32, 256, 32), (256, 32, 64), (100, 60, 90), (128, 128, 128)]


def fast_path_bound(cycles):
    """The largest relative difference of the fast path's cycles from predict()'s asserted
    on those shapes: 2% for a kernel of at least 5,000 cycles, 5% below (docs/performance.md
    has the table, and a random sample where the fast path strays further): the fast path
    models each step's overlap, not the cycle-by-cycle arbitration."""
    return 0.02 if cycles >= 5000 else 0.05


def within_fast_path_bound(exact, fast):
    """Whether the fast path's cycles are within :func:`fast_path_bound` of predict()'s."""
    return abs(fast.cycles - exact["cycles"]) <= \
        fast_path_bound(exact["cycles"]) * exact["cycles"]


def exact_and_fast(cfg, shape, dtype, rng):
    """predict()'s counters of the library GEMM of ``shape`` (random inputs from ``rng``)
    and the fast path's estimate of it."""
    program = kernels.random_gemm(cfg, rng, *shape, dtype)
    return cycle_model.predict(program), cycle_model.gemm(cfg, *shape, dtype=dtype)


@pytest.mark.parametrize("preset, dtype", [("tiny", "int8"), ("tiny", "bf16"),
                                           ("tiny", "mxfp8e4m3"), ("small", "int8")])
def test_fast_path_agrees_with_the_model(preset, dtype):
    """The fast path's MACs, tensor-busy cycles and DMA bytes equal the instruction-level
    model's on every shape; its cycles are within fast_path_bound."""
    cfg = config.preset(preset)
    rng = np.random.default_rng(9)
    for m, k, n in FAST_SHAPES + (LARGE_SHAPES if preset == "small" else []):
        exact, fast = exact_and_fast(cfg, (m, k, n), dtype, rng)
        label = f"{preset} {dtype} {m}x{k}x{n}"
        assert (fast.macs, fast.tensor_busy, fast.dma_bytes) == \
            (exact["macs"], exact["tensor_busy"], exact["dma_bytes"]), label
        assert within_fast_path_bound(exact, fast), \
            (label, fast.cycles, exact["cycles"])


def _random_sample(presets=(("tiny", ("int8", "bf16", "fp8e4m3", "mxfp8e4m3")),
                            ("small", ("int8",))), per_format=10, seed=2026):
    """A seeded sample of the benchmark's random shapes (``cycle_model.random_gemm_shapes``,
    each of its five kinds twice per format): ``(preset, dtype, shape)``."""
    sample = []
    for preset, dtypes in presets:
        rng = np.random.default_rng(seed)
        cfg = config.preset(preset)
        sample += [(preset, dtype, shape) for dtype in dtypes
                   for shape in cycle_model.random_gemm_shapes(cfg, dtype, per_format, rng)]
    return sample


#: Shapes of the sample the fast path is known to miss its bound on (docs/performance.md,
#: "The fast path": about 1% of the benchmark's random shapes): each is expected to fail,
#: and the test fails if it passes, so that a fix takes it off this list.
OUTSIDE_THE_BOUND = {
    # +2.3%: its steps that store and then prefetch take 38 to 44 cycles more than by
    # predict(), which runs the step's instruction fetches during the store and most of the
    # matmuls before it, where the step model spreads the fetches over the prefetch's reads
    # and the matmuls' SBUF reads over the store.
    ("small", "int8", (39, 31, 193)),
}


@pytest.mark.parametrize("preset, dtype, shape", [
    pytest.param(*case, id="{}-{}-{}x{}x{}".format(*case[:2], *case[2]),
                 marks=[pytest.mark.xfail(strict=True, reason="outside the bound")]
                 if case in OUTSIDE_THE_BOUND else [])
    for case in _random_sample()])
def test_fast_path_within_its_bound_on_a_random_sample(preset, dtype, shape):
    """The issue's bound (2% from 5,000 cycles, 5% below) on a seeded random sample of the
    shapes benchmarks/cycle_model_accuracy.py reports in full: K = 1, a long K with small M
    and N, sizes a tile either way, K around the SBUF's capacity."""
    exact, fast = exact_and_fast(config.preset(preset), shape, dtype,
                                 np.random.default_rng(0))
    assert fast.dma_bytes == exact["dma_bytes"]
    assert within_fast_path_bound(exact, fast), (fast.cycles, exact["cycles"])


#: Shapes whose operand rows start mid-word in HBM (M, N not multiples of the bus word) and
#: whose K nearly fills the SBUF: the fast path once counted every row as aligned and was
#: 16-18% short on these (docs/performance.md, "The fast path").
MISALIGNED_SHAPES = [("tiny", "int8", (7, 228, 55)), ("tiny", "fp8e4m3", (7, 222, 63)),
                     ("tiny", "mxfp8e4m3", (17, 223, 37)), ("small", "int8", (13, 451, 78))]


@pytest.mark.parametrize("preset, dtype, shape", MISALIGNED_SHAPES)
def test_fast_path_walks_misaligned_rows(preset, dtype, shape):
    """Each DMA side's rows are walked from their own addresses (hdl/access_pattern.py):
    the fast path's cycles within 2% of predict()'s, its bytes equal."""
    exact, fast = exact_and_fast(config.preset(preset), shape, dtype,
                                 np.random.default_rng(23))
    assert fast.dma_bytes == exact["dma_bytes"]
    assert abs(fast.cycles - exact["cycles"]) <= 0.02 * exact["cycles"], \
        (fast.cycles, exact["cycles"])


def test_fast_path_scales_to_trainium3():
    """An 8192^3 GEMM on a trn3 core: every MAC counted, the array's rate for the format,
    and no more cycles than the DMA and the array need at least."""
    cfg = config.preset("trn3")
    size = 8192
    for dtype in ("bf16", "mxfp8e4m3"):
        est = cycle_model.gemm(cfg, size, size, size, dtype=dtype)
        rate = cfg.macs_per_pe_cycle(dtype)
        assert est.macs == size ** 3
        assert est.tensor_busy * cfg.pe_rows * cfg.pe_cols * rate == size ** 3
        assert est.cycles >= est.tensor_busy
        assert est.cycles >= est.dma_bytes / cycle_model.dma_bytes_per_cycle(cfg)


@pytest.mark.parametrize("dtype, shape", [("bf16", (1024, 1024, 1024)),
                                          ("fp8e4m3", (1024, 1024, 1024)),
                                          ("mxfp8e4m3", (1024, 1024, 1024)),
                                          ("bf16", (1024, 128, 1024)),
                                          ("fp8e4m3", (1602, 1128, 544))])
def test_fast_path_agrees_with_the_model_at_trainium_size(dtype, shape):
    """On a 128x128 trn3 core with the one DMA engine the RTL builds (the exact model
    follows the RTL, so only there can it check the fast path that ``opentrn project``
    uses): macs, tensor-busy cycles and DMA bytes equal, cycles within 2% (docs/
    performance.md has a random sample). 1602x1128x544: DMA-bound, a partial last K tile
    (564 rows) in every step, whose matmuls but the last K tile's start before its
    descriptor ends (the fast path was 2.8% over when it waited for the whole step)."""
    cfg = config.resolve("trn3", overrides=["dma_engines=1"])
    exact, fast = exact_and_fast(cfg, shape, dtype, np.random.default_rng(17))
    assert (fast.macs, fast.tensor_busy, fast.dma_bytes) == \
        (exact["macs"], exact["tensor_busy"], exact["dma_bytes"])
    assert abs(fast.cycles - exact["cycles"]) <= 0.02 * exact["cycles"], \
        (fast.cycles, exact["cycles"])


#: Shapes whose overlaps the fast path once missed (docs/performance.md, "The fast path"),
#: with its difference from predict() then.
OVERLAP_SHAPES = [
    # 25 steps of one K tile: the read channel busy with instruction fetches (a NOP
    # before most epilogues), the tensor engine idle until each stationary tile is in
    # (-9.1%).
    ("tiny", "int8", (99, 16, 5)),
    # One moving slot refilled a K tile at a time behind the matmuls of the step before
    # and ahead of those of the next (+7.1%).
    ("tiny", "bf16", (6, 108, 58)),
    # The same refill slower than the matmuls: the read channel shared with the refill's
    # own descriptors' fetches (-3.8% while the fast path left those out).
    ("tiny", "mxfp8e4m3", (14, 221, 49)),
    # DMA-bound: the first step's matmuls start before its last descriptor ends (+3.8%).
    ("trn3", "bf16", (466, 367, 607)),
    # So do a later step's, while the tensor engine waits for the DMA (+2.2% when only the
    # first step's did; -2.1% with that alone, its descriptors taking their larger side's
    # words rather than each row's slower side, below).
    ("trn3", "fp8e4m3", (74, 1020, 724)),
]


#: Short shapes whose first prefetch the fast path once put too late (its reads behind the
#: sequencers' first fetch bursts, the DMA stream's refills among them), with its
#: difference from predict() then.
START_SHAPES = [
    # Two descriptors of a few rows: the refill between them hides the second's overhead
    # (+9.4%).
    ("small", "int8", (23, 2, 2)),
    # Six descriptors (MX scales): a refill between the first two, then one between later
    # ones (+8.3%).
    ("tiny", "mxfp8e4m3", (4, 3, 81)),
    # (+6.2%.)
    ("tiny", "bf16", (8, 7, 13)),
    # The first descriptor has more rows than the DMA keeps reads in flight: the refills go
    # out within it (-5.1%).
    ("tiny", "int8", (1, 9, 2)),
]


#: Short shapes of many steps of one K tile and a few columns, each with its epilogue, whose
#: steps the read channel sets: the streams' instructions (a stationary load and a matmul, an
#: activation, often a NOP, and the store and prefetch descriptors) take more of its beats
#: than the matmuls take cycles, in steps where the DMA reads nothing (the fast path
#: counted the fetches only beside the DMA's reads), with its difference from predict()
#: then.
CHANNEL_SHAPES = [
    ("tiny", "bf16", (97, 1, 2)),           # (-9.0%)
    ("tiny", "bf16", (110, 5, 1)),          # (-8.1%)
    ("tiny", "mxfp8e4m3", (32, 2, 2)),      # (-8.3%)
    ("tiny", "int8", (42, 1, 33)),          # (-5.8%)
]


@pytest.mark.parametrize("preset, dtype, shape", OVERLAP_SHAPES + START_SHAPES + CHANNEL_SHAPES)
def test_fast_path_models_the_overlaps(preset, dtype, shape):
    cfg = (config.resolve("trn3", overrides=["dma_engines=1"]) if preset == "trn3"
           else config.preset(preset))
    exact, fast = exact_and_fast(cfg, shape, dtype, np.random.default_rng(17))
    assert within_fast_path_bound(exact, fast), (fast.cycles, exact["cycles"])


def test_fast_path_first_refill_on_a_wide_bus():
    """On a 32-byte bus an instruction takes one beat, so the DMA stream's first refill goes
    out while the first descriptor's reads still do, within it, and hides no start-up
    (2x2x1 was 9.2% short when the refill went between the two descriptors)."""
    tiny = config.preset("tiny")
    cfg = tiny.replace(dma_bus_bytes=32,
                       hbm_bytes_per_s=float(32 * tiny.clock_hz * tiny.cores_per_chip))
    assert projection.exact_model_follows(cfg)
    exact, fast = exact_and_fast(cfg, (2, 2, 1), "int8", np.random.default_rng(17))
    assert within_fast_path_bound(exact, fast), (fast.cycles, exact["cycles"])


@pytest.mark.parametrize("shape", [(8, 226, 51), (13, 223, 35)])
def test_fast_path_rolling_refill_shares_the_read_channel(shape):
    """On a 4-byte bus an instruction is 8 beats, and a block's one moving slot, refilled a
    K tile at a time behind the step before, shares the read channel with the tensor
    engine's instruction fetches: what the refill has not read when that step ends shares
    the next step's channel in turn (8x226x51 was 6.9% short, 13x223x35 2.5%, when the
    rest of the refill went on beside the next step's fetches, taking none of its channel),
    and the two steps together take at least the channel's time (their fetches and the
    refill's reads: 8x226x51 was 6.9% short again, 13x223x35 2.4%, when the refill's
    descriptor fetches moved into the step it runs behind, their channel time lost where
    they did not fit in it)."""
    cfg = BUILDS["tiny-bus4"]
    exact, fast = exact_and_fast(cfg, shape, "int8", np.random.default_rng(17))
    assert schedule.gemm_tiling(cfg, *shape, "int8")[3] == 1    # one moving slot
    assert within_fast_path_bound(exact, fast), (fast.cycles, exact["cycles"])


#: Descriptors of ``n2`` K tiles (16 rows each) of ``length``-byte rows, from byte ``col0``
#: of rows ``pitch`` bytes apart in HBM to ``tile_bytes``-byte tiles of the SBUF, on a
#: 64-byte bus, whose rows' source and sink bus words differ in both directions: the whole
#: descriptor's larger side was 7 to 9 cycles short of its time.
ROW_PACED = [(294, 474, 147, 347, 2), (479, 592, 82, 494, 2), (102, 288, 167, 121, 2)]


@pytest.mark.parametrize("length, pitch, col0, tile_bytes, n2", ROW_PACED)
def test_fast_path_descriptor_rows_take_their_slower_side(length, pitch, col0, tile_bytes,
                                                         n2):
    """The DMA walks a descriptor's two sides row by row (hdl/access_pattern.py), so each
    row takes about the bus words of its slower side: the fast path's descriptor cost
    (``gemm._tiles_words``) is what a descriptor adds to the exact model's DMA-busy cycles
    in a run of them (three against one), within a cycle on these, where the larger side's
    total over the whole descriptor is 7 to 9 short (on other descriptors the realignment
    buffer lets a row's words overlap the next row's by a cycle or two)."""
    fast = importlib.import_module("opentrn.cycle_model.gemm")
    cfg = TRN3_16.replace(dma_bus_bytes=64)
    parts, width = cfg.sbuf_partitions, cfg.dma_bus_bytes

    def dma_busy(copies):
        k = Kernel(cfg)
        a = k.input("a", np.zeros((n2 * parts, pitch), np.uint8))
        tile = k.sbuf(parts, tile_bytes * n2)
        for _ in range(copies):
            k.dma_pattern(Pattern(tile, partition=0, pstep1=1, stride2=tile_bytes),
                          Pattern(a, offset=col0, stride1=pitch, stride2=parts * pitch),
                          n0=length, n1=parts, n2=n2)
        out = k.output("out", (1, 1), np.uint8)
        k.dma(out[0:1, 0:1], tile[0:1, 0:1])
        return cycle_model.predict(k.build())["dma_busy"]

    each = (dma_busy(3) - dma_busy(1)) / 2
    words = fast._tiles_words(col0, pitch, n2 * parts, length, 0, tile_bytes, parts, width)
    larger_side = max(fast._rows_words(col0, pitch, n2 * parts, length, width),
                      parts * fast._rows_words(0, tile_bytes, n2, length, width))
    assert abs(each - (cycle_model.DMA_READ_OVERHEAD + words)) <= 1, (each, words)
    assert each - (cycle_model.DMA_READ_OVERHEAD + larger_side) >= 7, (each, larger_side)


@pytest.mark.parametrize("shape", [(8, 224, 49), (7, 227, 50)])
def test_fast_path_refill_descriptors_are_fetched_behind_the_step_before(shape):
    """A rolling refill's descriptors (one per K tile, and one for its MX scales) are
    fetched as it runs, behind the step before: counted in the read channel of the step
    they fill, they slowed that step a second time (tiny MXFP8 8x224x49 4.7% over,
    7x227x50 4.5%: two blocks, the second's 56 or 57 K tiles refilled)."""
    cfg = config.preset("tiny")
    exact, fast = exact_and_fast(cfg, shape, "mxfp8e4m3", np.random.default_rng(23))
    assert schedule.gemm_tiling(cfg, *shape, "mxfp8e4m3")[3] == 1    # one moving slot
    assert within_fast_path_bound(exact, fast), (fast.cycles, exact["cycles"])


def test_store_end_loses_the_sbuf_read_port_to_the_matmuls():
    """``dma.shared_end``: a store's SBUF reads go at one word a cycle, less the tensor
    engine's reads while its matmuls run, and at least every other cycle (the port's
    round-robin)."""
    store_end = importlib.import_module("opentrn.cycle_model.dma").shared_end
    assert store_end(10, 100, []) == 110
    # 40 cycles at 3 words in 4 (30 words), then 70 alone.
    assert store_end(0, 100, [(0, 40, 0.25)]) == 110
    # Matmuls that read every cycle still leave the store half the port.
    assert store_end(0, 100, [(0, 100, 0.9)]) == 150
    # Runs that ended before the store, a gap, then a run it ends inside.
    assert store_end(50, 30, [(0, 40, 0.5), (60, 200, 0.5)]) == 100


def test_fast_path_counts_the_matmuls_sbuf_reads_in_a_stores_time():
    """DMA-bound MXFP8 on a trn3 core with one DMA engine: each store's SBUF reads lose the
    read port to the next steps' matmuls for as long as they run (by ``predict``, nearly
    every matmul read in a group of steps falls inside a store: the tensor engine runs
    ahead of the stores until the prefetch behind them). The fast path's chain of the
    engines now counts those reads in each store; it was 0.77% short here (1.01% at
    4096x4096x512, the per-core GEMM of one chip's 4096^3, and 1.52% at 8192^3)."""
    cfg = config.resolve("trn3", overrides=["dma_engines=1"])
    exact, fast = exact_and_fast(cfg, (2048, 4096, 512), "mxfp8e4m3",
                                 np.random.default_rng(29))
    assert abs(fast.cycles - exact["cycles"]) <= 0.0025 * exact["cycles"], \
        (fast.cycles, exact["cycles"])


@pytest.mark.parametrize("dtype", ["bf16", "fp8e4m3", "mxfp8e4m3"])
@pytest.mark.parametrize("size", [4096, 8192])
def test_library_gemm_keeps_a_trn3_core_90_percent_busy(dtype, size):
    """The library GEMM's tiling (schedule.gemm_tiling, timed by the fast path) keeps a trn3
    core's array >= 90% busy at 4096^3 and 8192^3 in BF16, FP8 and MXFP8, and moves at most
    1.5x the compulsory bytes (A and B once with MX scales, C once in FP32; MXFP8 8192^3
    1.51x before its blocks kept their first stationary tiles); BF16 8192^3 at most 2x
    (1.97x in 5 balanced blocks of 1664 columns; 2.21x in blocks of 1536, 2.75x of 1024),
    where a lower bound on any schedule is 1.5x, and on this kernel's, which keeps each
    output tile in the PSUM across all of K (blocks of at most 2048 columns: A fetched at
    least 4 times), 1.75x (docs/performance.md, "The GEMM schedule at Trainium scale")."""
    cfg = config.preset("trn3")
    est = cycle_model.gemm(cfg, size, size, size, dtype=dtype)
    assert est.tensor_busy / est.cycles >= 0.90, est
    fmt = numerics.data_format(dtype)
    per_element = fmt.bytes + (1 / numerics.MX_BLOCK if fmt.mx else 0)
    compulsory = 2 * size * size * per_element + 4 * size * size
    limit = 2.0 if (dtype, size) == ("bf16", 8192) else 1.5
    assert est.dma_bytes <= limit * compulsory, est.dma_bytes / compulsory


@pytest.mark.parametrize("args, message", [
    ((0, 4, 4, "int8"), "m=0: must be a positive integer"),
    ((4, 4, 4, "fp32"), "dtype='fp32': not among this configuration's formats"),
])
def test_fast_path_errors_name_the_field(args, message):
    m, k, n, dtype = args
    with pytest.raises(ValueError, match=message):
        cycle_model.gemm(config.preset("small"), m, k, n, dtype=dtype)


@pytest.mark.parametrize("dtype, count, error, message", [
    ("int8", -1, ValueError, "count=-1: must be a non-negative integer"),
    ("bf16", 5, ConfigError, "format='bf16': not among this build's formats"),
])
def test_random_shapes_refusals_name_the_field(dtype, count, error, message):
    with pytest.raises(error, match=message):
        cycle_model.random_gemm_shapes(config.preset("small"), dtype, count,
                                       np.random.default_rng(0))


def test_fast_path_refuses_a_tiling_the_kernel_does_not_take():
    cfg = config.preset("small")
    with pytest.raises(ValueError, match=r"tiling=\(3, 1, 1, 2\): not one of the kernel's "
                                         r"tilings of this GEMM, \("):
        cycle_model.gemm(cfg, 16, 8, 16, dtype="int8", tiling=(3, 1, 1, 2))
    tiling = schedule.gemm_tilings(cfg, 16, 8, 16, "int8")[0]
    assert cycle_model.gemm(cfg, 16, 8, 16, dtype="int8", tiling=tiling) == \
        cycle_model.gemm(cfg, 16, 8, 16, dtype="int8")
