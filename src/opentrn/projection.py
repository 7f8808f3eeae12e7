"""Performance projection: from one core's cycle model to chips, UltraServers and clusters.

The model
---------
* **Peaks** are derived from the configuration, never copied: a core does
  ``2 x pe_rows x pe_cols x macs_per_pe_cycle(format) x clock_hz`` FLOP/s, a chip
  ``cores_per_chip`` cores, a server ``chips_per_server`` chips. :func:`peaks` prints them
  beside the published figures of the reference file (``config.reference()``) of the preset
  (``config.PUBLISHED``), with both values where AWS's own pages disagree.
* **One core** runs the library GEMM kernel (``opentrn.kernels.gemm``, HBM in, HBM out); its
  time is the cycle model's fast path, ``cycle_model.gemm``, which accounts for the format's
  MAC rate, ``dma_engines`` and the core's share of the chip's HBM bandwidth
  (``cycle_model.dma_bytes_per_cycle``); or, where the exact model follows the
  configuration (one DMA engine at its bus width) and the fast path estimates at most
  :data:`EXACT_MAX_CYCLES`, the exact model's count of the kernel's program
  (``cycle_model.predict``, the RTL's cycles), chosen by ``model=``.
* **One chip** splits a GEMM over its cores by rows (M) or columns (N) of the output, whichever
  is faster; each core runs its share, and the chip takes as long as its largest share. The
  cores share the HBM bandwidth: that is already in each core's DMA rate.
* **Several chips**: data parallel splits M (each chip its rows; no communication in the
  forward pass); tensor parallel splits K (each chip a slice of the contraction) and adds the
  partial outputs by a ring all-reduce. A ring all-reduce of ``B`` bytes over ``N`` chips
  takes ``2 (N - 1) / N x B / link_bytes_per_s`` plus ``2 (N - 1)`` hops of
  ``hop_latency_s`` (0 by default: per-hop latency is ignored unless given).
* **Roofline**: arithmetic intensity = FLOPs / HBM bytes of one chip's share, its inputs read
  once at the format's storage size (MX formats: their E8M0 scales too) and its FP32/INT32
  output written once (the whole GEMM on one chip; data parallel, every chip reads all of B);
  the ridge point is peak FLOP/s over the HBM bandwidth of the cores used
  (``dma_bytes_per_cycle x clock_hz`` each). Below the ridge the GEMM is HBM-bound.
* **A transformer layer** (:func:`transformer_layer`): its six GEMMs timed as above, the
  attention GEMMs one core-time per (batch, head) spread over the cores, plus the
  vector work on the activation engine at its documented rate (docs/architecture.md: an
  ``ACTIVATE`` of ``n`` vectors of ``pe_cols`` lanes retires ``n + 7`` cycles after hand-over;
  one instruction takes at most ``moving_max`` vectors). Tensor parallel over chips in the
  Megatron style: heads and ``d_ff`` split, two all-reduces of the ``[batch x seq, d_model]``
  activations per layer.

What it ignores
---------------
Operations run one after the other (no overlap of the vector work, the communication or
successive GEMMs with each other); no data stays on chip between GEMMs; the network is one
ring of every chip at ``link_bytes_per_s`` (no topology, no congestion, no switch hops,
per-hop latency 0 unless given); no pipeline parallelism or its bubbles, no optimizer step,
no stragglers, no failures; training is modelled as 3x the forward-pass time (the backward
pass does twice the forward FLOPs) plus the gradient all-reduce.
"""

import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache

from opentrn import config as configuration
from opentrn import numerics
from opentrn.config import ConfigError

__all__ = ["EXACT_MAX_CYCLES", "CORE_MODELS", "exact_model_follows", "peak_flops", "peaks",
           "published_preset", "gemm", "gemm_levels",
           "allreduce_seconds", "activation_cycles", "transformer_layer", "scaling",
           "chip_counts", "scalesim", "plot"]


#: The reference file's name of each format in its ``tflops_*``/``pflops_*`` keys: one
#: published figure covers both FP8 formats, and both MXFP8 formats.
_REFERENCE_KEYS = {"int8": "int8", "bf16": "bf16", "fp8e4m3": "fp8", "fp8e5m2": "fp8",
                   "mxfp8e4m3": "mxfp8", "mxfp8e5m2": "mxfp8", "fp32": "fp32"}

#: Levels of the peaks table: (name, unit, scale from FLOP/s).
_LEVELS = (("core", "TFLOPS", 1e12), ("chip", "TFLOPS", 1e12), ("server", "PFLOPS", 1e15))


