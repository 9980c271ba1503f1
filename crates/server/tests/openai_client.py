"""Drives a running tandem server with the official `openai` Python client.

Run through tests/openai_client.sh (which starts the fake-model server, and the tiny-model
server with structured output for the second part), or by hand:
    python tests/openai_client.py http://127.0.0.1:8123/v1 <model> [http://127.0.0.1:8124/v1]
Exits non-zero on the first failed check; prints one line per check.
"""
import json
import sys
import urllib.error
import urllib.request

import openai

from client_checks import check

base, model = sys.argv[1], sys.argv[2]
structured_base = sys.argv[3] if len(sys.argv) > 3 else None
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=30)

models = client.models.list()
check([m.id for m in models.data] == [model], "models.list names the served model")

c = client.completions.create(model=model, prompt="hello world the cat", max_tokens=8, temperature=0)
check(c.object == "text_completion" and len(c.choices) == 1, "completion object and one choice")
check(c.usage.completion_tokens <= 8 and c.usage.prompt_tokens == 4, f"completion usage {c.usage}")
check(c.choices[0].finish_reason in ("stop", "length"), "completion finish_reason")

again = client.completions.create(model=model, prompt="hello world the cat", max_tokens=8, temperature=0)
check(again.choices[0].text == c.choices[0].text, "greedy completions are reproducible")

parts = []
finish = None
for chunk in client.completions.create(model=model, prompt="hello world the cat", max_tokens=8, temperature=0, stream=True):
    for ch in chunk.choices:
        parts.append(ch.text)
        finish = ch.finish_reason or finish
check("".join(parts) == c.choices[0].text, "streamed completion equals the whole one")
check(finish == c.choices[0].finish_reason, "streamed finish_reason")

lp = client.completions.create(model=model, prompt="hello", max_tokens=3, temperature=0, logprobs=2)
check(lp.choices[0].logprobs is not None and len(lp.choices[0].logprobs.token_logprobs) == lp.usage.completion_tokens, "completion logprobs per token")

msgs = [{"role": "system", "content": "the cat"}, {"role": "user", "content": "hello"}]
r = client.chat.completions.create(model=model, messages=msgs, max_completion_tokens=10, temperature=0, n=2, seed=3)
check(r.object == "chat.completion" and len(r.choices) == 2, "chat object with n=2")
check(r.choices[0].message.role == "assistant" and r.choices[0].message.content == r.choices[1].message.content, "greedy chat choices agree")

text, usage, roles = "", None, 0
stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True})
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for ch in chunk.choices:
        roles += ch.delta.role == "assistant"
        text += ch.delta.content or ""
check(roles == 1, "the stream announces the assistant role once")
check(text == r.choices[0].message.content, "streamed chat equals the whole one")
check(usage is not None and usage.prompt_tokens == r.usage.prompt_tokens and usage.completion_tokens == r.usage.completion_tokens / 2, f"stream usage {usage}")

r = client.chat.completions.create(model=model, messages=msgs, max_tokens=3, logprobs=True, top_logprobs=2)
check(len(r.choices[0].logprobs.content) == r.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in r.choices[0].logprobs.content), "chat logprobs")

try:
    client.completions.create(model=model, prompt="hi", temperature=7)
    check(False, "temperature 7 refused")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.body["param"] == "temperature", f"temperature 7 refused: {e.body['message']}")

try:
    client.chat.completions.create(model="not-" + model, messages=msgs)
    check(False, "unknown model refused")
except openai.NotFoundError as e:
    # vLLM's 404: clients written for vLLM read `code` as the status.
    check(e.status_code == 404 and e.body["code"] == 404 and e.body["param"] == "model", f"unknown model is vLLM's 404: {e.body}")

