//! The NATS client (`spillway::fleet::nats`) against a real nats-server: ordered delivery
//! of 1,000 messages of 0 B to 64 KiB, wildcard subjects, a message from another client,
//! the server's keep-alive PINGs on idle connections, and a killed server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use spillway::fleet::nats::{Msg, NatsError, Publisher, Subscriber};
use spillway_testkit::nats::Nats;

const CONNECT: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(10);

fn run<F: std::future::Future>(f: F) -> F::Output {
    spillway::runtime::build(0).unwrap().block_on(f)
}

async fn next(sub: &mut Subscriber) -> Result<Msg, NatsError> {
    monoio::time::timeout(WAIT, sub.next())
        .await
        .expect("no message within the wait")
}

/// Message `i`: its size sweeps 0 B to 64 KiB, its bytes depend on `i`.
fn payload(i: usize) -> Vec<u8> {
    let len = match i % 10 {
        0 => 0,
        1 => 64 * 1024,
        _ => (i * 7919) % (64 * 1024),
    };
    (0..len).map(|j| (i * 31 + j) as u8).collect()
}

#[test]
fn thousand_messages_arrive_in_order_and_intact() {
    let Some(nats) = Nats::start() else { return };
    let addr = nats.addr();
    run(async move {
        let mut sub = Subscriber::connect(addr, "sub", "load.w1", CONNECT)
            .await
            .unwrap();
        let mut publisher = Publisher::connect(addr, "pub", CONNECT).await.unwrap();
        let sender = monoio::spawn(async move {
            for i in 0..1000 {
                publisher.publish("load.w1", &payload(i)).await.unwrap();
            }
            publisher
        });
        for i in 0..1000 {
            let msg = next(&mut sub).await.unwrap();
            assert_eq!(msg.subject, "load.w1");
            assert!(msg.payload == payload(i), "message {i} differs");
        }
        drop(sender.await);
    });
}

#[test]
fn wildcard_subscription_sees_only_its_subjects() {
    let Some(nats) = Nats::start() else { return };
    let addr = nats.addr();
    run(async move {
        let mut sub = Subscriber::connect(addr, "sub", "load.>", CONNECT)
            .await
            .unwrap();
        let mut publisher = Publisher::connect(addr, "pub", CONNECT).await.unwrap();
        for subject in ["load.a", "other", "load.b.c", "loadx", "load.end"] {
            publisher
                .publish(subject, subject.as_bytes())
                .await
                .unwrap();
        }
        for want in ["load.a", "load.b.c", "load.end"] {
            let msg = next(&mut sub).await.unwrap();
            assert_eq!(msg.subject, want);
            assert_eq!(msg.payload, want.as_bytes());
        }
        let bad = publisher.publish("two words", b"").await;
        assert!(matches!(bad, Err(NatsError::Protocol(_))), "{bad:?}");
        assert!(Subscriber::connect(addr, "sub", "", CONNECT).await.is_err());
        // A refused subject leaves the publisher working.
        publisher.publish("load.after", b"x").await.unwrap();
        assert_eq!(next(&mut sub).await.unwrap().subject, "load.after");
    });
}

#[test]
fn a_message_from_another_client_arrives() {
    let Some(nats) = Nats::start() else { return };
    let addr = nats.addr();
    run(async move {
        let mut sub = Subscriber::connect(addr, "sub", "kit.x", CONNECT)
            .await
            .unwrap();
        nats.publish("kit.x", b"hello");
        let msg = next(&mut sub).await.unwrap();
        assert_eq!(
            (msg.subject.as_str(), &msg.payload[..]),
            ("kit.x", &b"hello"[..])
        );
    });
}

#[test]
fn idle_connections_survive_the_servers_pings() {
    let Some(nats) = Nats::start_with("ping_interval: \"1s\"\nping_max: 2\n") else {
        return;
    };
    let addr = nats.addr();
    run(async move {
        let mut sub = Subscriber::connect(addr, "sub", "idle", CONNECT)
            .await
            .unwrap();
        let mut publisher = Publisher::connect(addr, "pub", CONNECT).await.unwrap();
        // The subscriber waits in `next` (answering PINGs); the publisher sits idle.
        let waiting = monoio::spawn(async move {
            let msg = monoio::time::timeout(Duration::from_secs(30), sub.next()).await;
            (msg, sub)
        });
        monoio::time::sleep(Duration::from_secs(4)).await;
        publisher.publish("idle", b"still here").await.unwrap();
        let (msg, mut sub) = waiting.await;
        assert_eq!(msg.expect("no message").unwrap().payload, b"still here");
        // Both are still usable, past more PING rounds.
        monoio::time::sleep(Duration::from_millis(2500)).await;
        publisher.publish("idle", b"again").await.unwrap();
        assert_eq!(next(&mut sub).await.unwrap().payload, b"again");
    });
}

#[test]
fn a_killed_server_is_an_error_promptly() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let addr = nats.addr();
    run(async move {
        let mut sub = Subscriber::connect(addr, "sub", "k", CONNECT)
            .await
            .unwrap();
        let mut publisher = Publisher::connect(addr, "pub", CONNECT).await.unwrap();
        publisher.publish("k", b"before").await.unwrap();
        assert_eq!(next(&mut sub).await.unwrap().payload, b"before");
        nats.kill();
        let started = Instant::now();
        let err = next(&mut sub).await.unwrap_err();
        assert!(matches!(err, NatsError::Io { .. }), "{err:?}");
        // A write may still land in the socket's buffer; the reader sees the end soon after.
        let err = loop {
            match publisher.publish("k", b"after").await {
                Ok(()) => monoio::time::sleep(Duration::from_millis(10)).await,
                Err(err) => break err,
            }
            assert!(started.elapsed() < WAIT, "publish kept succeeding");
        };
        assert!(matches!(err, NatsError::Io { .. }), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            publisher.publish("k", b"").await.unwrap_err(),
            err,
            "errors stay"
        );
        assert!(Publisher::connect(addr, "pub", CONNECT).await.is_err());

        // Back on the same port: new connections work again.
        nats.restart();
        let mut sub = Subscriber::connect(addr, "sub", "k", CONNECT)
            .await
            .unwrap();
        let mut publisher = Publisher::connect(addr, "pub", CONNECT).await.unwrap();
        publisher.publish("k", b"again").await.unwrap();
        assert_eq!(next(&mut sub).await.unwrap().payload, b"again");
    });
}
