//! Reading a generation request's body: the top-level scan (the model and the prompt's
//! size, measured as Spillway's body scanner measures it) and the typed knobs.

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::{Api, ApiError, Finish, Generate};
use crate::disagg::Fields;

/// The top-level fields read as they stand in the body: `model`, and the raw JSON text of
/// `messages`, `prompt` and `input`, whose length is the prompt-size estimate's input (the
/// bytes Spillway's body scanner counts for its tracked load).
#[derive(Default)]
struct Top {
    model: Option<String>,
    prompt_bytes: usize,
    /// `model` was not a string, or came twice.
    bad_model: Option<&'static str>,
}

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Top, D::Error> {
        d.deserialize_map(TopVisitor)
    }
}

impl Top {
    /// Takes a top-level `model` value; a second one, or one that is not a string, is
    /// remembered as the body's fault.
    fn model<E: de::Error>(&mut self, raw: &str) -> Result<(), E> {
        if !raw.starts_with('"') {
            self.bad_model.get_or_insert("`model` must be a string");
        } else if self.model.is_some() {
            self.bad_model
                .get_or_insert("`model` appears more than once");
        } else {
            let name = serde_json::from_str::<String>(raw).map_err(E::custom)?;
            self.model = Some(name);
        }
        Ok(())
    }
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        let mut top = Top::default();
        while let Some(key) = map.next_key::<String>()? {
            let value: &'de RawValue = map.next_value()?;
            match key.as_str() {
                "messages" | "prompt" | "input" => top.prompt_bytes += value.get().len(),
                "model" => top.model(value.get())?,
                _ => {}
            }
        }
        Ok(top)
    }
}

/// Typed fields the top-level scan does not read; serde also validates the whole body.
#[derive(Deserialize)]
struct Knobs {
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    kv_transfer_params: Option<serde_json::Value>,
    #[serde(default)]
    bootstrap_host: Option<serde_json::Value>,
    #[serde(default)]
    bootstrap_port: Option<serde_json::Value>,
    #[serde(default)]
    bootstrap_room: Option<serde_json::Value>,
}

/// A generation request as read: what drives the engine, and its handoff fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub generate: Generate,
    pub handoff: Fields,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// The top-level scan of a body, with the refusals Spillway's body scanner would make.
fn scan(body: &[u8]) -> Result<Top, ApiError> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiError::bad_request("request body is not a JSON object"));
    }
    let top: Top = serde_json::from_slice(body)
        .map_err(|_| ApiError::bad_request("request body is not valid JSON"))?;
    match top.bad_model {
        Some(why) => Err(ApiError::bad_request(why)),
        None => Ok(top),
    }
}

/// Reads a generation request. The prompt size is measured as Spillway's body scanner
/// measures it, so the prompt estimate (bytes / 4 of `messages` or `prompt`, at least 1)
/// is the one Spillway's tracked load uses. A missing `model` means the served one.
pub fn parse(
    api: Api,
    body: &[u8],
    served_model: &str,
    default_max_tokens: u32,
) -> Result<Generate, ApiError> {
    parse_request(api, body, served_model, default_max_tokens).map(|r| r.generate)
}