# The Responses API: plain, streamed, previous_response_id, retrieve and delete.
resp = client.responses.create(model=model, input="hello world", instructions="the cat", max_output_tokens=6, temperature=0)
check(resp.object == "response" and resp.id.startswith("resp_") and resp.output[0].type == "message", f"responses.create: {resp.status}")
check(resp.output_text and resp.usage.output_tokens == 6 and resp.incomplete_details.reason == "max_output_tokens", f"responses usage and incomplete details: {resp.usage}")
text, events, final = "", [], None
for ev in client.responses.create(model=model, input="hello world", instructions="the cat", max_output_tokens=6, temperature=0, stream=True):
    events.append(ev.type)
    if ev.type == "response.output_text.delta":
        text += ev.delta
    elif ev.type in ("response.completed", "response.incomplete"):
        final = ev.response
check(events[:2] == ["response.created", "response.in_progress"] and "response.output_item.added" in events and "response.output_text.done" in events, f"responses stream events: {sorted(set(events))}")
check(final is not None and text == final.output_text == resp.output_text, "streamed response text equals the deltas and the whole answer")
follow = client.responses.create(model=model, input="sat", previous_response_id=resp.id, max_output_tokens=2)
check(follow.previous_response_id == resp.id and follow.usage.input_tokens > resp.usage.input_tokens - 3, f"previous_response_id continues: {follow.usage.input_tokens} input tokens")
check(client.responses.retrieve(resp.id).output_text == resp.output_text, "responses.retrieve gives the stored response")
client.responses.delete(resp.id)
try:
    client.responses.retrieve(resp.id)
    check(False, "a deleted response is gone")
except openai.NotFoundError as e:
    check(e.status_code == 404, "a deleted response is gone")
try:
    client.responses.create(model=model, input="hi", tools=[{"type": "web_search"}])
    check(False, "built-in tools refused")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.body["param"] == "tools[0].type", f"built-in tools are a 400 naming them: {e.body['message']}")
# A context overflow as client libraries (langchain-openai, litellm) recognise one: OpenAI's
# code and vLLM's sentence; a max_tokens past the room the prompt leaves is trimmed (vLLM 0.32).
try:
    client.completions.create(model=model, prompt=[5] * 600, max_tokens=4)
    check(False, "a prompt past the context refused")
except openai.BadRequestError as e:
    check(e.code == "context_length_exceeded" and "This model's maximum context length is" in e.body["message"], f"overflow recognisable: {e.body}")
r = client.completions.create(model=model, prompt="hello", max_tokens=100000)
check(r.usage.total_tokens <= 512 and r.choices[0].finish_reason in ("length", "stop"), f"max_tokens trimmed to the context: {r.usage}")

# vLLM's endpoints beside the API (plain HTTP: they are not in the client).
root = base.removesuffix("/v1")


