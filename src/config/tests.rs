use super::*;
use crate::config::KvOverrides;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, &Overrides::default())
}

const MIN: &str = "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:8001\"\n";

#[test]
fn documented_example_is_valid() {
    let c = parse(EXAMPLE_CONFIG).unwrap();
    assert!(!c.models.is_empty());
}

#[test]
fn minimal_defaults() {
    let c = parse(MIN).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:8000");
    assert_eq!(c.admin_listen.to_string(), "127.0.0.1:9090");
    assert_eq!(c.overload_status_code, 529);
    assert_eq!(c.limits, Limits::default());
    assert_eq!(c.workers[0].name, "127.0.0.1:8001");
    assert_eq!(c.models[0].router_mode, RouterMode::RoundRobin);
    assert!(c.cores >= 1);
    assert_eq!(c.client_budget_header, None);
    let c = parse(&format!("client_budget_header = \" X-Budget-Ms\"\n{MIN}")).unwrap();
    assert_eq!(c.client_budget_header.as_deref(), Some("x-budget-ms"));
    assert_eq!((c.tenant_header, c.tenant_room_share), (None, 1.0));
    assert!(!c.busy_spares_light_tenants);
    let c = parse(&format!(
        "tenant_header = \"Authorization\"\ntenant_room_share = 0.25\n{MIN}"
    ))
    .unwrap();
    assert_eq!(c.tenant_header.as_deref(), Some("authorization"));
    assert_eq!(c.tenant_room_share, 0.25);
    assert!(c.busy_spares_light_tenants, "on by default with tenants");
    let off = "tenant_header = \"x-tenant\"\nbusy_spares_light_tenants = false\n";
    assert!(
        !parse(&format!("{off}{MIN}"))
            .unwrap()
            .busy_spares_light_tenants
    );
}

#[test]
fn tenant_settings_are_checked() {
    let cases = [
        (
            "tenant_room_share = 0.5\n",
            "tenant_room_share (line 1): requests have no tenant: set `tenant_header` too",
        ),
        (
            "tenant_header = \"x-tenant\"\ntenant_room_share = 1.5\n",
            "tenant_room_share (line 2): must be greater than 0 and at most 1",
        ),
        (
            "busy_spares_light_tenants = true\n",
            "busy_spares_light_tenants (line 1): requests have no tenant: set `tenant_header` too",
        ),
    ];
    for (toml, want) in cases {
        let e = parse(&format!("{toml}{MIN}")).unwrap_err().to_string();
        assert!(e.contains(want), "{toml}: {e}");
    }
}

/// A prefill pool `p` (with `pool` lines) and model `m` naming it (with `front` lines).
fn pools(front: &str, pool: &str) -> String {
    format!(
        "[[models]]\nname = \"m\"\n{front}\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n\
         [[models]]\nname = \"p\"\n{pool}\n[[models.workers]]\nurl = \"http://127.0.0.1:2\"\n"
    )
}

#[test]
fn sglangs_handoff_reads_each_prefill_workers_bootstrap_port() {
    let sglang = pools(
        "prefill = \"p\"\nhandoff = \"sglang\"",
        "role = \"prefill\"",
    )
    .replace(
        "url = \"http://127.0.0.1:2\"",
        "url = \"http://127.0.0.1:2\"\nbootstrap_port = 9000",
    );
    let c = parse(&sglang).unwrap();
    assert_eq!(
        c.models[0].disagg.as_ref().unwrap().handoff,
        Handoff::Sglang
    );
    let ports: Vec<u16> = c.workers.iter().map(|w| w.bootstrap_port).collect();
    assert_eq!(ports, [DEFAULT_BOOTSTRAP_PORT, 9000]);
    let zero = sglang.replace("bootstrap_port = 9000", "bootstrap_port = 0");
    let e = parse(&zero).unwrap_err().to_string();
    assert!(
        e.contains("models[1].workers[0].bootstrap_port (line 12): must be greater than 0"),
        "{e}"
    );
}

