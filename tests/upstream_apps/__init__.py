"""Apps run as subprocesses by tests/test_upstream_apps.py: an OpenAI-compatible model server
traced by the real OpenTelemetry FastAPI instrumentation, and a client app traced by the real
GenAI client instrumentations. Each writes what it measured (the truth) as JSON lines."""
