"""cocotb testbench of the DMA engine (:mod:`opentrn.hdl.dma`).

HBM is :class:`opentrn.sim.hbm.HbmModel` (cocotbext-axi's AXI4 RAM with latency, random
back-pressure and injected SLVERR/DECERR words); SBUF and PSUM are models of their word
ports on numpy images, with random stalls; a monitor reads the status after every finished
descriptor and clears errors. The scoreboard runs every descriptor on the golden model
(:mod:`opentrn.golden.dma`) and compares the error code of each and, at the end, the whole
HBM, SBUF and PSUM byte for byte.

Environment (set by :mod:`opentrn.sim.runner`): ``OPENTRN_CONFIG``, ``OPENTRN_REPORT``,
``OPENTRN_SEED``, ``OPENTRN_CASES`` (random descriptors, default 300),
``OPENTRN_LATENCY`` and ``OPENTRN_BACKPRESSURE`` (of the HBM model; by default each test
draws every burst's latency from its own range).
"""

import random
import warnings

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, First, Timer

from opentrn.golden import dma as golden
from opentrn.hdl.dma import ErrorCode, Space, buffer_geometry, descriptor_layout
from opentrn.hdl.partitioned_memory import word_request_layout, word_write_layout

from . import harness
from .hbm import HbmModel
from .streams import ClockDomain, PayloadCodec, StreamSource

# cocotbext-axi 0.1.28 still calls cocotb 1 APIs that cocotb 2 deprecates.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"cocotbext\.axi")

HBM_WINDOW = 64 * 1024        # where random traffic goes (the bounds tests go past the end)


def _settings():
    return harness.config(), harness.setting("cases", 300), harness.setting("seed", 1)


# -- agents -----------------------------------------------------------------------------------

class WordPortModel:
    """A buffer as the DMA sees it: word reads answered the cycle after the request, word
    writes with byte enables, both ports stalled at random (as arbitration would)."""

    def __init__(self, domain, dut, name, image, word_bytes, *, stall, rng):
        self.image = image                      # [partitions, bytes] uint8, updated in place
        self.width, self.stall, self.rng = word_bytes, stall, rng
        partitions, depth = image.shape[0], image.shape[1] // word_bytes
        self.req = [getattr(dut, f"{name}_read__request__{s}")
                    for s in ("valid", "ready", "payload")]
        self.resp = [getattr(dut, f"{name}_read__response__{s}") for s in ("valid", "payload")]
        self.write = [getattr(dut, f"{name}_write__{s}") for s in ("valid", "ready", "payload")]
        self.req_codec = PayloadCodec(word_request_layout(partitions, depth))
        self.write_codec = PayloadCodec(word_write_layout(partitions, depth, word_bytes))
        self._answer = self._next_answer = None
        self._req_ready = self._write_ready = False
        self.reads = self.writes = 0
        domain.add(self)

    def drive(self):
        self._answer, self._next_answer = self._next_answer, None
        self.resp[0].value = int(self._answer is not None)
        if self._answer is not None:
            self.resp[1].value = int.from_bytes(self._answer.tobytes(), "little")
        self._req_ready = not (self.stall and self.rng.random() < self.stall)
        self._write_ready = not (self.stall and self.rng.random() < self.stall)
        self.req[1].value = int(self._req_ready)
        self.write[1].value = int(self._write_ready)

    def sample(self, cycle):
        # A read and a write in the same cycle: the read returns the old data.
        if self._req_ready and self.req[0].value:
            request = self.req_codec.decode(self.req[2].value.to_unsigned())
            start = request["word"] * self.width
            self._next_answer = self.image[request["partition"], start:start + self.width].copy()
            self.reads += 1
        if self._write_ready and self.write[0].value:
            write = self.write_codec.decode(self.write[2].value.to_unsigned())
            start = write["word"] * self.width
            for lane in range(self.width):
                if write["strobe"] >> lane & 1:
                    self.image[write["partition"], start + lane] = write["data"][lane]
            self.writes += 1


