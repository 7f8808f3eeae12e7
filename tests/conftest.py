import os

import numpy as np
import pytest

from opentrn import config, numerics
from opentrn.kernel import FORMAT_DTYPES
from opentrn.sim import runner

#: The builds every block's simulation tests run on: the two simulation presets, and 16-bit
#: accumulators (int8 only: int8 sums that wrap, narrower activation inputs).
SIM_BUILDS = {
    "tiny": config.preset("tiny"),
    "small": config.preset("small"),
    "tiny-acc16": config.preset("tiny").replace(dtypes=("int8",), acc_bits=16),
    # Every format with the FP datapath in as many stages as it can be cut into (an FPGA
    # build's, docs/fpga.md, "Float formats"): four registers between the PEs' multipliers
    # and adders (the fpga preset has one; three inside a float multiplier), four in their
    # adders and two in front of the array (the fpga preset has one; the latency formula
    # K (1 + A) + M - 1 + S + I, cycle-exact); the activation lanes' two input stages (the
    # fpga preset has the first), two more multiply stages and four in their adders; four
    # in the PSUM's accumulate; two at each SBUF partition (the fpga preset has one: every
    # SBUF read answered 3 cycles after its grant).
    "tiny-staged": config.preset("tiny").replace(pe_multiply_stages=4, pe_add_stages=4,
                                                 pe_input_stages=2, sbuf_input_stages=2,
                                                 activation_input_stages=2,
                                                 activation_multiply_stages=2,
                                                 activation_add_stages=4, psum_add_stages=4),
}

#: Builds of the tensor engine with more than one MX block (row ``k`` of the array takes the
#: E8M0 scales of block ``k // 32``): 64 rows, two blocks, in one MX format, and two columns
#: (the fewest a config has): 128 FP processing elements, whose Verilog alone takes about
#: 25 s to generate. Its testbench runs a short program (``test_mx_blocks``) on Icarus only
#: (:func:`simulators_for`), about 35 s in all from a cold build cache. ``mx64-fast``: the
#: same with the two-column fast weight load (each block's stationary scales skewed down its
#: rows, both columns' scales in one beat) and an add stage in each PE (rows two cycles
#: apart: 127 cycles of skew, the loads' rows skewed with the vectors).
MX_BUILDS = {
    "mx64": config.preset("tiny").replace(pe_rows=64, pe_cols=2, sbuf_partitions=64,
                                          dtypes=("int8", "mxfp8e4m3")),
}
MX_BUILDS["mx64-fast"] = MX_BUILDS["mx64"].replace(fast_weight_load=2, pe_add_stages=1)

#: trn3 at 1/8 (docs/performance.md, "On the RTL, at trn3's ratios"): a 16x16 array, PSUM
#: banks and SBUF partitions 1/8 as wide, a 32-byte bus, the one DMA engine the RTL builds.
TRN3_16 = config.resolve("trn3", overrides=[
    "pe_rows=16", "pe_cols=16", "sbuf_partitions=16", "moving_max=64", "psum_bank_entries=64",
    "sbuf_bytes_per_partition=32768", "dma_bus_bytes=32", "dma_engines=1",
    "hbm_bytes=16777216"])


def simulators_for(build):
    """The simulators a block testbench runs a build on: builds named like ``tiny``
    (``tiny``, ``sbuf-tiny``: every format the hardware has) on both, the other builds
    (sizes and widths, which do not depend on the simulator) on Icarus only, which needs no
    C++ build: the suite's time budget cannot hold a Verilator build of each."""
    return runner.SIMULATORS if build == "tiny" or build.endswith("-tiny") else ("icarus",)


def sim_runs(builds):
    """``pytest.param(build, sim)`` of each build with :func:`simulators_for` it."""
    return [pytest.param(build, sim, id=f"{build}-{sim}")
            for build in builds for sim in simulators_for(build)]


def require_simulator(sim):
    """Skip a test when ``sim`` cannot run here, with the reason; in CI, fail instead:
    CI must run both simulators."""
    reason = runner.available(sim)
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{sim} is required in CI: {reason}")
    pytest.skip(reason)


def pytest_collection_modifyitems(config, items):
    """Run the simulator tests first: they take minutes where the others take seconds, so
    started last they would leave one test worker busy while the others idle."""
    items.sort(key=lambda item: item.get_closest_marker("sim") is None)


#: Random vectors of the FP unit testbenches per run, by simulator. Icarus evaluates the wide
#: combinational lane vectors about ten times slower than Verilator (a million FP32 sums take
#: over two minutes there), so within the suite's time budget it runs a tenth of them;
#: ``OPENTRN_FULL_FP=1`` runs a million on both (docs/numerics.md gives those runs).
FP_VECTORS = {"verilator": 10**6,
              "icarus": 10**6 if os.environ.get("OPENTRN_FULL_FP") == "1" else 10**5}


def float_inputs(rng, shape, fmt, *, specials=True):
    """Random ``fmt`` values of ``shape`` (normal, then rounded by ml_dtypes), with a few
    edge codes mixed in: zeros of both signs, subnormals, the largest finite values and
    infinities (where the format has them); one NaN with ``specials``."""
    element = numerics.data_format(fmt).element
    values = rng.standard_normal(shape).astype(np.float32).astype(FORMAT_DTYPES[fmt])
    codes = values.view(element.uint_type).copy()
    if specials and codes.size >= 16:
        sign = 1 << (element.bits - 1)
        edges = [0, sign, 1, sign | 1, element.max_finite_bits, sign | element.max_finite_bits]
        if element.has_inf:
            inf = element.exp_max_field << element.man_bits
            edges += [inf, sign | inf]
        flat = codes.reshape(-1)
        spots = rng.choice(flat.size, len(edges) + 1, replace=False)
        for spot, code in zip(spots, edges, strict=False):
            flat[spot] = code
        flat[spots[-1]] = element.canonical_nan
    return codes.view(FORMAT_DTYPES[fmt])
