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

base, model = sys.argv[1], sys.argv[2]
structured_base = sys.argv[3] if len(sys.argv) > 3 else None
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=30)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    checks += 1
    print(f"ok: {what}")


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

    parse = tiny.chat.completions.parse if hasattr(tiny.chat.completions, "parse") else tiny.beta.chat.completions.parse
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

    calls, finish = [], None
    for chunk in tiny.chat.completions.create(model=tiny_model, messages=ask, tools=tools, tool_choice="required", max_tokens=300, seed=5, temperature=1.0, logit_bias=bias, stream=True):
        for ch in chunk.choices:
            calls += ch.delta.tool_calls or []
            finish = ch.finish_reason or finish
    check(finish == "tool_calls" and [c.function.arguments for c in calls] == [c.function.arguments for c in msg.tool_calls], "streamed tool calls equal the whole answer's")

    try:
        tiny.chat.completions.create(model=tiny_model, messages=ask, extra_body={"guided_regex": "(unclosed"})
        check(False, "a bad regex is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body["param"] == "guided_regex", f"a bad regex is a 400 naming guided_regex: {e.body['message']}")

print(f"all {checks} checks passed")