class StatusMonitor:
    """Reads ``error``/``error_code`` at each ``done`` pulse, records the code, and pulses
    ``clear`` after an error."""

    def __init__(self, domain, dut):
        self.dut, self.codes, self.finished_at = dut, [], []
        self._clear = False
        self.progress = Event()
        dut.clear.value = 0
        domain.add(self)

    def drive(self):
        self.dut.clear.value = int(self._clear)
        self._clear = False

    def sample(self, cycle):
        if self.dut.done.value:
            code = int(self.dut.error_code.value) if self.dut.error.value else 0
            self.codes.append(ErrorCode(code))
            self.finished_at.append(cycle)
            self._clear = code != 0
            self.progress.set()


class ReadPortDriver:
    """Issues reads on a read port (``<name>__request``, answered on ``<name>__response``
    the cycle after the request transfers) and collects the decoded responses in order."""

    def __init__(self, domain, dut, name, request_layout, response_layout):
        self.request = [getattr(dut, f"{name}__request__{s}")
                        for s in ("valid", "ready", "payload")]
        self.response = [getattr(dut, f"{name}__response__{s}") for s in ("valid", "payload")]
        self.request_codec = PayloadCodec(request_layout)
        self.response_codec = PayloadCodec(response_layout)
        self.queue, self.responses, self.outstanding = [], [], 0
        self._presenting = False
        domain.add(self)

    def read(self, requests):
        self.queue.extend(requests)

    @property
    def idle(self):
        return not self.queue and not self._presenting and not self.outstanding

    def drive(self):
        if not self._presenting and self.queue:
            self.request[2].value = self.request_codec.encode(self.queue.pop(0))
            self._presenting = True
        self.request[0].value = int(self._presenting)

    def sample(self, cycle):
        if self.outstanding and self.response[0].value:
            self.responses.append(self.response_codec.decode(self.response[1].value.to_unsigned()))
            self.outstanding -= 1
        if self._presenting and self.request[1].value:
            self._presenting = False
            self.outstanding += 1


# -- descriptors ------------------------------------------------------------------------------

def _side(rng, config, space, length, n1, n2, *, transposed=False):
    """A random side that fits, for ``n2 x n1`` rows of ``length`` bytes."""
    if space == Space.HBM:
        pitch1 = length + int(rng.integers(0, 600)) if rng.random() < 0.8 else \
            int(rng.integers(length, 5000))
        pitch2 = pitch1 * n1 + int(rng.integers(0, 300))
        if transposed:
            pitch1, pitch2 = length, int(rng.integers(n1 * length, n1 * length + 700))
        span = length + (n1 - 1) * pitch1 + (n2 - 1) * pitch2
        addr = int(rng.integers(0, max(1, HBM_WINDOW - span)))
        return golden.Side(space, addr=addr, stride1=pitch1, stride2=pitch2)
    partitions, size = buffer_geometry(config, space)
    if transposed or rng.random() < 0.6:         # rows across partitions, planes along bytes
        pstep1, stride1 = 1, 0
        pstep2, stride2 = 0, length + int(rng.integers(0, 40))
    else:                                        # rows along bytes, planes across partitions
        pstep1, stride1 = 0, length + int(rng.integers(0, 40))
        pstep2, stride2 = 1, 0
    parts = 1 + (n1 - 1) * pstep1 + (n2 - 1) * pstep2
    span = length + (n1 - 1) * stride1 + (n2 - 1) * stride2
    partition = int(rng.integers(0, max(1, partitions - parts + 1)))
    addr = int(rng.integers(0, max(1, size - span + 1)))
    return golden.Side(space, addr=addr, partition=partition, stride1=stride1, stride2=stride2,
                       pstep1=pstep1, pstep2=pstep2)


DIRECTIONS = [
    (Space.HBM, Space.SBUF), (Space.SBUF, Space.HBM), (Space.PSUM, Space.HBM),
    (Space.SBUF, Space.SBUF), (Space.HBM, Space.PSUM), (Space.PSUM, Space.SBUF),
    (Space.SBUF, Space.PSUM), (Space.HBM, Space.HBM),
]


