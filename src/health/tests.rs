use super::*;

fn at(ok: u64, failed: u64, connect_failed: u64) -> Outcomes {
    Outcomes {
        ok,
        failed,
        connect_failed,
    }
}

#[test]
fn five_failures_in_a_row_call_for_an_ejection_and_a_success_between_does_not() {
    let s = OutlierSettings::default();
    let mut h = WorkerHealth::default();
    assert_eq!(h.step(at(0, 4, 0), 10, &s), None);
    assert_eq!(
        h.step(at(0, 5, 0), 20, &s),
        Some(Change::EjectDue(EjectReason::ConsecutiveFailures))
    );
    let mut h = WorkerHealth::default();
    assert_eq!(h.step(at(0, 4, 0), 10, &s), None);
    assert_eq!(
        h.step(at(1, 8, 0), 20, &s),
        None,
        "a success in the step ends the streak"
    );
    assert_eq!(h.streak, 0);
    let mut h = WorkerHealth::default();
    assert_eq!(
        h.step(at(0, 5, 5), 10, &s),
        Some(Change::EjectDue(EjectReason::ConnectFailures))
    );
    let off = OutlierSettings {
        enabled: false,
        ..s
    };
    assert_eq!(WorkerHealth::default().step(at(0, 50, 0), 10, &off), None);
}

#[test]
fn outcomes_before_it_was_first_seen_do_not_count() {
    let s = OutlierSettings::default();
    let mut h = WorkerHealth::new(at(100, 100, 0));
    assert_eq!(h.step(at(100, 104, 0), 10, &s), None);
    assert_eq!(h.streak, 4);
}

#[test]
fn an_ejection_doubles_up_to_its_cap_then_a_trial_decides() {
    let s = OutlierSettings {
        base_ejection_ms: 1_000,
        max_ejection_ms: 3_000,
        ..OutlierSettings::default()
    };
    let mut h = WorkerHealth::default();
    assert_eq!(h.eject(EjectReason::ConsecutiveFailures, 0, &s), 1_000);
    assert!(h.unhealthy());
    assert_eq!(h.step(at(0, 0, 0), 999, &s), None);
    assert_eq!(h.step(at(0, 0, 0), 1_000, &s), Some(Change::TrialOpened));
    assert_eq!(h.ejection, Ejection::Trial { since_ms: 1_000 });
    assert_eq!(
        h.step(at(0, 1, 0), 1_100, &s),
        Some(Change::EjectDue(EjectReason::FailedTrial))
    );
    assert_eq!(h.eject(EjectReason::FailedTrial, 1_100, &s), 2_000);
    assert_eq!(
        h.eject(EjectReason::FailedTrial, 1_100, &s),
        3_000,
        "capped"
    );
    h.step(at(0, 1, 0), 4_100, &s);
    assert_eq!(h.step(at(1, 1, 0), 4_200, &s), Some(Change::Returned));
    assert!(!h.unhealthy());
    assert_eq!(h.ejections, 3);
    h.step(at(1, 1, 0), 4_200 + 3_000, &s);
    assert_eq!(
        h.ejections, 2,
        "each calm max_ejection_ms forgets one ejection"
    );
}

#[test]
fn checks_rise_and_fall_and_a_suspect_falls_at_once() {
    let s = CheckSettings::new(CheckKind::Http);
    let mut h = WorkerHealth::default();
    assert_eq!(h.checked(false, false, 0, &s), None);
    assert_eq!(h.checked(false, false, 0, &s), None);
    assert_eq!(h.checked(false, false, 0, &s), Some(Change::CheckFell));
    assert!(h.unhealthy());
    assert_eq!(h.checked(true, false, 0, &s), None);
    assert_eq!(
        h.checked(false, false, 0, &s),
        None,
        "a failure restarts the rise"
    );
    assert_eq!(h.checked(true, false, 0, &s), None);
    assert_eq!(h.checked(true, false, 0, &s), Some(Change::CheckRose));
    assert_eq!(
        h.checked(false, true, 0, &s),
        Some(Change::CheckFell),
        "suspect"
    );
}

#[test]
fn a_passing_check_ends_only_the_ejections_it_disproves() {
    let http = CheckSettings::new(CheckKind::Http);
    let canary = CheckSettings::new(CheckKind::Canary);
    let s = OutlierSettings::default();
    let mut h = WorkerHealth::default();
    h.eject(EjectReason::ConsecutiveFailures, 0, &s);
    assert_eq!(
        h.checked(true, false, 10, &http),
        None,
        "a live /health says nothing of 500s"
    );
    assert!(h.ejected());
    assert_eq!(h.checked(true, false, 10, &canary), Some(Change::Returned));
    assert!(!h.ejected());
    h.eject(EjectReason::ConnectFailures, 20, &s);
    assert_eq!(h.checked(true, false, 30, &http), Some(Change::Returned));
}

#[test]
fn the_healthy_share_caps_ejections_and_decides_panic() {
    // (workers, min_healthy_percent, may be ejected)
    for &(n, pct, max) in &[
        (1, 50, 0),
        (2, 50, 1),
        (3, 50, 1),
        (4, 50, 2),
        (10, 90, 1),
        (3, 0, 3),
        (3, 100, 0),
    ] {
        assert_eq!(max_ejected(n, pct), max, "{n} workers at {pct} %");
    }
    assert!(!panics(3, 2, 50));
    assert!(panics(3, 1, 50));
    assert!(!panics(4, 2, 50));
    assert!(!panics(0, 0, 50));
}

#[test]
fn a_failure_share_far_above_the_peers_is_an_outlier() {
    let s = OutlierSettings::default();
    let windows = [at(50, 50, 0), at(100, 0, 0), at(95, 5, 0), at(5, 5, 0)];
    assert_eq!(
        share_outliers(&windows, &s),
        0b0001,
        "the last has too few requests to judge"
    );
    let all_failing = [at(0, 100, 0), at(0, 100, 0), at(0, 100, 0)];
    assert_eq!(
        share_outliers(&all_failing, &s),
        0,
        "nobody is an outlier when all fail"
    );
    assert_eq!(
        share_outliers(&[at(0, 100, 0)], &s),
        0,
        "no peer to compare with"
    );
}

#[test]
fn checks_send_a_get_or_a_one_token_completion() {
    let get = CheckSettings::new(CheckKind::Http).request("w:1", "m");
    assert!(get.starts_with(b"GET /health HTTP/1.1\r\nhost: w:1\r\n"));
    let post = String::from_utf8(CheckSettings::new(CheckKind::Canary).request("w:1", "m"))
        .unwrap_or_default();
    assert!(post.starts_with("POST /v1/completions HTTP/1.1\r\n"));
    assert!(post.ends_with(r#"{"model":"m","prompt":"ping","max_tokens":1,"stream":false}"#));
    let body_len = post.split("\r\n\r\n").nth(1).map_or(0, str::len);
    assert!(post.contains(&format!("content-length: {body_len}\r\n")));
    assert!(
        checks::passes(200) && checks::passes(204) && !checks::passes(500) && !checks::passes(404)
    );
}
