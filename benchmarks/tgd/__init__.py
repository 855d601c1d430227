"""TextGrad (zou-group/textgrad, 0.1.8) as an optimizer of DSPy programs, for the head-to-head runner.

TextGrad's own primitives do the optimizing: each predictor's instruction is a ``textgrad.Variable``,
each program step's output a Variable whose backward pass is TextGrad's ``LLMCall.backward`` (the
instruction as the system prompt, the step's inputs as the prompt), the metric is a TextGrad
``StringBasedFunction`` over the outputs that make the prediction, ``textgrad.sum`` adds a batch's
losses, ``backward`` passes gradients along the program's steps, and ``TextualGradientDescent`` rewrites
the instructions, with TextGrad's own validate-and-revert rule. What TextGrad cannot express (the
forward pass of a DSPy predictor) is DSPy's, and the graph is rebuilt from DSPy's trace: see
:mod:`benchmarks.tgd.graph` and benchmarks/README.md.

Needs the ``textgrad`` extra: ``pip install 'dspy-agentgrad[textgrad]'``.
"""

from benchmarks.tgd.loop import TextGradSettings, optimize

__all__ = ["TextGradSettings", "optimize"]
