"""Head-to-head benchmarks for AgentGrad vs dspy.GEPA and dspy.MIPROv2 (HotpotQA, HoVer, IFBench).

``python -m benchmarks.run --help`` runs them; ``python -m benchmarks.tables`` assembles tables.
"""

from benchmarks.registry import BENCHMARKS, Benchmark, load_benchmark

__all__ = ["BENCHMARKS", "Benchmark", "load_benchmark"]
