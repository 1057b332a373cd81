"""Serving trained agents: `arpo serve agent` (an OpenAI-compatible Chat Completions API).

    scheduler.py      one engine thread: continuous batching of agent conversations, cancellation
    openai_format.py  requests, responses, stream chunks and errors in OpenAI's format
    app.py            the FastAPI app and `serve(ServeConfig)`
"""