#[test]
fn disaggregated_pools_are_checked() {
    let c = parse(&pools(
        "prefill = \"p\"\nmax_local_prefill_tokens = 512",
        "role = \"prefill\"",
    ))
    .unwrap();
    let (m, p) = (&c.models[0], &c.models[1]);
    assert_eq!((m.role, p.role), (PoolRole::Serve, PoolRole::Prefill));
    let d = m.disagg.as_ref().unwrap();
    assert_eq!((d.prefill.as_str(), d.handoff), ("p", Handoff::Vllm));
    assert_eq!((d.max_local_prefill_tokens, p.disagg.as_ref()), (512, None));
    let decode = pools("role = \"decode\"\nprefill = \"p\"", "role = \"prefill\"");
    assert!(parse(&decode).is_ok());
    let cases = [
        (
            pools("prefill = \"x\"", "role = \"prefill\""),
            "models[0].prefill (line 3): `x` is no prefill pool",
        ),
        (
            pools("prefill = \"p\"", ""),
            "models[0].prefill (line 3): `p` is no prefill pool",
        ),
        (
            pools("", "role = \"prefill\""),
            "models[1].role (line 8): prefill pool `p` is named by no model's `prefill`",
        ),
        (
            pools(
                "prefill = \"p\"",
                "role = \"prefill\"\nrouter_mode = \"direct\"",
            ),
            "models[1].router_mode (line 9): stage 1 names no worker",
        ),
        (
            pools("prefill = \"p\"", "role = \"prefill\"\nprefill = \"p\""),
            "models[1].prefill (line 9): a prefill pool has no prefill pool of its own",
        ),
        (
            pools("role = \"decode\"", ""),
            "models[0].role (line 3): a decode pool names its prefill pool: set `prefill`",
        ),
        (
            pools("role = \"both\"", ""),
            "models[0].role (line 3): unknown role `both` (expected prefill or decode)",
        ),
        (
            pools("handoff = \"vllm\"", ""),
            "models[0].handoff (line 3): only a model with a prefill pool has stages",
        ),
        (
            pools("max_local_prefill_tokens = 5", ""),
            "models[0].max_local_prefill_tokens: only a model with a prefill pool has stages",
        ),
        (
            pools(
                "prefill = \"p\"\nhandoff = \"sglang\"",
                "role = \"prefill\"\nwaiting_room_size = 4",
            ),
            "models[0].handoff (line 4): SGLang's prefill side is sent at once with the decode side: its prefill pool has no waiting room",
        ),
        (
            pools("prefill = \"p\"\nhandoff = \"nixl\"", "role = \"prefill\""),
            "models[0].handoff (line 4): unknown handoff `nixl` (expected vllm or sglang)",
        ),
    ];
    for (toml, want) in cases {
        let e = parse(&toml).unwrap_err().to_string();
        assert!(e.contains(want), "{toml}: {e}");
    }
}

#[test]
fn errors_name_key_and_line() {
    let cases: &[(&str, &str)] = &[
        ("bogus = 1\n", "unknown field `bogus`"),
        ("[limits]\nmax_body_bytes = \"x\"\n", "line 2"),
        (
            "[limits]\nmax_body_bytes = 0\n",
            "limits.max_body_bytes (line 2): must be greater than 0",
        ),
        ("listen = \"nope\"\n", "listen (line 1)"),
        (
            "client_budget_header = \"x budget\"\n",
            "client_budget_header (line 1): `x budget` is not a header name",
        ),
        (
            "[[models]]\nname = \"m\"\nrouter_mode = \"kv-cache\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            "models[0].router_mode (line 3): unknown router mode `kv-cache` (expected one of: round-robin, random, power-of-two, least-loaded, direct, kv)",
        ),
        (
            "[[models]]\nname = \"m\"\nrouter_mode = \"kv\"\nrouter_temperature = -0.5\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            "models[0].router_temperature (line 4): must be a number of at least 0",
        ),
        (
            "[[models]]\nname = \"m\"\nkv_cache_block_size = 512\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            "models[0].kv_cache_block_size (line 3): must be between 1 and 256",
        ),
        (
            "[[models]]\nname = \"m\"\nrouter_ttl_secs = 0.0\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            "models[0].router_ttl_secs (line 3): must be greater than 0",
        ),
        (
            "[[models]]\nname = \"m\"\nrouter_prefill_load_scale = 1.0\nrouter_kv_overlap_score_weight = 2.0\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            "models[0].router_kv_overlap_score_weight (line 4): is the deprecated name of router_prefill_load_scale",
        ),
        (
            "[[models]]\nname = \"m\"\nrouter_use_kv_events = true\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            "models[0].router_use_kv_events (line 3): Spillway does not subscribe to KV events",
        ),
        (
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"ftp://127.0.0.1:1\"\n",
            "models[0].workers[0].url (line 4): `ftp://127.0.0.1:1` must start with http:// or https://",
        ),
        (
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1/base\"\n",
            "a base path is not supported",
        ),
        (
            "[[models]]\nname = \"m\"\n",
            "models[0].workers (line 2): model `m` has no workers",
        ),
        (
            "[[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 1.5\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            "(line 3): active_decode_blocks_threshold must be between 0.0 and 1.0, got 1.5",
        ),
        (
            "overload_status_code = 150\n",
            "overload_status_code (line 1): must be between 200 and 999, got 150",
        ),
        (
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\nengine_request_limit = 2\nrequest_queue_limit = 1\n",
            "models[0].workers[0].request_queue_limit (line 6): must be at least 2, got 1",
        ),
        (
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\nengine_request_limit = 0\n",
            "models[0].workers[0].engine_request_limit (line 5): must be at least 1",
        ),
        (
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            "listed twice",
        ),
        (
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\nname = \"w\"\n[[models]]\nname = \"n\"\n[[models.workers]]\nurl = \"http://127.0.0.1:2\"\nname = \"w\"\n",
            "worker name `w` is already used",
        ),
    ];
    for (text, want) in cases {
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains(want), "{text:?}\n  got: {err}\n  want: {want}");
    }
}

