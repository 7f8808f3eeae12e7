"""The configuration layer: one frozen :class:`Config` sizes the hardware, the golden
models and the performance projections.

A config comes from a preset, optionally a TOML file of overrides, then ``key=value``
overrides, in that order (:func:`resolve`). Every field is checked by :meth:`Config.validate`;
a bad value raises :class:`ConfigError` naming the field, the value and the rule.

The ``trn2`` and ``trn3`` presets carry the published figures of
``shared/reference/trainium.toml`` (AWS Neuron documentation); the fields the documentation
does not publish (the DMA bus width) are modelling choices, documented in docs/architecture.md.
"""

import dataclasses
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

from opentrn import numerics

__all__ = ["Config", "ConfigError", "PRESETS", "PUBLISHED", "DTYPES", "preset", "resolve",
           "parse_overrides", "load_file", "reference", "VECTOR_WORD_MAX_BYTES"]


class ConfigError(ValueError):
    """An invalid configuration value, key or combination."""


#: Input formats of the tensor engine, with their storage width in bits (docs/numerics.md).
DTYPES = {name: numerics.data_format(name).bytes * 8 for name in numerics.TENSOR_FORMATS}

#: The widest word of one partition in an engine's SBUF or PSUM access
#: (:attr:`Config.vector_word_bytes`).
VECTOR_WORD_MAX_BYTES = 32

_KiB = 1024
_MiB = 1024 * _KiB
_GiB = 1024 * _MiB


