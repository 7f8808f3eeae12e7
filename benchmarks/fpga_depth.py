#!/usr/bin/env python3
"""Where the long paths are, in seconds rather than a placement's minutes: the deepest
register-to-register paths of a Yosys ``synth_ecp5`` netlist (the JSON that ``opentrn fpga``
leaves in its build folder), with a fixed delay per cell and per net.

    python benchmarks/fpga_depth.py build/fpga-fpga-ecpix5-85f/opentrn_board.json [--top NAME]
        [--paths 25] [--net-ns 0.7]

An estimate for finding paths, not a timing sign-off: the delays are typical ECP5 figures
(a LUT 0.25 ns, a carry step 0.05, a block RAM's unregistered output 3 ns, a combinational
18x18 multiplier 4 ns) plus ``--net-ns`` per net (placed, unrouted), except the carry chain
and the wide multiplexers' data inputs, which are wired inside a slice (until December 2026
those were charged as nets, which ranked Yosys's wide-multiplexer mappings too deep). On
the board top it pointed at the paths whose changes took nextpnr's estimate after
placement from 35.7 to 52.0 MHz (docs/fpga.md, "Timing").
Each line: the estimate, the cells on the path, its end, its start, and the blocks it
crosses (cells are named after the signals they drive, so the names are hints).
"""

import argparse
import collections
import json
import re
import sys

#: ns through a combinational cell, input to output.
CELL_NS = {"LUT4": 0.25, "PFUMX": 0.15, "L6MUX21": 0.15, "CCU2C": 0.3, "TRELLIS_DPR16X4": 0.5,
           "MULT18X18D": 4.0}
CARRY_NS = 0.05
#: Inputs wired inside a slice, not routed: a PFUMX's two LUT outputs, an L6MUX21's two
#: PFUMX outputs (nextpnr's reports give them 0 ns of routing). Only their select is routed.
IN_SLICE = {"PFUMX": ("ALUT", "BLUT"), "L6MUX21": ("D0", "D1")}
#: ns from the clock to the output of a cell that starts a path.
START_NS = {"TRELLIS_FF": 0.4, "DP16KD": 3.0, "TRELLIS_IO": 0.0}
_SUFFIX = re.compile(r"_(TRELLIS|LUT4|CCU2C|PFUMX|L6MUX|MULT|DP16).*")


def _registered_multiplier(cell):
    return cell["parameters"].get("REG_OUTPUT_CLK", "NONE") != "NONE"


