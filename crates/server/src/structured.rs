//! Structured output and tool calls as requests spell them: OpenAI's `response_format`, vLLM's
//! `guided_*` fields and `structured_outputs` object, `tools` with `tool_choice`. Each form
//! becomes one [`GuideSpec`] (compiled by `tandem-structured` into the engine's constraint);
//! tool calls are read back out of the text here.
//!
//! Rules (docs/openai-compat.md has the tables):
//! - at most one form per request; two are a 400 naming both fields;
//! - a wrong type is a 400 naming the field (`response_format.json_schema.name`, ...);
//! - a spec that does not compile is a 400 whose `param` is the field that held it;
//! - `tool_choice` "required" constrains the text to vLLM's JSON array of calls
//!   `[{"name": <a declared tool>, "parameters": <its schema>}]`, a named function to that
//!   tool's parameters; "auto" is unconstrained and read by `--tool-call-parser`
//!   ([`crate::tool_parser`]), or without one for Hermes-style
//!   `<tool_call>{"name": .., "arguments": ..}</tool_call>` blocks when the chat template itself
//!   contains `<tool_call>`; "none" renders the tools and reads plain text.

use std::hash::{BuildHasher, Hasher};

use serde_json::{json, Map, Value};
use tandem_structured::GuideSpec;

use crate::error::ApiError;
use crate::fields::{wrong_type, Fields};

/// A structured-output form, and the request field it came from (errors name it).
#[derive(Debug, Clone, PartialEq)]
pub struct GuideRequest {
    pub spec: GuideSpec,
    pub param: String,
}

/// A JSON schema given as an object (or boolean), or as a string holding one (vLLM accepts both).
fn schema_value(v: &Value, param: &str) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(x @ (Value::Object(_) | Value::Bool(_))) => Ok(x),
            Ok(x) => Err(wrong_type(param, "a JSON schema (an object, or a string holding one)", &x)),
            Err(e) => Err(ApiError::invalid(param, format!("`{param}` is a string but not JSON: {e}"))),
        },
        other => Err(wrong_type(param, "a JSON schema (an object, or a string holding one)", other)),
    }
}

/// xgrammar's strictness (vLLM's default structured-output backend): an object schema that
/// does not say what other properties it takes takes none (`additionalProperties: false`),
/// and an array with `prefixItems` but no `items` has no items beyond them. Schemas that
/// compose objects (`allOf`) are left open at that level, since closing each part would
/// refuse the others' properties. Applied to every schema a request constrains to, unless it
/// asks for the schema as written (`structured_outputs.disable_additional_properties: false`).
pub fn strict_schema(v: &mut Value) {
    let Value::Object(o) = v else { return };
    let is_object = o.contains_key("properties")
        || o.get("type")
            .is_some_and(|t| t == "object" || t.as_array().is_some_and(|a| a.iter().any(|x| x == "object")));
    let open_said = ["additionalProperties", "unevaluatedProperties", "patternProperties", "allOf"]
        .iter()
        .any(|k| o.contains_key(*k));
    if is_object && !open_said {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    if o.contains_key("prefixItems") && !o.contains_key("items") && !o.contains_key("unevaluatedItems") {
        o.insert("items".into(), Value::Bool(false));
    }
    for (k, x) in o.iter_mut() {
        match k.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                if let Value::Object(m) = x {
                    m.values_mut().for_each(strict_schema);
                }
            }
            "items" | "additionalProperties" | "not" | "if" | "then" | "else" | "contains" | "additionalItems" => {
                if let Value::Array(a) = x {
                    a.iter_mut().for_each(strict_schema);
                } else {
                    strict_schema(x);
                }
            }
            "prefixItems" | "anyOf" | "oneOf" => {
                if let Value::Array(a) = x {
                    a.iter_mut().for_each(strict_schema);
                }
            }
            // The parts of an `allOf` stay open themselves; what they nest is closed.
            "allOf" => {
                if let Value::Array(a) = x {
                    for part in a.iter_mut() {
                        let mut open = part.clone();
                        strict_schema(&mut open);
                        if let (Value::Object(closed), Value::Object(orig)) = (&mut open, &*part) {
                            if !orig.contains_key("additionalProperties") {
                                closed.remove("additionalProperties");
                            }
                        }
                        *part = open;
                    }
                }
            }
            _ => {}
        }
    }
}

