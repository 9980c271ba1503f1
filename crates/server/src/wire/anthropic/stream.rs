//! Anthropic's event stream of a Messages answer.

use serde_json::{json, Value};

use super::answer::{answer, error_body};
use crate::answer::{AnswerReader, Event};
use crate::body::EventFormat;
use crate::engine_client::{CompletionDelta, EngineUpdate, FinishReason};
use crate::error::ApiError;
use crate::job::{Job, ToolOutput};
use crate::run::Run;
use crate::wire::common::new_id;

/// Anthropic's event stream: `message_start`, `ping`, per block `content_block_start`,
/// `content_block_delta`s and `content_block_stop`, then `message_delta` (stop reason, output
/// tokens) and `message_stop`; an engine failure is an `error` event that ends it.
pub struct MessageStream {
    id: String,
    model: String,
    input_tokens: usize,
    tool_output: Option<ToolOutput>,
    /// The answer's reader: thinking, text and calls as they come.
    reader: AnswerReader,
    /// The index and type of the open block, if one is open; blocks opened so far.
    open: Option<(usize, &'static str)>,
    blocks: usize,
    finish: Option<FinishReason>,
    stop_string: Option<String>,
    failed: bool,
}

fn push_event(out: &mut String, name: &str, v: &Value) {
    use std::fmt::Write;
    let _ = write!(out, "event: {name}\ndata: {v}\n\n");
}

impl MessageStream {
    pub fn new(job: &Job, id: String, model: String) -> Self {
        let input_tokens = job.prompts.first().map_or(0, Vec::len);
        MessageStream {
            id,
            model,
            input_tokens,
            tool_output: job.tool_output.clone(),
            reader: AnswerReader::new(job),
            open: None,
            blocks: 0,
            finish: None,
            stop_string: None,
            failed: false,
        }
    }

    fn start_block(&mut self, out: &mut String, block: Value) {
        let index = self.blocks;
        self.blocks += 1;
        let kind = match block["type"].as_str() {
            Some("thinking") => "thinking",
            Some("tool_use") => "tool_use",
            _ => "text",
        };
        self.open = Some((index, kind));
        push_event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
    }

    fn delta(out: &mut String, index: usize, delta: Value) {
        push_event(out, "content_block_delta", &json!({"type": "content_block_delta", "index": index, "delta": delta}));
    }

