"""Generated from query.proto; regenerate with ``python -m latscope.api.codegen``."""
