//! The request-body scanner on arbitrary bytes: `peek`, then for a body it accepts the
//! prompt's identity walk (`prompt_parts`) and its chunk hashes (`prompt_hashes`) on the
//! prompt span it found. Checked: spans inside the body, the model's two decodings agree,
//! the hash count is whole chunks of what the walk fed, capped by the output, and a
//! shorter output holds a prefix of the same hashes. Where serde_json accepts the body as
//! an object, the scanner must accept it too (bar its documented refusals) and route on
//! the same model, and the prompt span must be a JSON value; and the disaggregated stages'
//! bodies (`route::handoff`) must be JSON objects with the stage's members and every other
//! member as sent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway::route::handoff::{self, Bootstrap};
use spillway::route::peek::{MESSAGE_END, PART_END, PeekError, RequestPeek, peek, prompt_parts};
use spillway::route::prefix::{MAX_CHUNK_BYTES, MAX_CHUNKS, prompt_hashes};

fn check_peek(body: &[u8], p: &RequestPeek<'_>) -> Option<Vec<u8>> {
    let model = p.model.map(|m| {
        let base = body.as_ptr() as usize;
        let at = m.raw.as_ptr() as usize - base;
        assert!(at + m.raw.len() <= body.len());
        let mut scratch = Vec::new();
        let decoded = m.decoded(&mut scratch).map(<[u8]>::to_vec);
        if let Ok(d) = &decoded {
            assert!(m.is(d), "decoded {d:?} is not the model {m:?}");
        }
        decoded
    });
    if let Some((start, end)) = p.prompt {
        assert!(start < end && end <= body.len(), "prompt {start}..{end}");
        assert!(p.prompt_bytes >= end - start);
    } else {
        assert_eq!(p.prompt_bytes, 0);
    }
    model.and_then(Result::ok)
}

fn check_prompt(value: &[u8]) {
    let mut fed = 0;
    prompt_parts(value, |part| {
        let inside = value.as_ptr_range();
        let own = part.as_ptr_range();
        let separator = part.len() == 1 && matches!(part[0], PART_END | MESSAGE_END);
        assert!(
            part.is_empty() || separator || (inside.start <= own.start && own.end <= inside.end),
            "a part that is neither the prompt's nor a separator"
        );
        fed += part.len();
    });
    let mut out = vec![0u64; MAX_CHUNKS];
    for chunk in [1, 7, 64, MAX_CHUNK_BYTES] {
        let n = prompt_hashes(value, chunk, &mut out);
        assert_eq!(n, (fed / chunk).min(MAX_CHUNKS), "chunk {chunk}");
        assert!(out[..n].iter().all(|&h| h != 0));
        let k = n / 2;
        let mut short = vec![0u64; k];
        assert_eq!(prompt_hashes(value, chunk, &mut short), k);
        assert_eq!(short[..], out[..k]);
    }
}

/// serde_json's reading of the body: accepted as an object, the model it names.
fn differential(body: &[u8], got: &Result<RequestPeek<'_>, PeekError>, model: Option<&[u8]>) {
    let Ok(serde_json::Value::Object(obj)) = serde_json::from_slice(body) else {
        return;
    };
    match got {
        Ok(p) => {
            let want = obj.get("model").and_then(|m| m.as_str()).map(str::as_bytes);
            assert_eq!(model, want);
            let prompt = ["messages", "prompt", "input"]
                .iter()
                .any(|k| obj.contains_key(*k));
            assert_eq!(p.prompt.is_some(), prompt);
            if let Some((start, end)) = p.prompt {
                let value = serde_json::from_slice::<serde_json::Value>(&body[start..end]);
                assert!(value.is_ok(), "prompt span is not a JSON value");
            }
        }
        Err(PeekError::TooDeep | PeekError::DuplicateModel | PeekError::ModelNotString) => {}
        Err(e) => panic!("serde_json accepts an object the scanner refuses: {e}"),
    }
    if got.is_ok() {
        check_handoff(body, &obj);
    }
}

/// The stages' bodies of a body both readers accept: objects that keep every member the
/// stage does not replace.
fn check_handoff(body: &[u8], obj: &serde_json::Map<String, serde_json::Value>) {
    let stage = |out: &[u8], replaced: &[&str]| {
        let Ok(serde_json::Value::Object(o)) = serde_json::from_slice(out) else {
            panic!("a stage's body is not a JSON object");
        };
        for (k, v) in obj.iter().filter(|(k, _)| !replaced.contains(&k.as_str())) {
            assert_eq!(o.get(k), Some(v), "member {k} changed");
        }
        o
    };
    let mut out = Vec::new();
    handoff::vllm_prefill(body, &mut out).expect("a body peek accepts");
    let replaced = [
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "kv_transfer_params",
    ];
    let o = stage(&out, &replaced);
    assert_eq!(o.get("stream"), Some(&serde_json::Value::Bool(false)));
    assert_eq!(o.get("max_tokens"), Some(&serde_json::Value::from(1)));
    assert!(!o.contains_key("stream_options"));
    handoff::vllm_decode(body, b"{\"a\":1}", &mut out).expect("a body peek accepts");
    stage(&out, &["kv_transfer_params"]);
    let at = Bootstrap {
        host: "h",
        port: 1,
        room: 2,
    };
    handoff::sglang(body, at, &mut out).expect("a body peek accepts");
    stage(
        &out,
        &["bootstrap_host", "bootstrap_port", "bootstrap_room"],
    );
}

fuzz_target!(|body: &[u8]| {
    let got = peek(body);
    let mut model = None;
    if let Ok(p) = &got {
        model = check_peek(body, p);
        if let Some((start, end)) = p.prompt {
            check_prompt(&body[start..end]);
        }
    }
    differential(body, &got, model.as_deref());
});
