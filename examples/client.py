"""A chat client using the ``openai`` library, its HTTP traced by latscope in two lines.

Run it against ``examples.inference_server``::

    python -m examples.client --base-url http://127.0.0.1:8000/v1 "why is the sky blue"
"""

from __future__ import annotations

import argparse

import httpx
import openai

from latscope import sdk


def make_client(base_url: str) -> openai.OpenAI:
    """An OpenAI client whose requests become latscope CLIENT spans (traceparent, first token)."""
    http = sdk.instrument_httpx(httpx.Client(timeout=30))
    return openai.OpenAI(base_url=base_url, api_key="unused", http_client=http, max_retries=0)


def chat(client: openai.OpenAI, prompt: str, *, stream: bool = True) -> str:
    """Ask once; returns the answer's text."""
    if not stream:
        resp = client.chat.completions.create(
            model="toy-echo-1", messages=[{"role": "user", "content": prompt}]
        )
        return resp.choices[0].message.content or ""
    parts = []
    with client.chat.completions.create(
        model="toy-echo-1", messages=[{"role": "user", "content": prompt}], stream=True
    ) as stream_resp:
        for chunk in stream_resp:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    args = parser.parse_args()
    sdk.configure(service_name="example-chat-client")
    try:
        print(chat(make_client(args.base_url), args.prompt))
    finally:
        sdk.shutdown()


if __name__ == "__main__":
    main()