#[test]
fn shared_worker_is_one_worker() {
    let c = parse("[[models]]\nname = \"a\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n[[models]]\nname = \"b\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n").unwrap();
    assert_eq!(c.workers.len(), 1);
    assert_eq!(c.models[1].workers, vec![0]);
}

#[test]
fn overload_status_env_rules() {
    for (v, want) in [
        ("503", 503),
        (" 429 ", 429),
        ("200", 200),
        ("999", 999),
        ("", 529),
        ("abc", 529),
        ("100", 529),
        ("199", 529),
        ("99", 529),
        ("1000", 529),
        ("-1", 529),
    ] {
        assert_eq!(parse_overload_status_env(v), want, "{v:?}");
    }
    let o = Overrides {
        overload_status_env: Some("503".into()),
        ..Overrides::default()
    };
    let c = Config::parse(&format!("overload_status_code = 429\n{MIN}"), &o).unwrap();
    assert_eq!(c.overload_status_code, 503);
    let c = parse(&format!("overload_status_code = 429\n{MIN}")).unwrap();
    assert_eq!(c.overload_status_code, 429);
}

#[test]
fn overrides_fill_in_where_file_is_silent() {
    let o = Overrides {
        thresholds: Thresholds {
            active_decode_blocks_threshold: Some(0.5),
            active_prefill_tokens_threshold: Some(10),
            ..Thresholds::default()
        },
        router_mode: Some(RouterMode::Random),
        track_output_blocks: Some(true),
        ..Overrides::default()
    };
    let text = "[[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 0.9\nrouter_mode = \"direct\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n";
    let c = Config::parse(text, &o).unwrap();
    let m = &c.models[0];
    assert_eq!(m.thresholds.active_decode_blocks_threshold, Some(0.9));
    assert_eq!(m.thresholds.active_prefill_tokens_threshold, Some(10));
    assert_eq!(m.router_mode, RouterMode::Direct);
    assert!(m.track_output_blocks);
}

#[test]
fn effective_config_round_trips_through_toml() {
    let c = parse(EXAMPLE_CONFIG).unwrap();
    let text = c.to_toml();
    assert!(text.contains("listen = \"127.0.0.1:8000\""), "{text}");
}

#[test]
fn validation_resolves_nothing() {
    // A name that no resolver knows is valid config: resolving happens at start and reload.
    let c = parse("[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://no-such-host.invalid:9/\"\nmetrics_url = \"http://metrics.invalid:7/m\"\n").unwrap();
    let w = &c.workers[0];
    assert_eq!(w.endpoint.to_string(), "no-such-host.invalid:9");
    assert_eq!(
        (w.metrics.to_string().as_str(), w.metrics_path.as_str()),
        ("metrics.invalid:7", "/m")
    );
    assert_eq!(w.name, "no-such-host.invalid:9");
    assert!(Addrs::literals(&c).is_none());
}

#[test]
fn kv_settings_file_over_flags_over_dynamo_defaults() {
    let plain = parse("[[models]]\nname = \"m\"\nrouter_mode = \"kv\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n").unwrap();
    assert_eq!(plain.models[0].router_mode, RouterMode::Kv);
    assert_eq!(plain.models[0].kv, crate::route::KvSettings::default());
    let o = Overrides {
        kv: KvOverrides {
            router_temperature: Some(0.3),
            kv_cache_block_size: Some(64),
            ..KvOverrides::default()
        },
        ..Overrides::default()
    };
    let text = "[[models]]\nname = \"m\"\nrouter_mode = \"kv\"\nkv_cache_block_size = 32\nrouter_kv_overlap_score_weight = 2.5\nrouter_use_kv_events = false\nrouter_ttl_secs = 30\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n";
    let kv = Config::parse(text, &o).unwrap().models[0].kv;
    assert_eq!(kv.router_temperature, 0.3, "from the flag");
    assert_eq!(kv.kv_cache_block_size, 32, "the file wins");
    assert_eq!(
        kv.router_prefill_load_scale, 2.5,
        "the deprecated name still works"
    );
    assert_eq!(kv.router_ttl_secs, 30.0);
}

