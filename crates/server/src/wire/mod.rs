//! The wire formats: each reads its requests into the pipeline's [`crate::job::Job`] and writes
//! the answer in its own shape, whole or streamed. They depend on the pipeline and the shared
//! state, never on the router or on each other.
//!
//! - [`openai`]: `/v1/completions`, `/v1/chat/completions` and `/generate`.
//! - [`anthropic`]: Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`).
//! - [`responses`]: OpenAI's Responses API (`/v1/responses`, `GET`/`DELETE` by id).
//! - [`common`]: what reading any of them shares (the JSON body, field errors, ids).

pub mod anthropic;
pub mod common;
pub mod openai;
pub mod responses;
