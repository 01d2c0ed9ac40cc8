use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{record_page, utc, Amount, Record, ReplicaLagNotice},
    domain::{AuditCallDetail, AuditQuery, Decision, Me, Role},
    server_fns::get_audit_call,
};

/// One audited call with everything recorded about it, and the way to the
/// key and to the calls that share its idempotency key or customer.
#[component]
pub fn AuditCallPage() -> impl IntoView {
    record_page(
        Record {
            name: "Call",
            missing: "The audit log has no such call.",
            back: ("/audit", "Back to the audit log"),
        },
        get_audit_call,
        |detail| view! { <CallDetail detail/> }.into_any(),
    )
}

#[component]
fn CallDetail(detail: AuditCallDetail) -> impl IntoView {
    let call = detail.call;
    let title = format!("Call {}", call.id);
    let dash = || "—".to_string();
    let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(dash);
    let same = |name: &str, value: &Option<String>| {
        let value = value.clone()?;
        Some(AuditQuery::from_pairs([(name, value)]).href("/audit"))
    };
    let same_idempotency = same("idempotency_key", &call.idempotency_key);
    let same_customer = same("customer_id", &call.metadata_customer_id);
    let amount = call.amount.zip(call.currency.clone());
    let can_act = use_context::<Me>().is_some_and(|me| me.role.allows(Role::Operator));
    let raise = call
        .vault_key_id
        .filter(|_| can_act && call.decision == Decision::RefusedCap)
        .map(|key| format!("/keys/{key}/cap-increase?origin=call:{}", call.id));
    view! {
        <Title text=title.clone()/>
        <p class="breadcrumb"><a href="/audit">"Audit log"</a> " / " {title.clone()}</p>
        <h1>{format!("{} {} · {}", call.method, call.path, call.decision.label())}</h1>
        <ReplicaLagNotice/>
        <section class="panel">
            <dl class="facts">
                <div><dt>"Time"</dt><dd>{format!("{} ({})", utc(call.at), call.at.to_rfc3339())}</dd></div>
                <div><dt>"Decision"</dt><dd>{call.decision.label()} " " <code>{call.decision.as_str()}</code></dd></div>
                <div><dt>"Vault key"</dt><dd>{match call.vault_key_id {
                    Some(id) => view! { <a href=format!("/keys/{id}")>{call.key_label.clone().unwrap_or_else(|| format!("key {id}"))}</a> }.into_any(),
                    None => view! { <span>{format!("unknown key {}", call.key_prefix.clone().map(|p| format!("{p}…")).unwrap_or_default())}</span> }.into_any(),
                }}</dd></div>
                <div><dt>"Amount"</dt><dd>{match amount {
                    Some((cents, currency)) => view! { <Amount cents currency/> }.into_any(),
                    None => view! { <span>"—"</span> }.into_any(),
                }}</dd></div>
                <div><dt>"Customer (metadata)"</dt><dd>{or_dash(&call.metadata_customer_id)}</dd></div>
                <div><dt>"Stripe customer"</dt><dd>{or_dash(&call.stripe_customer)}</dd></div>
                <div><dt>"Billing period"</dt><dd>{format!(
                    "{} (metadata: {})",
                    call.billing_period.map(|p| p.to_string()).unwrap_or_else(dash),
                    or_dash(&detail.metadata_billing_period)
                )}</dd></div>
                <div><dt>"Idempotency key"</dt><dd><code>{or_dash(&call.idempotency_key)}</code></dd></div>
                <div><dt>"Stripe status"</dt><dd>{call.upstream_status.map(|s| s.to_string()).unwrap_or_else(|| "not forwarded".into())}</dd></div>
                <div><dt>"Stripe object"</dt><dd><code>{or_dash(&call.stripe_object_id)}</code></dd></div>
                <div><dt>"Error code"</dt><dd><code>{or_dash(&call.error_code)}</code></dd></div>
                <div><dt>"Latency"</dt><dd>{call.latency_ms.map(|ms| format!("{ms} ms")).unwrap_or_else(dash)}</dd></div>
                <div><dt>"Request id"</dt><dd><code>{detail.request_id.clone()}</code></dd></div>
            </dl>
            {detail.message.clone().map(|message| view! { <p class="call-message">{message}</p> })}
            {raise.map(|href| view! {
                <p><a class="button button-quiet" href=href>"Request cap increase"</a></p>
            })}
        </section>
        <section class="panel">
            <h2>"Related calls"</h2>
            <ul class="plain-list">
                {same_idempotency.map(|href| view! { <li><a href=href>"Every call with this idempotency key"</a></li> })}
                {same_customer.map(|href| view! { <li><a href=href>"Every call for this customer"</a></li> })}
                {call.vault_key_id.map(|id| view! { <li><a href=format!("/audit?key={id}")>"Every call with this vault key"</a></li> })}
            </ul>
        </section>
    }
    .into_any()
}
