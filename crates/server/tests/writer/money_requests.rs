//! Money through the API: prices, reservations, bills and reports refuse
//! bad input by the field's name and change nothing when they do.

use serde_json::{json, Value};

use super::api::Api;

const MODEL: &str = "H100-80GB";

#[test]
fn bad_money_input_is_refused_by_name_and_changes_nothing() {
    let mut api = Api::new("money-input", |_| {});
    api.node("n1", MODEL, 4);
    api.tenant("acme");
    let admin = api.admin.clone();
    let refused = |api: &mut Api, method: &str, path: &str, body: Option<Value>, says: &str| {
        let said = api.call(method, path, Some(&admin), body.as_ref());
        assert!(said.status >= 400, "{method} {path} {body:?} was accepted: {}", said.body);
        assert!(
            said.error().contains(says),
            "{method} {path} {body:?}: {:?} does not say {says:?}",
            said.error()
        );
    };
    let before = api.get(&admin, "/v1/prices").body;
    let price = |usd: &str| Some(json!({ "on_demand_usd": usd }));
    refused(&mut api, "PUT", "/v1/prices/A100-40GB", price("2"), "unknown GPU model \"A100-40GB\"");
    let path = format!("/v1/prices/{MODEL}");
    refused(&mut api, "PUT", &path, price("-2"), "on_demand_usd: not a non-negative dollar amount");
    refused(&mut api, "PUT", &path, price("2.000001"), "cannot be discounted by 50%");
    let reserved = Some(json!({"on_demand_usd": "2", "reserved_usd": "abc"}));
    refused(&mut api, "PUT", &path, reserved, "reserved_usd");
    assert_eq!(api.get(&admin, "/v1/prices").body, before, "a refused price changed the book");

    let reservation = |tenant: &str, model: &str, gpus: u32, start: &str, end: &str| {
        Some(json!({"tenant": tenant, "gpu_model": model, "gpus": gpus, "start": start, "end": end}))
    };
    let made = api.post(
        &admin,
        "/v1/reservations",
        &reservation("acme", MODEL, 2, "2040-01-01", "2040-02-01").unwrap(),
    );
    assert_eq!(made.status, 201, "{}", made.body);
    for (body, says) in [
        (reservation("acme", "A100-40GB", 2, "2040-01-01", "2040-02-01"), "gpu_model: unknown GPU model"),
        (reservation("acme", MODEL, 2, "2040-03-01", "2040-02-01"), "is not after start"),
        (reservation("acme", MODEL, 1, "2040-01-15", "2040-03-01"), "overlaps reservation 1"),
        (reservation("acme", MODEL, 0, "2040-05-01", "2040-06-01"), "gpus: must be between 1 and the 4"),
        (reservation("acme", MODEL, 2, "next week", "2040-06-01"), "start: \"next week\" is not a date"),
        (reservation("nobody", MODEL, 1, "2041-01-01", "2041-02-01"), "tenant: unknown tenant \"nobody\""),
        // A start in the past charges for time gone: only when backdated.
        (reservation("acme", MODEL, 1, "2020-01-01", "2020-02-01"), "start: 2020-01-01 is "),
        (
            reservation("acme", MODEL, 1, "2020-01-01", "2020-02-01"),
            "in the past, and a reservation is charged from its start",
        ),
    ] {
        refused(&mut api, "POST", "/v1/reservations", body, says);
    }
    let listed = api.get(&admin, "/v1/reservations").body;
    assert_eq!(listed.as_array().unwrap().len(), 1, "only the good reservation exists: {listed}");

    let bill = "/v1/bill?from=2026-12-01&to=2026-11-01";
    refused(&mut api, "GET", bill, None, "from: 2026-12-01 is not before to: 2026-11-01");
    refused(&mut api, "GET", "/v1/report?from=2026-12-01&to=2026-12-01", None, "is not before");
    refused(
        &mut api,
        "GET",
        "/v1/bill?from=2026-13-01&to=2027-01-01",
        None,
        "from: \"2026-13-01\" is not a date",
    );
    // Reserved work needs a reservation of the tenant's.
    let reserved = Some(json!({"argv": ["true"], "tier": "reserved"}));
    refused(&mut api, "POST", "/v1/jobs", reserved, "tenant default has none");
    assert!(api.all_ids().is_empty(), "no job was made");
}