fn strict(mut g: GuideRequest) -> GuideRequest {
    if let GuideSpec::JsonSchema(v) = &mut g.spec {
        strict_schema(v);
    }
    g
}

fn string_value(v: &Value, param: &str) -> Result<String, ApiError> {
    v.as_str().map(String::from).ok_or_else(|| wrong_type(param, "a string", v))
}

fn choice_value(v: &Value, param: &str) -> Result<Vec<String>, ApiError> {
    let Value::Array(a) = v else { return Err(wrong_type(param, "a list of strings", v)) };
    if a.is_empty() {
        return Err(ApiError::invalid(param, format!("`{param}` must not be empty")));
    }
    a.iter()
        .enumerate()
        .map(|(i, c)| c.as_str().map(String::from).ok_or_else(|| wrong_type(&format!("{param}[{i}]"), "a string", c)))
        .collect()
}

/// OpenAI's `response_format`: `text` (no constraint), `json_object`, `json_schema`.
fn response_format(rf: &Value) -> Result<Option<GuideRequest>, ApiError> {
    let Value::Object(o) = rf else { return Err(wrong_type("response_format", "an object", rf)) };
    let f = Fields(o);
    let ty = match f.get("type") {
        None => None,
        Some(Value::String(t)) => Some(t.as_str()),
        Some(v) => return Err(wrong_type("response_format.type", "a string", v)),
    };
    match ty {
        None => Err(ApiError::invalid(
            "response_format.type",
            "`response_format.type` is required: \"text\", \"json_object\" or \"json_schema\"",
        )),
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GuideRequest { spec: GuideSpec::JsonObject, param: "response_format".into() })),
        Some("json_schema") => {
            let js = match f.get("json_schema") {
                None => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema",
                        "`response_format.json_schema` is required with `\"type\": \"json_schema\"`",
                    ))
                }
                Some(Value::Object(js)) => js,
                Some(v) => return Err(wrong_type("response_format.json_schema", "an object", v)),
            };
            let js = Fields(js);
            match js.get("name") {
                None => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.name",
                        "`response_format.json_schema.name` is required",
                    ))
                }
                Some(Value::String(n))
                    if n.is_empty()
                        || n.len() > 64
                        || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
                {
                    return Err(ApiError::invalid("response_format.json_schema.name", format!("`response_format.json_schema.name` must be 1 to 64 of a-z, A-Z, 0-9, `_` and `-`, got {n:?}")));
                }
                Some(Value::String(_)) => {}
                Some(v) => return Err(wrong_type("response_format.json_schema.name", "a string", v)),
            }
            if let Some(v) = js.get("strict").filter(|v| !v.is_boolean()) {
                return Err(wrong_type("response_format.json_schema.strict", "a boolean", v));
            }
            if let Some(v) = js.get("description").filter(|v| !v.is_string()) {
                return Err(wrong_type("response_format.json_schema.description", "a string", v));
            }
            let param = "response_format.json_schema.schema";
            let schema = match js.get("schema") {
                None => {
                    return Err(ApiError::invalid(
                        param,
                        format!("`{param}` is required: this server constrains the output to it"),
                    ))
                }
                Some(v) => schema_value(v, param)?,
            };
            Ok(Some(GuideRequest { spec: GuideSpec::JsonSchema(schema), param: param.into() }))
        }
        Some(other) => Err(ApiError::invalid(
            "response_format.type",
            format!("`response_format.type` must be \"text\", \"json_object\" or \"json_schema\", got {other:?}"),
        )),
    }
}

