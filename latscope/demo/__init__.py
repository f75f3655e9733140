"""``latscope demo``: a simulated LLM serving workload that knows the true answer.

``scenarios`` (what goes wrong) → ``engine`` (continuous batching, GPU time as sleeps) →
``server`` (OpenAI-compatible HTTP, instrumented with ``latscope.sdk``, ground truth in
``truth``) ← ``proxy`` (a slow network) ← ``load`` (the users) ; ``command`` runs them with
``latscope serve``, ``report`` prints latscope's answer and ``check`` grades it.
"""
