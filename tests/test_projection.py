"""The projection layer (opentrn.projection): peaks against the published figures, GEMM and
transformer-layer projections, scaling, the SCALE-Sim comparison. No simulator."""

import json
import math

import pytest

from opentrn import config, projection
from opentrn.config import ConfigError

#: Reference-file key of each modelled format (one published figure covers both FP8 and
#: both MXFP8 formats).
KEYS = {"bf16": "bf16", "fp8e4m3": "fp8", "fp8e5m2": "fp8", "mxfp8e4m3": "mxfp8",
        "mxfp8e5m2": "mxfp8"}


@pytest.mark.parametrize("name", list(config.PUBLISHED))
def test_per_core_peaks_within_1_percent_of_the_published_figures(name):
    ref = config.reference()
    core = ref["neuroncore"][config.PUBLISHED[name][0]]
    cfg = config.preset(name)
    checked = []
    for fmt in cfg.dtypes:
        published = core.get(f"tflops_{KEYS[fmt]}")
        if published is None:        # trn3's plain FP8: not published
            continue
        model = projection.peak_flops(cfg, fmt) / 1e12
        assert abs(model - published) / published < 0.01, (fmt, model, published)
        checked.append(fmt)
    assert "bf16" in checked and {"trn2": "fp8e4m3", "trn3": "mxfp8e4m3"}[name] in checked
    # The table says the same.
    rows = [row for row in projection.peaks(cfg) if row["level"] == "core"
            and row["model"] is not None and row["published"] is not None]
    assert {row["quantity"] for row in rows} == set(checked)
    assert all(abs(row["diff_pct"]) < 1 for row in rows)


def test_peaks_are_derived_from_the_configuration():
    trn3 = config.preset("trn3")
    assert projection.peak_flops(trn3, "bf16") == 2 * 128 * 128 * 2_400_000_000
    assert projection.peak_flops(trn3, "mxfp8e4m3") == 4 * projection.peak_flops(trn3, "bf16")
    slower = trn3.replace(pe_macs_per_cycle=("mxfp8e4m3:2",))
    assert projection.peak_flops(slower, "mxfp8e4m3") == 2 * projection.peak_flops(trn3, "bf16")
    assert projection.peak_flops(slower, "mxfp8e5m2") == projection.peak_flops(trn3, "bf16")
    with pytest.raises(ConfigError, match="format='int8': not among this build's formats"):
        projection.peak_flops(trn3, "int8")


@pytest.mark.parametrize("name", list(config.PUBLISHED))
def test_chip_and_server_rows_show_both_disagreeing_figures(name):
    ref = config.reference()
    core_key, chip_key, system_key = config.PUBLISHED[name]
    core, chip, system = (ref["neuroncore"][core_key], ref["chip"][chip_key],
                          ref["system"][system_key])
    cfg = config.preset(name)
    rows = {(row["level"], row["quantity"]): row for row in projection.peaks(cfg)}
    bf16_chip = rows["chip", "bf16"]
    assert bf16_chip["published"] == chip["tflops_bf16"]                       # 667 / 671
    assert bf16_chip["published_cores"] == core["tflops_bf16"] * chip["cores"]  # 632
    assert bf16_chip["note"] == ref["disagreements"]["per_core_x8_vs_chip_bf16"]
    assert math.isclose(bf16_chip["model"], projection.peak_flops(cfg, "bf16") * 8 / 1e12)
    # The model is 8 cores: it matches the per-core figure x 8 as closely as the core's.
    assert math.isclose(bf16_chip["diff_cores_pct"], rows["core", "bf16"]["diff_pct"])
    assert rows["server", "bf16"]["published"] == system["pflops_bf16"]
    assert rows["server", "bf16"]["unit"] == "PFLOPS"
    # FP32: published only.
    fp32 = rows["core", "fp32"]
    assert fp32["model"] is None and fp32["published"] == core["tflops_fp32"]
    assert fp32["note"] == "not an input format of this model"
    assert rows["chip", "HBM bandwidth"]["published"] == chip["hbm_tb_s"]
    assert rows["chip", "HBM bandwidth"]["diff_pct"] == pytest.approx(0)
    assert rows["server", "HBM bandwidth"]["published"] == system["hbm_tb_s"]
    assert rows["chip", "link bandwidth"]["published"] == chip["link_tb_s"]
    json.dumps(rows[("chip", "bf16")])