    fn stop_block(&mut self, out: &mut String) {
        if let Some((index, _)) = self.open.take() {
            push_event(out, "content_block_stop", &json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// Text into the open text block, one opened (and a thinking block closed) on the first.
    fn text(&mut self, out: &mut String, text: &str) {
        self.delta_into(out, "text", json!({"type": "text_delta", "text": text}), text.is_empty());
    }

    /// Thinking into the open thinking block, opened on the first.
    fn thinking(&mut self, out: &mut String, text: &str) {
        self.delta_into(out, "thinking", json!({"type": "thinking_delta", "thinking": text}), text.is_empty());
    }

    fn delta_into(&mut self, out: &mut String, kind: &'static str, delta: Value, empty: bool) {
        if empty {
            return;
        }
        let index = match self.open {
            Some((i, k)) if k == kind => i,
            _ => {
                self.stop_block(out);
                let block = if kind == "thinking" {
                    json!({"type": "thinking", "thinking": "", "signature": ""})
                } else {
                    json!({"type": "text", "text": ""})
                };
                self.start_block(out, block);
                self.blocks - 1
            }
        };
        Self::delta(out, index, delta);
    }

    /// A whole block: opened, its content in one delta, closed.
    fn whole_block(&mut self, out: &mut String, block: &Value) {
        if block["type"] == "tool_use" {
            self.start_block(out, json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}));
            Self::delta(
                out,
                self.blocks - 1,
                json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
            );
        } else {
            self.start_block(out, json!({"type": "text", "text": ""}));
            Self::delta(out, self.blocks - 1, json!({"type": "text_delta", "text": block["text"]}));
        }
        self.stop_block(out);
    }
}

impl EventFormat for MessageStream {
    fn head(&mut self) -> String {
        let mut out = String::new();
        let message = json!({"id": self.id, "type": "message", "role": "assistant", "content": [], "model": self.model, "stop_reason": null, "stop_sequence": null,
                             "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}});
        push_event(&mut out, "message_start", &json!({"type": "message_start", "message": message}));
        // A forced tool's block opens at once: the whole answer is its input.
        if let Some(ToolOutput::Named(name)) = &self.tool_output {
            let block = json!({"type": "tool_use", "id": new_id("toolu_"), "name": name, "input": {}});
            self.start_block(&mut out, block);
        }
        push_event(&mut out, "ping", &json!({"type": "ping"}));
        out
    }

    fn update(&mut self, out: &mut String, _run: &Run, _prompt: usize, upd: &EngineUpdate) {
        for d in upd.deltas.iter().filter(|d| d.index == 0) {
            self.delta_events(out, d);
        }
    }

    fn tail(&mut self, out: &mut String, run: &Run) {
        self.end_events(out, run.completion_tokens);
    }
}

impl MessageStream {
    pub(super) fn delta_events(&mut self, out: &mut String, d: &CompletionDelta) {
        if self.failed {
            return;
        }
        if let Some(FinishReason::Error(e)) = &d.finish {
            self.failed = true;
            let err = ApiError::internal(format!("the engine failed this request: {e}"));
            push_event(out, "error", &error_body(&err));
            return;
        }
        let named = matches!(self.tool_output, Some(ToolOutput::Named(_)));
        for e in self.reader.push(&d.text, d.finish.is_some()) {
            match e {
                Event::Thinking(t) => self.thinking(out, &t),
                Event::Text(t) => self.text(out, &t),
                // A forced tool's block opened in the head; its input is all the answer.
                Event::CallStart { .. } if named => {}
                Event::CallArgs { piece, .. } if named => {
                    Self::delta(out, 0, json!({"type": "input_json_delta", "partial_json": piece}))
                }
                Event::CallStart { name, .. } => {
                    self.stop_block(out);
                    self.start_block(
                        out,
                        json!({"type": "tool_use", "id": new_id("toolu_"), "name": name, "input": {}}),
                    );
                }
                Event::CallArgs { piece, .. } => {
                    Self::delta(out, self.blocks - 1, json!({"type": "input_json_delta", "partial_json": piece}))
                }
            }
        }
        if d.finish.is_some() {
            self.finish = d.finish.clone();
            self.stop_string = d.stop_string.clone();
        }
    }

    pub(super) fn end_events(&mut self, out: &mut String, output_tokens: usize) {
        if self.failed {
            return;
        }
        let finish = self.finish.clone().unwrap_or(FinishReason::Abort);
        let end = self.reader.finish(finish.as_str());
        let (reason, seq) = match &self.tool_output {
            Some(ToolOutput::Required) => {
                self.stop_block(out);
                let reason = match finish {
                    FinishReason::Length => "max_tokens",
                    FinishReason::Stop if end.streamed > 0 => "tool_use",
                    FinishReason::Stop => "end_turn",
                    _ => "pause_turn",
                };
                (reason, None)
            }
            None => {
                self.stop_block(out);
                let (_, reason, seq) = answer(None, "", &finish, self.stop_string.as_deref());
                (reason, seq)
            }
            Some(ToolOutput::Auto(_)) if end.streamed > 0 => {
                // Calls went out as they came: the answer is calls; any the stream did not
                // follow come whole.
                self.stop_block(out);
                let (blocks, _, _) = answer(self.tool_output.as_ref(), &end.text, &finish, self.stop_string.as_deref());
                for b in blocks.iter().filter(|b| b["type"] == "tool_use").skip(end.streamed) {
                    self.whole_block(out, b);
                }
                let reason = match finish {
                    FinishReason::Length => "max_tokens",
                    FinishReason::Stop => "tool_use",
                    _ => "pause_turn",
                };
                (reason, None)
            }
            Some(ToolOutput::Auto(_)) => {
                let (blocks, reason, seq) =
                    answer(self.tool_output.as_ref(), &end.text, &finish, self.stop_string.as_deref());
                if blocks.iter().any(|b| b["type"] == "tool_use") {
                    // The content before the calls went out already.
                    self.stop_block(out);
                    for b in blocks.iter().filter(|b| b["type"] == "tool_use") {
                        self.whole_block(out, b);
                    }
                } else {
                    self.text(out, &end.text[end.sent..]);
                    self.stop_block(out);
                }
                (reason, seq)
            }
            Some(ToolOutput::Named(_)) => {
                self.stop_block(out);
                let reason = match finish {
                    FinishReason::Length => "max_tokens",
                    FinishReason::Stop => "tool_use",
                    _ => "pause_turn",
                };
                (reason, None)
            }
        };
        push_event(
            out,
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": {"output_tokens": output_tokens}}),
        );
        push_event(out, "message_stop", &json!({"type": "message_stop"}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::Fields;
    use crate::params::{parse_params, Api};
    use crate::reasoning::ReasoningParser;
    use crate::tool_parser::ToolParser;
    use serde_json::Map;

    /// The events of a stream fed these text pieces, the last finishing with `finish`.
    fn stream(tool_output: Option<ToolOutput>, pieces: &[&str], finish: FinishReason) -> Vec<(String, Value)> {
        stream_with(tool_output, None, pieces, finish)
    }

    fn stream_with(
        tool_output: Option<ToolOutput>,
        reasoning: Option<ReasoningParser>,
        pieces: &[&str],
        finish: FinishReason,
    ) -> Vec<(String, Value)> {
        let p = parse_params(&Fields(&Map::new()), Api::Chat, 100, &Default::default()).unwrap();
        let job = Job {
            api: Api::Chat,
            prompts: vec![vec![1, 2, 3]],
            p,
            multi: false,
            echo_texts: vec![],
            guide: None,
            tool_output,
            reasoning,
            tool_parses: None,
        };
        let mut s = MessageStream::new(&job, "msg_x".into(), "m".into());
        let mut out = s.head();
        for (i, t) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            let d = CompletionDelta {
                index: 0,
                text: t.to_string(),
                token_ids: vec![],
                logprobs: vec![],
                prompt_logprobs: None,
                finish: last.then(|| finish.clone()),
                stop_string: None,
            };
            s.delta_events(&mut out, &d);
        }
        s.end_events(&mut out, pieces.len());
        out.trim_end()
            .split("\n\n")
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                (
                    name.trim_start_matches("event: ").to_string(),
                    serde_json::from_str(data.trim_start_matches("data: ")).unwrap(),
                )
            })
            .filter(|(n, _)| n != "ping")
            .collect()
    }

    fn names(ev: &[(String, Value)]) -> Vec<&str> {
        ev.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The events of an answer in two blocks, the first with two deltas, the second with one.
    const TWO_BLOCKS: [&str; 10] = [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ];

    fn texts(ev: &[(String, Value)]) -> Vec<String> {
        ev.iter()
            .filter(|(_, d)| d["delta"]["type"] == "text_delta")
            .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn hermes_calls_stream_their_content_then_their_input() {
        let pieces =
            ["Sure.", "\n<tool", "_call>{\"name\": \"get\", ", "\"arguments\": {\"city\": \"Oslo\"}}</tool_call>"];
        let ev = stream(Some(ToolOutput::Auto(ToolParser::Hermes)), &pieces, FinishReason::Stop);
        assert_eq!(names(&ev), TWO_BLOCKS);
        assert_eq!(texts(&ev), ["Sure.", "\n"], "the content streams; the tag's start is held until it is known");
        let tool = &ev[5].1["content_block"];
        assert_eq!(
            (tool["type"].as_str(), tool["name"].as_str(), ev[5].1["index"].as_u64()),
            (Some("tool_use"), Some("get"), Some(1))
        );
        assert_eq!(
            ev[6].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"city\": \"Oslo\"}"}),
            "the input as sampled"
        );
        assert_eq!(ev[8].1["delta"]["stop_reason"], "tool_use");

        // A `<tool` that grows into something else, and markup that does not parse: all text.
        let ev = stream(
            Some(ToolOutput::Auto(ToolParser::Hermes)),
            &["a <tool", "s> b", " <tool_call>{broken"],
            FinishReason::Length,
        );
        assert_eq!(texts(&ev).concat(), "a <tools> b <tool_call>{broken");
        assert_eq!(texts(&ev)[..2], ["a ", "<tools> b"], "held only while it may be the tag");
        assert_eq!(ev.last().map(|(n, _)| n.as_str()), Some("message_stop"));
        assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "max_tokens");
    }

    /// "any": each call a `tool_use` block whose input streams as sampled, in pieces.
    #[test]
    fn any_calls_stream_their_input() {
        let pieces = [
            "[{\"name\": \"get\", \"para",
            "meters\": {\"city\"",
            ": \"Oslo\"}}, {\"name\": \"now\", \"parameters\": {}}]",
        ];
        let ev = stream(Some(ToolOutput::Required), &pieces, FinishReason::Stop);
        assert_eq!(names(&ev), TWO_BLOCKS);
        let input = |i: u64| -> String {
            ev.iter()
                .filter(|(_, d)| d["index"] == i && d["delta"]["type"] == "input_json_delta")
                .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
                .collect()
        };
        assert_eq!((input(0), input(1)), ("{\"city\": \"Oslo\"}".to_string(), "{}".to_string()));
        assert_eq!(
            (ev[1].1["content_block"]["name"].as_str(), ev[5].1["content_block"]["name"].as_str()),
            (Some("get"), Some("now"))
        );
        assert_eq!(ev[8].1["delta"]["stop_reason"], "tool_use");
        // Cut: the call begun is a block with partial input, stop_reason max_tokens.
        let ev = stream(Some(ToolOutput::Required), &pieces[..2], FinishReason::Length);
        assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "max_tokens");
        assert_eq!(ev.iter().filter(|(n, _)| n == "content_block_start").count(), 1);
    }

