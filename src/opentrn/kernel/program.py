"""A built kernel: its HBM image, where its streams and tensors are, and its runs."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from opentrn import isa
from opentrn.config import Config

from .errors import KernelRunError


def golden_backend(program):
    """Run ``program`` on the golden machine: an ``Outcome``."""
    from opentrn.golden.core import Core
    return Core(program.config).run(program.hbm, program.programs)


@dataclass
class Program:
    """A built kernel: the HBM image holding the three instruction streams and the
    tensors, and where everything is.

    ``hbm`` is the used prefix of HBM (a multiple of 4096 bytes); ``programs`` the byte
    addresses of the DMA, tensor and activation streams; ``inputs`` / ``outputs`` map a
    tensor name to ``(addr, shape, dtype name)``; ``instruction_counts`` the instructions of
    each stream (``NOP`` and ``END`` included), ``opcode_counts`` the same per opcode;
    ``macs`` the useful multiply-accumulates (``rows * cols * n`` of every matmul)."""
    config: Config
    hbm: np.ndarray
    programs: tuple
    inputs: dict
    outputs: dict
    instruction_counts: dict
    macs: int
    name: str = "kernel"
    opcode_counts: dict = field(default_factory=dict)

    def read_outputs(self, hbm):
        """``{name: array}`` of the output tensors in the HBM image ``hbm``."""
        return {name: self._read(hbm, spec) for name, spec in self.outputs.items()}

    def read_inputs(self, hbm=None):
        """``{name: array}`` of the input tensors (in ``hbm``, default the program's)."""
        hbm = self.hbm if hbm is None else hbm
        return {name: self._read(hbm, spec) for name, spec in self.inputs.items()}

    @staticmethod
    def _read(hbm, spec):
        addr, shape, dtype = spec
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize
        hbm = np.asarray(hbm, np.uint8)
        if addr + size > len(hbm):
            raise ValueError(f"hbm has {len(hbm)} bytes: the tensor at {addr} needs "
                             f"{addr + size}")
        return hbm[addr:addr + size].copy().view(dtype.newbyteorder("<")).astype(
            dtype).reshape(shape)

    def run(self, backend: Callable | None = None, *, check=True):
        """Run on ``backend`` (``(program) -> Outcome``, default :func:`golden_backend`):
        ``(outputs, outcome)``. With ``check``, a fault raises :class:`KernelRunError`."""
        outcome = (backend or golden_backend)(self)
        if check and outcome.fault != isa.Fault.NONE:
            raise KernelRunError(
                f"{self.name}: the run ended with {isa.Fault(outcome.fault).name} on engine "
                f"{getattr(outcome.engine, 'name', outcome.engine)} at pc={outcome.pc} "
                f"(dma_error_code="
                f"{outcome.dma_error_code})", outcome)
        return self.read_outputs(outcome.hbm), outcome

    def save(self, path):
        """Write ``<path>.npz`` (the HBM image) and ``<path>.json`` (everything else);
        a ``.npz`` or ``.json`` suffix of ``path`` is dropped. Returns the base path."""
        base = Path(path)
        if base.suffix in (".npz", ".json"):
            base = base.with_suffix("")
        np.savez_compressed(base.with_suffix(".npz"), hbm=self.hbm)
        meta = {
            "name": self.name, "config": self.config.to_dict(),
            "programs": list(self.programs),
            "inputs": {k: [a, list(s), d] for k, (a, s, d) in self.inputs.items()},
            "outputs": {k: [a, list(s), d] for k, (a, s, d) in self.outputs.items()},
            "instruction_counts": self.instruction_counts, "macs": self.macs,
            "opcode_counts": self.opcode_counts,
        }
        base.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
        return base

    @classmethod
    def load(cls, path):
        """The :class:`Program` saved at ``path`` (see :meth:`save`)."""
        base = Path(path)
        if base.suffix in (".npz", ".json"):
            base = base.with_suffix("")
        meta = json.loads(base.with_suffix(".json").read_text())
        with np.load(base.with_suffix(".npz")) as data:
            hbm = data["hbm"]

        def tensors(table):
            return {k: (a, tuple(s), d) for k, (a, s, d) in table.items()}

        return cls(config=Config.from_dict(meta["config"]), hbm=hbm,
                   programs=tuple(meta["programs"]), inputs=tensors(meta["inputs"]),
                   outputs=tensors(meta["outputs"]),
                   instruction_counts=meta["instruction_counts"], macs=meta["macs"],
                   name=meta["name"], opcode_counts=meta.get("opcode_counts", {}))
