//! Webhook deliveries, outside the writer: the writer hands each delivery
//! over once the batch that made it has committed (its row is in the
//! store's outbox), and is told of every try. Each webhook has one queue,
//! delivered in order, a failed delivery tried again with back-off before
//! the next is sent, so that a job's events arrive in the order they
//! happened. A receiver that hangs holds up only its own webhook; the
//! writer never waits for one.
//!
//! A delivery connects only where [`ebb_http::Outbound`] allows (the
//! address connected to is checked, not the name), and what the tenant's
//! delivery log says of a failure is the same whatever it was (refused,
//! unreachable, timed out, answered with an error): the log is no port
//! scanner. The cause goes to the server's own log.
//!
//! A delivery is signed as Stripe signs its events: `Ebb-Signature:
//! t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the
//! webhook's secret>`. See `docs/webhooks.md`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ebb_core::JobId;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use tokio::sync::mpsc;

use crate::engine::Msg;

/// What a webhook receives for a job's event (format `ebb`,
/// `docs/webhooks.md`).
#[derive(Serialize)]
pub(crate) struct JobBody<'a> {
    pub delivery: u64,
    pub webhook: u64,
    pub event: &'a str,
    pub at: &'a str,
    pub at_ms: u64,
    pub tenant: &'a str,
    pub job: JobSummary<'a>,
    pub text: &'a str,
    pub detail: ebb_api::events::Detail<'a>,
}

/// The job a job's event is of, in its webhook body.
#[derive(Serialize)]
pub(crate) struct JobSummary<'a> {
    pub id: JobId,
    pub name: Option<&'a str>,
    pub tier: &'a str,
    pub state: &'a str,
    pub attempt: u32,
    pub run_id: String,
}

/// What an operators' webhook receives for a node's event (format `ebb`).
#[derive(Serialize)]
pub(crate) struct NodeBody<'a> {
    pub delivery: u64,
    pub webhook: u64,
    pub event: &'a str,
    pub at: String,
    pub at_ms: u64,
    pub node: &'a str,
    pub text: &'a str,
}

/// What a webhook of format `slack` receives: one line.
#[derive(Serialize)]
pub(crate) struct SlackBody {
    pub text: String,
}

/// A body as it is sent (and signed).
pub(crate) fn body_text(body: &impl Serialize) -> String {
    serde_json::to_string(body).expect("a webhook body is plain data")
}

/// What a tenant reads of every failed try.
pub const NOT_DELIVERED: &str = "not delivered: no 2xx answer from the receiver";

/// How long one try may take.
const TRY_TIMEOUT: Duration = Duration::from_secs(10);
/// The first wait after a failed try; each next one doubles, up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A delivery still failing this long after its event is given up.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);

/// What the writer hands over.
#[derive(Clone, Debug)]
pub enum Command {
    Send(Delivery),
    /// The webhook was removed: drop what is queued for it.
    Forget(u64),
}

/// One event for one webhook.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub id: u64,
    pub webhook: u64,
    pub url: String,
    pub secret: String,
    pub event: String,
    pub body: String,
    /// When the event happened, for giving up.
    pub created_ms: u64,
}

/// How a try went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tried {
    Delivered {
        status: u16,
    },
    /// Tried again later.
    Failed {
        status: Option<u16>,
        error: String,
    },
    GaveUp {
        status: Option<u16>,
        error: String,
    },
}

/// `Ebb-Signature`'s value for `body` sent at `t` (Unix seconds).
pub fn signature(secret: &str, t: u64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    let digest = mac.finalize().into_bytes();
    format!("t={t},v1={}", ebb_api::hex(&digest))
}

/// A new webhook's secret: 32 random bytes, hex, after `whsec_`.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the system's random source");
    format!("whsec_{}", ebb_api::hex(&bytes))
}