def test_trn3_published_disagreements_on_hbm_and_link_are_noted():
    ref = config.reference()["disagreements"]
    rows = {(row["level"], row["quantity"]): row for row in
            projection.peaks(config.preset("trn3"))}
    assert rows["chip", "HBM bandwidth"]["note"] == ref["trn3_hbm_tb_s"]
    assert rows["chip", "link bandwidth"]["note"] == ref["trn3_link"]


def test_presets_without_published_figures_have_no_published_column():
    rows = projection.peaks(config.preset("tiny"))
    assert all(row["published"] is None and row["published_cores"] is None for row in rows)
    assert {row["quantity"] for row in rows if row["level"] == "core"} == \
        set(config.preset("tiny").dtypes)
    # An overridden trn3 is still compared with trn3's figures when asked.
    faster = config.resolve("trn3", overrides=["clock_hz=3e9"])
    assert projection.published_preset(faster) is None
    core = [row for row in projection.peaks(faster, published="trn3")
            if (row["level"], row["quantity"]) == ("core", "bf16")][0]
    assert core["published"] == 79 and core["diff_pct"] > 20


TRN3 = config.preset("trn3")


@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (4096, 2048, 1024), (300, 700, 500)])
@pytest.mark.parametrize("dtype", ["bf16", "mxfp8e4m3"])
def test_achieved_never_exceeds_the_peak_or_the_roofline(shape, dtype):
    for _label, level in projection.gemm_levels(TRN3, *shape, dtype=dtype, chips=4):
        assert 0 < level.achieved_flops <= level.peak_flops
        assert level.achieved_flops <= level.roof_flops * (1 + 1e-9)
        assert level.utilization == pytest.approx(level.achieved_flops / level.peak_flops)
        assert level.seconds == pytest.approx(level.compute_s + level.comm_s)
        json.dumps(level.to_dict())


def test_a_chip_is_faster_than_a_core_on_a_large_gemm():
    core = projection.gemm(TRN3, 4096, 4096, 4096, dtype="bf16")
    chip = projection.gemm(TRN3, 4096, 4096, 4096, dtype="bf16", cores=8)
    assert chip.seconds <= core.seconds / 4
    assert chip.core_split in ("M", "N") and core.core_split == "-"


def test_roofline_class_flips_from_hbm_to_compute_bound_as_the_gemm_grows():
    classes = [projection.gemm(TRN3, size, size, size, dtype="bf16", cores=8).bound
               for size in (64, 128, 256, 512, 1024, 4096)]
    assert classes[0] == "HBM" and classes[-1] == "compute"
    flip = classes.index("compute")
    assert set(classes[flip:]) == {"compute"} and set(classes[:flip]) == {"HBM"}
    # The ridge is peak / bandwidth, the intensity FLOPs / compulsory bytes (bf16 in, FP32
    # out): 2 n^3 / (2 n^2 x 2 + 4 n^2) = n / 4.
    level = projection.gemm(TRN3, 512, 512, 512, dtype="bf16", cores=8)
    assert level.intensity == pytest.approx(512 / 4)
    assert level.ridge == pytest.approx(level.peak_flops / level.hbm_bytes_per_s)


def test_data_parallel_every_chip_reads_all_of_b():
    one = projection.gemm(TRN3, 4096, 4096, 4096, dtype="bf16", cores=8)
    many = projection.gemm(TRN3, 4096, 4096, 4096, dtype="bf16", cores=8, chips=128,
                           parallel="data")
    assert many.comm_s == 0 and many.core_share[0] <= 32
    assert many.intensity < one.intensity and many.bound == "HBM"


def test_ring_allreduce_formula():
    cfg = TRN3.replace(link_bytes_per_s=1e12)
    assert projection.allreduce_seconds(cfg, 10**9, 1) == 0
    # 2 (N - 1) / N x bytes / link: 2 x 3 / 4 x 1e9 / 1e12 = 1.5 ms.
    assert projection.allreduce_seconds(cfg, 10**9, 4) == pytest.approx(1.5e-3)
    # plus 2 (N - 1) hops of latency when given.
    assert projection.allreduce_seconds(cfg, 10**9, 4, hop_latency_s=1e-6) == \
        pytest.approx(1.5e-3 + 6e-6)
    tensor = projection.gemm(cfg, 1024, 1024, 2048, dtype="bf16", cores=8, chips=4)
    assert tensor.comm_s == pytest.approx(2 * 3 / 4 * 1024 * 2048 * 4 / 1e12)
    with pytest.raises(ConfigError, match="link_bytes_per_s=0.0: must be positive to project "
                                          "on chips=2"):
        projection.allreduce_seconds(config.preset("tiny"), 100, 2)