def _is_pow2(value):
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True, kw_only=True)
class Config:
    """Every size of one opentrn core and the chip and server it sits in.

    Fields
    ------
    pe_rows : int
        Rows of the systolic array: the contraction dimension K of one matmul, one row per
        SBUF partition.
    pe_cols : int
        Columns of the systolic array: the M dimension (output partitions) of one matmul.
    dtypes : tuple of str
        Input formats the tensor engine of this build supports (each matmul names one):
        ``int8``, ``bf16``, ``fp8e4m3``, ``fp8e5m2``, ``mxfp8e4m3``, ``mxfp8e5m2``
        (docs/numerics.md). The hardware builds every one of them; the integer path only
        when ``int8`` is listed (the ``trn2``/``trn3`` presets list their published float
        formats only).
    pe_macs_per_cycle : tuple of str
        Multiply-accumulates per PE per cycle of a format, as ``"format:count"`` items
        (``("mxfp8e4m3:4", "mxfp8e5m2:4")``); a format not listed does 1. Each count is a
        power of two from 1 to 16. The hardware builds it: a PE of rate ``r`` takes a column
        of ``r`` consecutive elements of K per cycle (docs/isa.md, "Packed columns"), so a
        matmul contracts ``r x pe_rows`` elements; the projection uses the same rates.
    pe_multiply_stages : int
        Registers between a PE's multipliers and its accumulating adders, 0 to 4 (with two
        or more, a float lane's first inside its multiplier, after the significand
        product, with three or more its second too, after the normalization, with four its
        third, after the subnormal shift; one always after the product): 0 multiplies and
        accumulates in one cycle; each stage adds a cycle to the array's latency (a moving
        vector's result leaves ``K (1 + pe_add_stages) + M - 1 + pe_multiply_stages +
        pe_input_stages`` cycles after it) and nothing to its throughput, so an FPGA
        build reaches its clock (the ``fpga`` preset has 1; docs/fpga.md, "Timing").
    pe_input_stages : int
        Registers in front of the array, 0 to 2: every row's moving vectors (with their
        weight bank, format and scales; with ``fast_weight_load``, the skewed stationary
        writes too) pass them, so the first row's multipliers start from flip-flops rather
        than from the tensor unit's choice of the vector. Each adds a cycle to the array's
        latency (``K (1 + pe_add_stages) + M - 1 + pe_multiply_stages + pe_input_stages``)
        and nothing to its throughput or its reloads: without the fast load a stationary
        beat still writes every row as it is taken, which the reload guard allows for two
        stages (the retired tile's last vector has passed each column by then), not three.
        The ``fpga`` preset has 1 (docs/fpga.md, "Timing").
    pe_add_stages : int
        Registers inside each PE's accumulating FP32 adder, 0 to 4 (after the alignment,
        after the add, after the ordering of the operands, after the normalization, in
        that order; the integer sum is delayed to match): each delays a partial sum a
        cycle more per row, so the moving vectors' skew is ``1 + pe_add_stages`` cycles a
        row, the array's latency ``K (1 + pe_add_stages) + M - 1 + pe_multiply_stages +
        pe_input_stages`` and, without ``fast_weight_load``, a reload of a retired bank
        waits ``K + (K - 1) pe_add_stages`` cycles; the throughput does not change. Needs
        one MAC per PE per cycle in every format (``pe_macs_per_cycle`` empty). For an
        FPGA build with float formats (docs/fpga.md, "Float formats").
    activation_input_stages : int
        Stages in front of the activation lanes' multipliers, 0 to 2: 1 takes the choice
        of a lane's input (a PSUM entry, or a byte of an SBUF word) off the path into its
        32 x 32 bit multiply (a register of the input), and cuts its FP32 multiplier after
        the significand product; 2 also registers the float path's input and scale (its
        decode and multiply then start from flip-flops), the integer path's input delayed
        to match.
        Each is a cycle more of the engine's latency (an ACTIVATE retires ``n + 7 +
        activation_input_stages`` cycles after it is handed over) and nothing of its
        throughput (the ``fpga`` preset has 1; docs/fpga.md, "Timing").
    activation_multiply_stages : int
        0 to 2: more registers inside each activation lane's FP32 multiplier, after its
        normalization, then after its subnormal shift, when ``activation_input_stages``
        already cuts it after the significand product (else there first), the integer
        path's product delayed to match: a cycle more of an ACTIVATE's latency each, nothing
        of its throughput. For an FPGA build with float formats (docs/fpga.md, "Float
        formats").
    activation_add_stages : int
        Registers inside each activation lane's FP32 adder (the float path's bias add), 0
        to 4 (cut as ``pe_add_stages`` cuts a PE's; the integer path's bias add delayed to
        match): each adds a cycle to the engine's latency (an ACTIVATE retires ``n + 7 +
        activation_input_stages + activation_multiply_stages + activation_add_stages``
        cycles after it is handed over)
        and nothing to its throughput. For an FPGA build with float formats (docs/fpga.md,
        "Float formats").
    psum_add_stages : int
        Registers inside the PSUM's accumulate, 0 to 4 (its FP32 adder cut as
        ``pe_add_stages`` cuts a PE's; the integer sum delayed to match): a result beat is
        written back ``2 + psum_add_stages`` cycles after the PSUM accepts it, so a matmul
        retires that much later, and a moving vector that accumulates into a PSUM entry
        enters the array only ``psum_add_stages + 1`` cycles or more after the last vector
        into that entry (a sum cannot be forwarded unfinished; back-to-back matmuls into
        the same entries wait only when they have at most ``psum_add_stages`` vectors).
        For an FPGA build with float formats (docs/fpga.md, "Float formats").
    fast_weight_load : int
        0, 1 or 2. 1 writes each stationary column into the array's idle weight bank row by
        row, skewed like the moving vectors (row ``k`` ``k`` cycles after row 0), so a load
        follows the wavefront of the tile it replaces instead of waiting ``pe_rows`` cycles
        for it to leave the array: back-to-back matmuls that each take a fresh tile issue
        every ``max(N, pe_cols + 1)`` cycles instead of ``max(N, pe_rows + pe_cols)``. 2
        also loads two columns a cycle (a load takes ``pe_cols / 2`` cycles) into a third
        weight bank, so a tile loads while the next one waits for its swap: every
        ``max(N, pe_cols / 2)`` cycles, 64 at 128x128 (docs/architecture.md, "Timing"). 1
        costs a skew register per row for the stationary column (as wide as the moving
        one); 2 twice that and a third weight register in every PE. 2 in the
        ``trn2``/``trn3`` presets.
    acc_bits : int
        Width of the accumulator: two's-complement wrap-around for ``int8``; 32 (FP32) when
        any float format is in ``dtypes``.
    moving_max : int
        Largest N (moving vectors) of one matmul: one PSUM bank.
    sbuf_partitions, sbuf_bytes_per_partition : int
        State buffer geometry.
    sbuf_input_stages : int
        Registers between the SBUF's arbiters and each partition's SRAM, 0 to 2: the
        granted read's address and enable and the granted write's address, data and byte
        enables pass them at every partition, so the arbitration does not drive the block
        RAMs of all partitions, spread over an FPGA, in the cycle of the grant. Reads and
        writes pass the same number, so they meet the memory in the order they were granted
        (a read still sees every write granted before it); each adds a cycle to every SBUF
        read's latency: the response comes ``1 + sbuf_input_stages`` cycles after the grant
        (docs/architecture.md, "Timing"). The ``fpga`` preset has 1 (docs/fpga.md,
        "Timing").
    psum_banks, psum_bank_entries : int
        Partial-sum buffer geometry (per PSUM partition; ``pe_cols`` partitions).
    dma_bus_bytes : int
        Data width of the AXI4 master to HBM, in bytes.
    dma_engines : int
        DMA engines per core.
    semaphores : int
        Hardware semaphores shared by the core's instruction sequencers (docs/isa.md).
    hbm_bytes : int
        HBM capacity addressed by the core's AXI master.
    clock_hz : int
        Core clock.
    cores_per_chip, chips_per_server : int
        Scale-up figures for performance projections.
    hbm_bytes_per_s, link_bytes_per_s : float
        Chip-level HBM bandwidth and inter-chip (NeuronLink) bandwidth per chip.
    """

    pe_rows: int
    pe_cols: int
    dtypes: tuple
    pe_macs_per_cycle: tuple = ()
    pe_multiply_stages: int = 0
    pe_input_stages: int = 0
    pe_add_stages: int = 0
    activation_input_stages: int = 0
    activation_multiply_stages: int = 0
    activation_add_stages: int = 0
    psum_add_stages: int = 0
    fast_weight_load: int = 0
    acc_bits: int
    moving_max: int
    sbuf_partitions: int
    sbuf_bytes_per_partition: int
    sbuf_input_stages: int = 0
    psum_banks: int
    psum_bank_entries: int
    dma_bus_bytes: int
    dma_engines: int
    semaphores: int
    hbm_bytes: int
    clock_hz: int
    cores_per_chip: int
    chips_per_server: int
    hbm_bytes_per_s: float
    link_bytes_per_s: float

    def __post_init__(self):
        self.validate()

    # -- validation -------------------------------------------------------------------------

    def validate(self):
        """Raise :class:`ConfigError` for the first field that breaks its rule."""
        for f in fields(self):
            value = getattr(self, f.name)
            expected = _FIELD_TYPES[f.name]
            if expected is float:
                ok = isinstance(value, int | float) and not isinstance(value, bool)
            else:
                ok = isinstance(value, expected) and not isinstance(value, bool)
            if expected is tuple and not ok:
                raise ConfigError(f"{f.name}={value!r}: must be a list of "
                                  f"{_TUPLE_ITEMS[f.name]}")
            if not ok:
                raise ConfigError(
                    f"{f.name}={value!r}: must be of type {expected.__name__}")

        def rule(field, ok, text):
            if not ok:
                raise ConfigError(f"{field}={getattr(self, field)!r}: {text}")

        for name in ("pe_rows", "pe_cols"):
            value = getattr(self, name)
            rule(name, _is_pow2(value) and 2 <= value <= 256,
                 "must be a power of two between 2 and 256")
        rule("dtypes", len(self.dtypes) >= 1 and all(isinstance(name, str) and name in DTYPES
                                                     for name in self.dtypes),
             f"must be a non-empty list of {', '.join(DTYPES)}")
        rule("dtypes", len(set(self.dtypes)) == len(self.dtypes), "must not repeat a format")
        self._pe_macs()         # checks pe_macs_per_cycle
        floats = [name for name in self.dtypes if name != "int8"]
        if floats:
            rule("acc_bits", self.acc_bits == 32,
                 f"must be 32 (FP32 accumulation) when dtypes includes {floats[0]}")
        else:
            rule("acc_bits", 16 <= self.acc_bits <= 32,
                 "must be between 16 (one int8 x int8 product) and 32")
        rule("sbuf_partitions", self.sbuf_partitions == self.pe_rows,
             f"must equal pe_rows={self.pe_rows} (one SBUF partition feeds one array row)")
        rule("sbuf_bytes_per_partition",
             self.sbuf_bytes_per_partition % 64 == 0
             and 64 <= self.sbuf_bytes_per_partition <= 16 * _MiB,
             "must be a multiple of 64 between 64 and 16 MiB")
        rule("psum_banks", _is_pow2(self.psum_banks) and self.psum_banks <= 64,
             "must be a power of two between 1 and 64")
        rule("psum_bank_entries",
             _is_pow2(self.psum_bank_entries) and self.psum_bank_entries <= 65536,
             "must be a power of two between 1 and 65536")
        rule("pe_multiply_stages", 0 <= self.pe_multiply_stages <= 4,
             "must be between 0 and 4")
        rule("pe_input_stages", 0 <= self.pe_input_stages <= 2, "must be 0, 1 or 2")
        rule("sbuf_input_stages", 0 <= self.sbuf_input_stages <= 2, "must be 0, 1 or 2")
        rule("pe_add_stages", 0 <= self.pe_add_stages <= 4, "must be between 0 and 4")
        if self.pe_add_stages:
            packed = [name for name in self.dtypes if self.macs_per_pe_cycle(name) > 1]
            rule("pe_add_stages", not packed,
                 f"needs one MAC per PE per cycle in every format, and {', '.join(packed)} "
                 f"{'has' if len(packed) == 1 else 'have'} more (pe_macs_per_cycle): the "
                 "adds of several products a cycle are not pipelined")
        rule("activation_input_stages", 0 <= self.activation_input_stages <= 2,
             "must be 0, 1 or 2")
        rule("activation_multiply_stages", 0 <= self.activation_multiply_stages <= 2,
             "must be 0, 1 or 2")
        rule("activation_add_stages", 0 <= self.activation_add_stages <= 4,
             "must be between 0 and 4")
        rule("psum_add_stages", 0 <= self.psum_add_stages <= 4, "must be between 0 and 4")
        rule("fast_weight_load", 0 <= self.fast_weight_load <= 2, "must be 0, 1 or 2")
        rule("moving_max", 1 <= self.moving_max <= self.psum_bank_entries,
             f"must be between 1 and psum_bank_entries={self.psum_bank_entries} "
             "(one matmul writes one PSUM bank)")
        rule("dma_bus_bytes", _is_pow2(self.dma_bus_bytes) and 4 <= self.dma_bus_bytes <= 128,
             "must be a power of two between 4 and 128 (AXI4 data width 32 to 1024 bits)")
        # The SBUF and PSUM are stored in words of one DMA bus beat.
        rule("sbuf_bytes_per_partition",
             self.sbuf_bytes_per_partition % self.dma_bus_bytes == 0,
             f"must be a multiple of dma_bus_bytes={self.dma_bus_bytes} (SBUF words are one "
             "DMA bus beat)")
        psum_bytes = self.psum_banks * self.psum_bank_entries * 4
        rule("psum_bank_entries", psum_bytes % self.dma_bus_bytes == 0,
             f"psum_banks * psum_bank_entries * 4 = {psum_bytes} bytes must be a multiple of "
             f"dma_bus_bytes={self.dma_bus_bytes} (PSUM words are one DMA bus beat)")
        rule("dma_engines", 1 <= self.dma_engines <= 64, "must be between 1 and 64")
        rule("semaphores", 1 <= self.semaphores <= 256,
             "must be between 1 and 256 (an instruction names one in 8 bits)")
        rule("hbm_bytes", self.hbm_bytes % 4096 == 0 and 4096 <= self.hbm_bytes <= 2**48,
             "must be a multiple of 4096 (one AXI4 burst boundary) between 4 KiB and 256 TiB")
        rule("clock_hz", self.clock_hz > 0, "must be positive")
        rule("cores_per_chip", self.cores_per_chip >= 1, "must be at least 1")
        rule("chips_per_server", self.chips_per_server >= 1, "must be at least 1")
        rule("hbm_bytes_per_s", 0 < self.hbm_bytes_per_s < math.inf,
             "must be positive and finite")
        rule("link_bytes_per_s", 0 <= self.link_bytes_per_s < math.inf,
             "must not be negative, and finite")
        if self.chips_per_server > 1:
            rule("link_bytes_per_s", self.link_bytes_per_s > 0,
                 f"must be positive when chips_per_server={self.chips_per_server} > 1")

    def _pe_macs(self):
        """``pe_macs_per_cycle`` as a dict ``{format: count}``, or :class:`ConfigError` for
        the first item that breaks a rule."""
        rates = {}
        for item in self.pe_macs_per_cycle:
            def refuse(text, item=item):
                raise ConfigError(f"pe_macs_per_cycle={self.pe_macs_per_cycle!r}: {item!r} {text}")
            if not isinstance(item, str):
                refuse("must be a string format:count (e.g. mxfp8e4m3:4)")
            name, sep, count = item.partition(":")
            name, count = name.strip(), count.strip()
            if not sep or not count.isdecimal():
                refuse("must have the form format:count with an integer count (e.g. "
                       "mxfp8e4m3:4)")
            if name not in self.dtypes:
                refuse(f"names a format not in dtypes={','.join(self.dtypes)}")
            if not (_is_pow2(int(count)) and int(count) <= 16):
                refuse("must have a count that is a power of two from 1 to 16")
            if name in rates:
                refuse(f"repeats the format {name} (each format at most once)")
            rates[name] = int(count)
        return rates

    def macs_per_pe_cycle(self, fmt):
        """Multiply-accumulates one PE completes per cycle in format ``fmt``
        (``pe_macs_per_cycle``; 1 for a format not listed there)."""
        if fmt not in self.dtypes:
            raise ConfigError(f"format={fmt!r}: not among this build's formats, dtypes="
                              f"{','.join(self.dtypes)}")
        return self._pe_macs().get(fmt, 1)

    # -- derived sizes ----------------------------------------------------------------------

    @property
    def in_bits(self):
        """Width of the tensor engine's element registers: the widest column of the build's
        formats, ``macs_per_pe_cycle(format)`` elements of ``format`` side by side."""
        return max(DTYPES[name] * self.macs_per_pe_cycle(name) for name in self.dtypes)

    @property
    def vector_word_bytes(self):
        """Bytes of one partition in an engine's access to the SBUF or the PSUM (a vector is
        the word at one index in every partition): ``dma_bus_bytes``, at most
        ``VECTOR_WORD_MAX_BYTES``. The DMA engine moves whole bus words; an engine takes at
        most 4 bytes of a partition per cycle, and a vector of 128 partitions x 64 bytes
        with its byte strobes would be wider than the widest Verilog vector Amaranth writes
        (docs/architecture.md, "The SBUF")."""
        return min(self.dma_bus_bytes, VECTOR_WORD_MAX_BYTES)

    @property
    def load_columns(self):
        """Stationary columns the tensor engine loads per cycle: 2 with
        ``fast_weight_load = 2``, else 1."""
        return 2 if self.fast_weight_load == 2 else 1

    @property
    def weight_banks(self):
        """Weight banks of every PE: 3 with ``fast_weight_load = 2`` (a tile loads while the
        one before it waits for its swap), else 2."""
        return 3 if self.fast_weight_load == 2 else 2

    @property
    def hbm_addr_bits(self):
        """Width of the AXI4 byte address that spans ``hbm_bytes``."""
        return max(12, math.ceil(math.log2(self.hbm_bytes)))

    @property
    def peak_macs_per_cycle(self):
        """Multiply-accumulates the tensor engine completes per cycle at full occupancy."""
        return self.pe_rows * self.pe_cols

    # -- conversions ------------------------------------------------------------------------

    def to_dict(self):
        return dataclasses.asdict(self)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def digest(self):
        """A short stable hash of every field: the key of simulator build caches."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def to_toml(self):
        lines = []
        for key, value in self.to_dict().items():
            if isinstance(value, tuple):
                lines.append(f"{key} = [{', '.join(json.dumps(item) for item in value)}]")
            elif isinstance(value, str):
                lines.append(f'{key} = "{value}"')
            elif isinstance(value, float):
                lines.append(f"{key} = {value!r}")
            else:
                lines.append(f"{key} = {value}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, values):
        unknown = sorted(set(values) - set(_FIELD_TYPES))
        if unknown:
            raise _unknown_key(unknown[0])
        missing = sorted(set(_FIELD_TYPES) - set(values))
        if missing:
            raise ConfigError(f"{missing[0]}: missing configuration key")
        # JSON and TOML give lists where the config holds tuples.
        values = {key: tuple(value) if isinstance(value, list) else value
                  for key, value in values.items()}
        return cls(**values)


_FIELD_TYPES = {
    "pe_rows": int, "pe_cols": int, "dtypes": tuple, "pe_macs_per_cycle": tuple,
    "pe_multiply_stages": int, "pe_input_stages": int, "pe_add_stages": int,
    "activation_input_stages": int,
    "activation_multiply_stages": int,
    "activation_add_stages": int, "psum_add_stages": int, "fast_weight_load": int,
    "acc_bits": int, "moving_max": int,
    "sbuf_partitions": int, "sbuf_bytes_per_partition": int, "sbuf_input_stages": int,
    "psum_banks": int, "psum_bank_entries": int,
    "dma_bus_bytes": int, "dma_engines": int, "semaphores": int, "hbm_bytes": int, "clock_hz": int,
    "cores_per_chip": int, "chips_per_server": int,
    "hbm_bytes_per_s": float, "link_bytes_per_s": float,
}
assert list(_FIELD_TYPES) == [f.name for f in fields(Config)]
#: What the items of each tuple field are, for the type error.
_TUPLE_ITEMS = {"dtypes": "format names", "pe_macs_per_cycle": "format:count items"}


def _unknown_key(key):
    if key == "dtype":
        return ConfigError("dtype: unknown configuration key; it is now dtypes, the list of "
                           "formats a build supports (dtypes=int8 or dtypes=int8,bf16)")
    return ConfigError(f"{key}: unknown configuration key "
                       f"(known keys: {', '.join(_FIELD_TYPES)})")


def _simulation_core(n, *, sbuf_kib, psum_banks, psum_bank_entries, clock_hz=100_000_000):
    """A core for simulation: a single chip with a single core, an FPGA-like clock (100 MHz
    unless given) and a memory that delivers one bus beat per cycle."""
    dma_bus_bytes = 8
    return dict(
        pe_rows=n, pe_cols=n, dtypes=("int8",), pe_macs_per_cycle=(), acc_bits=32,
        moving_max=psum_bank_entries,
        sbuf_partitions=n, sbuf_bytes_per_partition=sbuf_kib * _KiB,
        psum_banks=psum_banks, psum_bank_entries=psum_bank_entries,
        dma_bus_bytes=dma_bus_bytes, dma_engines=1, semaphores=8, hbm_bytes=16 * _MiB,
        clock_hz=clock_hz,
        cores_per_chip=1, chips_per_server=1,
        hbm_bytes_per_s=float(dma_bus_bytes * clock_hz), link_bytes_per_s=0.0,
    )


def reference():
    """The published Trainium figures (a copy of shared/reference/trainium.toml, with the
    source of each figure)."""
    with resources.files("opentrn").joinpath("reference/trainium.toml").open("rb") as f:
        return tomllib.load(f)


#: The tables of the reference file (:func:`reference`) each Trainium preset is built from
#: and published against: ``(neuroncore, chip, system)``. The presets and the projection's
#: published columns (:mod:`opentrn.projection`) both read this one mapping.
PUBLISHED = {
    "trn2": ("v3", "trainium2", "trn2_ultraserver"),
    "trn3": ("v4", "trainium3", "trn3_ultraserver"),
}


def _trainium_core(core, chip, system, dtypes, pe_macs_per_cycle):
    """A NeuronCore of the published figures: ``core``, ``chip`` and ``system`` name tables
    of the reference file."""
    ref = reference()
    core, chip, system = ref["neuroncore"][core], ref["chip"][chip], ref["system"][system]
    psum_bytes = core["psum_kib_per_partition"] * _KiB
    psum_bank_entries = 512                  # "8 banks x 512 fp32 per partition" [nki-arch]
    return dict(
        pe_rows=core["pe_rows"], pe_cols=core["pe_cols"], dtypes=dtypes,
        pe_macs_per_cycle=pe_macs_per_cycle, acc_bits=32,
        fast_weight_load=2,                  # Trainium's fast weight load (the reference file)
        moving_max=psum_bank_entries,        # N <= 512: one PSUM bank [nki-arch]
        sbuf_partitions=core["pe_rows"],
        sbuf_bytes_per_partition=core["sbuf_kib_per_partition"] * _KiB,
        psum_banks=psum_bytes // (psum_bank_entries * 4),
        psum_bank_entries=psum_bank_entries,
        dma_bus_bytes=64,                    # not published: a 512-bit AXI4 modelling choice
        dma_engines=core["dma_engines"],
        semaphores=32,                       # not published: a modelling choice
        hbm_bytes=chip["hbm_gib"] * _GiB,
        clock_hz=round(core["tensor_clock_ghz"] * 1e9),
        cores_per_chip=chip["cores"],
        chips_per_server=system["chips"],
        hbm_bytes_per_s=chip["hbm_tb_s"] * 1e12,
        link_bytes_per_s=chip["link_tb_s"] * 1e12,
    )


#: Named configurations. ``tiny`` is the default for simulation.
PRESETS = {
    # The simulation core of every format the hardware implements; small and fpga are the
    # int8-only build (an FPGA prototype may leave the float units out).
    "tiny": {**_simulation_core(4, sbuf_kib=4, psum_banks=4, psum_bank_entries=16),
             "dtypes": ("int8", "bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2")},
    "small": _simulation_core(8, sbuf_kib=8, psum_banks=4, psum_bank_entries=32),
    # A 4x4 array for an ECP5-85F class FPGA (84k LUTs, 156 18x18 multipliers, 208 x 18 kbit
    # block RAM), the largest whose board top routes there (an 8x8 fits but does not route:
    # docs/fpga.md): SBUF 4 x 16 KiB = 32 block RAMs, PSUM 4 x 4 x 64 x 32 bit; its HBM is
    # on-chip block RAM of the board top, 128 KiB = 64 more. A register after each PE
    # multiplier, one in front of the array, one before each activation lane's multiplier
    # and one at each SBUF partition's inputs; the clock one the board top meets from the
    # ECPIX-5's PLL (docs/fpga.md, "Results").
    "fpga": {**_simulation_core(4, sbuf_kib=16, psum_banks=4, psum_bank_entries=64,
                                clock_hz=80_000_000),
             "hbm_bytes": 128 * _KiB, "pe_multiply_stages": 1, "pe_input_stages": 1,
             "activation_input_stages": 1, "sbuf_input_stages": 1},
    # The formats of the published throughput figures (the reference file): BF16 and FP8 on
    # both, MXFP8 on Trainium3 (nc_matmul_mx). The MAC rates are the ratios of the published
    # per-core figures: NeuronCore-v3 tflops_fp8 158 = 2 x tflops_bf16 79, NeuronCore-v4
    # tflops_mxfp8 315 = 4 x 79; the peaks are then derived, 2 x pe_rows x pe_cols x rate x
    # clock (opentrn project --peaks), not copied. NeuronCore-v4's plain FP8 rate is not
    # published, so trn3 leaves fp8e4m3/fp8e5m2 at 1 rather than guess 2.
    "trn2": _trainium_core(*PUBLISHED["trn2"], ("bf16", "fp8e4m3", "fp8e5m2"),
                           ("fp8e4m3:2", "fp8e5m2:2")),
    "trn3": _trainium_core(*PUBLISHED["trn3"],
                           ("bf16", "fp8e4m3", "fp8e5m2", "mxfp8e4m3", "mxfp8e5m2"),
                           ("mxfp8e4m3:4", "mxfp8e5m2:4")),
}


def preset(name):
    """The :class:`Config` of a named preset."""
    # A file's `preset = [...]` is not a name (and a list is not hashable: no `in` test).
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(f"preset={name!r}: must be one of {', '.join(PRESETS)}")
    return Config(**PRESETS[name])


def _coerce(key, text):
    """Parse the text of a ``key=value`` override by the type of the field."""
    if key not in _FIELD_TYPES:
        raise _unknown_key(key)
    kind = _FIELD_TYPES[key]
    text = text.strip()
    if kind is str:
        return text.strip("\"'")
    if kind is tuple:                     # a comma-separated list: dtypes=int8,bf16
        return tuple(item.strip().strip("\"'") for item in text.strip("[]").split(",")
                     if item.strip())
    try:
        if kind is int:
            try:
                return int(text, 0)
            except ValueError:
                number = float(text)
                if not number.is_integer():
                    raise ValueError from None
                return int(number)
        return float(text)
    except ValueError:
        raise ConfigError(f"{key}={text!r}: must be {'an integer' if kind is int else 'a number'}"
                          ) from None


def parse_overrides(items):
    """Turn ``["pe_rows=8", ...]`` into a dict of typed values."""
    values = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"{item!r}: an override must have the form key=value")
        values[key.strip()] = _coerce(key.strip(), text)
    return values


def load_file(path):
    """Read a TOML file of configuration keys (a flat table; ``preset = "..."`` picks a base)."""
    path = Path(path)
    name = f"file={str(path)!r}"
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a TOML file") from None
    except PermissionError:
        raise ConfigError(f"{name}: not readable (permission denied)") from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: not valid TOML (not UTF-8 text: byte "
                          f"0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: not valid TOML ({exc})") from None
    for key, value in data.items():
        if isinstance(value, dict):
            raise ConfigError(f"{key}: tables are not configuration keys; the file is one flat "
                              "table of key = value")
        if key in _FIELD_TYPES and _FIELD_TYPES[key] is float and isinstance(value, int):
            data[key] = float(value)
    return data


def resolve(preset_name=None, file=None, overrides=()):
    """Resolve a configuration: preset (default ``tiny``, or the file's ``preset`` key), then
    the file's keys, then ``key=value`` overrides."""
    file_values = load_file(file) if file is not None else {}
    base = file_values.pop("preset", None)
    if preset_name is not None:
        base = preset_name
    values = dict(preset(base or "tiny").to_dict())
    for key, value in file_values.items():
        if key not in _FIELD_TYPES:
            raise _unknown_key(key)
        values[key] = value
    values.update(parse_overrides(overrides))
    return Config.from_dict(values)