class Netlist:
    def __init__(self, cells):
        self.cells = cells
        self.driver = {}
        for name, cell in cells.items():
            for port, bits in cell["connections"].items():
                if cell["port_directions"].get(port) == "output":
                    for bit in bits:
                        if not isinstance(bit, str):
                            self.driver[bit] = (name, port)
        self.arrival, self.previous = {}, {}

    def _inputs(self, cell, port):
        """(input bit, delay to ``port``, whether a routed net leads to it) of a
        combinational cell."""
        kind, connections = cell["type"], cell["connections"]
        if kind == "CCU2C":
            for bit in connections.get("CIN", []):
                yield bit, CARRY_NS, False
            extra = 0.2 if port != "COUT" else 0.0
            for name in ("A0", "B0", "C0", "D0", "A1", "B1", "C1", "D1"):
                for bit in connections.get(name, []):
                    yield bit, CELL_NS["CCU2C"] + extra, True
            return
        if kind == "MULT18X18D":
            names = [p for p in connections if p[0] in "AB" and p[1:].isdigit()]
        elif kind == "TRELLIS_DPR16X4":
            names = ["RAD"]
        else:
            names = [p for p, d in cell["port_directions"].items() if d == "input"]
        for name in names:
            for bit in connections.get(name, []):
                yield bit, CELL_NS.get(kind, 0.3), name not in IN_SLICE.get(kind, ())

    def arrive(self, bit, net_ns):
        """ns from the clock to net ``bit`` (iteratively: paths are thousands of cells)."""
        stack = [bit]
        while stack:
            top = stack[-1]
            if top in self.arrival:
                stack.pop()
                continue
            if top not in self.driver:
                self.arrival[top] = 0.0
                stack.pop()
                continue
            name, port = self.driver[top]
            cell = self.cells[name]
            kind = cell["type"]
            if kind in START_NS or (kind == "MULT18X18D" and _registered_multiplier(cell)):
                self.arrival[top] = START_NS.get(kind, 1.0)
                self.previous[top] = None
                stack.pop()
                continue
            inputs = [(b, d, net) for b, d, net in self._inputs(cell, port)
                      if not isinstance(b, str)]
            pending = [b for b, _, _ in inputs if b not in self.arrival and b not in stack]
            if pending:
                stack.extend(pending)
                continue
            best, via = 0.0, None
            for source, delay, net in inputs:
                value = self.arrival.get(source, 0.0) + delay + (net_ns if net else 0.0)
                if value > best:
                    best, via = value, source
            self.arrival[top], self.previous[top] = best, via
            stack.pop()
        return self.arrival[bit]

    def endpoints(self, net_ns):
        for name, cell in self.cells.items():
            kind, directions = cell["type"], cell["port_directions"]
            if kind == "TRELLIS_FF":
                ports = ["DI", "CE", "LSR", "M"]
            elif kind == "DP16KD" or (kind == "MULT18X18D" and _registered_multiplier(cell)):
                ports = [p for p, d in directions.items()
                         if d == "input" and not p.startswith("CLK")]
            elif kind == "TRELLIS_DPR16X4":
                ports = ["DI", "WAD", "WRE"]
            else:
                continue
            for port in ports:
                for bit in cell["connections"].get(port, []):
                    if not isinstance(bit, str):
                        yield self.arrive(bit, net_ns) + net_ns, name, port, bit

    def path(self, bit):
        cells = []
        while bit is not None and bit in self.driver:
            cells.append(self.driver[bit][0])
            bit = self.previous.get(bit)
        return cells[::-1]


def _block(cell, depth=5):
    return ".".join(_SUFFIX.sub("", cell).split(".")[:depth])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("netlist", help="a synth_ecp5 JSON netlist")
    parser.add_argument("--top", help="the top module (default: the JSON's only top)")
    parser.add_argument("--paths", type=int, default=25, help="paths to list")
    parser.add_argument("--net-ns", type=float, default=0.7, help="ns per net")
    args = parser.parse_args()
    with open(args.netlist) as file:
        modules = json.load(file)["modules"]
    tops = [name for name, module in modules.items()
            if module.get("attributes", {}).get("top")]
    top = args.top or (tops[0] if len(tops) == 1 else None)
    if top not in modules:
        sys.exit(f"--top: name one of the netlist's modules ({', '.join(tops) or 'none'})")
    netlist = Netlist(modules[top]["cells"])
    ends = sorted(netlist.endpoints(args.net_ns), key=lambda end: -end[0])
    histogram = collections.Counter(int(end[0] // 5) * 5 for end in ends)
    print("endpoints by estimated arrival: " + ", ".join(
        f"{low}-{low + 5} ns: {count}" for low, count in sorted(histogram.items())))
    shown = collections.Counter()
    for arrival, name, port, bit in ends:
        if len(shown) >= args.paths:
            break
        key = _block(name)
        shown[key] += 1
        if shown[key] > 1:                  # one path per ending block
            continue
        cells = netlist.path(bit)
        blocks = []
        for cell in cells:
            if not blocks or blocks[-1] != _block(cell):
                blocks.append(_block(cell))
        print(f"{arrival:5.1f} ns {len(cells):3d} cells  {name}.{port}")
        print(f"           from {cells[0] if cells else '-'}")
        print(f"           via  {' > '.join(blocks)[:400]}")


if __name__ == "__main__":
    main()
