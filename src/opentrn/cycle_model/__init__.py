"""The cycle model: the core's timing, predicted from a :class:`~opentrn.config.Config` and a
program, without the RTL.

:func:`predict` runs a program's three instruction streams through a model of the core's
control: the sequencers (instruction fetch over the shared AXI4 read channel, assembly,
checks, semaphore waits, retire queues), the DMA engine (descriptor queue, access-pattern
walks, bursts, the realignment buffer), the tensor unit (the load and matmul paths with their
SBUF column readers, the array's weight banks and its ``K (1 + A) + M - 1`` fill), the
activation unit (PSUM reads, the engine's pipeline, SBUF writes), the arbitration of the
SBUF and PSUM ports, and the HBM of the testbench (``sim/hbm.py``: a read burst's first
beat two cycles after its address, a write response two cycles after the burst's last
beat, one beat per cycle). It moves no data: each block is the RTL's handshakes and
counters, cycle by cycle, so its performance counters equal the RTL's (the tests compare
them on every kernel the suite runs on the RTL and on random GEMM and MLP shapes). Every
rule is the documented behaviour of a block (docs/architecture.md, docs/performance.md "The
cycle model"), sized by ``Config``; nothing is fitted.

The HBM may have a fixed latency (``latency=``): random latencies and back-pressure are not
modelled (the zero-latency prediction is then a lower bound).

:func:`gemm` is the fast path for workloads too large to build as a program: the library
GEMM kernel's steps (:func:`opentrn.schedule.gemm_tiling`), each as long as the larger of
the tensor engine's and the DMA's work in it; its difference from :func:`predict` is bounded
by the tests (docs/performance.md).

One module per block, named as in hdl/ (the sequencers, the DMA engine and its walkers, the
tensor and activation units, the memories' arbitration, the HBM), and :mod:`.core`, whose
``step`` is the clock cycle: every block's requests from registered state, the
arbitration, the datapaths, then the clock edge; :mod:`.gemm` is the fast path.

The model times programs that run to their end without a fault, as every program the
kernel API builds does (the API checks every rule when it emits an instruction). It refuses
an illegal opcode and a deadlock with :class:`ModelError`; the other faults (a field out of
range, a DMA error) it does not look for: the golden machine (:mod:`opentrn.golden.core`)
finds them.
"""

from .activation_unit import activate_overhead
from .axi4_memory import HBM_READ_CYCLES, HBM_WRITE_RESPONSE_CYCLES
from .core import COUNTERS, predict, predict_timeline, simulate, upper_bound
from .dma import DMA_FIFO_LATENCY, DMA_READ_OVERHEAD, DMA_WRITE_OVERHEAD, dma_bytes_per_cycle
from .errors import ModelError
from .gemm import MAX_GEMM_STEPS, Estimate, gemm, random_gemm_shapes

__all__ = ["COUNTERS", "ModelError", "predict", "predict_timeline", "simulate", "gemm",
           "Estimate", "dma_bytes_per_cycle", "upper_bound", "activate_overhead",
           "HBM_READ_CYCLES", "HBM_WRITE_RESPONSE_CYCLES", "DMA_FIFO_LATENCY",
           "DMA_READ_OVERHEAD", "DMA_WRITE_OVERHEAD", "MAX_GEMM_STEPS", "random_gemm_shapes"]