def post(path, body):
    req = urllib.request.Request(root + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


tj = post("/tokenize", {"model": model, "prompt": "hello world the cat"})
check(tj["count"] == len(tj["tokens"]) == c.usage.prompt_tokens, f"/tokenize counts the prompt as completions do: {tj}")
d = post("/detokenize", {"model": model, "tokens": tj["tokens"]})
check("hello world the cat" in d["prompt"], f"/detokenize gives the text back: {d}")
r = client.chat.completions.with_raw_response.create(model=model, messages=msgs, max_tokens=2, extra_headers={"X-Request-Id": "client-42"})
check(r.headers.get("x-request-id") == "client-42", "the client's X-Request-Id is echoed")

if structured_base is not None:
    # Structured output through the client's own helpers, on the tiny random model (its text
    # is random; the constraint makes it valid). The models are bounded so that it ends.
    from typing import Literal

    from pydantic import BaseModel, conint, constr

    tiny = openai.OpenAI(base_url=structured_base, api_key="unused", max_retries=0, timeout=60)
    tiny_model = tiny.models.list().data[0].id

    # LoRA adapters by name (the tiny server is the golden `tiny` model with tests/golden/lora's
    # tiny-all as `a`, tiny-rs as `b`, over one slot): each answers with HF + peft's greedy ids.
    listed = {m.id: m for m in tiny.models.list().data}
    check({"a", "b"} <= set(listed) and listed["a"].model_extra.get("parent") == tiny_model, f"models.list names the adapters with their parent: {sorted(listed)}")
    here = __file__.rsplit("/", 1)[0]

    def detokenize(ids):
        req = urllib.request.Request(structured_base.removesuffix("/v1") + "/detokenize", data=json.dumps({"tokens": ids}).encode(), headers={"content-type": "application/json"})
        return json.load(urllib.request.urlopen(req))["prompt"]

    for name, golden in [("a", "tiny-all"), ("b", "tiny-rs"), ("a", "tiny-all")]:
        with open(f"{here}/../../../tests/golden/lora/{golden}.json") as f:
            case = json.load(f)["cases"][1]
        n = len(case["greedy"])
        got = tiny.completions.create(model=name, prompt=case["prompt_ids"], max_tokens=n, temperature=0, extra_body={"ignore_eos": True})
        base = tiny.completions.create(model=tiny_model, prompt=case["prompt_ids"], max_tokens=n, temperature=0, extra_body={"ignore_eos": True})
        check(got.model == name and got.choices[0].text == detokenize(case["greedy"]), f"model={name!r} answers with {golden}'s peft greedy ids")
        check(base.choices[0].text == detokenize(case["base_greedy"]) != got.choices[0].text, f"the base model beside {name!r} answers with HF's base ids")
    try:
        tiny.completions.create(model="no-such-adapter", prompt="hi", max_tokens=2)
        check(False, "an unknown adapter is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.body["param"] == "model", f"an unknown adapter is NotFoundError: {e.body['message']}")

    class Person(BaseModel):
        name: constr(max_length=6)
        age: conint(ge=0, le=99)
        color: Literal["red", "green", "blue"]

    # JSON allows whitespace anywhere, and a random model would write it forever: bias the
    # whitespace-only tokens away (a trained model needs no such help).
    tiny_root = structured_base.removesuffix("/v1")
    bias, i = {}, 0
    while True:  # every token id, until /detokenize says the vocabulary ended
        req = urllib.request.Request(tiny_root + "/detokenize", data=json.dumps({"tokens": [i]}).encode(), headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                t = json.load(resp)["prompt"]
        except urllib.error.HTTPError:
            break
        if t and t.isspace():
            bias[str(i)] = -100
        i += 1
    check(len(bias) >= 3, f"the tiny tokenizer's whitespace tokens: {sorted(bias)}")

    parse = tiny.chat.completions.parse
    ask = [{"role": "user", "content": "Describe a person."}]
    for seed in (1, 2, 3):
        r = parse(model=tiny_model, messages=ask, response_format=Person, temperature=1.0, seed=seed, max_tokens=200, logit_bias=bias)
        p = r.choices[0].message.parsed
        check(isinstance(p, Person) and r.choices[0].finish_reason == "stop", f"chat.completions.parse gives a Person (seed {seed}): {p}")

    class GetWeather(BaseModel):
        city: Literal["Paris", "Oslo"]
        days: conint(ge=1, le=7)

    tools = [openai.pydantic_function_tool(GetWeather, name="get_weather", description="Weather in a city")]
    r = tiny.chat.completions.create(model=tiny_model, messages=ask, tools=tools, tool_choice="required", max_tokens=300, seed=5, temperature=1.0, logit_bias=bias)
    msg = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls" and msg.content is None and len(msg.tool_calls) >= 1, f"tool_choice required answers tool calls: {msg}")
    for call in msg.tool_calls:
        args = GetWeather.model_validate_json(call.function.arguments)
        check(call.function.name == "get_weather" and call.id.startswith("call_") and call.type == "function", f"a valid call: {call.function.name}({args})")
    r = parse(model=tiny_model, messages=ask, tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=100, seed=6, logit_bias=bias)
    parsed = r.choices[0].message.tool_calls[0].function.parsed_arguments
    check(isinstance(parsed, GetWeather), f"a named tool parses into its model: {parsed}")

    # Streamed: each call's arguments arrive in pieces as they are sampled (OpenAI's shape: the
    # first chunk of a call names it, later ones carry only its index and arguments).
    calls, pieces, finish = {}, 0, None
    for chunk in tiny.chat.completions.create(model=tiny_model, messages=ask, tools=tools, tool_choice="required", max_tokens=300, seed=5, temperature=1.0, logit_bias=bias, stream=True):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                if tc.id is not None:
                    calls[tc.index] = [tc.function.name, tc.function.arguments]
                else:
                    calls[tc.index][1] += tc.function.arguments
                    pieces += 1
            finish = ch.finish_reason or finish
    got = [(n, json.loads(a)) for n, a in calls.values()]
    check(finish == "tool_calls" and got == [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls], "streamed tool calls equal the whole answer's")
    check(pieces > len(calls), f"streamed tool call arguments come in pieces ({pieces} chunks for {len(calls)} calls)")

    # The Responses API: a function_call, its output sent back, an answer; json_schema output.
    rtools = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": {**GetWeather.model_json_schema(), "additionalProperties": False}}]
    r1 = tiny.responses.create(model=tiny_model, input="Weather in Oslo?", tools=rtools, tool_choice="required", max_output_tokens=300, temperature=0, extra_body={"logit_bias": bias})
    fc = [o for o in r1.output if o.type == "function_call"]
    check(r1.status == "completed" and len(fc) >= 1 and fc[0].name == "get_weather", f"responses: tool_choice required gives function_call items: {r1.output}")
    args = GetWeather.model_validate_json(fc[0].arguments)
    r2 = tiny.responses.create(model=tiny_model, previous_response_id=r1.id, input=[{"type": "function_call_output", "call_id": fc[0].call_id, "output": "sunny"}],
                               tools=rtools, tool_choice="none", max_output_tokens=5)
    check(r2.output[0].type == "message" and r2.usage.input_tokens > r1.usage.input_tokens, f"responses: function_call_output round trip ({args} -> {r2.output_text!r})")
    rs = tiny.responses.create(model=tiny_model, input="Weather?", tools=rtools, tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=300, temperature=0,
                               extra_body={"logit_bias": bias}, stream=True)
    deltas, done = [], None
    for ev in rs:
        if ev.type == "response.function_call_arguments.delta":
            deltas.append(ev.delta)
        elif ev.type == "response.completed":
            done = ev.response
    check(done is not None and len(deltas) > 1 and json.loads("".join(deltas)) == json.loads(done.output[0].arguments), f"responses: a streamed forced call's arguments in {len(deltas)} deltas")
    rj = tiny.responses.create(model=tiny_model, input="Describe a person.", text={"format": {"type": "json_schema", "name": "person", "schema": {**Person.model_json_schema(), "additionalProperties": False}, "strict": True}},
                               temperature=1.0, max_output_tokens=200, extra_body={"seed": 7, "logit_bias": bias})
    check(isinstance(Person.model_validate_json(rj.output_text), Person), f"responses: text.format json_schema: {rj.output_text}")
    rp = tiny.responses.parse(model=tiny_model, input="Describe a person.", text_format=Person, temperature=1.0, max_output_tokens=200, extra_body={"seed": 8, "logit_bias": bias})
    check(isinstance(rp.output_parsed, Person), f"responses.parse gives a Person: {rp.output_parsed}")

    try:
        tiny.chat.completions.create(model=tiny_model, messages=ask, extra_body={"guided_regex": "(unclosed"})
        check(False, "a bad regex is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body["param"] == "guided_regex", f"a bad regex is a 400 naming guided_regex: {e.body['message']}")

