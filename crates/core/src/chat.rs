//! Chat templates: the Jinja source from tokenizer_config.json, rendered with minijinja the
//! way transformers renders it (`trim_blocks`, `lstrip_blocks`, `raise_exception`, Python
//! string methods through minijinja-contrib's pycompat).

use minijinja::{Environment, ErrorKind, Value};

use crate::error::{Error, Result};

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    source: String,
}

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

/// transformers passes `strftime_now`; Llama 3 templates print today's date with it.
fn strftime_now(_fmt: String) -> String {
    // No date crate: the templates that use this only print the date in a system line, and a
    // fixed, documented value keeps renders reproducible.
    "26 Jul 2024".to_string()
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| Error::Template(e.to_string()))?;
        env.set_syntax(syntax);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| Error::Template(format!("does not parse: {e}")))?;
        Ok(ChatTemplate { env, bos_token, eos_token, source: source.to_string() })
    }

    /// The Jinja source, as tokenizer_config.json gives it (the server looks in it for the
    /// model's tool-call markup).
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn render(&self, messages: &[serde_json::Value], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// With `tools` (OpenAI's tool objects) passed as transformers passes them: a `tools`
    /// variable, left undefined when there are none, so that `{% if tools %}` and
    /// `tools is defined` read as they do there. A template that never mentions it ignores it.
    pub fn render_with_tools(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with_kwargs(messages, tools, add_generation_prompt, None)
    }

    /// The same, with extra template variables (vLLM's `chat_template_kwargs`, such as Qwen3's
    /// `enable_thinking`); the messages, tools and tokens above win over a variable of the
    /// same name.
    pub fn render_with_kwargs(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String> {
        for (i, m) in messages.iter().enumerate() {
            if m.get("role").and_then(|r| r.as_str()).is_none() {
                return Err(Error::Template(format!("message {i} has no string `role`")));
            }
        }
        let tmpl = self.env.get_template("chat").map_err(|e| Error::Template(e.to_string()))?;
        let ctx = minijinja::context! {
            messages => Value::from(minijinja::value::Serde(messages)),
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
            add_generation_prompt => add_generation_prompt,
        };
        let ctx = match tools {
            Some(t) => minijinja::context! { tools => Value::from(minijinja::value::Serde(t)), ..ctx },
            None => ctx,
        };
        let ctx = match kwargs {
            Some(k) => minijinja::context! { ..ctx, ..Value::from(minijinja::value::Serde(k)) },
            None => ctx,
        };
        tmpl.render(ctx).map_err(|e| {
            let mut msg = e.to_string();
            if let Some(d) = e.detail() {
                msg = format!("{msg}: {d}");
            }
            Error::Template(msg)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn kwargs_reach_the_template() {
        let t = ChatTemplate::new("{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>{% endif %}{{ messages[0]['content'] }}", None, None).unwrap();
        let m = [json!({"role": "user", "content": "hi"})];
        let kw = |v: serde_json::Value| v.as_object().unwrap().clone();
        assert_eq!(
            t.render_with_kwargs(&m, None, false, Some(&kw(json!({"enable_thinking": false})))).unwrap(),
            "<think>\n\n</think>hi"
        );
        assert_eq!(t.render_with_kwargs(&m, None, false, Some(&kw(json!({"enable_thinking": true})))).unwrap(), "hi");
        assert_eq!(
            t.render_with_kwargs(&m, None, false, Some(&kw(json!({"messages": []})))).unwrap(),
            "hi",
            "the messages win"
        );
    }

    #[test]
    fn renders_chatml_with_default_system() {
        let t = ChatTemplate::new(CHATML, None, None).unwrap();
        let out = t.render(&[json!({"role": "user", "content": "Hi"})], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_and_python_methods() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{{ bos_token }}{{ messages[0].content.strip().upper() }}";
        let t = ChatTemplate::new(src, Some("<s>".into()), None).unwrap();
        assert_eq!(t.render(&[json!({"role": "user", "content": "  hi "})], false).unwrap(), "<s>HI");
        let e = t.render(&[json!({"role": "system", "content": "x"})], false).unwrap_err();
        assert!(e.to_string().contains("first must be user"), "{e}");
    }

    #[test]
    fn tools_reach_the_template_only_when_given() {
        let src = "{% if tools is defined %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% endif %}{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments.x }}{% endif %};{% endfor %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let msgs = [
            json!({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 7}}}]}),
            json!({"role": "tool", "content": "42"}),
        ];
        assert_eq!(t.render(&msgs, false).unwrap(), "assistant:7;tool:42;");
        let tools = [
            json!({"type": "function", "function": {"name": "get"}}),
            json!({"type": "function", "function": {"name": "put"}}),
        ];
        assert_eq!(t.render_with_tools(&msgs, Some(&tools), false).unwrap(), "[get][put]assistant:7;tool:42;");
        assert_eq!(t.source(), src);
    }

    #[test]
    fn trims_blocks_like_transformers() {
        let src = "{% for m in messages %}\n  {{ m.content }}\n{% endfor %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        assert_eq!(
            t.render(&[json!({"role": "user", "content": "a"}), json!({"role": "user", "content": "b"})], false)
                .unwrap(),
            "  a\n  b\n"
        );
    }
}
