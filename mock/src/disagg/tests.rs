use super::*;
use serde_json::json;

fn setup(role: Role) -> Setup {
    Setup {
        role,
        identity: Identity::new("10.0.0.7:8000".parse().unwrap(), 0),
        bootstrap_port: 8998,
        block_size: 16,
    }
}

fn vllm(params: Value) -> Fields {
    Fields {
        kv_transfer_params: Some(params),
        ..Fields::default()
    }
}

fn sglang(host: Value, port: Value, room: Value) -> Fields {
    Fields {
        bootstrap_host: Some(host),
        bootstrap_port: Some(port),
        bootstrap_room: Some(room),
        ..Fields::default()
    }
}

const STAGE_1: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

/// The params a prefill engine of `role` returns for `text` (100 tokens: 7 blocks).
fn stage_1(role: Role, text: &[u8]) -> Value {
    let s = setup(role);
    let fields = vllm(serde_json::from_str(STAGE_1).unwrap());
    let Ok(Plan::PrefillVllm(ids)) = plan(&s, &fields, 100, text) else {
        panic!("not a prefill plan");
    };
    let mut out = Vec::new();
    render_params(&mut out, &ids, &s.identity);
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn roles_round_trip() {
    for r in [Role::Prefill, Role::Decode, Role::Both] {
        assert_eq!(r.name().parse::<Role>(), Ok(r));
        assert_eq!(r.to_string(), r.name());
    }
    assert!("mixed".parse::<Role>().unwrap_err().contains("prefill"));
    assert_eq!(Role::default(), Role::Both);
}

#[test]
fn the_engine_id_is_stable_per_address_and_seed() {
    let id = |addr: &str, seed| Identity::new(addr.parse().unwrap(), seed);
    let a = id("10.0.0.7:8000", 0);
    assert_eq!(a, id("10.0.0.7:8000", 0));
    assert_ne!(a.engine_id, id("10.0.0.7:8001", 0).engine_id);
    assert_ne!(a.engine_id, id("10.0.0.7:8000", 1).engine_id);
    assert!(a.engine_id.starts_with("mock-") && a.engine_id.len() == 21);
    assert_eq!((a.host.as_str(), a.port), ("10.0.0.7", 8000));
}

#[test]
fn stage_1_returns_nixl_shaped_params() {
    let text = b"\"user\":\"hello\"\n";
    let params = stage_1(Role::Prefill, text);
    let ids = BlockIds::new(&setup(Role::Prefill).identity.engine_id, text, 7);
    let want: Vec<u64> = ids.iter().collect();
    assert_eq!(
        params,
        json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": want,
            "remote_engine_id": setup(Role::Prefill).identity.engine_id,
            "remote_host": "10.0.0.7",
            "remote_port": 8000,
            "tp_size": 1,
        })
    );
    assert!(want.iter().all(|&id| id < 1 << 31));
    assert_eq!(
        stage_1(Role::Both, text),
        params,
        "a whole engine prefills too"
    );
    let e = plan(
        &setup(Role::Decode),
        &vllm(serde_json::from_str(STAGE_1).unwrap()),
        100,
        text,
    )
    .unwrap_err();
    assert!(e.contains("kv_transfer_params.do_remote_decode"), "{e}");
}

#[test]
fn stage_2_receives_only_the_blocks_given_to_this_prompt() {
    let text = b"\"user\":\"hello\"\n";
    let params = stage_1(Role::Prefill, text);
    for role in [Role::Decode, Role::Both] {
        let got = plan(&setup(role), &vllm(params.clone()), 100, text);
        assert_eq!(got, Ok(Plan::Receive(Protocol::Vllm, 7)), "{role}");
    }
    let tamper = |f: &dyn Fn(&mut Value)| {
        let mut p = params.clone();
        f(&mut p);
        plan(&setup(Role::Decode), &vllm(p), 100, text)
    };
    assert_eq!(
        tamper(&|p| p["remote_block_ids"][3] = json!(1)),
        Ok(Plan::Fallback)
    );
    assert_eq!(
        tamper(&|p| {
            p["remote_block_ids"].as_array_mut().unwrap().pop();
        }),
        Ok(Plan::Fallback)
    );
    assert_eq!(
        tamper(&|p| p["remote_engine_id"] = json!("other")),
        Ok(Plan::Fallback)
    );
    assert_eq!(
        tamper(&|p| p["remote_host"] = Value::Null),
        Ok(Plan::Fallback)
    );
    assert_eq!(
        tamper(&|p| p["remote_port"] = json!(70000)),
        Ok(Plan::Fallback)
    );
    assert_eq!(
        plan(&setup(Role::Decode), &vllm(params.clone()), 100, b"other"),
        Ok(Plan::Fallback),
        "another prompt"
    );
    assert_eq!(
        plan(&setup(Role::Decode), &vllm(params.clone()), 120, text),
        Ok(Plan::Fallback),
        "another prompt length"
    );
    let e = plan(&setup(Role::Prefill), &vllm(params), 100, text).unwrap_err();
    assert!(e.contains("kv_transfer_params.do_remote_prefill"), "{e}");
}

