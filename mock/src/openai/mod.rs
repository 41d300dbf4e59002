//! The OpenAI wire format of the mock engine: what it reads from a request body and the
//! JSON and server-sent events it answers with, shaped as vLLM's OpenAI server emits them.
//! Pure: no I/O, no clock (`created` is passed in).

use std::io::Write as _;

use crate::rng::Rng;

mod prompt;
mod request;

pub use prompt::prompt_text;
pub use request::{Request, parse, parse_request};

/// The two generation endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
}

impl Api {
    fn id_prefix(self) -> &'static str {
        match self {
            Api::Chat => "chatcmpl-",
            Api::Completions => "cmpl-",
        }
    }

    fn chunk_object(self) -> &'static str {
        match self {
            Api::Chat => "chat.completion.chunk",
            Api::Completions => "text_completion",
        }
    }

    fn object(self) -> &'static str {
        match self {
            Api::Chat => "chat.completion",
            Api::Completions => "text_completion",
        }
    }
}

/// Why a sequence ended, as `finish_reason` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The request's own `max_tokens` cut it: `"length"`.
    Length,
    /// No limit was asked for, so `default_max_tokens` plays the model's natural end of
    /// answer: `"stop"`.
    Stop,
}

impl Finish {
    fn as_str(self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Stop => "stop",
        }
    }
}

/// What the engine needs from a generation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generate {
    pub api: Api,
    pub stream: bool,
    /// `stream_options.include_usage`: a usage chunk before `[DONE]`.
    pub include_usage: bool,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub finish: Finish,
}

/// A refused request: status, OpenAI error type and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            kind: "BadRequestError",
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 404,
            kind: "NotFoundError",
            message: message.into(),
        }
    }

    /// `{"error":{"message":..,"type":..,"param":null,"code":<status>}}` (vLLM's shape).
    pub fn body(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + self.message.len());
        out.extend_from_slice(br#"{"error":{"message":"#);
        json_str(&mut out, &self.message);
        out.extend_from_slice(br#","type":"#);
        json_str(&mut out, self.kind);
        let _ = write!(out, r#","param":null,"code":{}}}}}"#, self.status);
        out
    }
}

/// Filler words: plain ASCII, so token text never needs escaping.
const WORDS: [&str; 32] = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "engines",
    "batch", "tokens", "in", "pages", "of", "cache", "and", "every", "step", "decodes", "one",
    "more", "word", "for", "each", "running", "sequence", "until", "its", "budget", "ends",
];

/// The deterministic text of one response: a word per token, drawn from a seeded RNG.
#[derive(Debug)]
pub struct Text {
    rng: Rng,
    tokens: u32,
}

impl Text {
    /// The text of request (sequence) number `request` under `seed`.
    pub fn new(seed: u64, request: u64) -> Text {
        Text {
            rng: Rng::new(seed ^ request.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            tokens: 0,
        }
    }

    /// The next token: a word, with a leading space after the first.
    pub fn next_token(&mut self) -> (&'static str, &'static str) {
        let word = WORDS[self.rng.below(WORDS.len())];
        let space = if self.tokens == 0 { "" } else { " " };
        self.tokens += 1;
        (space, word)
    }
}

/// Renders one response (a JSON body or its stream of events) for a request.
#[derive(Debug)]
pub struct Renderer<'a> {
    pub api: Api,
    /// The response id without its prefix.
    pub id: u64,
    pub created: u64,
    /// The served model, already a JSON string (quotes included).
    pub model_json: &'a str,
    /// Written after the model in every object: `,"system_fingerprint":"…"` or nothing.
    pub fingerprint: &'a str,
}

/// Token counts of a finished response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// `prompt_tokens_details.cached_tokens`, reported only with prefix caching on.
    pub cached_tokens: Option<u32>,
}

