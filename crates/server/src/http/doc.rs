//! The OpenAPI document: the operations as annotated, plus what holds for
//! all of them.

use super::extract::BODY_LIMIT;
use super::*;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "Ebb", description = "Preemptible GPU compute with a drain window"),
    paths(jobs::submit, jobs::submit_batch, jobs::list_jobs, jobs::show_job, jobs::cancel_job, jobs::signal_job, jobs::job_steps, jobs::list_partitions, jobs::drill_job, jobs::job_logs, fleet::list_nodes, fleet::capacity, fleet::drain_node, fleet::undrain_node, fleet::remove_node, fleet::reclaim, fleet::release_reclaim, tenants::create_tenant, tenants::list_tenants, tenants::rotate_tenant_token, tenants::revoke_tenant_tokens, fleet::rotate_join_token, tenants::get_tenant_limits, tenants::set_tenant_limits, tenants::list_registry_logins, tenants::set_registry_login, tenants::delete_registry_login, money::list_prices, money::set_price, money::create_reservation, money::list_reservations, money::delete_reservation, money::bill, money::operator_report, money::operator_report_series, agent::agent_register, agent::agent_commands, agent::agent_report, agent::agent_image, agent::tls_ca, webhooks::create_webhook, webhooks::list_webhooks, webhooks::delete_webhook, webhooks::webhook_log),
    components(schemas(
        api::JobSubmission, api::Submitted, api::JobBatch, api::BatchSubmitted, api::Job, api::JobEvent, api::EventKind, api::NodeGpus, api::Node, api::NodeJob, api::HeldGpus, api::Capacity, api::ModelCapacity, api::TierGpus,
        api::ReclaimRequest, api::ReclaimReply, api::ReclaimRelease, api::ReclaimReleased, api::TenantRequest, api::TenantCreated, api::TenantSummary, api::LogChunk, api::LogSource,
        api::ErrorBody, api::SweepParam, api::Checkpoint, api::Drill, api::DrillCheckpoint, api::DeadlineStatus, api::UsageSegment, api::ArrayTask, api::ArrayProgress, api::TaskState,
        api::Price, api::PriceBook, api::PriceUpdate, api::ReservationRequest, api::Reservation, api::Borrower, api::Usage,
        api::InvoiceLine, api::ReservationCharge, api::Invoice, api::TierReport, api::OperatorReport,
        api::ReportBucket, api::ReportSeries,
        api::NodeRemoved, api::JoinToken, api::TenantTokens,
        api::AttemptRef, api::Register, api::Registered, api::CheckpointStoreLocation, api::Command, api::Action, api::StartAttempt,
        api::DrainAttempt, api::Membership, api::MembershipChange, api::StopNotice, api::CancelRequest, api::Commands, api::Report, api::AgentEvent, api::ReportReply,
        api::JobImage, api::PullProgress, api::StartImage, api::StepImage, api::RegistryLogin, api::RegistryLoginInfo, api::SlurmBatch, api::SlurmComponent, api::EndedBy, api::SignalRequest, api::StepAccess, api::Partition,
        api::GpuFinding, api::Finding, api::Throttle, api::HealthClass, api::GpuOutOfService,
        api::WebhookRequest, api::Webhook, api::WebhookDelivery, api::WebhookLog
    )),
    tags(
        (name = "jobs", description = "Submitting, watching and cancelling jobs (tenant or admin token)"),
        (name = "operator", description = "Nodes, capacity and tenants (admin token)"),
        (name = "tenants", description = "A tenant's own settings: its registry logins (tenant or admin token)"),
        (name = "billing", description = "Prices, reservations, invoices and the operator's report"),
        (name = "agent", description = "The protocol between the server and its agents (join token)"),
        (name = "webhooks", description = "Webhooks: a tenant's on its jobs' events, the operators' on nodes' (tenant or admin token)")
    ),
    modifiers(&BearerAuth)
)]
pub(super) struct ApiDoc;

pub(super) struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]);
    }
}

pub(super) async fn openapi() -> Json<serde_json::Value> {
    static DOCUMENT: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    Json(DOCUMENT.get_or_init(document).clone())
}

/// The OpenAPI document: the operations as annotated, plus what holds for
/// all of them, so that no answer the server gives goes undescribed.
pub(super) fn document() -> serde_json::Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    state_unsigned_ranges(&mut doc);
    if let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        for operation in
            paths.values_mut().filter_map(|item| item.as_object_mut()).flat_map(|item| item.values_mut())
        {
            add_common_errors(operation);
        }
    }
    doc
}

/// Every unsigned integer states its range: a value outside it does not
/// parse, and is refused with a 400.
pub(super) fn state_unsigned_ranges(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            // utoipa spells these `u-int32` and so on.
            let unsigned = match map.get("format").and_then(|f| f.as_str()) {
                Some("uint8" | "u-int8") => Some(("uint8", u64::from(u8::MAX))),
                Some("uint16" | "u-int16") => Some(("uint16", u64::from(u16::MAX))),
                Some("uint32" | "u-int32") => Some(("uint32", u64::from(u32::MAX))),
                Some("uint64" | "u-int64") => Some(("uint64", u64::MAX)),
                _ => None,
            };
            if let Some((format, max)) = unsigned {
                map.insert("format".into(), format.into());
                map.entry("minimum").or_insert(0.into());
                map.entry("maximum").or_insert(max.into());
            }
            map.values_mut().for_each(state_unsigned_ranges);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(state_unsigned_ranges),
        _ => {}
    }
}

