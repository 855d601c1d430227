import os

import dspy
import pytest
from hypothesis import HealthCheck, Phase, settings

# Property tests over drawn worlds: "ci" (the default) draws the same 300 worlds per property on every run;
# HYPOTHESIS_PROFILE=dev draws 30 for a quick look (no shrinking), and =thorough 3,000 fresh ones.
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=300, derandomize=True, **_COMMON)
settings.register_profile("dev", max_examples=30, derandomize=True, phases=[Phase.generate], **_COMMON)
settings.register_profile("thorough", max_examples=3000, derandomize=False, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _no_lm_leaks_between_tests():
    """Each test configures its own LM; none leaks into the next."""
    yield
    dspy.configure(lm=None, adapter=None)