    #[test]
    fn thinking_streams_as_its_own_block() {
        let pieces = [
            "<thi",
            "nk>\nOslo is in",
            " Norway.\n</thi",
            "nk>\n\n<tool_call>{\"name\": \"get\", \"arguments\": {}}</tool_call>",
        ];
        let ev = stream_with(
            Some(ToolOutput::Auto(ToolParser::Hermes)),
            Some(ReasoningParser::Qwen3),
            &pieces,
            FinishReason::Stop,
        );
        let starts: Vec<(u64, &str)> = ev
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, d)| (d["index"].as_u64().unwrap(), d["content_block"]["type"].as_str().unwrap()))
            .collect();
        assert_eq!(starts, [(0, "thinking"), (1, "tool_use")], "the blank after </think> is no text block");
        let thinking: String = ev
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == "thinking_delta")
            .map(|(_, d)| d["delta"]["thinking"].as_str().unwrap())
            .collect();
        assert_eq!(thinking, "\nOslo is in Norway.\n");
        assert!(ev
            .iter()
            .all(|(n, d)| n != "content_block_delta" || d["index"] == 0 || d["delta"]["type"] != "thinking_delta"));
        assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "tool_use");
        // An answer that is all thinking (cut short): one thinking block, closed.
        let ev = stream_with(None, Some(ReasoningParser::DeepSeekR1), &["Hmm, ", "let me"], FinishReason::Length);
        assert_eq!(
            names(&ev),
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
    }

    #[test]
    fn plain_and_forced_streams() {
        let ev = stream(None, &["Hel", "lo"], FinishReason::Stop);
        assert_eq!(texts(&ev), ["Hel", "lo"]);
        assert_eq!(
            ev[ev.len() - 2].1,
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 2}})
        );
        let ev = stream(Some(ToolOutput::Named("get".into())), &["{\"a\"", ": 1}"], FinishReason::Stop);
        let json: String = ev.iter().filter_map(|(_, d)| d["delta"]["partial_json"].as_str()).collect();
        assert_eq!((json.as_str(), ev[1].1["content_block"]["name"].as_str()), ("{\"a\": 1}", Some("get")));
        assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "tool_use");
        let ev = stream(None, &["x"], FinishReason::Error("boom".into()));
        assert_eq!(ev.last().unwrap().0, "error", "an engine failure ends the stream with an error event");
        assert_eq!(ev.last().unwrap().1["error"]["type"], "api_error");
    }
}
