"""vLLM serving and the client every experiment uses."""

from serving.client import ChatResult, Endpoint, GenConfig, LLMClient

__all__ = ["ChatResult", "Endpoint", "GenConfig", "LLMClient"]