/// The refusals every operation can give: each a JSON `ErrorBody`.
pub(super) fn add_common_errors(operation: &mut serde_json::Value) {
    let takes_input =
        operation.get("parameters").is_some_and(|p| p.as_array().is_some_and(|p| !p.is_empty()));
    let takes_body = operation.get("requestBody").is_some();
    // Open to anyone (`security: [{}]`): no token is looked at.
    let open = operation.get("security").is_some_and(|s| *s == serde_json::json!([{}]));
    let Some(responses) = operation.get_mut("responses").and_then(|r| r.as_object_mut()) else { return };
    let error = |description: &str| {
        serde_json::json!({
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        })
    };
    if takes_input || takes_body {
        responses.entry("400").or_insert_with(|| {
            error("A malformed request: a parameter or body that does not match this document (the message names the field)")
        });
    }
    if takes_body {
        responses.entry("413").or_insert_with(|| error(&format!("The body is over the {BODY_LIMIT} limit")));
    }
    if open {
        return;
    }
    responses.entry("401").or_insert_with(|| {
        error("No bearer token, a malformed Authorization header, or an unknown or revoked token")
    });
    responses
        .entry("403")
        .or_insert_with(|| error("The token may not make this call (an admin-only call, or an agent's)"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_documents_its_refusals_as_error_bodies() {
        let doc = document();
        let error_body = serde_json::json!({"$ref": "#/components/schemas/ErrorBody"});
        let mut operations = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                operations += 1;
                let responses = op["responses"].as_object().unwrap();
                let open = op["security"] == serde_json::json!([{}]);
                for code in ["401", "403"] {
                    assert_eq!(responses.contains_key(code), !open, "{method} {path}: {code}");
                }
                if op.get("requestBody").is_some() {
                    assert!(
                        responses.contains_key("400") && responses.contains_key("413"),
                        "{method} {path}"
                    );
                }
                for (code, response) in responses {
                    if code.starts_with('4') {
                        let schema = &response["content"]["application/json"]["schema"];
                        assert_eq!(*schema, error_body, "{method} {path} {code}");
                    }
                }
            }
        }
        // Every route `serve` routes under /v1: a new one needs its
        // `#[utoipa::path]` and a place in `ApiDoc`'s paths.
        assert_eq!(operations, 44, "routes documented");
    }

    /// A job's events are a union on `kind`: each kind names the schema
    /// of its detail, and every schema named is in the document.
    #[test]
    fn every_event_kind_is_documented_with_its_detail() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        let text = serde_json::to_string(&schemas["Event"]).unwrap();
        for kind in api::EventKind::ALL {
            assert!(text.contains(&format!("\"{}\"", kind.as_str())), "{kind} not in {text}");
        }
        let whole = doc.to_string();
        for reference in whole.split("\"#/components/schemas/").skip(1) {
            let name = &reference[..reference.find('"').unwrap()];
            assert!(schemas.get(name).is_some(), "{name} is referred to and not described");
        }
        for detail in ["PlacedDetail", "DrainNoticeDetail", "DrillDetail", "RequeuedDetail"] {
            assert!(schemas.get(detail).is_some(), "{detail} not described");
        }
    }

    #[test]
    fn the_agent_protocol_is_documented_under_its_own_tag() {
        let doc = document();
        for (path, method) in
            [("/v1/agent/register", "post"), ("/v1/agent/commands", "get"), ("/v1/agent/report", "post")]
        {
            assert_eq!(doc["paths"][path][method]["tags"], serde_json::json!(["agent"]), "{path}");
        }
    }

    #[test]
    fn unsigned_integers_and_limits_state_their_ranges() {
        let doc = document();
        let job = &doc["components"]["schemas"]["JobSubmission"]["properties"];
        assert_eq!((job["gpus"]["minimum"].as_u64(), job["gpus"]["maximum"].as_u64()), (Some(1), Some(4096)));
        assert_eq!(u64::from(crate::validate::MAX_GPUS), job["gpus"]["maximum"].as_u64().unwrap());
        assert_eq!(job["max_retries"]["maximum"].as_u64(), Some(u64::from(u32::MAX)));
        assert_eq!(job["argv"]["minItems"].as_u64(), Some(1));
        // validate::array_pattern_allows implements this pattern.
        assert_eq!(job["array"]["pattern"].as_str(), Some(r"^0*[0-9]{1,19}(-0*[0-9]{1,19})?$"));
        let reservation = &doc["components"]["schemas"]["ReservationRequest"]["properties"];
        assert_eq!(reservation["start"]["pattern"].as_str(), Some(ebb_api::TIME_PATTERN));
        assert_eq!(reservation["rate_usd"]["pattern"].as_str(), Some(ebb_api::USD_PATTERN));
        let price = &doc["components"]["schemas"]["PriceUpdate"]["properties"];
        assert_eq!(price["on_demand_usd"]["pattern"].as_str(), Some(ebb_api::USD_PATTERN));
        let logs = &doc["paths"]["/v1/jobs/{id}/logs"]["get"]["parameters"];
        let id = logs.as_array().unwrap().iter().find(|p| p["name"] == "id").unwrap();
        assert_eq!(
            (id["schema"]["format"].as_str(), id["schema"]["maximum"].as_u64()),
            (Some("uint64"), Some(u64::MAX))
        );
        let bill = doc["paths"]["/v1/bill"]["get"]["parameters"].as_array().unwrap().clone();
        let from = bill.iter().find(|p| p["name"] == "from").unwrap();
        assert_eq!(from["schema"]["pattern"].as_str(), Some(ebb_api::TIME_PATTERN));
        let series = doc["paths"]["/v1/report/series"]["get"]["parameters"].as_array().unwrap().clone();
        let step = series.iter().find(|p| p["name"] == "step").unwrap();
        assert_eq!(step["schema"]["pattern"].as_str(), Some(ebb_api::STEP_PATTERN));
    }
}
