"""One small module per agent library: NAME, TRIGGER (the module whose import turns it on),
available() and enable(tracer_provider, options). A library that is not installed is skipped quietly;
one that is installed but not imported yet is turned on when it is imported, so instrument() costs
nothing for libraries the agent never uses (importing LiteLLM alone takes seconds)."""

from lightning_otel.instrumentation.integrations import (
    anthropic_sdk,
    langchain,
    litellm,
    openai_agents,
    openai_responses,
    openai_sdk,
    threads,
)

ALL = (threads, openai_sdk, openai_responses, anthropic_sdk, langchain, openai_agents, litellm)