def _cycle_model():
    # Imported late: the projection's other parts (peaks, SCALE-Sim) do not need it.
    from opentrn import cycle_model
    return cycle_model


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r}: must be a positive integer")
    return value


def _pct(model, published):
    if model is None or not published:
        return None
    return 100 * (model - published) / published


# -- peaks ------------------------------------------------------------------------------------

def peak_flops(config, fmt):
    """FLOP/s of one core in format ``fmt`` at full occupancy (a MAC is 2 FLOPs)."""
    return 2 * config.pe_rows * config.pe_cols * config.macs_per_pe_cycle(fmt) * config.clock_hz


def published_preset(config):
    """The name of the preset in :data:`config.PUBLISHED` that ``config`` equals, or None."""
    for name in configuration.PUBLISHED:
        if config == configuration.preset(name):
            return name
    return None


def _tables(published):
    if published is None:
        return None, None, None, {}
    if published not in configuration.PUBLISHED:
        raise ConfigError(f"published={published!r}: must be one of "
                          f"{', '.join(configuration.PUBLISHED)} (the presets with published "
                          "figures)")
    ref = configuration.reference()
    core, chip, system = configuration.PUBLISHED[published]
    return (ref["neuroncore"][core], ref["chip"][chip], ref["system"][system],
            ref.get("disagreements", {}))


def _disagreement(disagreements, published, level, quantity):
    """The reference file's note where AWS's pages disagree on this figure, or ''."""
    if quantity == "bf16" and level in ("chip", "server"):
        key = "per_core_x8_vs_chip_bf16"
    elif quantity == "HBM bandwidth":
        key = f"{published}_hbm_tb_s"
    elif quantity == "link bandwidth":
        key = f"{published}_link"
    else:
        return ""
    return disagreements.get(key, "")


def peaks(config, *, published="auto"):
    """The peak of every format of ``config.dtypes`` (and FP32, published only: the model has
    no FP32 input format) per core, chip and server, and the chip's and server's HBM, DMA and
    link bandwidth, each beside the published figure of the preset ``published`` (a name of
    :data:`config.PUBLISHED`; ``"auto"``: the preset ``config`` equals, if any; ``None``: no
    published column).

    Rows are dicts: ``level``, ``quantity``, ``unit``, ``model``, ``published`` and
    ``diff_pct`` (model against published), ``published_cores`` and ``diff_cores_pct`` (the
    published per-core figure times the cores, and chips, of the level: where it differs from
    the chip page, AWS's pages disagree), ``note``.
    """
    if published == "auto":
        published = published_preset(config)
    core_ref, chip_ref, system_ref, disagreements = _tables(published)
    refs = {"core": core_ref, "chip": chip_ref, "server": system_ref}
    counts = {"core": 1, "chip": config.cores_per_chip,
              "server": config.cores_per_chip * config.chips_per_server}
    rows = []

    def row(level, quantity, unit, model, published_value, published_cores=None, note=""):
        if published_cores is not None and published_value is not None and \
                math.isclose(published_cores, published_value, rel_tol=1e-9):
            published_cores = None       # the pages agree: one published value
        note = note or (_disagreement(disagreements, published, level, quantity)
                        if published else "")
        rows.append({"level": level, "quantity": quantity, "unit": unit, "model": model,
                     "published": published_value, "diff_pct": _pct(model, published_value),
                     "published_cores": published_cores,
                     "diff_cores_pct": _pct(model, published_cores), "note": note})

    for fmt in (*config.dtypes, "fp32"):
        key = _REFERENCE_KEYS[fmt]
        core_published = core_ref.get(f"tflops_{key}") if core_ref else None
        for level, unit, scale in _LEVELS:
            model = None
            if fmt in config.dtypes:
                model = peak_flops(config, fmt) * counts[level] / scale
            value = None
            if refs[level] is not None:
                prefix = "pflops" if level == "server" else "tflops"
                value = refs[level].get(f"{prefix}_{key}")
            cores = None
            if level != "core" and core_published is not None:
                cores = core_published * counts[level] * 1e12 / scale
            note = "" if model is not None else "not an input format of this model"
            if model is None and value is None and cores is None and core_published is None:
                continue
            row(level, fmt, unit, model, value, cores, note)

    tb = 1e12
    hbm_chip = config.hbm_bytes_per_s / tb
    row("chip", "HBM bandwidth", "TB/s", hbm_chip, chip_ref.get("hbm_tb_s") if chip_ref
        else None)
    row("server", "HBM bandwidth", "TB/s", hbm_chip * config.chips_per_server,
        system_ref.get("hbm_tb_s") if system_ref else None)
    row("chip", "HBM capacity", "GiB", config.hbm_bytes / 2**30,
        chip_ref.get("hbm_gib") if chip_ref else None)
    row("server", "HBM capacity", "GiB", config.hbm_bytes * config.chips_per_server / 2**30,
        system_ref.get("hbm_gib") if system_ref else None)
    dma_chip = (_cycle_model().dma_bytes_per_cycle(config) * config.clock_hz
                * config.cores_per_chip / tb)
    row("chip", "DMA bandwidth", "TB/s", dma_chip, chip_ref.get("dma_tb_s") if chip_ref
        else None, note="the cores' DMA rate: min(dma_engines x dma_bus_bytes, HBM share)")
    row("chip", "link bandwidth", "TB/s", config.link_bytes_per_s / tb,
        chip_ref.get("link_tb_s") if chip_ref else None)
    return rows