def test_activation_cycles_formula():
    tiny = config.preset("tiny")          # 4 lanes, 16 vectors per instruction
    # 100 elements = 25 vectors = 2 instructions, each n + 7 cycles to retire and one to
    # hand over the next: 25 + 2 x 8 cycles per pass.
    assert projection.activation_cycles(tiny, 100) == 25 + 2 * 8
    assert projection.activation_cycles(tiny, 100, passes=2) == 2 * (25 + 2 * 8)
    # Two cores: 13 vectors each, one instruction.
    assert projection.activation_cycles(tiny, 100, cores=2) == 13 + 8


LAYER = dict(d_model=1024, d_ff=4096, heads=16, seq=512, batch=2, dtype="bf16")


def test_transformer_layer_ops_sum_to_the_totals():
    layer = projection.transformer_layer(TRN3, **LAYER)
    ops = layer["ops"]
    assert [op["op"] for op in ops if op["kind"] == "tensor"] == [
        "QKV projection", "scores Q K^T", "context P V", "output projection", "FFN up",
        "FFN down"]
    assert {op["op"] for op in ops if op["kind"] == "vector"} == {
        "layernorm (attention)", "softmax", "residual add (attention)", "layernorm (FFN)",
        "GELU", "residual add (FFN)"}
    assert not [op for op in ops if op["kind"] == "link"] and layer["comm_s"] == 0
    assert layer["seconds"] == pytest.approx(sum(op["seconds"] for op in ops))
    assert layer["seconds"] == pytest.approx(layer["tensor_s"] + layer["vector_s"])
    assert sum(op["share"] for op in ops) == pytest.approx(1)
    # On one chip the GEMMs are the whole layer's FLOPs.
    assert layer["flops"] == sum(op["flops"] for op in ops)
    tokens, d, ff = 2 * 512, 1024, 4096
    assert layer["flops"] == 2 * tokens * (4 * d * d + 2 * d * ff) + 2 * 2 * 2 * 512 * 512 * d
    assert layer["achieved_flops"] <= layer["peak_flops"]
    assert layer["weights"] == 4 * d * d + 2 * d * ff
    json.dumps(layer)


def test_transformer_layer_tensor_parallel():
    one = projection.transformer_layer(TRN3, **LAYER)
    four = projection.transformer_layer(TRN3, **LAYER, chips=4)
    links = [op for op in four["ops"] if op["kind"] == "link"]
    assert len(links) == 2
    each = projection.allreduce_seconds(TRN3, 2 * 512 * 1024 * 2, 4)   # bf16 activations
    assert all(op["seconds"] == pytest.approx(each) for op in links)
    assert four["comm_s"] == pytest.approx(2 * each)
    assert four["compute_share"] + four["comm_share"] == pytest.approx(1)
    assert four["seconds"] < one["seconds"] and four["flops"] == one["flops"]
    # Each chip does a quarter of the GEMM work.
    assert sum(op["flops"] for op in four["ops"]) * 4 == one["flops"]
    with pytest.raises(ConfigError, match="chips=32: tensor parallelism splits the heads: "
                                          "must be at most heads=16"):
        projection.transformer_layer(TRN3, **LAYER, chips=32)
    with pytest.raises(ConfigError, match="d_model=1000: must be a multiple of heads=16"):
        projection.transformer_layer(TRN3, **{**LAYER, "d_model": 1000})


GEMM = {"kind": "gemm", "m": 2048, "k": 2048, "n": 2048, "dtype": "bf16"}


def test_scaling_chip_counts_reach_the_published_cluster():
    counts = projection.chip_counts(TRN3)
    assert counts[0] == 1 and 144 in counts
    assert counts[-1] == config.reference()["system"]["trn3_ultraserver"]["max_chips_clustered"]
    assert counts == sorted(set(counts))


