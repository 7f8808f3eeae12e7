"""Simulation: cocotb testbenches, the simulator runner and waveform tools."""