# -- one GEMM ---------------------------------------------------------------------------------

#: One core's GEMM comes from the exact model (``cycle_model.predict`` of the kernel's
#: program: the RTL's counters, cycle for cycle) when the configuration is one it follows
#: and the fast path estimates at most this many cycles: about two seconds of building and
#: running the program, where the fast path strays most (docs/performance.md).
EXACT_MAX_CYCLES = 50_000

#: ``model=`` of :func:`gemm`: the exact model where it follows the configuration and
#: the kernel is small enough, else the fast path; the exact model; the fast path.
CORE_MODELS = ("auto", "exact", "fast")


def exact_model_follows(config):
    """The exact model times the RTL's core: one DMA engine moving a bus word a cycle
    (the fast path also models ``dma_engines`` and the core's share of the HBM)."""
    return (config.dma_engines == 1
            and _cycle_model().dma_bytes_per_cycle(config) == config.dma_bus_bytes)


@lru_cache(maxsize=4096)
def _core_gemm(config, m, k, n, dtype, model="auto"):
    """One core's ``cycle_model.Estimate`` of the library GEMM, from the model ``model``
    (:data:`CORE_MODELS`) picks."""
    cycle_model = _cycle_model()
    if model not in CORE_MODELS:
        raise ConfigError(f"model={model!r}: must be one of {', '.join(CORE_MODELS)}")
    fast = cycle_model.gemm(config, m, k, n, dtype=dtype)
    follows = exact_model_follows(config)
    if model == "exact" and not follows:
        raise ConfigError(
            f"model='exact': the exact model follows the RTL's one DMA engine of "
            f"dma_bus_bytes a cycle; this configuration has dma_engines="
            f"{config.dma_engines} and moves "
            f"{cycle_model.dma_bytes_per_cycle(config):g} bytes a cycle")
    if model == "fast" or (model == "auto"
                           and not (follows and fast.cycles <= EXACT_MAX_CYCLES)):
        return fast
    import numpy as np

    from opentrn import kernels
    # The model moves no data: any inputs time the same.
    program = kernels.random_gemm(config, np.random.default_rng(0), m, k, n, dtype)
    counters = cycle_model.predict(program)
    return replace(fast, cycles=counters["cycles"], tensor_busy=counters["tensor_busy"],
                   dma_busy=counters["dma_busy"],
                   activation_busy=counters["activation_busy"],
                   dma_bytes=counters["dma_bytes"], model="exact")


