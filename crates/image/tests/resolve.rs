//! Resolving at submit against registries that lie: a fake registry on
//! loopback (plain tokio, one answer per request) says another image's
//! digest, redirects elsewhere, puts secrets in its errors, or sends a
//! body without end.

use std::sync::{Arc, Mutex};

use ebb_image::{resolve, ImageError, Registries};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the fake answers: status, headers, body.
type Answer = (u16, Vec<(String, String)>, Vec<u8>);

/// A registry on a free loopback port answering every request with
/// `answer(request line)`; the request lines it got.
async fn fake(answer: impl Fn(&str) -> Answer + Send + Sync + 'static) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (answer, log) = (Arc::new(answer), seen.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let (answer, log) = (answer.clone(), log.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let line = text.lines().next().unwrap_or("").to_string();
                log.lock().unwrap().push(line.clone());
                let (status, headers, body) = answer(&line);
                let mut out =
                    format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
                for (k, v) in headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                let _ = stream.write_all(out.as_bytes()).await;
                let _ = stream.write_all(&body).await;
            });
        }
    });
    (host, seen)
}

fn trusting(host: &str) -> Registries {
    Registries { insecure: vec![host.to_string()], ..Registries::default() }
}

const MANIFEST: &str =
    r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#;

fn digest_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect::<String>())
}

#[tokio::test]
async fn the_digest_is_the_hash_of_the_manifest_never_the_registrys_word() {
    let alices = format!("sha256:{}", "a".repeat(64));
    let said = alices.clone();
    let (host, _) =
        fake(move |_| (200, vec![("Docker-Content-Digest".into(), said.clone())], MANIFEST.into())).await;
    let e = resolve(&trusting(&host), &format!("{host}/x:v1"), None).await.unwrap_err();
    assert!(e.to_string().contains(&format!("says digest {alices}")), "{e}");

    // An honest one: the hash of what it sent, with or without the header.
    let (host, _) = fake(|_| (200, Vec::new(), MANIFEST.into())).await;
    assert_eq!(
        resolve(&trusting(&host), &format!("{host}/x:v1"), None).await.unwrap(),
        digest_of(MANIFEST.as_bytes())
    );
    // Named by a digest the bytes do not have.
    let e = resolve(&trusting(&host), &format!("{host}/x@{alices}"), None).await.unwrap_err();
    assert!(e.to_string().contains(&format!("for digest {alices}")), "{e}");
}

#[tokio::test]
async fn a_redirect_to_another_host_is_not_followed() {
    let (elsewhere, asked) =
        fake(|_| (200, Vec::new(), b"INTERNAL-ONLY: db_password=hunter2".to_vec())).await;
    let target = format!("http://{}/latest/meta-data/", elsewhere.replace("127.0.0.1", "localhost"));
    let (host, _) = fake(move |_| (302, vec![("Location".into(), target.clone())], Vec::new())).await;
    let e = resolve(&trusting(&host), &format!("{host}/x:v1"), None).await.unwrap_err();
    assert!(e.to_string().contains("a redirect to another host"), "{e}");
    assert!(asked.lock().unwrap().is_empty(), "the other host was asked: {:?}", asked.lock().unwrap());
}

#[tokio::test]
async fn an_error_says_the_status_never_the_body() {
    let (host, _) = fake(|_| (500, Vec::new(), b"INTERNAL-ONLY: db_password=hunter2".to_vec())).await;
    let e = resolve(&trusting(&host), &format!("{host}/x:v1"), None).await.unwrap_err();
    assert!(matches!(e, ImageError::Unreachable(..)), "{e}");
    assert!(e.to_string().contains("answered 500") && !e.to_string().contains("hunter2"), "{e}");
    let (host, _) = fake(|_| (418, Vec::new(), b"INTERNAL-ONLY: db_password=hunter2".to_vec())).await;
    let e = resolve(&trusting(&host), &format!("{host}/x:v1"), None).await.unwrap_err();
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[tokio::test]
async fn a_manifest_past_its_bound_is_refused() {
    let (host, _) = fake(|_| (200, Vec::new(), vec![b' '; ebb_image::MAX_MANIFEST_BYTES + 1])).await;
    let e = resolve(&trusting(&host), &format!("{host}/x:v1"), None).await.unwrap_err();
    assert!(e.to_string().contains("larger than 4096 KiB"), "{e}");
}

/// A registry the operator did not name is reached only at addresses the
/// cluster allows: not loopback by address, by name, or mapped.
#[tokio::test]
async fn an_unnamed_registry_on_loopback_or_link_local_is_refused() {
    let (host, asked) = fake(|_| (200, Vec::new(), MANIFEST.into())).await;
    let port = host.rsplit(':').next().unwrap();
    for reference in [
        format!("127.0.0.1:{port}/x:v1"),
        format!("localhost:{port}/x:v1"),
        "169.254.169.254/latest:v1".to_string(),
    ] {
        let e = resolve(&Registries::default(), &reference, None).await.unwrap_err();
        assert!(matches!(e, ImageError::Invalid(..)), "{reference}: {e}");
        assert!(e.to_string().contains("does not reach"), "{reference}: {e}");
    }
    // An address in brackets is no reference at all.
    let mapped = format!("[::ffff:127.0.0.1]:{port}/x:v1");
    assert!(matches!(resolve(&Registries::default(), &mapped, None).await, Err(ImageError::Invalid(..))));
    assert!(asked.lock().unwrap().is_empty());
}

/// A registry on loopback that the operator allowed but did not name
/// insecure is reached over plain HTTP, as Docker reaches one.
#[tokio::test]
async fn a_loopback_registry_needs_no_insecure_flag() {
    let (host, seen) = fake(|_| (200, Vec::new(), MANIFEST.into())).await;
    let allowed = Registries { allowed: vec![host.clone()], ..Registries::default() };
    assert_eq!(
        resolve(&allowed, &format!("{host}/x:v1"), None).await.unwrap(),
        digest_of(MANIFEST.as_bytes())
    );
    assert_eq!(seen.lock().unwrap().as_slice(), ["GET /v2/x/manifests/v1 HTTP/1.1"]);
    // Named by no one, it still meets the address policy (loopback refused).
    let e = resolve(&Registries::default(), &format!("{host}/x:v1"), None).await.unwrap_err();
    assert!(e.to_string().contains("loopback"), "{e}");
}
