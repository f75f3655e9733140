"""Runnable examples of the latscope SDK (exercised by the tests)."""