def random_descriptor(rng, config):
    """A valid descriptor of a random direction and shape (unaligned, odd sizes, strides
    across 4 KiB, partial partitions, transposed placements)."""
    while True:
        src_space, dst_space = DIRECTIONS[int(rng.integers(len(DIRECTIONS)))]
        elem_log2 = int(rng.integers(0, 4))
        transposed = rng.random() < 0.15
        buffer_sides = [s for s in (src_space, dst_space) if s != Space.HBM]
        max_parts = min([buffer_geometry(config, s)[0] for s in buffer_sides], default=8)
        if transposed:
            elem_log2 = int(rng.integers(0, 3))
            n0, n1, n2 = 1, int(rng.integers(1, max_parts + 1)), int(rng.integers(1, 12))
        else:
            max_row = 2048 if not buffer_sides else 160
            n0 = max(1, int(rng.integers(1, max_row + 1)) >> elem_log2)
            n1 = int(rng.integers(1, max_parts + 1))
            n2 = int(rng.integers(1, 4))
        length = n0 << elem_log2
        src = _side(rng, config, src_space, length, n1, n2, transposed=transposed)
        dst = _side(rng, config, dst_space, length, n1, n2, transposed=transposed)
        desc = golden.Descriptor(src, dst, n0=n0, n1=n1, n2=n2, elem_log2=elem_log2)
        if golden.check(config, desc) == ErrorCode.OK:
            return desc


def invalid_descriptor(rng, config):
    """A descriptor that must be refused before anything moves."""
    desc = random_descriptor(rng, config)
    kind = int(rng.integers(6))
    if kind == 0:
        return golden.Descriptor(desc.src, desc.dst, n0=desc.n0, n1=0, n2=desc.n2)
    if kind == 1:
        return golden.Descriptor(golden.Side(3), desc.dst, n0=desc.n0)
    if kind == 2:     # a row running past the end of HBM, or of the buffer's bytes
        space, n0 = desc.src.space, max(desc.n0, 2)
        limit = (config.hbm_bytes if space == Space.HBM
                 else buffer_geometry(config, space)[1])
        length = n0 << desc.elem_log2
        src = golden.Side(space, addr=limit - 1 - int(rng.integers(0, length - 1)),
                          partition=desc.src.partition)
        return golden.Descriptor(src, desc.dst, n0=n0, elem_log2=desc.elem_log2)
    if kind == 3:     # past the last partition (or HBM) on the destination
        space = desc.dst.space
        if space == Space.HBM:
            dst = golden.Side(space, addr=config.hbm_bytes - 1, stride1=1)
        else:
            dst = golden.Side(space, partition=buffer_geometry(config, space)[0] - 1, pstep1=1)
        return golden.Descriptor(desc.src, dst, n0=desc.n0, n1=2, elem_log2=desc.elem_log2)
    if kind == 4:     # the first plane fits; the second runs past the end (bytes or parts)
        space, length = desc.src.space, desc.row_bytes
        if space == Space.HBM:
            src = golden.Side(space, addr=config.hbm_bytes - length, stride2=length)
        else:
            src = golden.Side(space, addr=desc.src.addr,
                              partition=buffer_geometry(config, space)[0] - 1, pstep2=1)
        return golden.Descriptor(src, desc.dst, n0=desc.n0, n2=2, elem_log2=desc.elem_log2)
    side = golden.Side(Space.SBUF, addr=8, partition=0, pstep1=1)    # overlapping copy
    return golden.Descriptor(side, golden.Side(Space.SBUF, addr=12, partition=1, pstep1=1),
                             n0=16, n1=2)


# -- the bench --------------------------------------------------------------------------------

