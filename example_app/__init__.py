"""A runnable demo app for fastapi-agent-plugin: ``uvicorn example_app.main:app``."""
