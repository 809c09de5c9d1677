"""Agent frameworks as looptrace spans (see docs/agents.md).

One module per framework, each imported only by the user (``import looptrace`` loads none of
them, and each imports its framework only when it is imported itself):

- :mod:`looptrace.integrations.openai_agents`: the OpenAI Agents SDK's traces, through a
  tracing processor (``instrument_openai_agents``).
- :mod:`looptrace.integrations.langchain`: LangChain and LangGraph runs, through a callback
  handler (``instrument_langchain``, or ``callbacks=[Handler()]``).
- :mod:`looptrace.integrations.pydantic_ai`: pydantic-ai's own OpenTelemetry spans, through
  looptrace's OpenTelemetry bridge (``instrument_pydantic_ai``).
- :mod:`looptrace.integrations.litellm`: LiteLLM calls, through its callback interface
  (``instrument_litellm``).
"""