/// Issue 26, item 9: credentials in a worker's `url` or `metrics_url` (or an etcd
/// endpoint) are refused at load, with the key and line, and the password appears in no
/// message.
#[test]
fn url_credentials_are_refused_without_showing_them() {
    let worker = |keys: &str| format!("[[models]]\nname = \"m\"\n[[models.workers]]\n{keys}");
    for (text, want) in [
        (
            worker("url = \"http://user:s3cr3t@127.0.0.1:8000\"\n"),
            "models[0].workers[0].url (line 4): `http://***@127.0.0.1:8000`: credentials in a \
             worker URL are not supported: Spillway does not send them to the worker; the \
             client's own Authorization header is forwarded",
        ),
        (
            worker("url = \"https://s3cr3t@w.local\"\n"),
            "models[0].workers[0].url (line 4): `https://***@w.local`: credentials in a worker URL",
        ),
        (
            worker("url = \"http://user:s3cr3t@127.0.0.1:8000/v1\"\n"),
            "`http://***@127.0.0.1:8000/v1`: credentials in a worker URL",
        ),
        (
            worker("url = \"http://127.0.0.1:8000\"\nmetrics_url = \"http://u:s3cr3t@127.0.0.1:9/m\"\n"),
            "models[0].workers[0].metrics_url (line 5): `http://***@127.0.0.1:9`: credentials in this URL are not supported",
        ),
        (
            "[[models]]\nname = \"m\"\n[models.etcd]\nendpoints = [\"http://root:s3cr3t@127.0.0.1:2379\"]\nprefix = \"/w/\"\n".to_string(),
            "models[0].etcd.endpoints (line 4): `http://***@127.0.0.1:2379`: credentials in this URL",
        ),
        (
            "[nats]\nurl = \"nats://user:s3cr3t@127.0.0.1:4222\"\npublish = \"x\"\n".to_string(),
            "nats.url (line 2): `nats://***@127.0.0.1:4222`: credentials in the NATS URL are not supported",
        ),
    ] {
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}\n=> {e}\n(want {want})");
        assert!(!e.contains("s3cr3t"), "{e}");
    }
}

/// Issue 28: `[outlier]`, `[health_check]` and the retry budget, defaults and errors.
#[test]
fn health_settings_defaults_overrides_and_errors() {
    let c = parse(MIN).unwrap();
    assert_eq!(c.outlier, crate::health::OutlierSettings::default());
    assert_eq!(
        c.models[0].health_check, None,
        "checks are off unless written"
    );
    assert_eq!((c.retry_budget.percent, c.retry_budget.min), (20, 3));
    let text = format!(
        "[health_check]\ninterval_ms = 500\n{MIN}[[models]]\nname = \"n\"\n[models.health_check]\nkind = \"none\"\n[[models.workers]]\nurl = \"http://127.0.0.1:8002\"\n"
    );
    let c = parse(&text).unwrap();
    let checks = c.models[0].health_check.clone().unwrap();
    assert_eq!(
        (
            checks.path.as_str(),
            checks.interval_ms,
            checks.rise,
            checks.fall
        ),
        ("/health", 500, 2, 3)
    );
    assert_eq!(
        c.models[1].health_check, None,
        "kind = none turns a model's checks off"
    );
    let cases: &[(&str, &str)] = &[
        (
            "[health_check]\nkind = \"tcp\"\n",
            "health_check.kind (line 2): unknown check kind `tcp` (expected one of: http, canary, none)",
        ),
        (
            "[health_check]\npath = \"health\"\n",
            "health_check.path (line 2): must start with `/`",
        ),
        (
            "[health_check]\nrise = 0\n",
            "health_check.rise (line 2): must be greater than 0",
        ),
        (
            "[outlier]\nmin_healthy_percent = 101\n",
            "outlier.min_healthy_percent (line 2): must be between 0 and 100",
        ),
        (
            "[outlier]\nbase_ejection_ms = 5000\nmax_ejection_ms = 1000\n",
            "outlier.max_ejection_ms (line 3): must be at least base_ejection_ms (5000)",
        ),
        (
            "[outlier]\nfailure_share_above_peers = 0.0\n",
            "outlier.failure_share_above_peers (line 2): must be above 0 and at most 1",
        ),
        (
            "retry_budget_percent = 150\n",
            "retry_budget_percent (line 1): must be between 0 and 100",
        ),
    ];
    for (text, want) in cases {
        let err = parse(&format!("{text}{MIN}")).unwrap_err().to_string();
        assert!(err.contains(want), "{text:?}: {err}");
    }
}

