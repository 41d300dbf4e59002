use super::*;

fn model(body: &str) -> Result<Option<String>, PeekError> {
    let p = peek(body.as_bytes())?;
    let mut scratch = Vec::new();
    Ok(match p.model {
        Some(m) => Some(String::from_utf8(m.decoded(&mut scratch)?.to_vec()).unwrap()),
        None => None,
    })
}

#[test]
fn table() {
    let ok: &[(&str, Option<&str>)] = &[
        (r#"{"model":"m1","messages":[]}"#, Some("m1")),
        (r#"  {  "model" : "m1" }  "#, Some("m1")),
        (
            r#"{"messages":[{"model":"nested"}],"model":"top"}"#,
            Some("top"),
        ),
        (r#"{"messages":[{"model":"nested"}]}"#, None),
        (
            r#"{"x":{"model":"nested","y":[1,{"model":"deeper"}]}}"#,
            None,
        ),
        (
            r#"{"prompt":"say \"model\": \"fake\"","model":"real"}"#,
            Some("real"),
        ),
        (
            r#"{"prompt":"ends with backslash \\","model":"real"}"#,
            Some("real"),
        ),
        (r#"{"model":"Qwen\/Qwen3-0.6B"}"#, Some("Qwen/Qwen3-0.6B")),
        (r#"{"model":"caf\u00e9 \ud83d\ude00"}"#, Some("café 😀")),
        (r#"{"\u006dodel":"escaped-key"}"#, Some("escaped-key")),
        (r#"{"\"model\"":"quoted-key-is-not-model"}"#, None),
        (r#"{}"#, None),
        (
            r#"{"a":[],"b":{},"c":null,"d":-1.5e3,"model":"m"}"#,
            Some("m"),
        ),
    ];
    for (body, want) in ok {
        assert_eq!(model(body), Ok(want.map(str::to_string)), "{body}");
    }
    let bad: &[(&str, PeekError)] = &[
        ("", PeekError::NotObject),
        ("[1]", PeekError::NotObject),
        ("model=m1", PeekError::NotObject),
        (r#"{"model":"m1""#, PeekError::Syntax),
        (r#"{"model":"m1",}"#, PeekError::Syntax),
        (r#"{"model":"m1"} x"#, PeekError::Syntax),
        (r#"{"model":"m1}"#, PeekError::Syntax),
        (r#"{"a":[1,2}"#, PeekError::Syntax),
        (r#"{"a":{]}"#, PeekError::Syntax),
        (r#"{"a":tru}"#, PeekError::Syntax),
        (r#"{"model":1}"#, PeekError::ModelNotString),
        (r#"{"model":"a","model":"b"}"#, PeekError::DuplicateModel),
        (
            r#"{"model":"a","mod\u0065l":"b"}"#,
            PeekError::DuplicateModel,
        ),
        (r#"{"model":"a\x"}"#, PeekError::BadEscape),
        (r#"{"model":"\ud800"}"#, PeekError::BadEscape),
    ];
    for (body, want) in bad {
        assert_eq!(model(body), Err(*want), "{body}");
    }
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(200), "]".repeat(200));
    assert_eq!(peek(deep.as_bytes()), Err(PeekError::TooDeep));
}

#[test]
fn extracts_stream_tokens_and_prompt_size() {
    let body = r#"{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;
    let p = peek(body.as_bytes()).unwrap();
    assert!(p.stream);
    assert_eq!(p.max_tokens, Some(64));
    assert_eq!(p.prompt_bytes, r#"[{"role":"user","content":"hi"}]"#.len());
    let p =
        peek(br#"{"model":"m","stream":false,"max_tokens":5,"max_completion_tokens":7}"#).unwrap();
    assert!(!p.stream);
    assert_eq!(p.max_tokens, Some(7));
}

proptest::proptest! {
    /// Against serde_json as the oracle: for any valid JSON object, the scanner finds the
    /// same top-level model.
    #[test]
    fn agrees_with_serde(v in arb_object()) {
        let text = serde_json::to_string(&v).unwrap();
        let want = v.get("model").and_then(|m| m.as_str()).map(str::to_string);
        match v.get("model") {
            Some(m) if !m.is_string() => proptest::prop_assert_eq!(model(&text), Err(PeekError::ModelNotString)),
            _ => proptest::prop_assert_eq!(model(&text), Ok(want)),
        }
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        proptest::prop_assert_eq!(peek(text.as_bytes()).map(|p| p.model.is_some()), peek(pretty.as_bytes()).map(|p| p.model.is_some()));
    }

    /// Arbitrary bytes never panic.
    #[test]
    fn never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
        let _ = peek(&data);
    }
}

fn arb_json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        "(model|\\\\|\"|[a-z]|\\{|\\}|\\[|\\]|\u{e9}|\u{1F600}|\n){0,8}"
            .prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            proptest::collection::vec(("(model|m|\"model\"|x)", inner), 0..6)
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn arb_object() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    proptest::collection::vec(
        ("(model|messages|\"model\"|stream|k[0-9])", arb_json()),
        0..6,
    )
    .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect()))
}