/// vLLM's `structured_outputs` object: exactly one of `json`, `regex`, `choice`, `grammar`,
/// `json_object`. Its tuning options with no meaning here are refused when set.
fn structured_outputs(v: &Value) -> Result<Vec<GuideRequest>, ApiError> {
    let Value::Object(o) = v else { return Err(wrong_type("structured_outputs", "an object", v)) };
    let mut out = Vec::new();
    let mut compact = false;
    let mut as_written = false;
    for (key, value) in o.iter().filter(|(_, v)| !v.is_null()) {
        let param = format!("structured_outputs.{key}");
        let spec = match key.as_str() {
            "json" => GuideSpec::JsonSchema(schema_value(value, &param)?),
            "regex" => GuideSpec::Regex(string_value(value, &param)?),
            "choice" => GuideSpec::Choice(choice_value(value, &param)?),
            "grammar" => GuideSpec::Lark(string_value(value, &param)?),
            "json_object" => match value {
                Value::Bool(true) => GuideSpec::JsonObject,
                Value::Bool(false) => continue,
                v => return Err(wrong_type(&param, "a boolean", v)),
            },
            // There is one structured-output backend and nothing to fall back to.
            "disable_fallback" => match value {
                Value::Bool(_) => continue,
                v => return Err(wrong_type(&param, "a boolean", v)),
            },
            "disable_any_whitespace" => match value {
                Value::Bool(b) => {
                    compact = *b;
                    continue;
                }
                v => return Err(wrong_type(&param, "a boolean", v)),
            },
            // vLLM's switch that makes its guidance backend as strict as xgrammar: strict is
            // the default here; `false` asks for the schema as written.
            "disable_additional_properties" => match value {
                Value::Bool(b) => {
                    as_written = !*b;
                    continue;
                }
                v => return Err(wrong_type(&param, "a boolean", v)),
            },
            "whitespace_pattern" | "structural_tag" => {
                return Err(ApiError::invalid(&param, format!("`{param}` is not supported by this server")))
            }
            other => {
                return Err(ApiError::invalid(
                    &param,
                    format!("`structured_outputs` has no field `{other}` (json, regex, choice, grammar, json_object)"),
                ))
            }
        };
        out.push(GuideRequest { spec, param });
    }
    if out.is_empty() {
        return Err(ApiError::invalid(
            "structured_outputs",
            "`structured_outputs` must give one of `json`, `regex`, `choice`, `grammar` or `json_object: true`",
        ));
    }
    if !as_written {
        out = out.into_iter().map(strict).collect();
    }
    if compact {
        // vLLM's meaning: JSON without optional whitespace (llguidance's own schema option;
        // regex, choice and grammar spell their whitespace out already).
        for g in &mut out {
            g.spec = match std::mem::replace(&mut g.spec, GuideSpec::JsonObject) {
                GuideSpec::JsonObject => {
                    GuideSpec::JsonSchema(json!({"type": "object", "x-guidance": {"whitespace_flexible": false}}))
                }
                GuideSpec::JsonSchema(Value::Object(mut o)) => {
                    let xg = o.entry("x-guidance").or_insert_with(|| json!({}));
                    if let Some(xg) = xg.as_object_mut() {
                        xg.insert("whitespace_flexible".into(), json!(false));
                    }
                    GuideSpec::JsonSchema(Value::Object(o))
                }
                // `true` and `false` schemas: the same as `{}` and an empty enum, no option to set.
                other => other,
            };
        }
    }
    Ok(out)
}

/// The structured-output form of a request, if any (tools aside: see [`Tools::guide`]).
pub fn parse_guide(f: &Fields) -> Result<Option<GuideRequest>, ApiError> {
    let mut forms: Vec<GuideRequest> = Vec::new();
    if let Some(rf) = f.get("response_format") {
        forms.extend(response_format(rf)?.map(strict));
    }
    if let Some(v) = f.get("guided_json") {
        forms.push(strict(GuideRequest {
            spec: GuideSpec::JsonSchema(schema_value(v, "guided_json")?),
            param: "guided_json".into(),
        }));
    }
    if let Some(v) = f.get("guided_regex") {
        forms.push(GuideRequest {
            spec: GuideSpec::Regex(string_value(v, "guided_regex")?),
            param: "guided_regex".into(),
        });
    }
    if let Some(v) = f.get("guided_choice") {
        forms.push(GuideRequest {
            spec: GuideSpec::Choice(choice_value(v, "guided_choice")?),
            param: "guided_choice".into(),
        });
    }
    if let Some(v) = f.get("guided_grammar") {
        forms.push(GuideRequest {
            spec: GuideSpec::Lark(string_value(v, "guided_grammar")?),
            param: "guided_grammar".into(),
        });
    }
    if let Some(v) = f.get("structured_outputs") {
        forms.extend(structured_outputs(v)?);
    }
    // vLLM's tuning fields of the older API: silently dropping them would change the output.
    for name in ["guided_whitespace_pattern", "guided_decoding_backend"] {
        if f.get(name).is_some() {
            return Err(ApiError::invalid(name, format!("`{name}` is not supported by this server")));
        }
    }
    one_form(forms)
}

