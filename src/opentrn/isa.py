"""The instruction set of an opentrn core: the binary formats, in one place for the hardware
(:func:`layout`), the golden machine and the kernel API (:func:`encode`, :func:`decode`).

Each engine (DMA, tensor, activation) runs its own stream of instructions from HBM. An
instruction is one 32-byte word, except ``DMA``, which is two (64 bytes). Bit ``i`` of an
instruction is bit ``i % 8`` of byte ``i // 8`` (little-endian). Every instruction starts
with the same 64-bit header:

* ``opcode`` (:class:`Opcode`);
* ``wait``: before it starts, the instruction waits until ``sem[wait_sem] >= wait_value``;
* ``signal``: when it completes, ``sem[signal_sem]`` is incremented by one.

Instructions of one engine complete in program order. Semaphores are 32-bit counters, zero
at start, that only increment. docs/isa.md documents every field and the semantics; its
tables are :func:`markdown` (a test checks they agree).
"""

import enum
from dataclasses import dataclass

__all__ = ["Opcode", "Engine", "Fault", "Field", "FORMATS", "WORD_BYTES", "HEADER_BITS",
           "ENGINE_OPCODES", "instruction_bytes", "encode", "decode", "layout", "fields",
           "markdown", "IsaError"]

#: Bytes of one instruction word.
WORD_BYTES = 32
#: Bits of the common header.
HEADER_BITS = 64


class IsaError(ValueError):
    """An instruction that cannot be encoded: a field value out of its range."""


class Opcode(enum.IntEnum):
    END = 0x00              # end of the stream: the engine finishes once all before it did
    NOP = 0x01              # nothing: a wait and/or a signal only
    DMA = 0x10              # queue one DMA descriptor
    LOAD_STATIONARY = 0x20  # SBUF -> the tensor engine's background weight bank
    MATMUL = 0x21           # moving tile from SBUF through the array -> PSUM
    ACTIVATE = 0x30         # PSUM or SBUF -> activation engine -> SBUF


class Engine(enum.IntEnum):
    """The engines, numbered as in the status register and the program pointers."""
    DMA = 0
    TENSOR = 1
    ACTIVATION = 2


#: The opcodes each engine's sequencer accepts; any other is ``ILLEGAL_OPCODE``.
ENGINE_OPCODES = {
    Engine.DMA: (Opcode.END, Opcode.NOP, Opcode.DMA),
    Engine.TENSOR: (Opcode.END, Opcode.NOP, Opcode.LOAD_STATIONARY, Opcode.MATMUL),
    Engine.ACTIVATION: (Opcode.END, Opcode.NOP, Opcode.ACTIVATE),
}


class Fault(enum.IntEnum):
    """The core's error codes (status register ``error_code``; docs/isa.md, "Errors")."""
    NONE = 0
    ILLEGAL_OPCODE = 1   # unknown opcode, one the engine does not execute, or a format the
                         # build lacks (Config.dtypes)
    BAD_FIELD = 2        # a field outside its rule: semaphore index, n, rows, alignment...
    OUT_OF_RANGE = 3     # an SBUF / PSUM access past the buffer, or a DMA field too wide
    DMA_ERROR = 4        # the DMA finished a descriptor with an error (see dma_error_code)
    DEADLOCK = 5         # every unfinished engine waits on a semaphore and none can change
    FETCH_ERROR = 6      # the instruction fetch left HBM or got an AXI error response


@dataclass(frozen=True)
class Field:
    name: str
    lsb: int
    width: int
    signed: bool = False
    doc: str = ""

    @property
    def msb(self):
        return self.lsb + self.width - 1


_HEADER = (
    Field("opcode", 0, 8, doc="Opcode"),
    Field("wait", 8, 1, doc="1: wait until sem[wait_sem] >= wait_value before starting"),
    Field("signal", 9, 1, doc="1: increment sem[signal_sem] when the instruction completes"),
    Field("wait_sem", 16, 8, doc="semaphore index, < Config.semaphores"),
    Field("signal_sem", 24, 8, doc="semaphore index, < Config.semaphores"),
    Field("wait_value", 32, 32, doc="unsigned"),
)


