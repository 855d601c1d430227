import logging

import dspy
import pytest


@pytest.fixture(autouse=True)
def _no_lm_leaks_between_tests():
    """Each test configures its own LM; none leaks into the next."""
    yield
    dspy.configure(lm=None, adapter=None)


@pytest.fixture
def caplog(caplog):
    """pytest's caplog, also hearing AgentGrad's logger: DSPy's ``dspy`` logger does not propagate to the root."""
    logger = logging.getLogger("dspy.agentgrad")
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)
