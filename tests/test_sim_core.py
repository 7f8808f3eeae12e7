"""The whole core RTL under cocotb, on both simulators: library kernels end to end
(HBM -> DMA -> SBUF -> tensor engine -> PSUM -> activation -> SBUF -> DMA -> HBM) and illegal
programs, each against the golden ISA machine (the final HBM image bit for bit, the fault
code, engine and address) and the kernels against numpy. One simulation per simulator runs
every job, with a soft reset between them, so the reset is exercised too."""

import numpy as np
import pytest

from opentrn import config, cycle_model, isa, kernels, numerics, schedule
from opentrn.golden.core import Core as GoldenCore
from opentrn.isa import Fault, Opcode, encode
from opentrn.kernel import same_bits
from opentrn.sim import runner
from opentrn.sim.core import HBMS, CoreRunError, choose_hbm, run_images, run_programs
from opentrn.timeline import ENGINES

from .conftest import float_inputs, require_simulator
from .test_kernel import outside_the_tile_kernel

TINY = config.preset("tiny")


def _int8(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def _kernel_jobs(cfg):
    """``[(label, program, expected)]``: the issue's shapes and every library kernel."""
    rng = np.random.default_rng(11)
    jobs = []
    # 6x600x40 cuts K into parts.
    for m, k, n in [(1, 1, 1), (7, 13, 29), (16, 16, 16), (6, 600, 40)]:
        a, b = _int8(rng, (m, k)), _int8(rng, (k, n))
        program, expected = kernels.gemm(cfg, a.T.copy(), b)
        assert np.array_equal(expected["c"], a.astype(np.int64) @ b.astype(np.int64))
        jobs.append((f"gemm {m}x{k}x{n}", program, expected))
    jobs.append(_one_moving_slot_job(cfg, rng))
    a, b = _int8(rng, (9, 6)), _int8(rng, (6, 35))
    bias = rng.integers(-3000, 3000, 9).astype(np.int32)
    program, expected = kernels.gemm_bias_relu(cfg, a.T.copy(), b, bias, multiplier=3,
                                               shift=7)
    jobs.append(("gemm+bias+relu 9x6x35", program, expected))
    batch, d_in, hidden, d_out = 10, 9, 12, 5
    program, expected = kernels.mlp(
        cfg, _int8(rng, (d_in, batch)), _int8(rng, (d_in, hidden)),
        rng.integers(-500, 500, hidden).astype(np.int32), _int8(rng, (hidden, d_out)),
        rng.integers(-500, 500, d_out).astype(np.int32), requant=((5, 9), (3, 8)))
    jobs.append(("mlp 10x9x12x5", program, expected))
    return jobs


def _one_moving_slot_job(cfg, rng):
    """BF16 6x108x58: two blocks of 32 columns whose 27 K tiles fit the SBUF once, not
    twice, so the schedule keeps one moving slot and refills it for the second block a K
    tile at a time behind the first block's matmuls (docs/kernels.md, "One moving slot");
    asserted, so that a change of the schedule cannot take the case out of the RTL runs."""
    M, K, N = 6, 108, 58
    width, kts, _, buffers = schedule.gemm_tiling(cfg, M, K, N, "bf16")
    assert (buffers, kts) == (1, -(-K // cfg.pe_rows)) and width < N, (width, kts, buffers)
    a, b = (kernels.random_inputs(rng, shape, "bf16") for shape in ((M, K), (K, N)))
    program, expected = kernels.gemm(cfg, a.T.copy(), b)
    return f"bf16 gemm {M}x{K}x{N} (one moving slot)", program, expected


def _float_kernel_jobs(cfg):
    """``[(label, program, expected)]``: every library kernel in each float format of
    ``cfg``, with edge values among the inputs."""
    rng = np.random.default_rng(12)
    jobs = []
    for fmt in (name for name in numerics.float_formats(cfg)
                if not numerics.data_format(name).mx):
        # Edge values in one operand each: an infinity or NaN spreads along its row or
        # column, so most results stay finite (rounding, subnormals, cancellation).
        a = float_inputs(rng, (7, 13), fmt)
        b = float_inputs(rng, (13, 29), fmt, specials=False)
        program, expected = kernels.gemm(cfg, a.T.copy(), b)
        jobs.append((f"{fmt} gemm 7x13x29", program, expected))
        a = float_inputs(rng, (9, 6), fmt, specials=False)
        b = float_inputs(rng, (6, 35), fmt)
        bias = rng.standard_normal(9).astype(np.float32)
        program, expected = kernels.gemm_bias_relu(cfg, a.T.copy(), b, bias, scale=0.375)
        jobs.append((f"{fmt} gemm+bias+relu 9x6x35", program, expected))
        jobs.append(_mlp_job(cfg, rng, fmt, out="fp32" if fmt == "bf16" else fmt))
    jobs.append(("bf16 inf and NaN just outside the tile", *outside_the_tile_kernel(cfg)))
    return jobs + _mx_kernel_jobs(cfg, rng)


def _mlp_job(cfg, rng, fmt, **options):
    """The MLP 10x9x12x5 in the float format ``fmt`` (scales 0.5 and 2.0); in an MX format
    with block scales ``2**-2 .. 2**2``: ``(label, program, expected)``."""
    element = numerics.data_format(fmt).element.name
    batch, d_in, hidden, d_out = 10, 9, 12, 5
    x_t, w1 = (float_inputs(rng, shape, element, specials=False)
               for shape in ((d_in, batch), (d_in, hidden)))
    b1 = rng.standard_normal(hidden).astype(np.float32)
    w2 = float_inputs(rng, (hidden, d_out), element, specials=False)
    b2 = rng.standard_normal(d_out).astype(np.float32)
    if numerics.data_format(fmt).mx:
        options["block_scales"] = (_mx_scales(rng, d_in, batch, 2),
                                   _mx_scales(rng, d_in, hidden, 2),
                                   _mx_scales(rng, hidden, d_out, 2))
    program, expected = kernels.mlp(cfg, x_t, w1, b1, w2, b2, scales=(0.5, 2.0), **options)
    return f"{fmt} mlp {batch}x{d_in}x{hidden}x{d_out}", program, expected


def _mx_scales(rng, rows, cols, spread=5):
    """E8M0 codes ``[ceil(rows / 32), cols]``, ``2**-spread .. 2**spread``."""
    return rng.integers(127 - spread, 128 + spread, (-(-rows // 32), cols)).astype(np.uint8)


def _mx_kernel_jobs(cfg, rng):
    """The library kernels in the MX formats of ``cfg`` (one kernel per format and kind,
    to keep the simulation short): a GEMM whose K spans two blocks of 32 (8 K tiles of the
    4-row array share one block's scales) with NaN, overflowing and underflowing scales,
    GEMM + bias + relu, and the MLP (its hidden layer enters layer 2 with unit scales)."""
    formats = [name for name in numerics.float_formats(cfg) if numerics.data_format(name).mx]
    jobs = []
    for i, fmt in enumerate(formats):
        element = numerics.data_format(fmt).element.name
        if i % 2 == 0:
            M, K, N = 7, 40, 9
            a = float_inputs(rng, (M, K), element, specials=False)
            b = float_inputs(rng, (K, N), element)
            sa, sb = _mx_scales(rng, K, M), _mx_scales(rng, K, N)
            sa[1, 0] = 255                        # E8M0 NaN: row 0 of C is NaN
            sa[0, 1], sb[0, 2] = 254, 254         # overflow
            sa[1, 2], sb[1, 3] = 0, 0             # subnormal or zero products
            program, expected = kernels.gemm(cfg, a.T.copy(), b, block_scales=(sa, sb))
            assert np.isnan(expected["c"][0]).all()
            jobs.append((f"{fmt} gemm {M}x{K}x{N}", program, expected))
        if i % 2 == 1 or len(formats) == 1:
            a = float_inputs(rng, (9, 6), element, specials=False)
            b = float_inputs(rng, (6, 35), element)
            program, expected = kernels.gemm_bias_relu(
                cfg, a.T.copy(), b, rng.standard_normal(9).astype(np.float32), scale=0.375,
                block_scales=(_mx_scales(rng, 6, 9), _mx_scales(rng, 6, 35)))
            jobs.append((f"{fmt} gemm+bias+relu 9x6x35", program, expected))
        jobs.append(_mlp_job(cfg, rng, fmt))
    return jobs


def _stream(*instructions):
    return b"".join(instructions)


def _image(streams, *, size=16384, pointers=None):
    """An HBM image with the three streams at 0x1000, 0x2000, 0x3000 (or ``pointers``)."""
    hbm = np.zeros(size, np.uint8)
    pointers = pointers or (0x1000, 0x2000, 0x3000)
    for pointer, stream in zip(pointers, streams, strict=True):
        if stream:
            hbm[pointer:pointer + len(stream)] = np.frombuffer(stream, np.uint8)
    return hbm, pointers


END = encode(Opcode.END)


def _mx_fault_jobs(cfg):
    """The MX formats' rules: scales must lie in the SBUF; a matmul takes its tile's
    format (MX or not)."""
    if not any(numerics.data_format(name).mx for name in cfg.dtypes):
        return []
    mx = numerics.data_format("mxfp8e4m3").code
    load_mx = encode(Opcode.LOAD_STATIONARY, rows=cfg.pe_rows, cols=cfg.pe_cols, format=mx,
                     scale_offset=8)
    sbuf_bytes = cfg.sbuf_bytes_per_partition
    return [
        ("MX load scales past the SBUF", _image((END, _stream(encode(
            Opcode.LOAD_STATIONARY, rows=1, cols=2, format=mx, scale_offset=sbuf_bytes - 1),
            END), END)), Fault.OUT_OF_RANGE),
        ("MX matmul scales past the SBUF", _image((END, _stream(load_mx, encode(
            Opcode.MATMUL, n=3, format=mx, scale_offset=sbuf_bytes - 2), END), END)),
         Fault.OUT_OF_RANGE),
        ("fp8 matmul on an MX tile", _image((END, _stream(load_mx, encode(
            Opcode.MATMUL, n=1, format=numerics.data_format("fp8e4m3").code), END), END)),
         Fault.BAD_FIELD),
    ]


def _fault_jobs(cfg):
    """``[(label, hbm, pointers, expected fault)]``: one illegal program per fault the
    hardware can meet in a test, each with the rest of the program legal."""
    load = encode(Opcode.LOAD_STATIONARY, rows=cfg.pe_rows, cols=cfg.pe_cols)
    sbuf_bytes = cfg.sbuf_bytes_per_partition
    # HBM -> SBUF, 64 bytes to each partition: fine on its own.
    dma_in = encode(Opcode.DMA, n0=64, n1=cfg.sbuf_partitions, n2=1, src_addr=0x3800,
                    src_stride1=64, dst_space=1, dst_pstep1=1)
    refused = encode(Opcode.DMA, n0=0, n1=1, n2=1, dst_space=1)     # ZERO_SIZE
    nop = encode(Opcode.NOP)
    jobs = [
        ("tensor opcode on the DMA stream", _image((_stream(load, END), END, END)),
         Fault.ILLEGAL_OPCODE),
        ("unknown opcode", _image((END, END, _stream(encode(Opcode.NOP), b"\x7f" + bytes(31)))),
         Fault.ILLEGAL_OPCODE),
        ("semaphore index past the file", _image((
            END, _stream(encode(Opcode.NOP, signal_sem=cfg.semaphores), END), END)),
         Fault.BAD_FIELD),
        ("matmul n = 0", _image((END, _stream(load, encode(Opcode.MATMUL, n=0), END), END)),
         Fault.BAD_FIELD),
        ("matmul before any load", _image((END, _stream(encode(Opcode.MATMUL, n=1), END),
                                           END)), Fault.BAD_FIELD),
        ("stationary past the SBUF", _image((END, _stream(encode(
            Opcode.LOAD_STATIONARY, rows=1, cols=2, sbuf_offset=sbuf_bytes - 1), END), END)),
         Fault.OUT_OF_RANGE),
        ("activation past the PSUM bank", _image((END, END, _stream(encode(
            Opcode.ACTIVATE, n=2, psum_entry=cfg.psum_bank_entries - 1), END))),
         Fault.OUT_OF_RANGE),
        ("DMA of zero bytes", _image((_stream(refused, END), END, END)), Fault.DMA_ERROR),
        # The refused descriptor's own address, though NOPs completed after the one before.
        ("DMA error after NOPs", _image((_stream(dma_in, nop, nop, nop, refused, END), END,
                                         END)), Fault.DMA_ERROR),
        # Descriptors queued behind the refused one still run, and the core goes idle.
        ("DMA error with more queued", _image((_stream(refused, dma_in, dma_in, END), END,
                                               END)), Fault.DMA_ERROR),
        ("DMA address wider than the build", _image((_stream(encode(
            Opcode.DMA, n0=1, n1=1, n2=1, src_addr=1 << 47, dst_space=1), END), END, END)),
         Fault.OUT_OF_RANGE),
        ("load after load", _image((END, _stream(load, load, END), END)), Fault.BAD_FIELD),
        ("BAD_FIELD before OUT_OF_RANGE", _image((END, _stream(load, encode(
            Opcode.MATMUL, n=0, psum_bank=cfg.psum_banks), END), END)), Fault.BAD_FIELD),
        ("int32 activation output misaligned", _image((END, END, _stream(encode(
            Opcode.ACTIVATE, n=1, out_format=7, dst_offset=2), END))), Fault.BAD_FIELD),
        ("DMA past HBM", _image((_stream(encode(
            Opcode.DMA, n0=64, n1=1, n2=1, src_addr=cfg.hbm_bytes - 8, dst_space=1), END),
            END, END)), Fault.DMA_ERROR),
        ("wait that nothing signals", _image((
            END, _stream(encode(Opcode.NOP, signal_sem=0), END),
            _stream(encode(Opcode.NOP, wait_sem=0, wait_value=2), END))), Fault.DEADLOCK),
        ("two engines waiting on each other", _image((
            _stream(encode(Opcode.NOP, wait_sem=1, wait_value=1, signal_sem=0), END),
            _stream(encode(Opcode.NOP, wait_sem=0, wait_value=1, signal_sem=1), END), END)),
         Fault.DEADLOCK),
        ("misaligned program pointer", _image((END, END, END),
                                              pointers=(0x1000, 0x2010, 0x3000)),
         Fault.FETCH_ERROR),
    ]
    if numerics.float_formats(cfg):
        bf16 = numerics.data_format("bf16").code
        load_bf16 = encode(Opcode.LOAD_STATIONARY, rows=cfg.pe_rows, cols=cfg.pe_cols,
                           format=bf16)
        jobs += [
            ("matmul in int32 (not an input format)", _image((END, _stream(
                load, encode(Opcode.MATMUL, n=1, format=7), END), END)), Fault.ILLEGAL_OPCODE),
            ("load in fp32 (not an input format)", _image((END, _stream(encode(
                Opcode.LOAD_STATIONARY, rows=1, cols=1, format=6), END), END)),
             Fault.ILLEGAL_OPCODE),
            ("matmul format differs from the tile's", _image((END, _stream(
                load_bf16, encode(Opcode.MATMUL, n=1, format=0), END), END)), Fault.BAD_FIELD),
            ("bf16 load at an odd offset", _image((END, _stream(encode(
                Opcode.LOAD_STATIONARY, rows=1, cols=1, format=bf16, sbuf_offset=3), END),
                END)), Fault.BAD_FIELD),
            ("bf16 moving columns past the SBUF", _image((END, _stream(load_bf16, encode(
                Opcode.MATMUL, n=2, format=bf16, sbuf_offset=sbuf_bytes - 2), END), END)),
             Fault.OUT_OF_RANGE),
            *_mx_fault_jobs(cfg),
            ("activation to an MX format", _image((END, END, _stream(encode(
                Opcode.ACTIVATE, n=1, out_format=4), END))), Fault.ILLEGAL_OPCODE),
            ("float activation from the SBUF", _image((END, END, _stream(encode(
                Opcode.ACTIVATE, n=1, src=1, out_format=bf16, dst_offset=64), END))),
             Fault.BAD_FIELD),
            ("bf16 activation output misaligned", _image((END, END, _stream(encode(
                Opcode.ACTIVATE, n=1, out_format=bf16, dst_offset=1), END))),
             Fault.BAD_FIELD),
        ]
    # A stream that runs off the end of HBM (a NOP in the last 32 bytes, then nothing).
    hbm = np.zeros(cfg.hbm_bytes, np.uint8)
    last = cfg.hbm_bytes - isa.WORD_BYTES
    hbm[last:] = np.frombuffer(encode(Opcode.NOP), np.uint8)
    for pointer in (0x1000, 0x2000):
        hbm[pointer:pointer + 32] = np.frombuffer(END, np.uint8)
    jobs.append(("stream past the end of HBM", (hbm, (0x1000, 0x2000, last)),
                 Fault.FETCH_ERROR))
    return [(label, image[0], image[1], fault) for label, image, fault in jobs]


@pytest.mark.sim
@pytest.mark.parametrize("sim", runner.SIMULATORS)
def test_core_runs_kernels_and_faults_like_the_golden_machine(sim):
    require_simulator(sim)
    kernel_jobs = _kernel_jobs(TINY) + _float_kernel_jobs(TINY)
    fault_jobs = _fault_jobs(TINY)
    images = [(program.hbm, program.programs) for _, program, _ in kernel_jobs]
    images += [(hbm, pointers) for _, hbm, pointers, _ in fault_jobs]
    outcomes, result = run_images(TINY, images, sim=sim, timeline=True)
    golden = GoldenCore(TINY)

    for (label, program, expected), outcome in zip(kernel_jobs, outcomes[:len(kernel_jobs)],
                                                   strict=True):
        reference = golden.run(program.hbm, program.programs)
        assert outcome.fault == reference.fault == Fault.NONE, (label, outcome)
        # The whole image: outputs, inputs and programs, bit for bit.
        assert np.array_equal(outcome.hbm, reference.hbm[:len(program.hbm)]), label
        outputs = program.read_outputs(outcome.hbm)
        for name, value in expected.items():
            assert same_bits(outputs[name], value), (label, name)
        assert outcome.counters["macs"] == reference.counters["macs"] == program.macs, label
        assert outcome.counters["dma_bytes"] == reference.counters["dma_bytes"], label
        # Every engine was busy at some point and no counter exceeds the run.
        counters = outcome.counters
        assert 0 < counters["tensor_busy"] <= counters["cycles"], label
        assert 0 < counters["activation_busy"] <= counters["cycles"], label
        assert 0 < counters["dma_busy"] <= counters["cycles"], label
        # The cycle model predicts every counter (docs/performance.md, "The cycle model"),
        # and its timeline is the RTL's, event for event: every instruction's hand-over and
        # completion, every semaphore wait, busy cycle and HBM burst (docs/waves.md).
        predicted, timeline = cycle_model.predict_timeline(program)
        assert predicted == counters, label
        assert timeline == outcome.timeline, label
        assert {name: outcome.timeline.busy_cycles(name) for name in ENGINES} == \
            {name: counters[f"{name}_busy"] for name in ENGINES}, label

    for (label, hbm, pointers, fault), outcome in zip(fault_jobs, outcomes[len(kernel_jobs):],
                                                      strict=True):
        reference = golden.run(hbm, pointers)
        assert reference.fault == fault, (label, reference)
        assert (outcome.fault, outcome.engine, outcome.pc, outcome.dma_error_code) == \
            (reference.fault, reference.engine, reference.pc, reference.dma_error_code), label
        # None of these programs writes HBM before its fault: the RTL did not either.
        assert np.array_equal(outcome.hbm, reference.hbm[:len(hbm)]), label


@pytest.mark.sim
def test_core_is_exact_with_hbm_latency_and_backpressure():
    """Random per-burst HBM latency and stalls on every AXI channel change the timing,
    never the results."""
    sim = runner.long_run_simulator()
    require_simulator(sim)
    jobs = _kernel_jobs(TINY)
    picked = [jobs[1], jobs[4], jobs[5]]
    outcomes, _ = run_programs([program for _, program, _ in picked], sim=sim,
                               latency=(0, 40), backpressure=0.3, seed=7)
    golden = GoldenCore(TINY)
    for (label, program, expected), outcome in zip(picked, outcomes, strict=True):
        assert outcome.fault == Fault.NONE, (label, outcome)
        reference = golden.run(program.hbm, program.programs)
        assert np.array_equal(outcome.hbm, reference.hbm[:len(program.hbm)]), label
        outputs = program.read_outputs(outcome.hbm)
        assert all(same_bits(outputs[name], value) for name, value in expected.items())
        # Random latency and stalls are not modelled: the zero-latency prediction is a lower
        # bound of every run (docs/performance.md, "The cycle model").
        assert outcome.counters["cycles"] >= cycle_model.predict(program)["cycles"], label


@pytest.mark.sim
def test_fast_and_axi_hbm_give_the_same_cycles_and_results():
    """At one fixed latency (9; the rest of the suite runs the HBM in hardware at 0) the
    HBM in hardware (``fast``) and cocotbext-axi's RAM (``axi``) give every counter equal,
    cycle for cycle, and the same HBM image, on every library kernel; the cycle model
    predicts both."""
    latency = 9
    sim = runner.long_run_simulator()
    require_simulator(sim)
    jobs = _kernel_jobs(TINY) + _float_kernel_jobs(TINY)[:3]
    programs = [program for _, program, _ in jobs]
    runs = {hbm: run_programs(programs, sim=sim, hbm=hbm, latency=(latency, latency),
                              timeline=True)
            for hbm in HBMS}
    assert {hbm: {r["hbm"] for r in result.reports if r.get("test") == "job"}
            for hbm, (_, result) in runs.items()} == {hbm: {hbm} for hbm in HBMS}
    for index, (label, program, _) in enumerate(jobs):
        fast, axi = (runs[hbm][0][index] for hbm in ("fast", "axi"))
        assert fast.fault == axi.fault == Fault.NONE, label
        assert np.array_equal(fast.hbm, axi.hbm), label
        predicted, timeline = cycle_model.predict_timeline(program, latency=latency)
        assert fast.counters == axi.counters == predicted, label
        assert fast.timeline == axi.timeline == timeline, label


def test_the_fast_hbm_is_chosen_where_it_can_serve():
    assert choose_hbm(TINY) == "fast"
    assert choose_hbm(TINY, latency=(3, 3)) == "fast"
    assert choose_hbm(TINY, latency=(0, 40)) == "axi"
    assert choose_hbm(TINY, backpressure=0.3) == "axi"
    assert choose_hbm(TINY, "axi") == "axi"
    with pytest.raises(ValueError, match=r"hbm='fast' cannot serve this run: "
                       r"latency=\(0, 40\) varies"):
        choose_hbm(TINY, "fast", latency=(0, 40))
    with pytest.raises(ValueError, match="hbm='ddr': must be one of fast, axi"):
        choose_hbm(TINY, "ddr")
    huge = TINY.replace(hbm_bytes=1 << 31)
    assert choose_hbm(huge) == "axi"
    # On Icarus a large fast HBM costs more memory and start-up than it gains.
    large = config.preset("small").replace(hbm_bytes=128 << 20)
    assert choose_hbm(TINY, sim="icarus") == choose_hbm(large, sim="verilator") == "fast"
    assert choose_hbm(large, sim="icarus") == "axi"
    assert choose_hbm(large, "fast", sim="icarus") == "fast"


@pytest.mark.sim
def test_tensor_engine_is_busy_90_percent_on_a_compute_bound_gemm(monkeypatch):
    """A 128x128x128 GEMM on tiny keeps the array busy >= 90% of the kernel's cycles
    (counters) in int8, BF16 and MXFP8, thanks to double buffering, background weight
    loads and a tiling that fits the SBUF without refetching (docs/kernels.md). The run
    also tells its progress (every 0.05 s here, every 5 s by default)."""
    sim = runner.long_run_simulator()
    require_simulator(sim)
    rng = np.random.default_rng(3)
    jobs = []
    for dtype in ("int8", "bf16", "mxfp8e4m3"):
        a, b = (kernels.random_inputs(rng, (128, 128), dtype) for _ in range(2))
        extra = ({"block_scales": (kernels.random_scales(rng, 128, 128),
                                   kernels.random_scales(rng, 128, 128))}
                 if numerics.data_format(dtype).mx else {})
        jobs.append((dtype, *kernels.gemm(TINY, a.T.copy(), b, **extra)))
    monkeypatch.setenv("OPENTRN_PROGRESS_SECONDS", "0.05")
    lines = []
    outcomes, _ = run_programs([program for _, program, _ in jobs], sim=sim,
                               progress=lines.append)
    told = [int(line.split(": ")[1].split()[0].replace(",", "")) for line in lines
            if line.startswith(f"job 1 of {len(jobs)}: ")]
    assert len(told) >= 2 and told == sorted(told), lines
    assert told[-1] < outcomes[0].counters["cycles"]
    for (dtype, program, expected), outcome in zip(jobs, outcomes, strict=True):
        assert outcome.fault == Fault.NONE, dtype
        assert same_bits(program.read_outputs(outcome.hbm)["c"], expected["c"]), dtype
        counters = outcome.counters
        assert counters["macs"] == 128 ** 3, dtype
        assert counters["tensor_busy"] * TINY.peak_macs_per_cycle == counters["macs"], dtype
        assert counters["tensor_busy"] / counters["cycles"] >= 0.90, (dtype, counters)
        assert cycle_model.predict(program) == counters, dtype


@pytest.mark.sim
def test_watchdog_turns_a_hang_into_a_failure_with_the_engine_states():
    """A run that outlives its watchdog (here one far too short for the kernel) fails the
    simulation, and the log shows each sequencer's state."""
    sim = runner.long_run_simulator()
    require_simulator(sim)
    _, program, _ = _kernel_jobs(TINY)[2]
    with pytest.raises(CoreRunError) as info:     # the progress-telling wait, too
        run_programs([program], sim=sim, watchdog=50, progress=lambda text: None)
    log = info.value.result.log.read_text()
    assert "no interrupt within 50 cycles" in log
    for engine in ("DMA", "TENSOR", "ACTIVATION"):
        assert f"{engine}: {{'pc':" in log


@pytest.mark.sim
def test_a_run_does_not_inherit_the_previous_runs_tile():
    """Runs back to back without a soft reset (only a fault needs one): a run that ends
    with a loaded tile not yet used, then a kernel whose first instruction is a load (which
    the previous tile would make a load-after-load fault), then a matmul before any load
    (which the previous tile would let through)."""
    sim = runner.long_run_simulator()
    require_simulator(sim)
    load = encode(Opcode.LOAD_STATIONARY, rows=TINY.pe_rows, cols=TINY.pe_cols)
    matmul = encode(Opcode.MATMUL, n=1)
    leaves_a_tile = _image((END, _stream(load, matmul, load, END), END))
    matmul_first = _image((END, _stream(matmul, END), END))
    _, program, expected = _kernel_jobs(TINY)[2]
    outcomes, _ = run_images(TINY, [
        leaves_a_tile, (program.hbm, program.programs, {"soft_reset": False}),
        (*matmul_first, {"soft_reset": False})], sim=sim)
    assert outcomes[0].fault == Fault.NONE
    assert outcomes[1].fault == Fault.NONE
    assert np.array_equal(program.read_outputs(outcomes[1].hbm)["c"], expected["c"])
    assert (outcomes[2].fault, outcomes[2].pc) == (Fault.BAD_FIELD, 0x2000)


#: The Trainium shape of core at simulation size: no int8 (no integer datapath), FP8 at 2 and
#: MXFP8 at 4 MACs per PE per cycle (packed columns), a 64-byte bus (a beat holds two
#: instruction words), as the trn2/trn3 presets have them.
TRAINIUM_TINY = TINY.replace(dtypes=("bf16", "fp8e4m3", "mxfp8e4m3"),
                             pe_macs_per_cycle=("fp8e4m3:2", "mxfp8e4m3:4"), dma_bus_bytes=64)


@pytest.mark.sim
def test_packed_core_without_int8_is_exact_and_predicted():
    """On the Trainium-shaped tiny core, GEMMs in each format (K over several packed K tiles,
    partial tiles of M and N, MX scales per block of 32 / r partitions): outputs equal the
    numpy reference and the golden machine bit for bit, the MAC counter counts r MACs per PE
    per cycle, and the cycle model predicts every counter."""
    cfg = TRAINIUM_TINY
    sim = runner.default_simulator()
    require_simulator(sim)
    rng = np.random.default_rng(21)
    jobs = []
    for fmt, (m, k, n) in {"bf16": (5, 11, 9), "fp8e4m3": (6, 21, 13),
                           "mxfp8e4m3": (7, 40, 9)}.items():
        element = numerics.data_format(fmt).element.name
        a = float_inputs(rng, (m, k), element, specials=False)
        b = float_inputs(rng, (k, n), element)
        scales = {}
        if numerics.data_format(fmt).mx:
            scales["block_scales"] = (_mx_scales(rng, k, m, 2), _mx_scales(rng, k, n, 2))
        program, expected = kernels.gemm(cfg, a.T.copy(), b, **scales)
        jobs.append((f"{fmt} gemm {m}x{k}x{n}", program, expected))
    outcomes, _ = run_programs([program for _, program, _ in jobs], sim=sim)
    golden = GoldenCore(cfg)
    for (label, program, expected), outcome in zip(jobs, outcomes, strict=True):
        reference = golden.run(program.hbm, program.programs)
        assert outcome.fault == reference.fault == Fault.NONE, (label, outcome)
        assert np.array_equal(outcome.hbm, reference.hbm[:len(program.hbm)]), label
        assert same_bits(program.read_outputs(outcome.hbm)["c"], expected["c"]), label
        assert outcome.counters["macs"] == reference.counters["macs"] == program.macs, label
        assert cycle_model.predict(program) == outcome.counters, label