class DmaBench:
    """Build with :meth:`create`: the agents start once reset has defined the outputs."""

    # Inputs that the models drive only with a transfer: undriven, Icarus would see them
    # as X and carry the X through logic that ignores them when their valid is low.
    QUIET_INPUTS = ("axi__rdata", "axi__rresp", "axi__rid", "axi__rlast", "axi__bresp",
                    "axi__bid", "descriptor__payload", "descriptor__valid", "clear",
                    # dma top: the buffer models' responses
                    "sbuf_read__response__payload", "psum_read__response__payload",
                    "sbuf_read__response__valid", "psum_read__response__valid",
                    # memory_system top: the engines' ports of the buffers
                    "sbuf_te_read__request__valid", "sbuf_te_read__request__payload",
                    "sbuf_act_read__request__valid", "sbuf_act_read__request__payload",
                    "sbuf_act_write__valid", "sbuf_act_write__payload",
                    "psum_te_write__valid", "psum_te_write__payload",
                    "psum_act_read__request__valid", "psum_act_read__request__payload")

    @classmethod
    async def create(cls, dut, config, **kwargs):
        for name in cls.QUIET_INPUTS:
            if hasattr(dut, name):
                getattr(dut, name).value = 0
        dut.rst.value = 1
        Clock(dut.clk, harness.CLOCK_PERIOD_NS, unit="ns").start()
        await ClockCycles(dut.clk, 2)
        bench = cls(dut, config, **kwargs)
        await ClockCycles(dut.clk, 1)
        dut.rst.value = 0
        return bench

    def __init__(self, dut, config, *, latency, backpressure, stall, seed):
        self.dut, self.config = dut, config
        self.rng = np.random.default_rng(seed)
        prng = random.Random(seed)
        self.domain = ClockDomain(dut.clk)
        self.images = golden.Images.zeros(config)
        window = self.rng.integers(0, 256, HBM_WINDOW, dtype=np.uint8)
        self.images.hbm[:HBM_WINDOW] = window
        self.images.sbuf[:] = self.rng.integers(0, 256, self.images.sbuf.shape)
        self.images.psum[:] = self.rng.integers(0, 256, self.images.psum.shape)
        self.expected = self.images.copy()
        self.hbm = HbmModel(dut, "axi_", dut.clk, size=config.hbm_bytes,
                            period_ns=harness.CLOCK_PERIOD_NS, latency=latency,
                            backpressure=backpressure, seed=seed)
        self.hbm.write(0, window.tobytes())
        # On the `dma` top the buffers are models of their word ports; on `memory_system`
        # they are the SBUF and PSUM hardware, loaded and read back through their
        # engine-side ports.
        self.rtl_buffers = hasattr(dut, "sbuf_act_write__valid")
        if self.rtl_buffers:
            self.sbuf = self.psum = None
            self._rtl_ports(config)
        else:
            self.sbuf = WordPortModel(self.domain, dut, "sbuf", self.images.sbuf,
                                      config.dma_bus_bytes, stall=stall, rng=prng)
            self.psum = WordPortModel(self.domain, dut, "psum", self.images.psum,
                                      config.dma_bus_bytes, stall=stall, rng=prng)
        self.status = StatusMonitor(self.domain, dut)
        self.descriptors = StreamSource(self.domain, dut, "descriptor",
                                        descriptor_layout(config), rng=prng)

    def _rtl_ports(self, config):
        from opentrn.hdl import partitioned_memory as pm
        from opentrn.hdl import psum, sbuf
        parts, width, depth = sbuf.geometry(config)
        self.sbuf_writer = StreamSource(self.domain, self.dut, "sbuf_act_write",
                                        pm.vector_write_layout(parts, width, depth))
        self.sbuf_reader = ReadPortDriver(self.domain, self.dut, "sbuf_act_read",
                                          pm.vector_request_layout(depth),
                                          pm.vector_response_layout(parts, width))
        self.psum_writer = StreamSource(self.domain, self.dut, "psum_te_write",
                                        psum.te_write_layout(config))
        self.psum_reader = ReadPortDriver(self.domain, self.dut, "psum_act_read",
                                          psum.act_request_layout(config),
                                          psum.act_response_layout(config))

    def _psum_entries(self, image):
        """The PSUM image as signed 32-bit entries [partition, bank, entry]."""
        config = self.config
        return image.view("<i4").reshape(config.pe_cols, config.psum_banks,
                                         config.psum_bank_entries)

    async def load_buffers(self):
        """Write the initial SBUF and PSUM images through the engines' ports."""
        if not self.rtl_buffers:
            return
        width = self.config.dma_bus_bytes
        parts = self.images.sbuf.shape[0]
        for word in range(self.images.sbuf.shape[1] // width):
            chunk = self.images.sbuf[:, word * width:(word + 1) * width]
            self.sbuf_writer.send({"word": word, "data": chunk.tolist(),
                                   "strobe": [(1 << width) - 1] * parts})
        entries = self._psum_entries(self.images.psum)
        for bank in range(self.config.psum_banks):
            for entry in range(self.config.psum_bank_entries):
                self.psum_writer.send({"bank": bank, "entry": entry, "accumulate": 0,
                                       "float": 0, "data": entries[:, bank, entry].tolist()})
        while not (self.sbuf_writer.idle and self.psum_writer.idle):
            await ClockCycles(self.dut.clk, 16)
        await ClockCycles(self.dut.clk, 4)

    async def read_buffers(self):
        """The SBUF and PSUM images: the models', or read back from the hardware."""
        if not self.rtl_buffers:
            return self.images.sbuf, self.images.psum
        width = self.config.dma_bus_bytes
        sbuf_image = np.zeros_like(self.images.sbuf)
        psum_image = np.zeros_like(self.images.psum)
        words = self.images.sbuf.shape[1] // width
        self.sbuf_reader.read([{"word": word} for word in range(words)])
        keys = [(bank, entry) for bank in range(self.config.psum_banks)
                for entry in range(self.config.psum_bank_entries)]
        self.psum_reader.read([{"bank": bank, "entry": entry} for bank, entry in keys])
        while not (self.sbuf_reader.idle and self.psum_reader.idle):
            await ClockCycles(self.dut.clk, 16)
        for word, response in enumerate(self.sbuf_reader.responses):
            sbuf_image[:, word * width:(word + 1) * width] = np.array(response["data"])
        entries = self._psum_entries(psum_image)
        for (bank, entry), response in zip(keys, self.psum_reader.responses, strict=True):
            entries[:, bank, entry] = response["data"]
        return sbuf_image, psum_image

    def inject_errors(self, count):
        """``count`` read and ``count`` write error words in the traffic window, both
        kinds of response, shared by the memory model and the golden model."""
        words = self.rng.choice(HBM_WINDOW // self.config.dma_bus_bytes, 2 * count,
                                replace=False)
        for index, word in enumerate(words):
            table = (self.hbm.read_errors, self.hbm.write_errors)[index % 2]
            table[int(word)] = ("SLVERR", "DECERR")[(index // 2) % 2]
        self.expected.read_errors = self.hbm.read_errors
        self.expected.write_errors = self.hbm.write_errors

    async def run(self, descriptors):
        """Run the descriptors (queued all at once); check every code and all memories."""
        want_codes = [golden.execute(self.config, self.expected, d) for d in descriptors]
        start = self.domain.now
        for desc in descriptors:
            self.descriptors.send(desc.payload())
        moved = sum(d.row_bytes * d.n1 * d.n2 for d, c in zip(descriptors, want_codes,
                                                               strict=True)
                    if c not in _REFUSED)
        budget_ns = (200 * len(descriptors) + 40 * moved // self.config.dma_bus_bytes
                     + 100_000) * harness.CLOCK_PERIOD_NS
        timer = Timer(budget_ns, "ns")
        while len(self.status.codes) < len(descriptors):
            self.status.progress.clear()
            if await First(self.status.progress.wait(), timer) is timer:
                raise AssertionError(
                    f"watchdog: {len(self.status.codes)}/{len(descriptors)} descriptors "
                    f"finished; busy={int(self.dut.busy.value)} "
                    f"queue={len(self.descriptors.queue)} "
                    f"completed={int(self.dut.completed.value)}")
        cycles = self.domain.now - start
        await ClockCycles(self.dut.clk, 4)

        code_mismatches = [(i, got, want) for i, (got, want)
                           in enumerate(zip(self.status.codes, want_codes, strict=True))
                           if got != want]
        for index, got, want in code_mismatches[:5]:
            self.dut._log.error("descriptor %d (%s): code %s, golden %s", index,
                                descriptors[index], got.name, want.name)
        hbm = np.frombuffer(self.hbm.read(0, self.config.hbm_bytes), dtype=np.uint8)
        sbuf_image, psum_image = await self.read_buffers()
        differences = {
            "hbm": int(np.count_nonzero(hbm != self.expected.hbm)),
            "sbuf": int(np.count_nonzero(sbuf_image != self.expected.sbuf)),
            "psum": int(np.count_nonzero(psum_image != self.expected.psum)),
        }
        if any(differences.values()):
            self.dut._log.error("bytes differing from the golden model: %s", differences)
        counts = {code.name: want_codes.count(code) for code in ErrorCode
                  if want_codes.count(code)}
        return {"descriptors": len(descriptors), "codes": counts,
                "code_mismatches": len(code_mismatches), "byte_mismatches": differences,
                "bytes_moved": moved, "cycles": cycles,
                "directions": sorted({f"{d.src.space.name}->{d.dst.space.name}"
                                      for d in descriptors if d.src.space != 3})}


_REFUSED = {ErrorCode.ZERO_SIZE, ErrorCode.BAD_SPACE, ErrorCode.SRC_BOUNDS,
            ErrorCode.DST_BOUNDS, ErrorCode.OVERLAP}


def _check(stats):
    assert stats["code_mismatches"] == 0, f"{stats['code_mismatches']} error codes differ"
    assert not any(stats["byte_mismatches"].values()), \
        f"memories differ from the golden model: {stats['byte_mismatches']}"


async def _random_test(dut, name, *, errors, latency, backpressure, stall, invalid):
    config, cases, seed = _settings()
    if (fixed := harness.setting("latency", None)) is not None:
        latency = fixed
    backpressure = harness.setting("backpressure", backpressure, float)
    testbench = await DmaBench.create(dut, config, latency=latency,
                                      backpressure=backpressure, stall=stall, seed=seed)
    if errors:
        testbench.inject_errors(errors)
    await testbench.load_buffers()
    descriptors = [invalid_descriptor(testbench.rng, config) if testbench.rng.random() < invalid
                   else random_descriptor(testbench.rng, config) for _ in range(cases)]
    stats = await testbench.run(descriptors)
    stats.update(test=name, seed=seed, latency=latency, backpressure=backpressure,
                 buffers="rtl" if testbench.rtl_buffers else "model")
    dut._log.info("scoreboard: %s", stats)
    harness.report(stats)
    _check(stats)


@cocotb.test()
async def test_random_descriptors(dut):
    """Random descriptors in every direction, with random HBM latency and back-pressure
    and buffer stalls, some invalid: codes and all memories equal the golden model."""
    await _random_test(dut, "random_descriptors", errors=0, latency=(0, 24),
                       backpressure=0.2, stall=0.2, invalid=0.1)


@cocotb.test()
async def test_axi_errors(dut):
    """Injected SLVERR and DECERR words on reads and writes: the erroring bytes are not
    written, the descriptor ends with the golden code, and the engine goes on after clear."""
    await _random_test(dut, "axi_errors", errors=6, latency=(0, 8), backpressure=0.1,
                       stall=0.1, invalid=0.05)


@cocotb.test()
async def test_throughput(dut):
    """One large contiguous descriptor (``OPENTRN_DIRECTION`` ``hbm_to_sbuf`` or
    ``sbuf_to_hbm``, ``OPENTRN_BYTES`` bytes per partition row, all partitions) with no
    back-pressure: bytes per cycle from the descriptor's acceptance to ``done``."""
    config, _, seed = _settings()
    latency = harness.setting("latency", 0)
    direction = harness.setting("direction", "hbm_to_sbuf", str)
    partitions, size = buffer_geometry(config, Space.SBUF)
    length = min(harness.setting("bytes", size), size)
    testbench = await DmaBench.create(dut, config, latency=latency, backpressure=0.0,
                                      stall=0.0, seed=seed)
    hbm = golden.Side(Space.HBM, addr=0, stride1=length)
    sbuf = golden.Side(Space.SBUF, addr=0, partition=0, pstep1=1)
    src, dst = (hbm, sbuf) if direction == "hbm_to_sbuf" else (sbuf, hbm)
    desc = golden.Descriptor(src, dst, n0=length, n1=partitions)
    await testbench.load_buffers()
    stats = await testbench.run([desc])
    accepted = testbench.descriptors.accepted[0][0]
    cycles = testbench.status.finished_at[0] - accepted + 1
    stats.update(test="throughput", direction=direction, latency=latency,
                 bytes=desc.row_bytes * desc.n1, transfer_cycles=cycles,
                 bytes_per_cycle=desc.row_bytes * desc.n1 / cycles,
                 peak_bytes_per_cycle=config.dma_bus_bytes)
    stats["efficiency"] = stats["bytes_per_cycle"] / config.dma_bus_bytes
    dut._log.info("throughput: %s", stats)
    harness.report(stats)
    _check(stats)