def _side(prefix, base, what):
    return (
        Field(f"{prefix}_addr", base, 48, doc=f"{what}: HBM byte address, or byte offset in "
              "the first partition"),
        Field(f"{prefix}_stride1", base + 48, 48, doc="bytes between rows along i1"),
        Field(f"{prefix}_stride2", base + 96, 48, doc="bytes between rows along i2"),
        Field(f"{prefix}_partition", base + 144, 8, doc="first partition (buffers)"),
        Field(f"{prefix}_pstep1", base + 152, 8, doc="partition step along i1 (buffers)"),
        Field(f"{prefix}_pstep2", base + 160, 8, doc="partition step along i2 (buffers)"),
    )


#: The fields after the header, by opcode. Bits not covered are reserved: written as zero by
#: the assembler, ignored by the hardware.
FORMATS = {
    Opcode.END: (),
    Opcode.NOP: (),
    Opcode.DMA: (
        Field("src_space", 64, 2, doc="0 HBM, 1 SBUF, 2 PSUM"),
        Field("dst_space", 66, 2, doc="0 HBM, 1 SBUF, 2 PSUM"),
        Field("elem_log2", 68, 2, doc="element size 2**elem_log2 bytes (scales n0)"),
        Field("n0", 80, 16, doc="elements per row"),
        Field("n1", 96, 16, doc="rows along i1"),
        Field("n2", 112, 16, doc="rows along i2"),
        *_side("src", 128, "source"),
        *_side("dst", 320, "destination"),
    ),
    Opcode.LOAD_STATIONARY: (
        Field("sbuf_offset", 64, 32, doc="byte offset of column 0 in partitions 0..rows-1"),
        Field("rows", 96, 16, doc="1..pe_rows: rows (partitions) loaded; the rest are 0"),
        Field("cols", 112, 16, doc="1..pe_cols: columns loaded; the rest are 0"),
        Field("format", 128, 3, doc="element format (docs/numerics.md): 0 int8, 1 bf16, "
              "2 fp8e4m3, 3 fp8e5m2, 4 mxfp8e4m3, 5 mxfp8e5m2; one of Config.dtypes"),
        Field("scale_offset", 160, 32, doc="MX formats: byte offset of the E8M0 scales, "
              "column m's for rows 32b..32b+31 in partition scale_partition + b"),
        Field("scale_partition", 192, 8, doc="MX formats: partition of block 0's scales, a "
              "multiple of the build's blocks (mx_blocks)"),
    ),
    Opcode.MATMUL: (
        Field("sbuf_offset", 64, 32, doc="byte offset of moving column 0 in every partition"),
        Field("n", 96, 16, doc="1..moving_max: moving columns"),
        Field("psum_bank", 112, 8, doc="< psum_banks"),
        Field("psum_entry", 120, 16, doc="first entry; psum_entry + n <= psum_bank_entries"),
        Field("accumulate", 136, 1, doc="1: add to PSUM (int32 or FP32 by format); "
              "0: overwrite"),
        Field("format", 137, 3, doc="element format, that of the stationary tile"),
        Field("scale_offset", 160, 32, doc="MX formats: byte offset of the E8M0 scales, "
              "column j's for rows 32b..32b+31 in partition scale_partition + b"),
        Field("scale_partition", 192, 8, doc="MX formats: partition of block 0's scales, a "
              "multiple of the build's blocks (mx_blocks)"),
    ),
    Opcode.ACTIVATE: (
        Field("src", 64, 1, doc="0: PSUM (bank, entry); 1: SBUF int8 at src_offset "
              "(integer path only)"),
        Field("function", 65, 1, doc="0: identity, 1: relu"),
        Field("bias", 67, 1, doc="1: add the int32 (float path: FP32) at bias_offset of each "
              "partition"),
        Field("out_format", 68, 3, doc="0 int8, 7 int32 (integer path); 6 fp32, 1 bf16, "
              "2 fp8e4m3, 3 fp8e5m2 (float path)"),
        Field("shift", 72, 6, doc="rounding right shift, 0..63 (float path: 0)"),
        Field("n", 80, 16, doc="1..moving_max: vectors (free-axis elements)"),
        Field("multiplier", 96, 32, signed=True, doc="integer path: signed; float path: the "
              "FP32 bits of the scale"),
        Field("src_offset", 128, 32, doc="SBUF byte offset (src = 1)"),
        Field("psum_bank", 160, 8, doc="< psum_banks (src = 0)"),
        Field("psum_entry", 168, 16, doc="psum_entry + n <= psum_bank_entries (src = 0)"),
        Field("dst_offset", 192, 32, doc="SBUF byte offset, a multiple of the output "
              "element's bytes"),
        Field("bias_offset", 224, 32, doc="SBUF byte offset, a multiple of 4 (bias = 1)"),
    ),
}


