//! Chat-template rendering of arbitrary messages (what a client controls): the default model's
//! own template when it is installed, and templates written here in the styles real models use
//! (ChatML with tools, Llama 3 headers with a system slice and `tojson`, Mistral's alternation
//! check with `raise_exception`, a Qwen-style `namespace` and reasoning split).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};
use std::sync::OnceLock;
use tandem_core::chat::ChatTemplate;

const CHATML_TOOLS: &str = r#"{% if tools %}<|im_start|>system
Tools:{% for t in tools %}
{{ t | tojson }}{% endfor %}<|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{% if m.content is string %}{{ m.content }}{% elif m.content %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}{% if m.tool_calls %}{% for c in m.tool_calls %}
<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

const LLAMA3: &str = r#"{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] | trim %}{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}<|start_header_id|>system<|end_header_id|>

Today Date: {{ strftime_now('%d %b %Y') }}
{{ system }}<|eot_id|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>

{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}{{ m['content'] | tojson }}{% endif %}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"#;

const MISTRAL: &str = r#"{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"#;

const QWEN: &str = r#"{%- set ns = namespace(last_query=messages|length - 1) %}{%- for m in messages[::-1] %}{%- if m.role == 'user' and m.content is string %}{%- set ns.last_query = messages|length - 1 - loop.index0 %}{%- break %}{%- endif %}{%- endfor %}{%- for m in messages %}{%- set content = m.content if m.content is string else '' %}{%- if m.role == 'assistant' and '</think>' in content %}{%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- if loop.index0 > ns.last_query %}<|im_start|>assistant
<think>
{{ reasoning.strip('\n') }}
</think>

{{ content.lstrip('\n') }}<|im_end|>
{%- else %}<|im_start|>assistant
{{ content }}<|im_end|>
{%- endif %}{%- else %}<|im_start|>{{ m.role }}
{{ content }}<|im_end|>
{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{%- if enable_thinking is defined and enable_thinking is false %}
<think>

</think>
{%- endif %}
{% endif %}"#;

fn templates() -> &'static [ChatTemplate] {
    static T: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t: Vec<ChatTemplate> = [CHATML_TOOLS, LLAMA3, MISTRAL, QWEN]
            .iter()
            .map(|s| {
                ChatTemplate::new(s, Some("<s>".into()), Some("</s>".into())).expect("a template written here parses")
            })
            .collect();
        if let Ok(tok) = tandem_core::tokenizer::Tokenizer::from_dir(&tandem_fuzz::model_dir()) {
            if let Some(c) = tok.chat_template() {
                t.push(
                    ChatTemplate::new(c.source(), Some("<s>".into()), Some("</s>".into()))
                        .expect("the model's template parses"),
                );
            }
        }
        t
    })
}

fn value(b: &mut tandem_fuzz::Bytes, depth: u32) -> Value {
    match b.u8() % if depth > 2 { 5 } else { 7 } {
        0 => Value::Null,
        1 => json!(b.u8() & 1 == 1),
        2 => json!(b.u32() as i32),
        3 => json!(f64::from(b.u16()) / 7.0),
        4 => json!(b.string()),
        5 => Value::Array((0..b.u8() % 4).map(|_| value(b, depth + 1)).collect()),
        _ => {
            let mut m = Map::new();
            for _ in 0..b.u8() % 4 {
                m.insert(b.string(), value(b, depth + 1));
            }
            Value::Object(m)
        }
    }
}

fn content(b: &mut tandem_fuzz::Bytes) -> Value {
    match b.u8() % 4 {
        0 => json!(b.string()),
        1 => Value::Array((0..b.u8() % 3).map(|_| json!({"type": "text", "text": b.string()})).collect()),
        2 => Value::Null,
        _ => value(b, 0),
    }
}

fn message(b: &mut tandem_fuzz::Bytes) -> Value {
    const ROLES: [&str; 4] = ["user", "assistant", "system", "tool"];
    let k = b.u8();
    let role = if k < 250 { json!(ROLES[k as usize % 4]) } else { value(b, 1) };
    let mut m = json!({"role": role, "content": content(b)});
    let extra = b.u8();
    if extra & 1 == 1 {
        let args = if extra & 2 == 2 { json!(b.string()) } else { value(b, 0) };
        m["tool_calls"] =
            json!([{"id": b.string(), "type": "function", "function": {"name": b.string(), "arguments": args}}]);
    }
    if extra & 4 == 4 {
        m["tool_call_id"] = json!(b.string());
    }
    if extra & 8 == 8 {
        m["name"] = value(b, 1);
    }
    m
}

fuzz_target!(|data: &[u8]| {
    let mut b = tandem_fuzz::Bytes::new(data);
    let ts = templates();
    let t = &ts[b.u8() as usize % ts.len()];
    let flags = b.u8();
    let messages: Vec<Value> = (0..b.u8() % 6).map(|_| message(&mut b)).collect();
    let tools: Vec<Value> = (0..b.u8() % 3)
        .map(|_| json!({"type": "function", "function": {"name": b.string(), "description": b.string(), "parameters": value(&mut b, 0)}}))
        .collect();
    let mut kwargs = Map::new();
    if flags & 2 == 2 {
        kwargs.insert("enable_thinking".into(), json!(flags & 4 == 4));
    }
    if flags & 8 == 8 {
        kwargs.insert(b.string(), value(&mut b, 0));
    }
    let _ =
        t.render_with_kwargs(&messages, (flags & 16 == 16).then_some(tools.as_slice()), flags & 1 == 1, Some(&kwargs));
});
