"""serve: a deployment as an LLM endpoint — an OpenAI-compatible HTTP API and a terminal chat over one runner.

One job per module:

- ``schemas``  pydantic models of the OpenAI requests and responses this server speaks (and its errors),
- ``stops``    stop sequences on streamed text (hold back what could still become a stop string),
- ``engine``   one ``NpuRunner`` + a FIFO queue served by one worker thread, with prefix KV-cache reuse,
- ``app``      the FastAPI application (routes, validation, server-sent events, error bodies),
- ``launch``   the uvicorn launcher (signals: SIGINT/SIGTERM stop the running generation and exit 0),
- ``repl``     the multi-turn terminal chat of ``tilepilot chat``.

Every NPU figure the server reports is *modeled* (the deployment's timing model; there is no NPU here)
and says so in its name; host times are measured wall clock of this process.
"""