def test_data_parallel_scaling_is_monotonic():
    rows = projection.scaling(TRN3, GEMM, [1, 2, 8, 144, 10_000, 1_000_000])
    achieved = [row["achieved_flops"] for row in rows]
    assert achieved == sorted(achieved) and len(set(achieved)) == len(achieved)
    efficiency = [row["efficiency"] for row in rows]
    assert efficiency[0] == pytest.approx(1) and efficiency == sorted(efficiency, reverse=True)
    comm = [row["comm_s"] for row in rows]
    assert comm[0] == 0 and comm == sorted(comm)
    # The gradient all-reduce of B (bf16) over the ring, after 3x the forward pass.
    one = rows[0]["seconds"] / 3
    assert rows[3]["seconds"] == pytest.approx(
        3 * one + projection.allreduce_seconds(TRN3, 2048 * 2048 * 2, 144))
    assert all(row["achieved_flops"] <= row["peak_flops"] for row in rows)
    # Inference: no communication, linear.
    rows = projection.scaling(TRN3, GEMM, [1, 1000], training=False)
    assert rows[1]["achieved_flops"] == pytest.approx(1000 * rows[0]["achieved_flops"])


def test_tensor_parallel_scaling_stops_at_the_split():
    layer = {"kind": "transformer", **LAYER}
    rows = projection.scaling(TRN3, layer, [1, 2, 4, 16, 32, 144], parallel="tensor")
    assert [row["chips"] for row in rows] == [1, 2, 4, 16]      # heads = 16
    comm = [row["comm_s"] for row in rows]
    assert comm[0] == 0 and comm == sorted(comm)
    assert all(row["achieved_flops"] <= row["peak_flops"] for row in rows)


def test_scalesim_comparison():
    tiny = config.preset("tiny")          # 4x4, N <= 16 per matmul
    result = projection.scalesim(tiny, 64, 64, 64)
    folds = 16 * 16
    assert result["folds"] == folds and result["T"] == 64
    assert result["scalesim_cycles"] == folds * (2 * 4 + 4 + 64 - 2)
    assert result["ideal_cycles"] == folds * 64
    # Background loading: each fold costs its 64 vectors; only the first load and the
    # last drain are exposed.
    assert result["schedule_cycles"] == folds * 64 + 4 + (4 + 4 - 1)
    assert result["speedup"] > 1
    # Short folds (T < R + C) wait for the next tile's load behind the guard: K + M each.
    short = projection.scalesim(tiny, 8, 8, 2)
    assert short["schedule_cycles"] < short["scalesim_cycles"]


def test_one_core_is_exact_where_the_exact_model_follows_the_configuration():
    """The issue's example (tiny, int8 256x1x256: the fast path's cycles were 28% above the
    RTL's): by default one core's cycles are the exact model's, predict() of the kernel's
    program, because the exact model follows tiny (one DMA engine) and the kernel is short;
    ``model="fast"`` gives the fast path's."""
    import numpy as np

    from opentrn import cycle_model, kernels
    tiny = config.preset("tiny")
    assert projection.exact_model_follows(tiny)
    rng = np.random.default_rng(3)
    a = kernels.random_inputs(rng, (256, 1), "int8")
    b = kernels.random_inputs(rng, (1, 256), "int8")
    exact = cycle_model.predict(kernels.gemm(tiny, a.T.copy(), b)[0])
    auto = projection.gemm(tiny, 256, 1, 256, dtype="int8")
    assert (auto.model, auto.cycles, auto.dma_bytes, auto.tensor_busy) == \
        ("exact", exact["cycles"], exact["dma_bytes"], exact["tensor_busy"])
    fast = projection.gemm(tiny, 256, 1, 256, dtype="int8", model="fast")
    assert fast.model == "fast path"
    assert fast.cycles == cycle_model.gemm(tiny, 256, 1, 256, dtype="int8").cycles
    # Past the budget the fast path answers (its estimate decides).
    big = cycle_model.gemm(tiny, 512, 512, 512, dtype="int8")
    assert big.cycles > projection.EXACT_MAX_CYCLES
    assert projection.gemm(tiny, 512, 512, 512, dtype="int8").model == "fast path"


def test_the_exact_core_model_refuses_what_it_does_not_model():
    """trn3's 16 DMA engines are the fast path's only: asking for the exact model there
    names the field; by default trn3 takes the fast path, and with one DMA engine (what the
    RTL builds) a short kernel is exact."""
    trn3 = config.preset("trn3")
    with pytest.raises(ConfigError, match="dma_engines=16"):
        projection.gemm(trn3, 512, 512, 512, dtype="bf16", model="exact")
    assert projection.gemm(trn3, 512, 512, 512, dtype="bf16").model == "fast path"
    one_engine = config.resolve("trn3", overrides=["dma_engines=1"])
    assert projection.gemm(one_engine, 128, 128, 128, dtype="bf16").model == "exact"
    with pytest.raises(ConfigError, match="model='best'"):
        projection.gemm(one_engine, 128, 128, 128, dtype="bf16", model="best")