fn one_form(mut forms: Vec<GuideRequest>) -> Result<Option<GuideRequest>, ApiError> {
    if forms.len() > 1 {
        let names: Vec<String> = forms.iter().map(|g| format!("`{}`", g.param)).collect();
        return Err(ApiError::invalid(
            &forms[1].param,
            format!(
                "a request may give one structured-output form, this one gives {}: {}",
                forms.len(),
                names.join(", ")
            ),
        ));
    }
    Ok(forms.pop())
}

/// How the text of a chat answer with tools is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Tools are rendered; the text is plain content.
    None,
    /// Unconstrained; `<tool_call>` blocks are parsed out when the template defines them.
    Auto,
    /// Constrained to a JSON array of one or more calls.
    Required,
    /// Constrained to this tool's arguments.
    Named(String),
}

/// A chat request's `tools` and `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// As given, for the chat template (`tools`, transformers' convention).
    pub list: Vec<Value>,
    /// Per tool: its name and parameters schema.
    pub functions: Vec<(String, Value)>,
    pub choice: ToolChoice,
}

/// `tools` and `tool_choice` of a chat request; `None` without tools.
pub fn parse_tools(f: &Fields) -> Result<Option<Tools>, ApiError> {
    let list = match f.get("tools") {
        None => None,
        Some(Value::Array(a)) if a.is_empty() => None,
        Some(Value::Array(a)) => Some(a.clone()),
        Some(v) => return Err(wrong_type("tools", "a list of tool objects", v)),
    };
    let choice = f.get("tool_choice");
    let Some(list) = list else {
        return match choice {
            // vLLM (and OpenAI) take "none" without tools: nothing to call, nothing to refuse.
            None => Ok(None),
            Some(Value::String(c)) if c == "none" => Ok(None),
            Some(_) => Err(ApiError::invalid("tool_choice", "`tool_choice` needs `tools`")),
        };
    };
    let mut functions = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let Value::Object(o) = t else { return Err(wrong_type(&p, "an object", t)) };
        match o.get("type") {
            Some(Value::String(s)) if s == "function" => {}
            Some(v) if !v.is_null() => {
                return Err(ApiError::invalid(
                    &format!("{p}.type"),
                    format!("`{p}.type` must be \"function\", got {v}"),
                ))
            }
            _ => return Err(ApiError::invalid(&format!("{p}.type"), format!("`{p}.type` is required (\"function\")"))),
        }
        let func = match o.get("function") {
            Some(Value::Object(func)) => func,
            Some(v) => return Err(wrong_type(&format!("{p}.function"), "an object", v)),
            None => return Err(ApiError::invalid(&format!("{p}.function"), format!("`{p}.function` is required"))),
        };
        let name = match func.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            Some(Value::String(_)) => {
                return Err(ApiError::invalid(
                    &format!("{p}.function.name"),
                    format!("`{p}.function.name` must not be empty"),
                ))
            }
            Some(v) => return Err(wrong_type(&format!("{p}.function.name"), "a string", v)),
            None => {
                return Err(ApiError::invalid(
                    &format!("{p}.function.name"),
                    format!("`{p}.function.name` is required"),
                ))
            }
        };
        if functions.iter().any(|(n, _)| *n == name) {
            return Err(ApiError::invalid(&format!("{p}.function.name"), format!("two tools are named {name:?}")));
        }
        if let Some(v) = func.get("description").filter(|v| !v.is_null() && !v.is_string()) {
            return Err(wrong_type(&format!("{p}.function.description"), "a string", v));
        }
        // OpenAI: a function without parameters takes none.
        let params = match func.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(v) => return Err(wrong_type(&format!("{p}.function.parameters"), "a JSON schema object", v)),
        };
        functions.push((name, params));
    }
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => return Err(ApiError::invalid("tool_choice", format!("`tool_choice` must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {other:?}"))),
        },
        Some(Value::Object(o)) => {
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::invalid("tool_choice.type", "`tool_choice.type` must be \"function\""));
            }
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            let Some(name) = name else { return Err(ApiError::invalid("tool_choice.function.name", "`tool_choice.function.name` must be a string")) };
            if !functions.iter().any(|(n, _)| n == name) {
                let known: Vec<&str> = functions.iter().map(|(n, _)| n.as_str()).collect();
                return Err(ApiError::invalid("tool_choice.function.name", format!("`tool_choice` names {name:?}, which is not among the tools: {}", known.join(", "))));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(v) => return Err(wrong_type("tool_choice", "a string or an object", v)),
    };
    Ok(Some(Tools { list, functions, choice }))
}

