//! The prompt text the engine "sees", for prefix caching: what a chat template would feed
//! the model, minus the template. Every role and text piece is written as a JSON string
//! literal (self-delimiting), a role followed by `:` and a message by a newline, so two
//! different conversations never give the same text.

use serde_json::Value;

use super::Api;

/// The prompt text of a request body: for chat, each message's role and its content (a
/// string, or the `text` of each part of an array, in order); for completions, the
/// `prompt` string or each string of an array. Whatever else is there, or a body that
/// does not parse, adds nothing.
pub fn prompt_text(api: Api, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return out;
    };
    match api {
        Api::Chat => {
            let messages = v.get("messages").and_then(Value::as_array);
            for m in messages.into_iter().flatten() {
                string(&mut out, m.get("role"));
                out.push(b':');
                match m.get("content") {
                    Some(Value::Array(parts)) => {
                        parts.iter().for_each(|p| string(&mut out, p.get("text")));
                    }
                    content => string(&mut out, content),
                }
                out.push(b'\n');
            }
        }
        Api::Completions => match v.get("prompt") {
            Some(Value::Array(prompts)) => prompts.iter().for_each(|p| string(&mut out, Some(p))),
            prompt => string(&mut out, prompt),
        },
    }
    out
}

/// Appends `v` as a JSON string literal when it is a string.
fn string(out: &mut Vec<u8>, v: Option<&Value>) {
    if let Some(s) = v.and_then(Value::as_str) {
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(messages: &str) -> String {
        let body = format!(r#"{{"model":"m","messages":{messages}}}"#);
        String::from_utf8(prompt_text(Api::Chat, body.as_bytes())).unwrap()
    }

    fn completion(prompt: &str) -> String {
        let body = format!(r#"{{"prompt":{prompt},"max_tokens":3}}"#);
        String::from_utf8(prompt_text(Api::Completions, body.as_bytes())).unwrap()
    }

    #[test]
    fn chat_messages_in_order_with_decoded_content() {
        assert_eq!(
            chat(
                r#"[{"role":"system","content":"be br\u0069ef"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]"#
            ),
            "\"system\":\"be brief\"\n\"user\":\"a\"\"b\"\n"
        );
        assert_eq!(
            chat(r#"[{"role":"user","content":"hi"}]"#),
            chat(r#"[{"role":"user","content":[{"type":"text","text":"hi"}]}]"#),
            "one text part reads as the plain string"
        );
        assert_eq!(
            chat(r#"[{"role":"assistant","content":null,"tool_calls":[]}]"#),
            "\"assistant\":\n"
        );
        assert_eq!(chat(r#""not a list""#), "");
    }

    #[test]
    fn boundaries_are_unambiguous() {
        let split = chat(r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]"#);
        let joined = chat(r#"[{"role":"user","content":"a\n\"assistant\":\"b"}]"#);
        assert_ne!(split, joined);
        assert_ne!(
            chat(r#"[{"role":"user","content":[{"text":"ab"},{"text":"c"}]}]"#),
            chat(r#"[{"role":"user","content":"abc"}]"#)
        );
    }

    #[test]
    fn completion_prompts() {
        assert_eq!(completion(r#""once upon""#), r#""once upon""#);
        assert_eq!(completion(r#"["a","b",[1,2]]"#), r#""a""b""#);
        assert_eq!(completion("[1,2,3]"), "");
        assert_eq!(prompt_text(Api::Completions, b"not json"), b"");
    }
}