/// Issue 28: Dynamo's canary variables, for a file without `[health_check]`.
#[test]
fn dynamo_canary_variables_give_every_model_a_canary() {
    let dynamo = Overrides {
        canary: CanaryOverrides {
            enabled: Some(true),
            wait_secs: Some(5),
            timeout_secs: None,
        },
        ..Overrides::default()
    };
    let c = Config::parse(MIN, &dynamo).unwrap();
    let canary = c.models[0].health_check.clone().unwrap();
    assert_eq!(canary.kind, crate::health::CheckKind::Canary);
    assert_eq!(
        (canary.interval_ms, canary.timeout_ms),
        (5_000, 3_000),
        "Dynamo's 3 s timeout"
    );
    let file = Config::parse(&format!("[health_check]\n{MIN}"), &dynamo).unwrap();
    let file_checks = file.models[0].health_check.clone().unwrap();
    assert_eq!(
        file_checks.kind,
        crate::health::CheckKind::Http,
        "the file wins"
    );
    let https = "[health_check]\n[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"https://127.0.0.1:8443\"\n";
    let err = parse(https).unwrap_err().to_string();
    assert!(err.contains("health checks speak plain HTTP"), "{err}");
}

#[test]
fn a_waiting_room_is_a_size_a_timeout_and_a_hold() {
    let model = |keys: &str| {
        format!(
            "[[models]]\nname = \"m\"\n{keys}\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n"
        )
    };
    assert_eq!(parse(&model("")).unwrap().models[0].waiting_room, None);
    let c = parse(&model("waiting_room_size = 64")).unwrap();
    let room = WaitingRoom {
        size: 64,
        timeout_ms: 5_000,
        hold_ms: None,
        waits_for_busy: false,
    };
    assert_eq!(c.models[0].waiting_room, Some(room));
    let c = parse(&model(
        "waiting_room_size = 8\nwaiting_room_waits_for_busy = true",
    ))
    .unwrap();
    assert_eq!(
        c.models[0].waiting_room.map(|r| r.waits_for_busy),
        Some(true)
    );
    let c = parse(&model("waiting_room_size = 8\nrollout_hold_ms = 30000")).unwrap();
    assert_eq!(
        c.models[0].waiting_room.and_then(|r| r.hold_ms),
        Some(30_000)
    );
    let c = parse(&model(
        "waiting_room_size = 1\nwaiting_room_timeout_ms = 250",
    ))
    .unwrap();
    assert_eq!(c.models[0].waiting_room.map(|r| r.timeout_ms), Some(250));
    let errors = [
        (
            "waiting_room_size = 0",
            "models[0].waiting_room_size (line 3): must be between 1 and 1048575 (leave it unset for no room)",
        ),
        (
            "waiting_room_size = 1048576",
            "must be between 1 and 1048575",
        ),
        (
            "waiting_room_size = 4\nwaiting_room_timeout_ms = 0",
            "models[0].waiting_room_timeout_ms (line 4): must be greater than 0",
        ),
        (
            "waiting_room_timeout_ms = 100",
            "models[0].waiting_room_timeout_ms (line 3): the model has no waiting room: set `waiting_room_size` too",
        ),
        (
            "waiting_room_waits_for_busy = true",
            "models[0].waiting_room_waits_for_busy (line 3): the model has no waiting room: set `waiting_room_size` too",
        ),
        (
            "rollout_hold_ms = 1000",
            "models[0].rollout_hold_ms (line 3): the model has no waiting room: set `waiting_room_size` too",
        ),
        (
            "waiting_room_size = 4\nrollout_hold_ms = 0",
            "models[0].rollout_hold_ms (line 4): must be greater than 0",
        ),
        (
            "router_mode = \"direct\"\nwaiting_room_size = 4",
            "direct routing names its worker: the model has no waiting room",
        ),
    ];
    for (keys, want) in errors {
        let e = parse(&model(keys)).unwrap_err().to_string();
        assert!(e.contains(want), "{keys}: {e}");
    }
}
