"""The optimizer's own LM roles, as DSPy signatures with their prompts kept together."""

from __future__ import annotations

import dspy
from pydantic import BaseModel, Field


class ExtractGradient(dspy.Signature):
    """You improve the instruction of one step (an "agent") in a multi-step LM program.

    For one training example, the step produced an original output that led the program to fail.
    The step was then re-run with a hint written for this example only, and produced a corrected
    output with which the program succeeded. The hint will not exist when the program runs later:
    the instruction alone must make the step behave the way it did with the hint. Compare the two
    outputs and write a textual gradient: specific, actionable advice on how the step's instruction
    should change so that it produces outputs like the corrected one. Describe the behaviour to
    change (what to look for in the inputs, what to check, what the output must contain); never
    tell the step to use, follow or wait for a hint, and do not copy answers or facts that only
    apply to this example."""

    program_steps: str = dspy.InputField(desc="the program's steps in execution order, with their fields")
    step_signature: str = dspy.InputField(desc="this step's input and output fields")
    current_instruction: str = dspy.InputField(desc="the step's instruction now")
    step_inputs: str = dspy.InputField(desc="what the step was given")
    original_output: str = dspy.InputField(desc="what the step produced (the program failed)")
    corrected_output: str = dspy.InputField(
        desc="what the step produced when re-run with the example's hint (the program succeeded)"
    )
    gradient: str = dspy.OutputField(desc="how the instruction should change, in 1-4 sentences")


class ExtractSystemGradient(dspy.Signature):
    """You improve the instruction of one step in a multi-step LM program.

    The program failed on one training example. You see the program's input, its final output, the
    expected result and the evaluator's feedback, but not which step went wrong. Write a textual
    gradient: specific, actionable advice on how this step's instruction should change so that the
    program produces the expected kind of result. Describe general behaviour; do not copy answers
    that only apply to this example."""

    current_instruction: str = dspy.InputField(desc="the step's instruction now")
    program_inputs: str = dspy.InputField()
    program_output: str = dspy.InputField()
    expected: str = dspy.InputField(desc="the expected result and the evaluator's feedback")
    gradient: str = dspy.OutputField(desc="how the instruction should change, in 1-4 sentences")


class ReflectOnFailure(dspy.Signature):
    """You improve the instruction of one step (an "agent") in a multi-step LM program.

    The program failed on one training example, and re-running any step with a hint for this example
    did not fix it, so nobody knows which step went wrong. You see this step's inputs and output in the
    failed run, the program's final output, the expected result and the evaluator's feedback. Decide
    whether this step's output is wrong or shows a problem given its inputs. If it is fine, answer
    exactly "No change needed." Otherwise write a textual gradient: specific, actionable advice on how
    the step's instruction should change. Describe general behaviour; do not copy answers or facts that
    only apply to this example."""

    program_steps: str = dspy.InputField(desc="the program's steps in execution order, with their fields")
    step_signature: str = dspy.InputField(desc="this step's input and output fields")
    current_instruction: str = dspy.InputField(desc="the step's instruction now")
    step_inputs: str = dspy.InputField(desc="what the step was given")
    step_output: str = dspy.InputField(desc="what the step produced in the failed run")
    program_output: str = dspy.InputField(desc="the program's final output")
    expected: str = dspy.InputField(desc="the expected result and the evaluator's feedback")
    gradient: str = dspy.OutputField(desc='how the instruction should change, in 1-4 sentences, or "No change needed."')


class GradientCluster(BaseModel):
    members: list[int] = Field(description="numbers of the gradients in this cluster")
    generalized_gradient: str = Field(description="one correction that covers every member")


class AbstractGradients(dspy.Signature):
    """Group textual gradients for one step's instruction by the correction they ask for.

    Gradients that ask for the same change in behaviour belong in one cluster, even when they
    mention different examples; gradients asking for unrelated changes must not be mixed. Every
    gradient number belongs to exactly one cluster. Only clusters with at least the minimum number
    of members lead to an update this round: where gradients ask for related corrections (the same
    part of the step's behaviour, compatible changes), merge them so that their cluster reaches the
    minimum. For each cluster write one generalized gradient: the shared correction stated so that
    it applies beyond the individual examples."""

    current_instruction: str = dspy.InputField()
    gradients: str = dspy.InputField(desc="numbered gradients, one per failed example")
    min_cluster_size: int = dspy.InputField(desc="the fewest members a cluster needs to be used this round")
    clusters: list[GradientCluster] = dspy.OutputField()


class SummarizeGradients(dspy.Signature):
    """Several textual gradients for one step's instruction ask for related changes.
    Write one generalized gradient that states their shared correction so that it applies beyond
    the individual examples."""

    current_instruction: str = dspy.InputField()
    gradients: str = dspy.InputField(desc="numbered gradients")
    generalized_gradient: str = dspy.OutputField()


class RewriteInstruction(dspy.Signature):
    """Rewrite the instruction of one step of an LM program so that it follows the given feedback.

    Keep what the current instruction does well, keep the step's task and its input and output
    fields unchanged, and keep the output format the step produces now. Integrate the correction as
    clear, general guidance. The examples show what the step produced and what it should have
    produced on a few training cases; use them to understand the correction, but do not copy their
    facts, names or answers into the instruction. Do not repeat a rewrite that was already tried
    and rejected. Stay within the maximum length. Return only the new instruction text."""

    step_signature: str = dspy.InputField(desc="the step's input and output fields")
    current_instruction: str = dspy.InputField()
    feedback: str = dspy.InputField(desc="the generalized gradient: how the instruction should change")
    examples: str = dspy.InputField(desc="a few training cases: the step's inputs, original and corrected outputs")
    rejected_rewrites: str = dspy.InputField(desc="earlier rewrites of this instruction that did not improve it")
    max_instruction_chars: int = dspy.InputField(desc="the most characters the new instruction may have")
    new_instruction: str = dspy.OutputField()
