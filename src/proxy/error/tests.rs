use super::*;

fn decode(value: f64) -> Option<Why> {
    Some(Why {
        knob: Knob::DecodeBlocks,
        value,
        threshold: 0.85,
    })
}

#[test]
fn statuses_labels_and_retry_safety() {
    let queue_timeout = RequestError::Refused(Refusal::QueueTimeout, None);
    let cases = [
        (RequestError::Overloaded(decode(0.9)), 529, "overload", true),
        (queue_timeout, 529, "overload", true),
        (RequestError::Unavailable, 503, "unavailable", true),
        (RequestError::UnknownModel, 404, "not_found", false),
        (RequestError::MissingModel, 400, "validation", false),
        (
            RequestError::Framing(HttpError::BodyTimeout),
            408,
            "validation",
            false,
        ),
        (RequestError::BadGateway("x"), 502, "internal", false),
        (RequestError::GatewayTimeout, 504, "response_timeout", false),
    ];
    for (e, status, label, retry) in cases {
        let got = (e.status(529), e.label(), e.client_may_retry());
        assert_eq!(got, (status, label, retry), "{e:?}");
    }
    assert!(AttemptError::Refused(Refusal::AtCapacity, None).another_worker_may_try());
    assert!(AttemptError::Unreachable.another_worker_may_try());
    assert!(!AttemptError::BadGateway("x").another_worker_may_try());
    assert_eq!(AttemptError::Timeout.status(529), Some(504));
    assert_eq!(AttemptError::ClientGone.label(), "cancelled");
    assert_eq!(
        Refusal::UpstreamUnavailable.to_client(None),
        RequestError::Unavailable
    );
}

fn snapshot() -> Snapshot {
    let config = crate::config::Config::parse(
        "retry_after_secs = 2\n[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
        &crate::config::Overrides::default(),
    )
    .unwrap();
    Snapshot::standalone(config, 1).unwrap()
}

fn render(e: RequestError) -> String {
    render_as(e, Class::Standard)
}

fn render_as(e: RequestError, class: Class) -> String {
    let mut out = Vec::new();
    e.write(&snapshot(), (class, None), &mut out, b"r", true, true);
    String::from_utf8(out).unwrap()
}

fn body(text: &str) -> serde_json::Value {
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    serde_json::from_str(body).unwrap()
}

#[test]
fn one_place_renders_every_answer() {
    let text = render(RequestError::Framing(HttpError::BodyTimeout));
    assert!(
        text.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{text}"
    );
    assert!(
        text.contains("timed out reading the request body"),
        "{text}"
    );
    let text = render(RequestError::MethodNotAllowed { allow: "POST" });
    assert!(text.contains("allow: POST\r\n"));
    let text = render(RequestError::UnknownModel);
    assert_eq!(
        body(&text),
        serde_json::json!({"message":"Model not found","type":"Not Found","code":404})
    );
}

#[test]
fn refusals_say_which_knob_the_value_and_the_setting() {
    let text = render(RequestError::Overloaded(decode(0.9)));
    assert!(text.starts_with("HTTP/1.1 529 "), "{text}");
    assert!(text.contains("retry-after: 2\r\n"), "{text}");
    assert_eq!(
        body(&text),
        serde_json::json!({
            "message": "Service temporarily overloaded", "type": "Overloaded", "code": 529,
            "knob": "decode_blocks", "value": 0.9, "threshold": 0.85,
            "setting": "active_decode_blocks_threshold", "class": "standard"
        })
    );
    let full = Why {
        knob: Knob::QueueFull,
        value: 18.0,
        threshold: 18.0,
    };
    let v = body(&render(RequestError::Refused(
        Refusal::AtCapacity,
        Some(full),
    )));
    assert_eq!(v["message"], AT_CAPACITY);
    assert_eq!(
        (v["knob"].as_str(), v["value"].as_u64()),
        (Some("queue_full"), Some(18))
    );
    let v = body(&render_as(RequestError::Unavailable, Class::Sheddable));
    assert_eq!(v["type"], "Service Unavailable");
    assert_eq!(v["class"], "sheddable");
    assert_eq!(v["knob"], "unreachable");
    let null = Some(&serde_json::Value::Null);
    assert_eq!((v.get("value"), v.get("threshold")), (null, null), "{v}");
    assert!(v["setting"].as_str().is_some_and(|s| !s.is_empty()));
}

/// The keys of every shed answer, in order: Dynamo's three, then Spillway's five.
const KEYS: [&str; 8] = [
    "message",
    "type",
    "code",
    "knob",
    "value",
    "threshold",
    "setting",
    "class",
];

/// Every shed answer carries the same keys in the same order, whatever its knob and
/// whether Spillway has its figures: those it has not are `null`.
#[test]
fn every_refusal_body_has_the_same_keys() {
    use RequestError::{DirectBusy, Overloaded, Refused};
    let with = |knob| {
        Some(Why {
            knob,
            value: 3.0,
            threshold: 2.5,
        })
    };
    let mut answers = vec![
        RequestError::Unavailable,
        Overloaded(None),
        DirectBusy(None),
        Refused(Refusal::UpstreamOverloaded, None),
        Refused(Refusal::AtCapacity, None),
        Refused(Refusal::QueueTimeout, None),
    ];
    for knob in Knob::ALL {
        answers.extend([
            Overloaded(with(knob)),
            DirectBusy(with(knob)),
            Refused(Refusal::AtCapacity, with(knob)),
            Refused(Refusal::QueueTimeout, with(knob)),
        ]);
    }
    for e in answers {
        let text = render(e);
        let (_, raw) = text.split_once("\r\n\r\n").unwrap();
        let at: Vec<usize> = KEYS
            .iter()
            .map(|k| {
                let key = format!("\"{k}\":");
                raw.find(&key).unwrap_or_else(|| panic!("no {k}: {raw}"))
            })
            .collect();
        assert!(at.is_sorted(), "keys out of order: {raw}");
        let v = body(&text);
        assert_eq!(v.as_object().map(|o| o.len()), Some(KEYS.len()), "{raw}");
        let knob = e.knob().unwrap();
        assert_eq!(
            (&v["knob"], &v["setting"]),
            (&knob.label().into(), &knob.setting().into())
        );
        let figure = |key: &str| v.get(key).map(|x| x.as_f64().ok_or(x.clone()));
        let null = Some(Err(serde_json::Value::Null));
        let expected = match e.why() {
            Some(w) => (Some(Ok(w.value)), Some(Ok(w.threshold))),
            None => (null.clone(), null),
        };
        assert_eq!((figure("value"), figure("threshold")), expected, "{raw}");
    }
}
