#!/usr/bin/env python3
"""Measure the tensor engine's steady-state utilization on the RTL: back-to-back matmuls of
one N, each with a fresh stationary tile (background weight load) or all reusing one: the
measured issue interval against the formula ``max(N, K + M)`` (fresh) or ``N`` (reused).

    python benchmarks/tensor_engine_utilization.py [--presets tiny,small] [--sim verilator]

Utilization here is N / issue interval: the fraction of cycles the array takes a new moving
vector in steady state, without the first load and the final drain.
"""

import argparse
import json
import sys

from opentrn import config
from opentrn.golden import tensor_engine as golden
from opentrn.report import markdown_table
from opentrn.sim import runner


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--sim", default=None, help="default: Verilator if it can run")
    parser.add_argument("--matmuls", type=int, default=48)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sim = args.sim or runner.long_run_simulator()

    rows = []
    for preset in args.presets.split(","):
        cfg = config.preset(preset)
        k_plus_m = cfg.pe_rows + cfg.pe_cols
        for n in sorted({1, 2, cfg.pe_cols, k_plus_m // 2 + 1, k_plus_m - 1, k_plus_m,
                         cfg.moving_max}):
            for fresh in (True, False):
                print(f"{preset}: N={n} {'fresh' if fresh else 'reused'} on {sim}",
                      file=sys.stderr, flush=True)
                result = runner.run(cfg, "opentrn.sim.tb_tensor_engine", "tensor_engine", sim,
                                    testcase="test_back_to_back",
                                    env={"OPENTRN_N": n, "OPENTRN_FRESH": int(fresh),
                                         "OPENTRN_MATMULS": args.matmuls})
                if not result.passed:
                    raise SystemExit(f"{preset} N={n}: not bit- and cycle-exact: {result.log}")
                stats = result.reports[0]
                interval = golden.issue_interval(cfg, n, fresh=fresh)
                # Idle cycles all fall between matmuls: the measured issue interval is the
                # span from the first vector of the first matmul to that of the last one.
                gaps = stats["cases"] - 1
                measured = (gaps * n + stats["moving_idle_cycles"]) / gaps
                rows.append({
                    "preset": preset, "array": f"{cfg.pe_rows}x{cfg.pe_cols}", "n": n,
                    "tile": "fresh" if fresh else "reused",
                    "interval_formula": interval,
                    "interval_measured": round(measured, 3),
                    "utilization": round(n / measured, 4),
                    "idle_cycles": stats["moving_idle_cycles"],
                    "matmuls": stats["cases"],
                })
    if args.json:
        print(json.dumps({"sim": sim, "rows": rows}, indent=2))
        return 0
    headers = ["preset", "array", "n", "tile", "interval_formula", "interval_measured",
               "utilization", "idle_cycles", "matmuls"]
    print(markdown_table(rows, headers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