def instruction_bytes(opcode):
    """Length of an instruction with ``opcode``: 64 bytes for ``DMA``, else 32."""
    return 2 * WORD_BYTES if opcode == Opcode.DMA else WORD_BYTES


def fields(opcode):
    """Every field of an instruction with ``opcode``: the header, then the operands."""
    return _HEADER + FORMATS[Opcode(opcode)]


def encode(opcode, **values):
    """The bytes of one instruction. Missing fields are zero; ``wait=``/``signal=`` are
    implied by giving ``wait_sem``/``signal_sem``. Raises :class:`IsaError` for a value
    that does not fit its field or an unknown field name."""
    try:
        opcode = Opcode(opcode)
    except ValueError:
        raise IsaError(f"opcode={opcode!r}: not an opcode (one of "
                       f"{', '.join(op.name for op in Opcode)})") from None
    values = dict(values)
    if "wait_sem" in values:
        values.setdefault("wait", 1)
    if "signal_sem" in values:
        values.setdefault("signal", 1)
    known = {f.name: f for f in fields(opcode)}
    word = opcode.value
    for name, value in values.items():
        if name not in known:
            raise IsaError(f"{name}: not a field of {opcode.name} "
                           f"(fields: {', '.join(known)})")
        f = known[name]
        value = int(value)
        lo, hi = ((-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1) if f.signed
                  else (0, (1 << f.width) - 1))
        if not lo <= value <= hi:
            raise IsaError(f"{opcode.name}.{name}={value}: must be between {lo} and {hi} "
                           f"({f.width}-bit {'signed' if f.signed else 'unsigned'} field)")
        word |= (value & ((1 << f.width) - 1)) << f.lsb
    return word.to_bytes(instruction_bytes(opcode), "little")


def decode(data, offset=0):
    """``(opcode, fields)`` of the instruction at ``data[offset:]``. An unknown opcode gives
    ``(code, {header fields})`` with the raw ``int`` code; an instruction cut short by the end
    of ``data`` raises :class:`IsaError`."""
    if offset + WORD_BYTES > len(data):
        raise IsaError(f"offset={offset}: no instruction word there ({len(data)} bytes)")
    code = data[offset]
    try:
        opcode = Opcode(code)
    except ValueError:
        opcode = None
    size = instruction_bytes(opcode) if opcode is not None else WORD_BYTES
    if offset + size > len(data):
        raise IsaError(f"offset={offset}: the {opcode.name} instruction needs {size} bytes")
    word = int.from_bytes(bytes(data[offset:offset + size]), "little")
    result = {}
    for f in fields(opcode) if opcode is not None else _HEADER:
        value = (word >> f.lsb) & ((1 << f.width) - 1)
        if f.signed and value >> (f.width - 1):
            value -= 1 << f.width
        result[f.name] = value
    del result["opcode"]
    return (opcode if opcode is not None else code), result


def layout(opcode):
    """An ``amaranth.lib.data.StructLayout`` of the whole instruction (256 or 512 bits),
    fields at their bit positions, reserved bits as ``_reserved_<lsb>``."""
    from amaranth import signed, unsigned
    from amaranth.lib import data

    members, position = {}, 0
    for f in sorted(fields(opcode), key=lambda f: f.lsb):
        if f.lsb > position:
            members[f"_reserved_{position}"] = unsigned(f.lsb - position)
        members[f.name] = signed(f.width) if f.signed else unsigned(f.width)
        position = f.lsb + f.width
    total = 8 * instruction_bytes(opcode)
    if position < total:
        members[f"_reserved_{position}"] = unsigned(total - position)
    return data.StructLayout(members)


def markdown():
    """The field tables of docs/isa.md."""
    lines = []
    for title, table in [("Header (every instruction)", _HEADER)] + [
            (f"`{op.name}` (opcode 0x{op.value:02x}, {instruction_bytes(op)} bytes)",
             FORMATS[op]) for op in Opcode if FORMATS[op]]:
        lines += [f"#### {title}", "", "| bits | field | type | meaning |",
                  "|---|---|---|---|"]
        for f in table:
            kind = f"s{f.width}" if f.signed else f"u{f.width}"
            lines.append(f"| {f.msb}:{f.lsb} | `{f.name}` | {kind} | {f.doc} |")
        lines.append("")
    return "\n".join(lines)
