"""Drives a running tandem server with the OpenAI Agents SDK (`openai-agents`), which speaks the
Responses API by default: one agent turn, whole and streamed.

Run through tests/openai_client.sh (on the fake-model server), or by hand:
    python tests/agents_client.py http://127.0.0.1:8123/v1 <model>
The fake model never ends on its own, and the SDK treats a `response.incomplete` (an answer cut by
max_output_tokens) as a failed turn, as it would against OpenAI; so the turn ends on a stop
string taken from the greedy answer. Exits non-zero on the first failed check.
"""
import asyncio
import sys

from agents import Agent, ModelSettings, Runner, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI, OpenAI

from client_checks import check

base, model = sys.argv[1], sys.argv[2]

text = OpenAI(base_url=base, api_key="unused", max_retries=0).responses.create(model=model, input="hello world", instructions="the cat", max_output_tokens=8, temperature=0).output_text
stop = " " + text.split()[3]
want = text[: text.index(stop)]


async def main():
    set_default_openai_client(AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=30), use_for_tracing=False)
    set_tracing_disabled(True)
    agent = Agent(name="assistant", instructions="the cat", model=model, model_settings=ModelSettings(temperature=0, extra_body={"stop": [stop]}))
    r = await Runner.run(agent, "hello world")
    check(r.final_output == want, f"an Agents SDK turn over the Responses API: {r.final_output!r}")
    s = Runner.run_streamed(agent, "hello world")
    kinds = set()
    async for ev in s.stream_events():
        kinds.add(ev.type)
    check(s.final_output == want and "raw_response_event" in kinds, f"the same turn streamed: {s.final_output!r} ({sorted(kinds)})")


asyncio.run(main())