/// Starts the deliverer on a thread of its own (its own small runtime:
/// the writer runs on a plain thread). Tries are reported to the writer
/// through `writer`, which it does not keep alive: when the writer is gone
/// (the server stops, or no longer leads) so is the deliverer.
pub fn start(writer: mpsc::WeakSender<Msg>, outbound: ebb_http::Outbound) -> mpsc::UnboundedSender<Command> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("ebb-webhooks".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for webhook deliveries");
            runtime.block_on(run(rx, writer, outbound));
        })
        .expect("a thread for webhook deliveries");
    tx
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Command>,
    writer: mpsc::WeakSender<Msg>,
    outbound: ebb_http::Outbound,
) {
    let client = match client(&outbound) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!("webhooks will not be delivered: {e}");
            return;
        }
    };
    let mut queues: HashMap<u64, mpsc::UnboundedSender<Delivery>> = HashMap::new();
    while let Some(command) = rx.recv().await {
        match command {
            Command::Send(delivery) => {
                let queue = queues.entry(delivery.webhook).or_insert_with(|| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    tokio::spawn(deliver_in_order(rx, client.clone(), outbound.clone(), writer.clone()));
                    tx
                });
                let _ = queue.send(delivery);
            }
            Command::Forget(webhook) => {
                queues.remove(&webhook);
            }
        }
    }
}

/// One webhook's deliveries, one after another.
async fn deliver_in_order(
    mut rx: mpsc::UnboundedReceiver<Delivery>,
    client: reqwest::Client,
    outbound: ebb_http::Outbound,
    writer: mpsc::WeakSender<Msg>,
) {
    while let Some(delivery) = rx.recv().await {
        let mut backoff = FIRST_BACKOFF;
        for attempt in 1u32.. {
            let tried = try_once(&client, &outbound, &delivery).await;
            let tried = match tried {
                Tried::Failed { status, error } if given_up(&delivery) => Tried::GaveUp { status, error },
                other => other,
            };
            let again = matches!(tried, Tried::Failed { .. });
            let Some(writer) = writer.upgrade() else { return };
            let at_ms = ebb_core::time::unix_ms(std::time::SystemTime::now());
            let msg = Msg::WebhookTried { delivery: delivery.id, attempt, tried, at_ms };
            if writer.send(msg).await.is_err() {
                return;
            }
            drop(writer);
            if !again {
                break;
            }
            let until = Instant::now() + backoff;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            // A webhook removed meanwhile closes the queue: stop waiting.
            tokio::select! {
                _ = tokio::time::sleep_until(until.into()) => {}
                _ = closed(&rx) => return,
            }
        }
    }
}

