"""One small module per agent library. Each has NAME, available() and enable(provider, capture)."""

from lightning_otel.instrument.integrations import openai_sdk

ALL = (openai_sdk,)
