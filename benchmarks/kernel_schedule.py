#!/usr/bin/env python3
"""The library GEMM's tiling at Trainium scale: what the schedule chooses, how busy it keeps
the array and how many bytes it moves against the compulsory ones.

    python benchmarks/kernel_schedule.py [--preset trn3] [--set KEY=VALUE ...]
        [--sizes 4096,8192] [--dtypes bf16,fp8e4m3,mxfp8e4m3] [--json]

Per format and square GEMM ``S^3`` on one core of the preset, from the cycle model's fast
path (``cycle_model.gemm``, which sizes its steps with ``schedule.gemm_tiling`` as the
kernel does): the tiling (block width, K tiles per step, M tiles per stationary descriptor,
moving slots), cycles, tensor busy (the share of cycles a moving vector enters the array:
the format's peak), the bytes the DMA moves between HBM and the SBUF, the compulsory bytes
(A and B read once, with MX scales, C written once in FP32) and their ratio, and the ratio
a lower bound allows: the reads of A and B of any schedule of a classical matrix product
are at least ``2 M N K / sqrt(S)`` elements for a fast memory of ``S`` elements (Hong and
Kung 1981; leading term of Smith et al. 2019), here the whole SBUF, plus C once.
"""

import argparse
import json
import math
import sys

from opentrn import config, cycle_model, numerics, schedule
from opentrn.report import markdown_table


def row(cfg, preset, dtype, size):
    m = k = n = size
    fmt = numerics.data_format(dtype)
    width, kts, m_block, slots = schedule.gemm_tiling(cfg, m, k, n, dtype)
    est = cycle_model.gemm(cfg, m, k, n, dtype=dtype)
    # Bytes per input element, with an MX format's one scale byte per block of 32.
    per_element = fmt.bytes
    scale = 1 / numerics.MX_BLOCK if fmt.mx else 0
    inputs = (m * k + k * n) * (per_element + scale)
    compulsory = inputs + m * n * 4
    sbuf_elements = cfg.sbuf_partitions * cfg.sbuf_bytes_per_partition / per_element
    bound = max(inputs, 2 * m * n * k / math.sqrt(sbuf_elements) * (per_element + scale)) \
        + m * n * 4
    return {
        "preset": preset, "format": dtype, "gemm": f"{size}^3",
        "tiling": f"{width} cols x {kts} K tiles, {m_block} M/desc, {slots} slot(s)",
        "cycles": est.cycles, "tensor_busy": round(est.tensor_busy / est.cycles, 4),
        "dma_bytes": est.dma_bytes, "compulsory_bytes": round(compulsory),
        "bytes_ratio": round(est.dma_bytes / compulsory, 2),
        "lower_bound_ratio": round(bound / compulsory, 2),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="trn3")
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append",
                        default=[], help="override one configuration key (repeatable)")
    parser.add_argument("--sizes", default="4096,8192")
    parser.add_argument("--dtypes", default="bf16,fp8e4m3,mxfp8e4m3")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        cfg = config.resolve(args.preset, overrides=args.overrides)
    except config.ConfigError as error:
        parser.error(str(error))
    try:
        sizes = [int(text) for text in args.sizes.split(",")]
        if min(sizes) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: must be positive integers separated by ','")
    dtypes = args.dtypes.split(",")
    for dtype in dtypes:
        if dtype not in cfg.dtypes:
            parser.error(f"--dtypes: {dtype!r} is not among {args.preset}'s formats "
                         f"({','.join(cfg.dtypes)})")
    rows = [row(cfg, args.preset, dtype, size) for dtype in dtypes for size in sizes]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    headers = ["preset", "format", "GEMM", "tiling", "cycles", "tensor busy", "DMA bytes",
               "compulsory bytes", "ratio", "lower bound ratio"]
    print(markdown_table([dict(zip(headers, [
        r["preset"], r["format"], r["gemm"], r["tiling"], f"{r['cycles']:,}",
        f"{100 * r['tensor_busy']:.1f}%", f"{r['dma_bytes']:,}",
        f"{r['compulsory_bytes']:,}", f"{r['bytes_ratio']:.2f}x",
        f"{r['lower_bound_ratio']:.2f}x"], strict=True)) for r in rows], headers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
