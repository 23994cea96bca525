//! `GET /v1/stream`: one server-sent event per committed change, for live
//! pages; and the dashboard's page, served from the server's own origin.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use crate::support::{wait_for, Cluster, Options};

/// The next `data:` line's sequence number.
fn next_seq(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> u64 {
    for line in lines {
        let line = line.unwrap();
        if let Some(data) = line.strip_prefix("data: ") {
            let v: serde_json::Value = serde_json::from_str(data).unwrap();
            return v["seq"].as_u64().unwrap();
        }
    }
    panic!("the stream ended");
}

#[test]
fn a_committed_change_is_an_event_on_the_stream_within_moments() {
    let c = Cluster::start(Options { nodes: 1, gpus: 2, ..Options::default() });
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let open = |token: Option<&str>| {
        let mut req = http.get(format!("{}/v1/stream", c.url));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        req.send().unwrap()
    };
    assert_eq!(open(None).status(), 401);
    let resp = open(Some(&c.admin));
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let mut lines = BufReader::new(resp).lines();
    let first = next_seq(&mut lines);
    let t = Instant::now();
    c.submit(&["--", "true"]);
    let next = next_seq(&mut lines);
    assert!(next > first, "{next} after {first}");
    eprintln!("event {:?} after the submission was answered", t.elapsed());

    // A tenant follows it too; what it reads again is its own.
    let tenant: serde_json::Value =
        serde_json::from_str(&c.ebb(&["tenant", "create", "watcher", "--json"])).unwrap();
    let resp = open(tenant["token"].as_str());
    assert_eq!(resp.status(), 200);
    let mut lines = BufReader::new(resp).lines();
    let seen = next_seq(&mut lines);
    c.submit(&["--", "true"]);
    assert!(next_seq(&mut lines) > seen);
}

#[test]
fn the_dashboard_is_served_from_the_server_with_nothing_from_elsewhere() {
    let c = Cluster::start(Options { nodes: 1, gpus: 1, ..Options::default() });
    let page = reqwest::blocking::get(format!("{}/", c.url)).unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
    let html = page.text().unwrap();
    assert!(html.contains(r#"<label for="token">Token</label>"#) && html.contains("Sign in"), "{html}");
    // Every script and stylesheet the page names is the server's own.
    for asset in ["/assets/app.js", "/assets/app.css"] {
        assert!(html.contains(asset), "{asset} not in the page");
        assert_eq!(reqwest::blocking::get(format!("{}{asset}", c.url)).unwrap().status(), 200, "{asset}");
    }
    for attr in ["src=\"http", "src=\"//", "href=\"http", "href=\"//"] {
        assert!(!html.contains(attr), "the page loads from another origin ({attr}...)");
    }
    assert_eq!(reqwest::blocking::get(format!("{}/assets/nope.js", c.url)).unwrap().status(), 404);
}

#[test]
fn a_tenant_cannot_hold_more_than_its_share_of_streams_open() {
    let c = Cluster::start(Options { nodes: 1, gpus: 1, ..Options::default() });
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let tenant: serde_json::Value =
        serde_json::from_str(&c.ebb(&["tenant", "create", "greedy", "--json"])).unwrap();
    let token = tenant["token"].as_str().unwrap();
    let open = |token: &str| http.get(format!("{}/v1/stream", c.url)).bearer_auth(token).send().unwrap();
    let held: Vec<_> = (0..32).map(|_| open(token)).collect();
    assert!(held.iter().all(|r| r.status() == 200));
    let refused = open(token);
    assert_eq!(refused.status(), 429);
    let said = refused.text().unwrap();
    assert!(said.contains("tenant greedy has 32 event streams open"), "{said}");
    // Another tenant and the operators are not held up by it.
    assert_eq!(open(&c.admin).status(), 200);
    // A closed stream gives its place back.
    drop(held);
    wait_for("the tenant's closed stream to be given back", Duration::from_secs(5), || {
        (open(token).status() == 200).then_some(())
    });
}
