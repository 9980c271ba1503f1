"""Drives a running tandem server with the official `anthropic` Python client (Messages API).

Run through tests/openai_client.sh (which starts the fake-model server, and the tiny-model
server with structured output for the tool checks), or by hand:
    python tests/anthropic_client.py http://127.0.0.1:8123 <model> [http://127.0.0.1:8124]
(the servers' roots: the client adds /v1/messages). Exits non-zero on the first failed check;
prints one line per check.
"""
import json
import sys

import anthropic

from client_checks import check

root, model = sys.argv[1], sys.argv[2]
tiny_root = sys.argv[3] if len(sys.argv) > 3 else None
client = anthropic.Anthropic(base_url=root, api_key="unused", max_retries=0, timeout=30)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


models = client.models.list().data
check([m.id for m in models] == [model] and models[0].max_input_tokens > 0, f"models.list names the served model and its context: {models[0].max_input_tokens}")
check(client.models.retrieve(model).id == model, "models.retrieve")

# The current SDK has no sampling arguments (temperature, top_p, top_k); the API takes them.
greedy = {"temperature": 0}
ask = dict(model=model, system="the cat", messages=[{"role": "user", "content": "hello world"}], extra_body=greedy)
m = client.messages.create(max_tokens=8, **ask)
check(m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == model, f"a message: {m.id}")
check(m.content[0].type == "text" and m.stop_reason in ("max_tokens", "end_turn"), f"text and stop_reason {m.stop_reason}")
check(0 < m.usage.output_tokens <= 8 and m.usage.input_tokens > 0, f"usage {m.usage}")

with client.messages.stream(max_tokens=8, **ask) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check(streamed == text_of(m), "the streamed text equals the whole one")
check(final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens, f"the stream's final message: {final.stop_reason}, {final.usage}")
kinds = [e.type for e in client.messages.create(max_tokens=8, stream=True, **ask)]
check(kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"] and "content_block_delta" in kinds, f"raw event order: {kinds[:3]}...{kinds[-3:]}")

words = text_of(m).split()
stop = " " + words[2]
r = client.messages.create(max_tokens=8, stop_sequences=[stop], **ask)
want = text_of(m)[: text_of(m).find(stop)]
check(r.stop_reason == "stop_sequence" and r.stop_sequence == stop and text_of(r) == want, f"stop_sequences: {r.stop_reason} {r.stop_sequence!r}")

n = client.messages.count_tokens(model=model, system="the cat", messages=[{"role": "user", "content": "hello world"}])
check(n.input_tokens == m.usage.input_tokens, f"count_tokens {n.input_tokens} equals the message's input_tokens")

r = client.messages.with_raw_response.create(max_tokens=2, extra_headers={"X-Request-Id": "client-7"}, **ask)
check(r.headers.get("x-request-id") == "client-7", "the client's X-Request-Id is echoed")

try:
    client.messages.create(model="not-" + model, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    check(False, "an unknown model is refused")
except anthropic.NotFoundError as e:
    check(e.status_code == 404 and e.body["error"]["type"] == "not_found_error", f"an unknown model is a not_found_error: {e.body}")
try:
    client.messages.create(model=model, max_tokens=2, extra_body={"temperature": 7}, messages=[{"role": "user", "content": "hi"}])
    check(False, "temperature 7 is refused")
except anthropic.BadRequestError as e:
    check(e.status_code == 400 and e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", f"temperature 7 is an invalid_request_error: {e.body['error']['message']}")

if tiny_root is not None:
    # Tools on the tiny random model: its text is random, the constraint makes calls valid.
    tiny = anthropic.Anthropic(base_url=tiny_root, api_key="unused", max_retries=0, timeout=60)
    weather = {
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"], "additionalProperties": False},
    }
    question = [{"role": "user", "content": "What is the weather in Oslo?"}]

    def valid(block):
        return block.type == "tool_use" and block.name == "get_weather" and block.id.startswith("toolu_") and block.input.get("city") in ("Paris", "Oslo") and 1 <= block.input.get("days", 0) <= 7

    r = tiny.messages.create(model="tiny", max_tokens=300, extra_body=greedy, tools=[weather], tool_choice={"type": "tool", "name": "get_weather"}, messages=question)
    check(r.stop_reason == "tool_use" and len(r.content) == 1 and valid(r.content[0]), f"a forced tool answers a tool_use block: {r.content}")
    with tiny.messages.stream(model="tiny", max_tokens=300, extra_body=greedy, tools=[weather], tool_choice={"type": "tool", "name": "get_weather"}, messages=question) as s:
        pieces = sum(1 for e in s if e.type == "input_json")
        final = s.get_final_message()
    check(final.stop_reason == "tool_use" and final.content[0].input == r.content[0].input and pieces >= 1, f"streamed, its input arrives as input_json_delta ({pieces} pieces) and equals the whole one")

    r = tiny.messages.create(model="tiny", max_tokens=300, extra_body=greedy, tools=[weather], tool_choice={"type": "any"}, messages=question)
    check(r.stop_reason == "tool_use" and r.content and all(valid(b) for b in r.content), f"tool_choice any answers tool_use blocks: {len(r.content)}")

    # The round trip: the call goes back as the assistant's turn, its result in a user turn.
    call = r.content[0]
    convo = question + [{"role": "assistant", "content": r.content}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}]}]
    after = tiny.messages.create(model="tiny", max_tokens=5, tools=[weather], tool_choice={"type": "none"}, messages=convo)
    check(after.content and after.content[0].type == "text" and after.stop_reason in ("max_tokens", "end_turn"), f"tool_result round trip answers text: {after.stop_reason}")
    counted = tiny.messages.count_tokens(model="tiny", tools=[weather], messages=convo)
    check(counted.input_tokens == after.usage.input_tokens, f"count_tokens with tools and blocks: {counted.input_tokens}")

    # Structured output: output_config.format, constrained through llguidance.
    r = tiny.messages.create(model="tiny", max_tokens=300, extra_body=greedy, output_config={"format": {"type": "json_schema", "schema": weather["input_schema"]}}, messages=question)
    answer = json.loads(text_of(r))
    check(r.stop_reason == "end_turn" and answer.get("city") in ("Paris", "Oslo") and 1 <= answer.get("days", 0) <= 7, f"output_config.format gives schema-valid JSON: {answer}")

    try:
        tiny.messages.create(model="tiny", max_tokens=5, tools=[{"type": "web_search_20250305", "name": "web_search"}], messages=question)
        check(False, "a server tool is refused")
    except anthropic.BadRequestError as e:
        check("tools[0].type" in e.body["error"]["message"], f"a server tool is a 400 naming it: {e.body['error']['message']}")