/// Resolves once nothing more can be sent to `rx` (its webhook was
/// removed, or the deliverer stopped).
async fn closed(rx: &mpsc::UnboundedReceiver<Delivery>) {
    while !rx.is_closed() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The deliverer's client: no redirects, and only the addresses
/// `outbound` allows, as they are connected to.
fn client(outbound: &ebb_http::Outbound) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .dns_resolver(outbound.resolver())
        .timeout(TRY_TIMEOUT)
        .connect_timeout(TRY_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .use_rustls_tls()
        // https:// receivers are verified against the system's roots.
        .tls_built_in_native_certs(true)
        .build()
}

fn given_up(delivery: &Delivery) -> bool {
    let now = ebb_core::time::unix_ms(std::time::SystemTime::now());
    now.saturating_sub(delivery.created_ms) >= GIVE_UP_AFTER.as_millis() as u64
}

async fn try_once(client: &reqwest::Client, outbound: &ebb_http::Outbound, d: &Delivery) -> Tried {
    let failed = |cause: &str| {
        tracing::info!(webhook = d.webhook, delivery = d.id, "webhook not delivered: {cause}");
        Tried::Failed { status: None, error: NOT_DELIVERED.to_string() }
    };
    // A name is checked as it resolves; an address here.
    let checked = reqwest::Url::parse(&d.url)
        .map_err(|e| e.to_string())
        .and_then(|u| outbound.check_url(&u).map_err(|e| e.to_string()));
    match checked {
        Ok(()) => {}
        Err(why) => return failed(&why),
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let sent = client
        .post(&d.url)
        .header("Content-Type", "application/json")
        .header("User-Agent", concat!("ebb-webhooks/", env!("CARGO_PKG_VERSION")))
        .header("Ebb-Webhook-Id", d.webhook.to_string())
        .header("Ebb-Delivery", d.id.to_string())
        .header("Ebb-Event", &d.event)
        .header("Ebb-Signature", signature(&d.secret, t, &d.body))
        .body(d.body.clone())
        .send()
        .await;
    match sent {
        Ok(answer) if answer.status().is_success() => Tried::Delivered { status: answer.status().as_u16() },
        Ok(answer) => failed(&format!("the receiver answered {}", answer.status())),
        Err(e) if e.is_timeout() => failed("no answer within 10s"),
        Err(e) => failed(&ebb_image::request_error(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(url: String) -> Delivery {
        Delivery {
            id: 1,
            webhook: 1,
            url,
            secret: "whsec_x".into(),
            event: "failed".into(),
            body: "{}".into(),
            created_ms: 0,
        }
    }

    /// A receiver on loopback that counts its connections and answers
    /// each with `status`.
    async fn receiver(status: u16) -> (u16, std::sync::Arc<std::sync::atomic::AtomicU32>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = count.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        (port, count)
    }

    /// A tenant's webhook pointed at loopback, by address, by name or
    /// mapped into IPv6, never connects; and what the tenant reads of a
    /// failure is the same whether the port was closed, refused by the
    /// policy, or answered with an error: the log scans no ports.
    #[tokio::test]
    async fn deliveries_reach_only_allowed_addresses_and_every_failure_reads_the_same() {
        let (port, connections) = receiver(500).await;
        let policy = ebb_http::Outbound::default();
        let strict = client(&policy).unwrap();
        for url in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://localhost:{port}/"),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            format!("http://0.0.0.0:{port}/"),
        ] {
            let tried = try_once(&strict, &policy, &delivery(url.clone())).await;
            assert_eq!(tried, Tried::Failed { status: None, error: NOT_DELIVERED.into() }, "{url}");
        }
        assert_eq!(
            connections.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "a refused address was connected to"
        );

        let loopback = ebb_http::Outbound::with_loopback();
        let allowed = client(&loopback).unwrap();
        let answered = try_once(&allowed, &loopback, &delivery(format!("http://127.0.0.1:{port}/"))).await;
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let p = l.local_addr().unwrap().port();
            drop(l);
            try_once(&allowed, &loopback, &delivery(format!("http://127.0.0.1:{p}/"))).await
        };
        assert_eq!(answered, closed, "an answered 500 and a closed port read the same");
        let (ok_port, _) = receiver(204).await;
        let delivered =
            try_once(&allowed, &loopback, &delivery(format!("http://127.0.0.1:{ok_port}/"))).await;
        assert_eq!(delivered, Tried::Delivered { status: 204 });
    }

    /// The documented scheme, checked against a value worked out apart
    /// (Python: hmac.new(b"whsec_test", b"1700000000.{}", hashlib.sha256)).
    #[test]
    fn a_signature_is_the_hmac_of_the_time_and_the_body() {
        assert_eq!(
            signature("whsec_test", 1_700_000_000, "{}"),
            "t=1700000000,v1=35495024f4ef3f94e5a93e22221544c4b75e9a42300cd965ab81cb85cd994e91"
        );
    }

    #[test]
    fn secrets_are_random_and_say_what_they_are() {
        let (a, b) = (new_secret(), new_secret());
        assert!(a.starts_with("whsec_") && a.len() == 6 + 64);
        assert_ne!(a, b);
    }
}
