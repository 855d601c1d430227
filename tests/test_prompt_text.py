"""Reading a prompt back: the instruction, inputs and output fields the chat adapter wrote."""

from __future__ import annotations

import dspy

from dspy_agentgrad.program.prompt_text import input_values, instructions, output_fields


def test_prompt_text_reads_back_what_the_chat_adapter_wrote():

    class QA(dspy.Signature):
        """Answer briefly."""

        question: str = dspy.InputField()
        answer: str = dspy.OutputField()
        score: list[int] = dspy.OutputField()

    messages = dspy.ChatAdapter().format(QA, demos=[], inputs={"question": "Who?"})
    system, user = messages[0]["content"], messages[-1]["content"]
    assert [name for name, _ in output_fields(system)] == ["answer", "score"]
    assert dict(output_fields(system))["score"] == "list[int]"
    assert instructions(system) == "Answer briefly."
    assert input_values(user) == {"question": "Who?"}
