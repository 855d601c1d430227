"""A TextGrad computation graph rebuilt from one traced run of a DSPy program.

TextGrad builds its graph while its own ``LLMCall`` runs the forward pass. A DSPy predictor's forward
pass (its adapter formats the signature, demos and inputs into messages and parses the reply into
fields) is not a TextGrad operation, so the program runs in DSPy and the graph is rebuilt afterwards
from ``dspy.settings.trace``, with TextGrad's own pieces:

* each step's output is a ``Variable`` whose predecessors are its predictor's instruction (the
  optimized parameter) and the earlier steps' outputs it consumed, and whose backward pass is
  ``LLMCall.backward`` with the instruction as system prompt and the step's inputs as prompt -- the
  same feedback prompts TextGrad uses for a chain of LLM calls;
* the loss is a ``StringBasedFunction`` (the benchmark's metric, score and feedback text) over the step
  outputs the prediction is made of, with the reference answer as a constant input.

Edges come from the trace's values: an earlier output feeds a later step when its text appears in
that step's inputs (or in the prediction). Operations the trace does not see (retrieval, PUPA's
untrusted model) hide that link; an output that feeds nothing visible is linked to the next step (or
to the loss for the last one), as the closest reading of "this output went on into the rest of the
program".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from benchmarks.tgd.engine import tg  # before any textgrad module: it moves textgrad's log file

LLMCall, StringBasedFunction = tg.autograd.LLMCall, tg.autograd.StringBasedFunction
BackwardContext = tg.autograd.function.BackwardContext

#: Outputs shorter than this are not matched against later inputs (words like "ok" match anywhere).
MIN_MATCH_CHARS = 4


@dataclass
class StepCall:
    """One predictor call of a traced run."""

    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]

    def prompt(self) -> str:
        return "\n".join(f"{k}: {v}" for k, v in self.inputs.items())

    def output_text(self) -> str:
        return "\n".join(f"{k}: {v}" for k, v in self.outputs.items())

    def matchable(self) -> list[str]:
        values = (str(v).strip() for k, v in self.outputs.items() if k != "reasoning")
        return [v for v in values if len(v) >= MIN_MATCH_CHARS]


def steps_of(program, trace: list) -> list[StepCall]:
    """The predictor calls of a ``dspy.settings.trace``, named as ``program.named_predictors()`` names them."""
    names = {id(pred): name for name, pred in program.named_predictors()}
    steps = []
    for predictor, inputs, prediction in trace:
        name = names.get(id(predictor))
        if name is None:  # a predictor outside the program (e.g. a judge inside the metric)
            continue
        outputs = {k: prediction.get(k) for k in predictor.signature.output_fields}
        steps.append(StepCall(name, dict(inputs), outputs))
    return steps


def _feeds(step: StepCall, texts: list[str]) -> bool:
    return any(value in text for value in step.matchable() for text in texts)


def links(steps: list[StepCall], prediction: Mapping[str, Any]) -> tuple[list[list[int]], list[int]]:
    """(earlier steps feeding each step, steps feeding the prediction), as indices into ``steps``."""
    pred_texts = [str(v) for v in prediction.values()]
    feeds = [
        [j for j in range(i) if _feeds(steps[j], [str(v) for v in s.inputs.values()])] for i, s in enumerate(steps)
    ]
    final = [j for j, s in enumerate(steps) if _feeds(s, pred_texts)]
    for j in range(len(steps)):
        used = j in final or any(j in f for f in feeds[j + 1 :])
        if not used:  # it went on through an operation the trace does not show
            if j + 1 < len(steps):
                feeds[j + 1].append(j)
            else:
                final.append(j)
    return feeds, final


def role_of(name: str, signature) -> str:
    """The role description of a predictor's instruction (TextGrad finds specific roles matter)."""
    ins = ", ".join(signature.input_fields)
    outs = ", ".join(f for f in signature.output_fields if f != "reasoning")
    return f"instruction (system prompt) of the program step `{name}`, which reads {ins} and writes {outs}"


def loss_of(
    steps: list[StepCall],
    prediction: Mapping[str, Any],
    reference: str,
    evaluation: str,
    instructions: Mapping[str, Any],
    engine,
):
    """The TextGrad loss Variable of one run; its ``backward`` fills the instructions' gradients."""
    feeds, final = links(steps, prediction)
    outputs = []
    for step, sources in zip(steps, feeds):
        instruction = instructions[step.name]
        response = tg.Variable(
            step.output_text(),
            predecessors=[instruction, *(outputs[j] for j in sources)],
            role_description=f"output of the program step `{step.name}`",
        )
        call = LLMCall(engine, system_prompt=instruction)
        response.set_grad_fn(
            BackwardContext(
                backward_fn=call.backward, response=response, prompt=step.prompt(), system_prompt=instruction.value
            )
        )
        outputs.append(response)
    inputs = {f"{steps[j].name} output": outputs[j] for j in final}
    inputs["prediction"] = tg.Variable(
        "\n".join(f"{k}: {v}" for k, v in prediction.items()),
        requires_grad=False,
        role_description="the program's final prediction",
    )
    inputs["reference"] = tg.Variable(reference, requires_grad=False, role_description="the reference for this input")
    metric = StringBasedFunction(
        lambda **_: evaluation,
        function_purpose="the benchmark's metric: scores the program's prediction against the reference "
        "and explains the score",
    )
    return metric(inputs=inputs, response_role_description="evaluation of the program's prediction")
