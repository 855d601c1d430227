"""Several OpenAI-compatible servers (vLLM, SGLang) behind one ``dspy.LM``: a litellm Router as a DSPy engine.

The Router spreads calls over the endpoints (simple shuffle) and, when one fails, retries the call on
another and puts the failed endpoint in a cooldown, so a run keeps going while a server is down.
"""

from __future__ import annotations

from typing import Any

from dspy.clients.engines.litellm_engine import LiteLLMEngine
from dspy.clients.engines.litellm_errors import litellm_errors

#: The name under which every endpoint of one model is registered in its Router.
ROUTER_ALIAS = "agentgrad-endpoints"


class RouterEngine(LiteLLMEngine):
    """A DSPy engine that sends each request through ``router`` (a ``litellm.Router``).

    ``extra_body`` is merged into every request (e.g. ``{"chat_template_kwargs": {"enable_thinking":
    False}}``): DSPy's typed requests cannot carry it, so the engine owns it, like the endpoints and keys.
    """

    #: DSPy must use ``complete(Request)``, not the inherited legacy shortcut that bypasses the Router.
    complete_legacy = None

    def __init__(self, router: Any, alias: str = ROUTER_ALIAS, extra_body: dict | None = None):
        super().__init__(model_type="chat")
        self.router, self.alias = router, alias
        self.extra_body = dict(extra_body or {})

    def complete(self, request):
        data = self._arguments(request)
        data.pop("num_retries", None)  # the Router's own retries move a failed call to another endpoint
        data["model"] = self.alias
        if self.extra_body:
            data["extra_body"] = self.extra_body
        with litellm_errors(model=request.model):
            raw = self.router.completion(**data)
        return self._response(raw, request)

    def __repr__(self) -> str:
        return f"RouterEngine({len(self.router.model_list)} endpoints)"


def make_router(model: str, api_bases: list[str], api_key: str, *, timeout: float | None = None) -> Any:
    """A litellm Router over ``api_bases`` serving ``model``: shuffled load balancing, a failed call retried
    on the other endpoints, a failing endpoint cooled down for 30 s."""
    import litellm

    params: dict[str, Any] = {"model": model, "api_key": api_key}
    if timeout is not None:
        params["timeout"] = timeout
    deployments = [{"model_name": ROUTER_ALIAS, "litellm_params": {**params, "api_base": base}} for base in api_bases]
    return litellm.Router(
        model_list=deployments,
        routing_strategy="simple-shuffle",
        num_retries=max(2, len(api_bases)),
        retry_after=0,
        allowed_fails=1,
        cooldown_time=30,
    )