#[test]
fn other_kv_transfer_params() {
    let s = setup(Role::Decode);
    let both = json!({"do_remote_decode": true, "do_remote_prefill": true});
    assert!(plan(&s, &vllm(both), 1, b"").unwrap_err().contains("both"));
    let e = plan(&s, &vllm(json!("yes")), 1, b"").unwrap_err();
    assert_eq!(e, "kv_transfer_params must be an object");
    let neither = json!({"do_remote_decode": false, "do_remote_prefill": "true"});
    assert_eq!(plan(&s, &vllm(neither), 1, b""), Ok(Plan::Local));
    for role in [Role::Prefill, Role::Decode, Role::Both] {
        assert_eq!(
            plan(&setup(role), &Fields::default(), 1, b""),
            Ok(Plan::Local)
        );
    }
}

#[test]
fn sglang_bootstrap_fields() {
    let ok = sglang(json!("10.0.0.7"), json!(8998), json!(u64::MAX >> 1));
    assert_eq!(
        plan(&setup(Role::Decode), &ok, 40, b""),
        Ok(Plan::Receive(Protocol::Sglang, 3))
    );
    assert_eq!(
        plan(&setup(Role::Prefill), &ok, 40, b""),
        Ok(Plan::PrefillSglang)
    );
    assert_eq!(plan(&setup(Role::Both), &ok, 40, b""), Ok(Plan::Local));
    let other_port = sglang(json!("h"), json!(9000), json!(1));
    let e = plan(&setup(Role::Prefill), &other_port, 1, b"").unwrap_err();
    assert!(e.starts_with("bootstrap_port 9000"), "{e}");
    assert!(plan(&setup(Role::Decode), &other_port, 1, b"").is_ok());
    for (fields, field) in [
        (
            sglang(json!("h"), json!(1), json!(1u64 << 63)),
            "bootstrap_room",
        ),
        (sglang(json!("h"), json!(1), json!(-1)), "bootstrap_room"),
        (sglang(json!("h"), json!(1), json!(1.5)), "bootstrap_room"),
        (sglang(json!("h"), json!(1), json!("7")), "bootstrap_room"),
        (sglang(json!("h"), json!(0), json!(1)), "bootstrap_port"),
        (sglang(json!("h"), json!(65536), json!(1)), "bootstrap_port"),
        (sglang(json!(""), json!(1), json!(1)), "bootstrap_host"),
        (sglang(json!(7), json!(1), json!(1)), "bootstrap_host"),
        (
            Fields {
                bootstrap_room: Some(json!(1)),
                ..Fields::default()
            },
            "bootstrap_host is missing",
        ),
    ] {
        for role in [Role::Prefill, Role::Decode] {
            let e = plan(&setup(role), &fields, 1, b"").unwrap_err();
            assert!(e.starts_with(field), "{fields:?}: {e}");
        }
        assert_eq!(plan(&setup(Role::Both), &fields, 1, b""), Ok(Plan::Local));
    }
}

#[test]
fn counts_by_protocol() {
    let mut c = Counts::default();
    c.decided(&Plan::Receive(Protocol::Sglang, 3));
    c.decided(&Plan::Fallback);
    c.decided(&Plan::Local);
    c.prefilled(Protocol::Vllm);
    assert_eq!(
        (c.received(Protocol::Sglang), c.received(Protocol::Vllm)),
        (1, 0)
    );
    assert_eq!(
        (c.fallback(Protocol::Vllm), c.prefills(Protocol::Vllm)),
        (1, 1)
    );
}