/// [`parse`], with the request's disaggregation handoff fields.
pub fn parse_request(
    api: Api,
    body: &[u8],
    served_model: &str,
    default_max_tokens: u32,
) -> Result<Request, ApiError> {
    let top = scan(body)?;
    if let Some(name) = top.model.filter(|m| m != served_model) {
        return Err(ApiError::not_found(format!(
            "The model `{name}` does not exist."
        )));
    }
    let knobs: Knobs = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    let asked = knobs.max_completion_tokens.or(knobs.max_tokens);
    let max_tokens = match asked {
        Some(n) => u32::try_from(n).unwrap_or(u32::MAX),
        None => default_max_tokens,
    };
    let generate = Generate {
        api,
        stream: knobs.stream.unwrap_or(false),
        include_usage: knobs
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        prompt_tokens: u32::try_from((top.prompt_bytes / 4).max(1)).unwrap_or(u32::MAX),
        max_tokens,
        finish: if asked.is_some() {
            Finish::Length
        } else {
            Finish::Stop
        },
    };
    let handoff = Fields {
        kv_transfer_params: knobs.kv_transfer_params,
        bootstrap_host: knobs.bootstrap_host,
        bootstrap_port: knobs.bootstrap_port,
        bootstrap_room: knobs.bootstrap_room,
    };
    Ok(Request { generate, handoff })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn request(api: Api, body: &str) -> Result<Generate, ApiError> {
        parse(api, body.as_bytes(), "m/1", 16)
    }

    #[test]
    fn reads_the_fields_that_drive_the_engine() {
        let g = request(
            Api::Chat,
            r#"{"model":"m/1","stream":true,"stream_options":{"include_usage":true},"max_tokens":7,"messages":[{"role":"user","content":"0123456789abcdef0123"}]}"#,
        )
        .unwrap();
        assert_eq!(
            g,
            Generate {
                api: Api::Chat,
                stream: true,
                include_usage: true,
                prompt_tokens: 12, // 50 bytes of messages / 4
                max_tokens: 7,
                finish: Finish::Length,
            }
        );
        let g = request(
            Api::Completions,
            r#"{"prompt":"x","max_tokens":3,"max_completion_tokens":5}"#,
        )
        .unwrap();
        assert_eq!((g.max_tokens, g.prompt_tokens, g.stream), (5, 1, false));
        let g = request(Api::Chat, r#"{"model":"m\/1","stream_options":null}"#).unwrap();
        assert_eq!((g.max_tokens, g.finish), (16, Finish::Stop));
    }

    #[test]
    fn reads_the_handoff_fields_as_they_stand() {
        let r = parse_request(
            Api::Completions,
            br#"{"prompt":"x","kv_transfer_params":{"do_remote_decode":true},"bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":null}"#,
            "m/1",
            16,
        )
        .unwrap();
        assert_eq!(
            r.handoff,
            Fields {
                kv_transfer_params: Some(json!({"do_remote_decode":true})),
                bootstrap_host: Some(json!("h")),
                bootstrap_port: Some(json!(8998)),
                bootstrap_room: None,
            }
        );
        let plain = parse_request(Api::Completions, br#"{"prompt":"x"}"#, "m/1", 16).unwrap();
        assert_eq!(plain.handoff, Fields::default());
    }

    #[test]
    fn refusals_in_openai_shape() {
        let e = request(Api::Chat, r#"{"model":"other"}"#).unwrap_err();
        assert_eq!(e.status, 404);
        let v: Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(
            v,
            json!({"error":{"message":"The model `other` does not exist.","type":"NotFoundError","param":null,"code":404}})
        );
        for bad in [
            "not json",
            r#"{"model":"m/1","max_tokens":-1}"#,
            r#"{"model":"m/1","stream":"yes"}"#,
            r#"{"model":"m/1","messages":[}"#,
        ] {
            assert_eq!(request(Api::Chat, bad).unwrap_err().status, 400, "{bad}");
        }
    }

    #[test]
    fn prompt_size_is_the_raw_text_of_the_prompt_values() {
        let tokens = |body: &str| request(Api::Completions, body).unwrap().prompt_tokens;
        // `"0123456789abcd"`: 16 bytes with its quotes; the spaces around it do not count.
        assert_eq!(tokens(r#"{ "prompt" :  "0123456789abcd"  }"#), 4);
        assert_eq!(
            tokens(r#"{"pr\u006fmpt":"0123456789abcd"}"#),
            4,
            "escaped key"
        );
        assert_eq!(tokens(r#"{"input":[1, 2, 3, 4, 5, 6, 7]}"#), 5, "21 bytes");
        assert_eq!(
            tokens(r#"{"prompt":"ab","messages":"cdefgh"}"#),
            3,
            "4 + 8 bytes"
        );
        assert_eq!(
            tokens(r#"{"prompt":"a\"\\b"}"#),
            2,
            "escapes count as written"
        );
        assert_eq!(tokens(r#"{"prompt":"a"}"#), 1);
        assert_eq!(tokens(r#"{"max_tokens":3}"#), 1, "at least 1");
    }

    #[test]
    fn body_faults_are_refused_before_the_model_is_looked_up() {
        for (body, message) in [
            ("", "request body is not a JSON object"),
            (" [1]", "request body is not a JSON object"),
            (r#"{"model":"other""#, "request body is not valid JSON"),
            (r#"{"model":"other"} x"#, "request body is not valid JSON"),
            (r#"{"model":1}"#, "`model` must be a string"),
            (
                r#"{"model":"other","model":"m/1"}"#,
                "`model` appears more than once",
            ),
        ] {
            let e = request(Api::Chat, body).unwrap_err();
            assert_eq!((e.status, e.message.as_str()), (400, message), "{body}");
        }
        let e = request(Api::Chat, r#"{"model":"other","max_tokens":-1}"#).unwrap_err();
        assert_eq!(
            e.status, 404,
            "the model is checked before the other fields"
        );
    }
}