impl Tools {
    /// The constraint `tool_choice` implies: vLLM's schemas for "required" and a named tool.
    pub fn guide(&self) -> Option<GuideRequest> {
        match &self.choice {
            ToolChoice::None | ToolChoice::Auto => None,
            ToolChoice::Named(name) => {
                let i = self.functions.iter().position(|(n, _)| n == name)?;
                Some(strict(GuideRequest {
                    spec: GuideSpec::JsonSchema(self.functions[i].1.clone()),
                    param: format!("tools[{i}].function.parameters"),
                }))
            }
            ToolChoice::Required => {
                let any: Vec<Value> = self
                    .functions
                    .iter()
                    .map(|(n, p)| json!({"type": "object", "properties": {"name": {"type": "string", "enum": [n]}, "parameters": p}, "required": ["name", "parameters"], "additionalProperties": false}))
                    .collect();
                let schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": any}});
                Some(strict(GuideRequest { spec: GuideSpec::JsonSchema(schema), param: "tools".into() }))
            }
        }
    }
}

/// One parsed call: the function's name and its arguments as a JSON string.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// The calls of a "required" answer (`[{"name", "parameters"}, ...]`); None if it is not that.
pub fn parse_required(text: &str) -> Option<Vec<ToolCall>> {
    let Ok(Value::Array(calls)) = serde_json::from_str::<Value>(text) else { return None };
    if calls.is_empty() {
        return None;
    }
    calls
        .iter()
        .map(|c| {
            let name = c.get("name")?.as_str()?.to_string();
            let args = c.get("parameters").cloned().unwrap_or(json!({}));
            Some(ToolCall { name, arguments: args.to_string() })
        })
        .collect()
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The template's own tool-call markup decides whether "auto" output is parsed.
pub fn template_has_tool_calls(template_source: &str) -> bool {
    template_source.contains(OPEN)
}

/// Hermes-style calls (Qwen2.5, Hermes, SmolLM3): the text before the first `<tool_call>` is
/// content (None when blank), each block holds `{"name": .., "arguments": {..}}`; the last
/// block may lack its closing tag (generation ended on EOS). Any block that does not parse,
/// or no block at all, gives None: the text is then plain content, as vLLM's Hermes parser
/// answers.
pub fn parse_hermes(text: &str) -> Option<(Option<String>, Vec<ToolCall>)> {
    let start = text.find(OPEN)?;
    let content = text[..start].trim();
    let mut calls = Vec::new();
    let mut rest = &text[start..];
    while let Some(body) = rest.strip_prefix(OPEN) {
        let (inner, after) = match body.find(CLOSE) {
            Some(end) => (&body[..end], &body[end + CLOSE.len()..]),
            None => (body, ""),
        };
        let v: Value = serde_json::from_str(inner.trim()).ok()?;
        let name = v.get("name")?.as_str()?.to_string();
        let arguments = match v.get("arguments") {
            None | Some(Value::Null) => "{}".to_string(),
            // Some models write the arguments as a JSON string already.
            Some(Value::String(s)) => s.clone(),
            Some(a) => a.to_string(),
        };
        calls.push(ToolCall { name, arguments });
        rest = after.trim_start();
    }
    // Text after the last block (other than whitespace) means this was not a clean call list.
    if !rest.is_empty() {
        return None;
    }
    Some(((!content.is_empty()).then(|| content.to_string()), calls))
}

/// OpenAI's shape of a call in a message (`index` is added for stream deltas).
pub fn tool_call_json(call: &ToolCall, id: &str, index: Option<usize>) -> Value {
    let mut m = Map::new();
    if let Some(i) = index {
        m.insert("index".into(), json!(i));
    }
    m.insert("id".into(), json!(id));
    m.insert("type".into(), json!("function"));
    m.insert("function".into(), json!({"name": call.name, "arguments": call.arguments}));
    Value::Object(m)
}

/// `call_` and 24 random hex digits (std's per-process random hash keys; ids need to be
/// unique, not secret).
pub fn tool_call_id() -> String {
    let s = std::collections::hash_map::RandomState::new();
    let mut h = s.build_hasher();
    h.write_u64(0x7461_6e64_656d);
    let a = h.finish();
    let mut h = s.build_hasher();
    h.write_u64(a);
    format!("call_{:016x}{:08x}", a, h.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guide(v: Value) -> Result<Option<GuideRequest>, ApiError> {
        parse_guide(&Fields(v.as_object().unwrap()))
    }

    fn tools(v: Value) -> Result<Option<Tools>, ApiError> {
        parse_tools(&Fields(v.as_object().unwrap()))
    }

    #[test]
    fn every_form_maps_to_its_spec() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": false});
        let cases = [
            (json!({"response_format": {"type": "text"}}), None),
            (json!({"response_format": {"type": "json_object"}}), Some((GuideSpec::JsonObject, "response_format"))),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x_1", "schema": schema, "strict": true}}}),
                Some((GuideSpec::JsonSchema(schema.clone()), "response_format.json_schema.schema")),
            ),
            (json!({"guided_json": schema}), Some((GuideSpec::JsonSchema(schema.clone()), "guided_json"))),
            (json!({"guided_json": schema.to_string()}), Some((GuideSpec::JsonSchema(schema.clone()), "guided_json"))),
            (json!({"guided_regex": "a+"}), Some((GuideSpec::Regex("a+".into()), "guided_regex"))),
            (
                json!({"guided_choice": ["x", "y"]}),
                Some((GuideSpec::Choice(vec!["x".into(), "y".into()]), "guided_choice")),
            ),
            (
                json!({"guided_grammar": "start: \"a\""}),
                Some((GuideSpec::Lark("start: \"a\"".into()), "guided_grammar")),
            ),
            (
                json!({"structured_outputs": {"json": schema}}),
                Some((GuideSpec::JsonSchema(schema.clone()), "structured_outputs.json")),
            ),
            (
                json!({"structured_outputs": {"regex": "b", "disable_fallback": true}}),
                Some((GuideSpec::Regex("b".into()), "structured_outputs.regex")),
            ),
            (
                json!({"structured_outputs": {"choice": ["z"]}}),
                Some((GuideSpec::Choice(vec!["z".into()]), "structured_outputs.choice")),
            ),
            (
                json!({"structured_outputs": {"grammar": "g"}}),
                Some((GuideSpec::Lark("g".into()), "structured_outputs.grammar")),
            ),
            (
                json!({"structured_outputs": {"json_object": true}}),
                Some((GuideSpec::JsonObject, "structured_outputs.json_object")),
            ),
            (json!({"guided_json": null, "response_format": null}), None),
            (
                json!({"structured_outputs": {"json_object": true, "disable_any_whitespace": true}}),
                Some((
                    GuideSpec::JsonSchema(json!({"type": "object", "x-guidance": {"whitespace_flexible": false}})),
                    "structured_outputs.json_object",
                )),
            ),
            (
                json!({"structured_outputs": {"json": {"type": "object", "x-guidance": {"lenient": true}}, "disable_any_whitespace": true}}),
                Some((
                    GuideSpec::JsonSchema(
                        json!({"type": "object", "x-guidance": {"lenient": true, "whitespace_flexible": false}, "additionalProperties": false}),
                    ),
                    "structured_outputs.json",
                )),
            ),
            (
                json!({"structured_outputs": {"regex": "a b", "disable_any_whitespace": true}}),
                Some((GuideSpec::Regex("a b".into()), "structured_outputs.regex")),
            ),
        ];
        for (body, want) in cases {
            let got = guide(body.clone()).unwrap_or_else(|e| panic!("{body}: {e:?}"));
            assert_eq!(got.map(|g| (g.spec, g.param)), want.map(|(s, p)| (s, p.to_string())), "{body}");
        }
    }

    /// xgrammar's strictness: objects that do not say otherwise take no other properties,
    /// arrays no items past their `prefixItems`, at every depth; `allOf` parts stay open;
    /// `disable_additional_properties: false` keeps the schema as written.
    #[test]
    fn schemas_are_strict_as_xgrammar() {
        let open = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "b": {"type": "array", "prefixItems": [{"type": "object"}]},
            "c": {"type": "object", "additionalProperties": {"type": "object", "properties": {}}},
            "d": {"allOf": [{"type": "object", "properties": {"p": {"type": "object"}}}, {"properties": {"q": {}}}]},
            "e": {"anyOf": [{"type": "object"}, {"type": "string"}]}
        }, "$defs": {"t": {"type": "object"}}});
        let want = json!({"type": "object", "additionalProperties": false, "properties": {
            "a": {"type": "object", "additionalProperties": false, "properties": {"x": {"type": "integer"}}},
            "b": {"type": "array", "items": false, "prefixItems": [{"type": "object", "additionalProperties": false}]},
            "c": {"type": "object", "additionalProperties": {"type": "object", "properties": {}, "additionalProperties": false}},
            "d": {"allOf": [{"type": "object", "properties": {"p": {"type": "object", "additionalProperties": false}}}, {"properties": {"q": {}}}]},
            "e": {"anyOf": [{"type": "object", "additionalProperties": false}, {"type": "string"}]}
        }, "$defs": {"t": {"type": "object", "additionalProperties": false}}});
        for body in [
            json!({"guided_json": open}),
            json!({"structured_outputs": {"json": open}}),
            json!({"structured_outputs": {"json": open, "disable_additional_properties": true}}),
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": open}}}),
        ] {
            assert_eq!(guide(body.clone()).unwrap().unwrap().spec, GuideSpec::JsonSchema(want.clone()), "{body}");
        }
        let g = guide(json!({"structured_outputs": {"json": open, "disable_additional_properties": false}}))
            .unwrap()
            .unwrap();
        assert_eq!(g.spec, GuideSpec::JsonSchema(open.clone()));
        let t = tools(json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {}}}}}], "tool_choice": {"type": "function", "function": {"name": "f"}}})).unwrap().unwrap();
        assert_eq!(
            t.guide().unwrap().spec,
            GuideSpec::JsonSchema(json!({"type": "object", "properties": {"x": {}}, "additionalProperties": false}))
        );
    }

    #[test]
    fn bad_forms_name_their_field() {
        let cases = [
            (json!({"response_format": "json"}), "response_format", "an object"),
            (json!({"response_format": {}}), "response_format.type", "required"),
            (json!({"response_format": {"type": "yaml"}}), "response_format.type", "\"yaml\""),
            (json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema", "required"),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
                "response_format.json_schema.name",
                "required",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}),
                "response_format.json_schema.name",
                "1 to 64",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}}),
                "response_format.json_schema.schema",
                "required",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}}),
                "response_format.json_schema.schema",
                "JSON schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "strict": "yes"}}}),
                "response_format.json_schema.strict",
                "boolean",
            ),
            (json!({"guided_json": "{not json"}), "guided_json", "not JSON"),
            (json!({"guided_json": [1]}), "guided_json", "JSON schema"),
            (json!({"guided_regex": 5}), "guided_regex", "a string"),
            (json!({"guided_choice": "a"}), "guided_choice", "list of strings"),
            (json!({"guided_choice": []}), "guided_choice", "empty"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice[1]", "a string"),
            (json!({"guided_grammar": {}}), "guided_grammar", "a string"),
            (json!({"structured_outputs": []}), "structured_outputs", "an object"),
            (json!({"structured_outputs": {}}), "structured_outputs", "one of"),
            (json!({"structured_outputs": {"json_object": "yes"}}), "structured_outputs.json_object", "boolean"),
            (json!({"structured_outputs": {"xml": "a"}}), "structured_outputs.xml", "no field"),
            (
                json!({"structured_outputs": {"regex": "a", "disable_any_whitespace": 1}}),
                "structured_outputs.disable_any_whitespace",
                "boolean",
            ),
            (
                json!({"structured_outputs": {"regex": "a", "disable_additional_properties": 1}}),
                "structured_outputs.disable_additional_properties",
                "boolean",
            ),
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
                "structured_outputs.choice",
                "one structured-output form",
            ),
            (
                json!({"guided_regex": "a", "response_format": {"type": "json_object"}}),
                "guided_regex",
                "`response_format`, `guided_regex`",
            ),
            (json!({"guided_whitespace_pattern": " "}), "guided_whitespace_pattern", "not supported"),
        ];
        for (body, field, msg) in cases {
            let e = guide(body.clone()).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(field)), "{body}: {}", e.message);
            assert!(e.message.contains(msg), "{body}: {}", e.message);
        }
    }

    #[test]
    fn tools_and_tool_choice() {
        let t = json!([{"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}, {"type": "function", "function": {"name": "now"}}]);
        let got = tools(json!({"tools": t})).unwrap().unwrap();
        assert_eq!(got.choice, ToolChoice::Auto, "OpenAI's default with tools");
        assert_eq!(got.functions[1], ("now".to_string(), json!({"type": "object", "properties": {}})));
        assert_eq!(got.guide(), None);
        assert_eq!(tools(json!({"tools": t, "tool_choice": "none"})).unwrap().unwrap().choice, ToolChoice::None);
        let named = tools(json!({"tools": t, "tool_choice": {"type": "function", "function": {"name": "get"}}}))
            .unwrap()
            .unwrap();
        let mut closed = got.functions[0].1.clone();
        strict_schema(&mut closed);
        assert_eq!(
            named.guide().unwrap(),
            GuideRequest { spec: GuideSpec::JsonSchema(closed), param: "tools[0].function.parameters".into() }
        );
        let req = tools(json!({"tools": t, "tool_choice": "required"})).unwrap().unwrap().guide().unwrap();
        let GuideSpec::JsonSchema(s) = req.spec else { panic!() };
        assert_eq!(s["items"]["anyOf"][1]["properties"]["name"]["enum"], json!(["now"]));
        assert_eq!(s["minItems"], 1);
        assert_eq!(tools(json!({})).unwrap(), None);

        let cases = [
            (json!({"tool_choice": "auto"}), "tool_choice", "needs `tools`"),
            (json!({"tools": {}}), "tools", "list"),
            (json!({"tools": [{"function": {"name": "a"}}]}), "tools[0].type", "required"),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type", "\"function\""),
            (json!({"tools": [{"type": "function"}]}), "tools[0].function", "required"),
            (json!({"tools": [{"type": "function", "function": {"name": 3}}]}), "tools[0].function.name", "a string"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a", "parameters": []}}]}),
                "tools[0].function.parameters",
                "schema",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]}),
                "tools[1].function.name",
                "two tools",
            ),
            (json!({"tools": t, "tool_choice": "always"}), "tool_choice", "\"always\""),
            (
                json!({"tools": t, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice.function.name",
                "not among the tools: get, now",
            ),
            (json!({"tools": t, "tool_choice": {"type": "function"}}), "tool_choice.function.name", "a string"),
            (json!({"tools": t, "tool_choice": 1}), "tool_choice", "a string or an object"),
        ];
        for (body, field, msg) in cases {
            let e = tools(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
            assert!(e.message.contains(msg), "{body}: {}", e.message);
        }
    }

    #[test]
    fn hermes_calls_parse_out_of_the_text() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\"}</tool_call>\n";
        let (content, calls) = parse_hermes(text).unwrap();
        assert_eq!(content.as_deref(), Some("Let me look."));
        assert_eq!(
            calls,
            vec![
                ToolCall { name: "get".into(), arguments: "{\"city\":\"Paris\"}".into() },
                ToolCall { name: "now".into(), arguments: "{}".into() }
            ]
        );
        let (content, calls) = parse_hermes("<tool_call>{\"name\": \"get\", \"arguments\": {}}").unwrap();
        assert_eq!((content, calls.len()), (None, 1), "an unclosed last block still counts");
        assert_eq!(parse_hermes("no calls here"), None);
        assert_eq!(
            parse_hermes("<tool_call>{\"name\": \"get\", \"argum</tool_call>"),
            None,
            "broken JSON: plain content"
        );
        assert_eq!(parse_hermes("<tool_call>{\"arguments\": {}}</tool_call>"), None, "no name");
        assert_eq!(parse_hermes("<tool_call>{\"name\": \"a\"}</tool_call> and more"), None, "text after the calls");
        assert!(
            template_has_tool_calls("{% if tools %}<tool_call>{% endif %}")
                && !template_has_tool_calls("{{ messages }}")
        );
    }

    #[test]
    fn required_answers_parse() {
        let calls = parse_required(
            "[{\"name\": \"get\", \"parameters\": {\"city\": \"Oslo\"}}, {\"name\": \"now\", \"parameters\": {}}]",
        )
        .unwrap();
        assert_eq!(calls[0], ToolCall { name: "get".into(), arguments: "{\"city\":\"Oslo\"}".into() });
        assert_eq!(calls[1].arguments, "{}");
        assert_eq!(parse_required("[]"), None);
        assert_eq!(parse_required("[{\"name\": \"get\", \"param"), None, "cut short");
        let (a, b) = (tool_call_id(), tool_call_id());
        assert!(a.starts_with("call_") && a.len() == 29 && a != b, "{a} {b}");
    }
}
