"""Shared by the LangChain and LangGraph tests: langchain-core's fake chat model, describing
itself as a provider's model does, and its scripted replies. (A module of its own, not part of
agents_support: it imports langchain-core, which the other frameworks' tests do not need.)"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

REPLY = "Sunny in Paris"
USAGE = {"input_tokens": 11, "output_tokens": 3, "total_tokens": 14}


class ChatModel(GenericFakeChatModel):
    """langchain-core's fake chat model, describing itself as ChatOpenAI does (provider and
    model in its LangSmith parameters), answering with usage as a provider's reply has."""

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "openai"
        params["ls_model_name"] = "gpt-4o-mini"
        params["ls_temperature"] = 0.2
        return params


def model(*replies: AIMessage) -> ChatModel:
    """The fake chat model answering ``replies`` in turn (by default one reply, with usage)."""
    if not replies:
        replies = (AIMessage(content=REPLY, usage_metadata=USAGE),)  # type: ignore[arg-type]
    return ChatModel(messages=iter(replies))
