import dspy
import pytest


@pytest.fixture(autouse=True)
def _no_lm_leaks_between_tests():
    """Each test configures its own LM; none leaks into the next."""
    yield
    dspy.configure(lm=None, adapter=None)
