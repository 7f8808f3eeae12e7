"""An NKI-like kernel builder: tensors in HBM, tiles in the SBUF and PSUM, and the
instructions of the three engine streams (docs/isa.md), with the semaphores inserted for you.

A :class:`Kernel` records instructions in the order of the calls; each call goes to its
engine's stream (``dma`` to the DMA engine, ``load_stationary`` and ``matmul`` to the tensor
engine, ``activation`` to the activation engine). Every instruction reads and writes regions
(a tensor's rows x bytes, a tile's partitions x bytes); for each new instruction the builder
finds the earlier instructions of the other engines it conflicts with (read after write,
write after read, write after write) and makes it wait until they have completed:

* every instruction except ``END`` signals its own engine's semaphore (semaphore ``e`` counts
  the completed instructions of engine ``e``: they complete in program order), so "until
  instruction ``#i`` of engine ``f`` has completed" is the wait ``sem[f] >= i + 1``;
* an instruction has one wait: the largest value needed per engine is kept, and the others
  go into ``NOP`` instructions just before it on its own stream;
* a wait already implied by an earlier wait of the stream (directly, or through what the
  awaited instruction had itself waited for) is dropped;
* the DMA engine runs its descriptors one after another and the tensor engine never reads
  what it writes, so neither waits for itself; the pipelined activation engine waits for
  its own earlier ``ACTIVATE`` when their SBUF bytes conflict.

:meth:`Kernel.build` lays out one HBM image (the three streams at 4 KiB-aligned addresses
from 0, then the tensors, 64-byte aligned) and returns a :class:`Program`, which runs on the
golden machine (:func:`golden_backend`) or on any backend ``(program) -> Outcome``.

Every argument is checked when the call is made: a :class:`KernelError` names the argument,
its value and the rule, so that no instruction the hardware would refuse is ever emitted.

The package, one module a part: :mod:`.builder` (:class:`Kernel`), :mod:`.tensors` (tensors,
tiles, views, DMA patterns), :mod:`.dependencies` (the waits), :mod:`.program`
(:class:`Program`, the golden backend), :mod:`.formats` (each format's numpy dtype,
bit-exact comparison) and :mod:`.errors`.
"""

from .builder import (
    ENGINE_NAMES,
    FUNCTIONS,
    OUTPUT_FILL,
    PROGRAM_ALIGN,
    TENSOR_ALIGN,
    Kernel,
)
from .errors import KernelError, KernelRunError
from .formats import (
    _format_dtypes,
    format_dtype,
    format_of_dtype,
    mismatches,
    same_bits,
    tensor_format,
)
from .program import Program, golden_backend
from .tensors import Pattern, PsumTile, SbufTile, Tensor, View

__all__ = ["Kernel", "KernelError", "KernelRunError", "Program", "Tensor", "SbufTile",
           "PsumTile", "View", "Pattern", "golden_backend", "PROGRAM_ALIGN", "TENSOR_ALIGN",
           "FUNCTIONS", "ENGINE_NAMES", "OUTPUT_FILL", "format_dtype", "format_of_dtype",
           "mismatches", "same_bits", "tensor_format",
           "FORMAT_DTYPES"]  # noqa: F822 (made on first use by __getattr__)


def __getattr__(name):
    # FORMAT_DTYPES: the numpy dtype of each format's elements in HBM tensors (``ml_dtypes``
    # for the float formats below FP32), made when first asked for.
    if name == "FORMAT_DTYPES":
        return _format_dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