def _chip_gemm(config, m, k, n, dtype, cores, model="auto"):
    """The cycle model's estimate of the busiest core when a chip's ``cores`` split the
    GEMM by M or by N (the faster), with the split: ``(estimate, "M"|"N"|"-", (m, k, n))``."""
    if cores == 1:
        return _core_gemm(config, m, k, n, dtype, model), "-", (m, k, n)
    best = None
    for split, size in (("N", n), ("M", m)):
        share = -(-size // cores)
        shape = (m, k, share) if split == "N" else (share, k, n)
        estimate = _core_gemm(config, *shape, dtype, model)
        if best is None or estimate.cycles < best[0].cycles:
            best = (estimate, split, shape)
    return best


def _storage_bytes(rows, cols, dtype):
    """HBM bytes of a [rows, cols] operand of ``dtype`` with K along rows (MX formats: one
    E8M0 scale byte per block of ``MX_BLOCK`` rows and column)."""
    fmt = numerics.data_format(dtype)
    scales = -(-rows // numerics.MX_BLOCK) * cols if fmt.mx else 0
    return rows * cols * fmt.bytes + scales


def _output_bytes(dtype):
    """Bytes of one GEMM output element: INT32 for int8 inputs, else FP32."""
    return numerics.data_format("int32" if dtype == "int8" else "fp32").bytes


def allreduce_seconds(config, nbytes, chips, *, hop_latency_s=0.0):
    """Ring all-reduce of ``nbytes`` over ``chips`` chips: ``2 (N - 1) / N x bytes / link``
    (reduce-scatter then all-gather, each chip sending and receiving at
    ``link_bytes_per_s``), plus ``2 (N - 1)`` steps of ``hop_latency_s``."""
    if chips == 1:
        return 0.0
    if config.link_bytes_per_s <= 0:
        raise ConfigError(f"link_bytes_per_s={config.link_bytes_per_s!r}: must be positive to "
                          f"project on chips={chips}")
    steps = 2 * (chips - 1)
    return steps / chips * nbytes / config.link_bytes_per_s + steps * hop_latency_s


@dataclass(frozen=True)
class GemmProjection:
    """One GEMM ``C[M, N] = A[M, K] @ B[K, N]`` on ``cores`` cores of each of ``chips``
    chips. Times in seconds, rates in FLOP/s and bytes/s."""

    m: int
    k: int
    n: int
    dtype: str
    cores: int
    chips: int
    parallel: str
    core_split: str          # "M" or "N": how a chip splits its share over its cores
    core_share: tuple        # (m, k, n) of the busiest core
    cycles: int              # of the busiest core (cycle_model.gemm or predict: ``model``)
    tensor_busy: int
    dma_busy: int
    activation_busy: int
    dma_bytes: int           # HBM bytes the busiest core's kernel moves (cycle_model.gemm)
    compute_s: float
    comm_s: float
    seconds: float
    flops: int
    hbm_bytes: int           # inputs read once and output written once by each chip
    intensity: float         # FLOPs per HBM byte of one chip's share
    peak_flops: float
    hbm_bytes_per_s: float
    ridge: float             # FLOPs per byte where the HBM slope meets the peak
    bound: str               # "compute" or "HBM"
    roof_flops: float        # min(peak, intensity x bandwidth)
    achieved_flops: float
    utilization: float       # achieved / peak
    model: str = "fast path"  # of the busiest core's cycles: "exact" or "fast path"

    def to_dict(self):
        return asdict(self)


def gemm(config, m, k, n, *, dtype, cores=1, chips=1, parallel="tensor", hop_latency_s=0.0,
         model="auto"):
    """Project one GEMM on ``cores`` cores per chip and ``chips`` chips (see the module
    docstring: ``parallel="data"`` splits M over the chips, ``"tensor"`` splits K and
    all-reduces the FP32 partial outputs); the busiest core's cycles from ``model``
    (:data:`CORE_MODELS`: by default the exact model where it follows the configuration and
    the kernel has at most :data:`EXACT_MAX_CYCLES`, else the fast path)."""
    m, k, n = (_positive(name, value) for name, value in (("m", m), ("k", k), ("n", n)))
    _positive("chips", chips)
    if not (isinstance(cores, int) and 1 <= cores <= config.cores_per_chip):
        raise ConfigError(f"cores={cores!r}: must be between 1 and cores_per_chip="
                          f"{config.cores_per_chip}")
    if parallel not in ("tensor", "data"):
        raise ConfigError(f"parallel={parallel!r}: must be tensor or data")
    rate = peak_flops(config, dtype)                      # refuses a format not in dtypes
    comm = 0.0
    if parallel == "data":
        shape = (-(-m // chips), k, n)
    else:
        shape = (m, -(-k // chips), n)
        comm = allreduce_seconds(config, m * n * _output_bytes(dtype), chips,
                                 hop_latency_s=hop_latency_s)
    estimate, split, share = _chip_gemm(config, *shape, dtype, cores, model)
    compute = estimate.cycles / config.clock_hz
    seconds = compute + comm
    flops = 2 * m * k * n
    # Each chip reads the inputs of its share once and writes its output once: data
    # parallel, every chip reads all of B; tensor parallel, every chip writes a whole C of
    # partial sums.
    chip_m, chip_k, chip_n = shape
    chip_hbm = (_storage_bytes(chip_k, chip_m, dtype) + _storage_bytes(chip_k, chip_n, dtype)
                + chip_m * chip_n * _output_bytes(dtype))
    hbm = chip_hbm * chips
    peak = rate * cores * chips
    bandwidth = _cycle_model().dma_bytes_per_cycle(config) * config.clock_hz * cores * chips
    intensity = 2 * chip_m * chip_k * chip_n / chip_hbm
    ridge = peak / bandwidth
    achieved = flops / seconds
    return GemmProjection(
        m=m, k=k, n=n, dtype=dtype, cores=cores, chips=chips, parallel=parallel,
        core_split=split, core_share=share, cycles=estimate.cycles,
        tensor_busy=estimate.tensor_busy, dma_busy=estimate.dma_busy,
        activation_busy=estimate.activation_busy, dma_bytes=estimate.dma_bytes,
        compute_s=compute, comm_s=comm,
        seconds=seconds, flops=flops, hbm_bytes=hbm, intensity=intensity, peak_flops=peak,
        hbm_bytes_per_s=bandwidth, ridge=ridge,
        bound="compute" if intensity >= ridge else "HBM",
        roof_flops=min(peak, intensity * bandwidth), achieved_flops=achieved,
        utilization=achieved / peak, model=estimate.model)


def gemm_levels(config, m, k, n, *, dtype, cores=None, chips=1, parallel="tensor",
                hop_latency_s=0.0, model="auto"):
    """:func:`gemm` on one core, one chip (``cores``, default ``cores_per_chip``) and, when
    ``chips > 1``, ``chips`` chips: ``[(label, GemmProjection), ...]``."""
    cores = config.cores_per_chip if cores is None else cores
    levels = [("1 core", gemm(config, m, k, n, dtype=dtype, model=model))]
    if cores > 1:
        levels.append((f"1 chip ({cores} cores)", gemm(config, m, k, n, dtype=dtype,
                                                       cores=cores, model=model)))
    if chips > 1:
        levels.append((f"{chips} chips ({parallel})",
                       gemm(config, m, k, n, dtype=dtype, cores=cores, chips=chips,
                            parallel=parallel, hop_latency_s=hop_latency_s, model=model)))
    return levels


# -- a transformer layer ----------------------------------------------------------------------

def activation_cycles(config, elements, *, passes=1, cores=1):
    """Cycles of ``passes`` element-wise passes over ``elements`` values on the activation
    engines of ``cores`` cores: each pass is ``ceil(elements / pe_cols)`` vectors, split over
    the cores, in instructions of at most ``moving_max`` vectors, each ``n +
    cycle_model.activate_overhead(config)`` cycles (``n + 7`` to retire, docs/architecture.md,
    a cycle more with each of ``activation_input_stages``, ``activation_multiply_stages``
    and ``activation_add_stages``, and the cycle the next is handed over in)."""
    vectors = -(-elements // config.pe_cols)
    per_core = -(-vectors // cores)
    instructions = -(-per_core // config.moving_max)
    return passes * (per_core + _cycle_model().activate_overhead(config) * instructions)


#: The element-wise passes of each vector op of a layer: model assumptions, not measurements.
#: Softmax: exp (with the row sums) then normalise (the running max is not modelled);
#: layernorm: statistics then normalise; GELU and a residual add: one pass.
VECTOR_PASSES = {"softmax": 2, "gelu": 1, "layernorm": 2, "residual": 1}


def transformer_layer(config, *, d_model, d_ff, heads, seq, batch, dtype, chips=1,
                      comm_format="bf16", hop_latency_s=0.0):
    """The forward pass of one transformer layer on ``chips`` chips (tensor parallel: each
    chip ``heads / chips`` heads and ``d_ff / chips`` of the FFN, the layer norms and residual
    adds on every chip, two ring all-reduces of the ``[batch x seq, d_model]`` activations in
    ``comm_format``). Returns a dict: ``ops`` (one row per op: kind ``tensor``, ``vector`` or
    ``link``, shape, count, FLOPs per chip, cycles, seconds, share of the time) and the
    totals."""
    for name, value in (("d_model", d_model), ("d_ff", d_ff), ("heads", heads), ("seq", seq),
                        ("batch", batch), ("chips", chips)):
        _positive(name, value)
    if d_model % heads:
        raise ConfigError(f"d_model={d_model}: must be a multiple of heads={heads}")
    if chips > heads:
        raise ConfigError(f"chips={chips}: tensor parallelism splits the heads: must be at "
                          f"most heads={heads}")
    cores = config.cores_per_chip
    d_head = d_model // heads
    tokens = batch * seq
    heads_chip = -(-heads // chips)
    ff_chip = -(-d_ff // chips)
    clock = config.clock_hz
    ops = []

    def tensor_op(name, m, k, n, count=1):
        if count == 1:
            cycles = _chip_gemm(config, m, k, n, dtype, cores)[0].cycles
        else:       # one core per (batch, head) GEMM, spread over the cores
            cycles = _core_gemm(config, m, k, n, dtype).cycles * -(-count // cores)
        ops.append({"op": name, "kind": "tensor", "shape": f"{m}x{k}x{n}", "count": count,
                    "flops": 2 * m * k * n * count, "cycles": cycles})

    def vector_op(name, what, elements, count=1):
        cycles = count * activation_cycles(config, elements, passes=VECTOR_PASSES[what],
                                           cores=cores)
        ops.append({"op": name, "kind": "vector", "shape": f"{elements} elements x "
                    f"{VECTOR_PASSES[what]} passes", "count": count, "flops": 0,
                    "cycles": cycles})

    vector_op("layernorm (attention)", "layernorm", tokens * d_model)
    tensor_op("QKV projection", tokens, d_model, 3 * heads_chip * d_head)
    tensor_op("scores Q K^T", seq, d_head, seq, batch * heads_chip)
    vector_op("softmax", "softmax", batch * heads_chip * seq * seq)
    tensor_op("context P V", seq, seq, d_head, batch * heads_chip)
    tensor_op("output projection", tokens, heads_chip * d_head, d_model)
    vector_op("residual add (attention)", "residual", tokens * d_model)
    vector_op("layernorm (FFN)", "layernorm", tokens * d_model)
    tensor_op("FFN up", tokens, d_model, ff_chip)
    vector_op("GELU", "gelu", tokens * ff_chip)
    tensor_op("FFN down", tokens, ff_chip, d_model)
    vector_op("residual add (FFN)", "residual", tokens * d_model)
    for row in ops:
        row["seconds"] = row["cycles"] / clock
    if chips > 1:
        nbytes = tokens * d_model * numerics.data_format(comm_format).bytes
        seconds = allreduce_seconds(config, nbytes, chips, hop_latency_s=hop_latency_s)
        for where in ("attention", "FFN"):
            ops.append({"op": f"all-reduce ({where})", "kind": "link",
                        "shape": f"{nbytes} bytes over {chips} chips", "count": 1, "flops": 0,
                        "cycles": None, "seconds": seconds})
    total = sum(row["seconds"] for row in ops)
    for row in ops:
        row["share"] = row["seconds"] / total
    flops = (2 * tokens * d_model * 3 * d_model + 2 * 2 * batch * heads * seq * seq * d_head
             + 2 * tokens * d_model * d_model + 2 * 2 * tokens * d_model * d_ff)
    by_kind = {kind: sum(row["seconds"] for row in ops if row["kind"] == kind)
               for kind in ("tensor", "vector", "link")}
    peak = peak_flops(config, dtype) * cores * chips
    return {
        "d_model": d_model, "d_ff": d_ff, "heads": heads, "seq": seq, "batch": batch,
        "dtype": dtype, "chips": chips, "cores_per_chip": cores, "comm_format": comm_format,
        "ops": ops, "seconds": total, "tensor_s": by_kind["tensor"],
        "vector_s": by_kind["vector"], "comm_s": by_kind["link"],
        "compute_share": (by_kind["tensor"] + by_kind["vector"]) / total,
        "comm_share": by_kind["link"] / total, "flops": flops,
        "weights": 4 * d_model * d_model + 2 * d_model * d_ff,
        "achieved_flops": flops / total, "peak_flops": peak,
        "utilization": flops / total / peak,
    }


# -- scaling ----------------------------------------------------------------------------------

def chip_counts(config):
    """Chip counts of a scaling curve: powers of two up to a server, the server, then powers
    of ten up to the largest published cluster (the reference file's
    ``max_chips_clustered``, the only published cluster size)."""
    ref = configuration.reference()
    largest = max(system.get("max_chips_clustered", 0) for system in ref["system"].values())
    counts = {1, config.chips_per_server}
    counts.update(2**i for i in range(1, config.chips_per_server.bit_length())
                  if 2**i < config.chips_per_server)
    power = 10 ** len(str(config.chips_per_server))
    while power <= largest:
        counts.add(power)
        power *= 10
    return sorted(counts)


def _workload_one(config, workload, chips=1):
    """``(seconds, flops, weight elements, communication seconds)`` of ``workload`` on
    ``chips`` chips (tensor parallel), all cores of each."""
    kind = workload["kind"]
    if kind == "gemm":
        result = gemm(config, workload["m"], workload["k"], workload["n"],
                      dtype=workload["dtype"], cores=config.cores_per_chip, chips=chips,
                      parallel="tensor", hop_latency_s=workload.get("hop_latency_s", 0.0))
        return result.seconds, result.flops, workload["k"] * workload["n"], result.comm_s
    if kind == "transformer":
        params = {key: workload[key] for key in ("d_model", "d_ff", "heads", "seq", "batch",
                                                 "dtype")}
        result = transformer_layer(config, **params, chips=chips,
                                   hop_latency_s=workload.get("hop_latency_s", 0.0))
        return result["seconds"], result["flops"], result["weights"], result["comm_s"]
    raise ConfigError(f"workload kind={kind!r}: must be gemm or transformer")


def _tensor_limit(workload):
    return workload["k"] if workload["kind"] == "gemm" else workload["heads"]


def scaling(config, workload, chips_list=None, *, parallel="data", training=True,
            grad_format="bf16", hop_latency_s=0.0):
    """The scaling curve of ``workload`` (``{"kind": "gemm", "m", "k", "n", "dtype"}`` or
    ``{"kind": "transformer", "d_model", "d_ff", "heads", "seq", "batch", "dtype"}``) over
    ``chips_list`` (default :func:`chip_counts`).

    ``parallel="data"``: weak scaling: each chip runs the workload as given (its batch
    share; the global batch grows with the chips); with ``training`` a step is 3x the forward
    time plus the ring all-reduce of the weights' gradients (``grad_format``) over all the
    chips, else the forward pass alone. ``parallel="tensor"``: strong scaling of the one
    workload (K split for a GEMM, heads for a layer), for as many chips as the split allows
    (rows beyond it are left out). Rows: ``chips``, ``seconds``, ``comm_s``,
    ``achieved_flops``, ``peak_flops``, ``efficiency`` (achieved over chips x one chip's
    achieved)."""
    chips_list = chip_counts(config) if chips_list is None else chips_list
    if parallel not in ("tensor", "data"):
        raise ConfigError(f"parallel={parallel!r}: must be tensor or data")
    workload = {**workload, "hop_latency_s": hop_latency_s}
    peak_chip = peak_flops(config, workload["dtype"]) * config.cores_per_chip
    one_s, flops, weights, _ = _workload_one(config, workload)
    factor = 3 if training and parallel == "data" else 1
    one_rate = flops / one_s                 # FLOP/s of one chip
    rows = []
    for chips in chips_list:
        _positive("chips", chips)
        if parallel == "data":
            comm = 0.0
            if training:
                comm = allreduce_seconds(
                    config, weights * numerics.data_format(grad_format).bytes, chips,
                    hop_latency_s=hop_latency_s)
            seconds = factor * one_s + comm
            total_flops = factor * flops * chips
        else:
            if chips > _tensor_limit(workload):
                continue
            seconds, total_flops, _, comm = _workload_one(config, workload, chips)
        achieved = total_flops / seconds
        rows.append({"chips": chips, "parallel": parallel,
                     "training": training and parallel == "data", "seconds": seconds,
                     "comm_s": comm, "achieved_flops": achieved,
                     "peak_flops": peak_chip * chips,
                     "efficiency": achieved / (chips * one_rate)})
    return rows


# -- SCALE-Sim --------------------------------------------------------------------------------

def scalesim(config, m, k, n, *, dtype=None):
    """One GEMM ``[M, K] x [K, N]`` on the tensor engine of ``config``: SCALE-Sim's
    weight-stationary cost, ``folds x (2R + C + T - 2)`` (R, C the array's rows and columns,
    ``folds = ceil(K / R) x ceil(M / C)``, T = N moving vectors per fold), against this
    model's tensor engine (``golden.tensor_engine.schedule``: the folds in order, each a
    fresh stationary tile loaded in the background, then its N vectors in matmuls of at most
    ``moving_max``) and against the cycle model's whole GEMM kernel (one core's, as
    :func:`gemm` gets it: ``tensor_busy`` and ``cycles``, DMA and activation included)."""
    import numpy as np

    from opentrn.golden import tensor_engine
    for name, value in (("m", m), ("k", k), ("n", n)):
        _positive(name, value)
    dtype = dtype or ("bf16" if "bf16" in config.dtypes else config.dtypes[0])
    rows, cols = config.pe_rows, config.pe_cols
    folds = -(-k // rows) * -(-m // cols)
    scalesim_cycles = folds * (2 * rows + cols + n - 2)
    tile = np.zeros((rows, cols), np.int8)
    # schedule() reads only the moving operand's column count: empty [0, N] arrays.
    chunks = [np.empty((0, min(config.moving_max, n - start)), np.int8)
              for start in range(0, n, config.moving_max)]
    program = []
    for _ in range(folds):
        program.append(tensor_engine.Matmul(moving=chunks[0], stationary=tile))
        program += [tensor_engine.Matmul(moving=chunk) for chunk in chunks[1:]]
    ours = tensor_engine.schedule(config, program).total_cycles
    estimate = _core_gemm(config, m, k, n, dtype)
    return {"m": m, "k": k, "n": n, "array": f"{rows}x{cols}", "folds": folds, "T": n,
            "scalesim_cycles": scalesim_cycles, "schedule_cycles": ours,
            "speedup": scalesim_cycles / ours, "ideal_cycles": folds * n,
            "dtype": dtype, "model_tensor_busy": estimate.tensor_busy,
            "model_cycles": estimate.cycles}


# -- plots ------------------------------------------------------------------------------------

def plot(path, *, config, dtype, points=(), scaling_rows=(), title=""):
    """Write a PNG: a roofline of one chip (log-log FLOP/s against FLOPs per HBM byte: the
    peak of each format and the HBM slope) with ``points`` (``(label, intensity,
    FLOP/s per chip)``), and the scaling curves ``scaling_rows`` (lists of :func:`scaling`
    rows, one per curve) as achieved PFLOP/s against chips."""
    import matplotlib
    matplotlib.use("Agg")                   # files only: no display
    import matplotlib.pyplot as plt

    cores = config.cores_per_chip
    bandwidth = _cycle_model().dma_bytes_per_cycle(config) * config.clock_hz * cores
    fig, (roof, scale) = plt.subplots(1, 2, figsize=(13, 5))
    largest = max([intensity for _, intensity, _ in points] + [1e4])
    intensities = [0.1 * 1.1**i for i in range(int(math.log(largest * 3 / 0.1, 1.1)) + 1)]
    roofs = {}                              # one line per distinct peak
    for fmt in config.dtypes:
        roofs.setdefault(peak_flops(config, fmt) * cores, []).append(fmt)
    for peak, formats in sorted(roofs.items()):
        roof.plot(intensities, [min(peak, x * bandwidth) / 1e12 for x in intensities],
                  label=f"{', '.join(formats)}: peak {peak / 1e12:,.0f} TFLOP/s")
    roof.plot(intensities, [x * bandwidth / 1e12 for x in intensities], ":", color="grey",
              label=f"HBM {bandwidth / 1e12:.1f} TB/s")
    markers = "osD^v<>phX*"
    for index, (label, intensity, achieved) in enumerate(points):
        roof.plot([intensity], [achieved / 1e12], markers[index % len(markers)],
                  linestyle="none", label=f"{label}: {achieved / 1e12:,.0f} TFLOP/s")
    roof.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOPs per HBM byte)",
             ylabel="TFLOP/s per chip", title=f"roofline: one chip ({cores} cores)")
    top = max(roofs) / 1e12
    roof.set_ylim(top / 1e3, top * 2)
    roof.legend(fontsize=7, loc="lower right")
    roof.grid(True, which="both", alpha=0.3)
    for rows in scaling_rows:
        if not rows:
            continue
        label = rows[0]["parallel"] + (" parallel, training" if rows[0]["training"] else
                                       " parallel")
        scale.plot([r["chips"] for r in rows], [r["achieved_flops"] / 1e15 for r in rows],
                   "o-", label=label)
    curve = max(scaling_rows, key=len, default=())
    if curve:
        scale.plot([r["chips"] for r in curve], [r["peak_flops"] / 1e15 for r in curve],
                   "--", color="grey", label=f"peak ({dtype})")
    scale.axvline(config.chips_per_server, color="grey", alpha=0.4)
    scale.set(xscale="log", yscale="log", xlabel="chips", ylabel="achieved PFLOP/s",
              title=f"scaling (line: {config.chips_per_server} chips, one server)")
    scale.legend(fontsize=8)
    scale.grid(True, which="both", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