impl Renderer<'_> {
    /// `{"id":..,"object":..,"created":..,"model":..,"choices":[`
    fn open(&self, out: &mut Vec<u8>, object: &str) {
        let _ = write!(
            out,
            r#"{{"id":"{}{:016x}","object":"{object}","created":{},"model":{}{},"choices":["#,
            self.api.id_prefix(),
            self.id,
            self.created,
            self.model_json,
            self.fingerprint,
        );
    }

    /// The first event of a chat stream: the assistant role with empty content.
    pub fn role_event(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: ");
        self.open(out, self.api.chunk_object());
        out.extend_from_slice(
            br#"{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
        );
        out.extend_from_slice(b"\n\n");
    }

    /// One token's event; the last one carries `finish_reason`, as in vLLM.
    pub fn token_event(&self, out: &mut Vec<u8>, text: &[&str], finish: Option<Finish>) {
        out.extend_from_slice(b"data: ");
        self.open(out, self.api.chunk_object());
        match self.api {
            Api::Chat => out.extend_from_slice(br#"{"index":0,"delta":{"content":""#),
            Api::Completions => out.extend_from_slice(br#"{"index":0,"text":""#),
        }
        text.iter()
            .for_each(|t| out.extend_from_slice(t.as_bytes()));
        out.extend_from_slice(b"\"");
        if self.api == Api::Chat {
            out.push(b'}');
        }
        out.extend_from_slice(br#","logprobs":null,"finish_reason":"#);
        finish_json(out, finish);
        out.extend_from_slice(b"}]}\n\n");
    }

    /// The usage event sent when `stream_options.include_usage` is set: no choices.
    pub fn usage_event(&self, out: &mut Vec<u8>, usage: Usage) {
        out.extend_from_slice(b"data: ");
        self.open(out, self.api.chunk_object());
        out.extend_from_slice(b"],");
        usage_json(out, usage);
        out.extend_from_slice(b"}\n\n");
    }

    /// A complete non-streaming response.
    pub fn response(&self, out: &mut Vec<u8>, text: &str, finish: Finish, usage: Usage) {
        self.open(out, self.api.object());
        match self.api {
            Api::Chat => {
                out.extend_from_slice(br#"{"index":0,"message":{"role":"assistant","content":"#);
                json_str(out, text);
                out.push(b'}');
            }
            Api::Completions => {
                out.extend_from_slice(br#"{"index":0,"text":"#);
                json_str(out, text);
            }
        }
        out.extend_from_slice(br#","logprobs":null,"finish_reason":"#);
        finish_json(out, Some(finish));
        out.extend_from_slice(b"}],");
        usage_json(out, usage);
        out.push(b'}');
    }
}

/// Adds a top-level field, `raw` JSON, to the end of the JSON object in `out`.
pub fn append_field(out: &mut Vec<u8>, name: &str, raw: &[u8]) {
    if out.last() != Some(&b'}') {
        return;
    }
    out.pop();
    if out.last().is_some_and(|&b| b != b'{') {
        out.push(b',');
    }
    json_str(out, name);
    out.push(b':');
    out.extend_from_slice(raw);
    out.push(b'}');
}

/// The stream's end marker.
pub const DONE_EVENT: &[u8] = b"data: [DONE]\n\n";

fn finish_json(out: &mut Vec<u8>, finish: Option<Finish>) {
    match finish {
        Some(f) => {
            let _ = write!(out, "\"{}\"", f.as_str());
        }
        None => out.extend_from_slice(b"null"),
    }
}

fn usage_json(out: &mut Vec<u8>, u: Usage) {
    let _ = write!(
        out,
        r#""usage":{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{}"#,
        u.prompt_tokens,
        u.completion_tokens,
        u64::from(u.prompt_tokens) + u64::from(u.completion_tokens)
    );
    if let Some(cached) = u.cached_tokens {
        let _ = write!(
            out,
            r#","prompt_tokens_details":{{"cached_tokens":{cached}}}"#
        );
    }
    out.push(b'}');
}

fn json_str(out: &mut Vec<u8>, s: &str) {
    let _ = serde_json::to_writer(&mut *out, s);
}

/// `{"object":"list","data":[{"id":<model>,"object":"model",..}]}` for `GET /v1/models`.
pub fn models(out: &mut Vec<u8>, model_json: &str, created: u64) {
    let _ = write!(
        out,
        r#"{{"object":"list","data":[{{"id":{model_json},"object":"model","created":{created},"owned_by":"spillway-mock","root":{model_json},"parent":null,"max_model_len":null}}]}}"#
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn events(r: &Renderer<'_>, f: impl FnOnce(&Renderer<'_>, &mut Vec<u8>)) -> Value {
        let mut out = Vec::new();
        f(r, &mut out);
        let text = String::from_utf8(out).unwrap();
        let json = text
            .strip_prefix("data: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .unwrap();
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn chat_stream_events_match_vllm() {
        let r = Renderer {
            api: Api::Chat,
            id: 0xab,
            created: 1700000000,
            model_json: r#""m/1""#,
            fingerprint: "",
        };
        let head = json!({"id":"chatcmpl-00000000000000ab","object":"chat.completion.chunk","created":1700000000,"model":"m/1"});
        let with = |choices: Value| {
            let mut v = head.clone();
            v["choices"] = choices;
            v
        };
        assert_eq!(
            events(&r, |r, o| r.role_event(o)),
            with(
                json!([{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}])
            )
        );
        assert_eq!(
            events(&r, |r, o| r.token_event(o, &[" ", "fox"], None)),
            with(
                json!([{"index":0,"delta":{"content":" fox"},"logprobs":null,"finish_reason":null}])
            )
        );
        assert_eq!(
            events(&r, |r, o| r.token_event(o, &["dog"], Some(Finish::Length))),
            with(
                json!([{"index":0,"delta":{"content":"dog"},"logprobs":null,"finish_reason":"length"}])
            )
        );
        let mut usage = with(json!([]));
        usage["usage"] = json!({"prompt_tokens":3,"completion_tokens":2,"total_tokens":5});
        assert_eq!(
            events(&r, |r, o| r.usage_event(
                o,
                Usage {
                    prompt_tokens: 3,
                    completion_tokens: 2,
                    cached_tokens: None,
                }
            )),
            usage
        );
    }

    #[test]
    fn full_responses_match_openai() {
        let usage = Usage {
            prompt_tokens: 4,
            completion_tokens: 2,
            cached_tokens: None,
        };
        let mut out = Vec::new();
        Renderer {
            api: Api::Chat,
            id: 1,
            created: 5,
            model_json: r#""m""#,
            fingerprint: "",
        }
        .response(&mut out, "a b", Finish::Stop, usage);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            json!({"id":"chatcmpl-0000000000000001","object":"chat.completion","created":5,"model":"m",
                "choices":[{"index":0,"message":{"role":"assistant","content":"a b"},"logprobs":null,"finish_reason":"stop"}],
                "usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}})
        );
        let mut out = Vec::new();
        Renderer {
            api: Api::Completions,
            id: 1,
            created: 5,
            model_json: r#""m""#,
            fingerprint: "",
        }
        .response(&mut out, "a", Finish::Length, usage);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], "a");
        let mut out = Vec::new();
        let cached = Usage {
            cached_tokens: Some(3),
            ..usage
        };
        Renderer {
            api: Api::Chat,
            id: 1,
            created: 5,
            model_json: r#""m""#,
            fingerprint: "",
        }
        .response(&mut out, "a", Finish::Length, cached);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens":4,"completion_tokens":2,"total_tokens":6,"prompt_tokens_details":{"cached_tokens":3}})
        );
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let mut out = Vec::new();
        Renderer {
            api: Api::Completions,
            id: 1,
            created: 5,
            model_json: r#""m""#,
            fingerprint: "",
        }
        .token_event(&mut out, &[" a"], None);
        assert!(out.starts_with(b"data: {\"id\":\"cmpl-"));
    }

    #[test]
    fn a_field_is_appended_to_the_object() {
        let mut out = br#"{"a":1}"#.to_vec();
        append_field(&mut out, "kv_transfer_params", br#"{"b":[2]}"#);
        assert_eq!(out, br#"{"a":1,"kv_transfer_params":{"b":[2]}}"#);
        let mut empty = b"{}".to_vec();
        append_field(&mut empty, "x", b"1");
        assert_eq!(empty, br#"{"x":1}"#);
        let mut not_an_object = b"[1]".to_vec();
        append_field(&mut not_an_object, "x", b"1");
        assert_eq!(not_an_object, b"[1]");
    }

    #[test]
    fn text_is_seeded() {
        let words = |seed, req| {
            let mut t = Text::new(seed, req);
            (0..8).map(|_| t.next_token().1).collect::<Vec<_>>()
        };
        assert_eq!(words(1, 2), words(1, 2));
        assert_ne!(words(1, 2), words(1, 3));
        assert_ne!(words(1, 2), words(2, 2));
        let mut t = Text::new(0, 0);
        assert_eq!(t.next_token().0, "");
        assert_eq!(t.next_token().0, " ");
    }
}
