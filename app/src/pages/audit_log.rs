use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::{
    components::utc,
    components::{
        col, num, Amount, ApplyOrClear, DataTable, ErrorPanel, KeysetPager, PerPage,
        ReplicaLagNotice, RequireRole,
    },
    domain::{
        counted, datetime_local, group_thousands, AuditCall, AuditPage, AuditQuery, ChainStatus,
        Decision, LogIntegrity, Role,
    },
    server_fns::{audit_integrity, list_audit},
};

/// Every call through the proxy, newest first: filters in a GET form (a
/// link reproduces the view), keyset pages, and the CSV of exactly the
/// filtered set.
#[component]
pub fn AuditLogPage() -> impl IntoView {
    let params = use_query_map();
    let query = move || params.with(|q| AuditQuery::from_pairs(q));
    let page = Resource::new(query, list_audit);
    let integrity = Resource::new(|| (), |_| audit_integrity());
    view! {
        <Title text="Audit log"/>
        <RequireRole role=Role::Viewer>
            <div class="page-head">
                <h1>"Audit log"</h1>
            </div>
            <ReplicaLagNotice/>
            <Suspense>
                {move || Suspend::new(async move {
                    integrity.await.ok().map(|integrity| view! { <Integrity integrity/> })
                })}
            </Suspense>
            <Suspense>
                {move || Suspend::new(async move {
                    let query = query();
                    match page.await {
                        Ok(page) => view! {
                            <AuditFilters query=query.clone()/>
                            <AuditResults page query/>
                        }.into_any(),
                        Err(error) => view! {
                            <AuditFilters query/>
                            <ErrorPanel error/>
                        }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn AuditFilters(query: AuditQuery) -> impl IntoView {
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    let decision = value(&query.decision);
    let limit = query
        .limit
        .clone()
        .unwrap_or_else(|| crate::domain::DEFAULT_AUDIT_PAGE_SIZE.to_string());
    let text = |id: &'static str, label: &'static str, current: String, hint: &'static str| {
        view! {
            <div class="field">
                <label for=format!("audit-{id}")>{label}</label>
                <input id=format!("audit-{id}") name=id type="text" maxlength="200" value=current placeholder=hint/>
            </div>
        }
    };
    view! {
        <form class="filters audit-filters" method="get" action="/audit" role="search" aria-label="Filter the audit log">
            <TimeField id="audit-from" name="from" label="From (UTC)" value=datetime_local(&query.from, false)/>
            <TimeField id="audit-to" name="to" label="Before (UTC)" value=datetime_local(&query.to, true)/>
            {text("customer_id", "Customer (metadata)", value(&query.customer_id), "cust_000123")}
            {text("customer", "Stripe customer", value(&query.customer), "cus_…")}
            <div class="field">
                <label for="audit-decision">"Decision"</label>
                <select id="audit-decision" name="decision">
                    <option value="" selected=decision.is_empty()>"Any decision"</option>
                    <option value="refused" selected=decision == "refused">"Any refusal"</option>
                    {Decision::ALL.into_iter().map(|d| view! {
                        <option value=d.as_str() selected=decision == d.as_str()>{d.label()}</option>
                    }).collect_view()}
                </select>
            </div>
            {text("key", "Vault key id", value(&query.key), "12")}
            {text("period", "Billing period", value(&query.period), "2026-11")}
            {text("endpoint", "Endpoint path", value(&query.endpoint), "/v1/charges")}
            {text("status", "Stripe status", value(&query.status), "402")}
            {text("idempotency_key", "Idempotency key", value(&query.idempotency_key), "")}
            {text("object", "Stripe object", value(&query.object), "ch_… or pi_…")}
            // The amounts are read in the currency beside them.
            {text("currency", "Currency", value(&query.currency), "usd")}
            {text("min_amount", "Amount from", value(&query.min_amount), "100.00")}
            {text("max_amount", "Amount to", value(&query.max_amount), "5,000.00")}
            <PerPage id="audit-limit" limit/>
            <ApplyOrClear page="/audit"/>
        </form>
    }
}

#[component]
fn AuditResults(page: AuditPage, query: AuditQuery) -> impl IntoView {
    let first = query.at(None);
    let export = format!(
        "/audit.csv{}",
        match first.query_string() {
            q if q.is_empty() => String::new(),
            q => format!("?{q}"),
        }
    );
    let positioned = query.after.is_some() || query.before.is_some();
    let pager = view! {
        <KeysetPager label="Pages of calls"
            newest=positioned.then(|| first.href("/audit"))
            newer=page.newer.as_ref().map(|q| q.href("/audit"))
            older=page.older.as_ref().map(|q| q.href("/audit"))/>
    };
    if page.calls.is_empty() {
        return view! {
            <section class="panel">
                <p>"No calls match these filters."</p>
                <p class="hint">"Widen the time range or clear a filter. " <a href="/audit">"Show every call"</a></p>
            </section>
            {pager}
        }
        .into_any();
    }
    view! {
        <div class="table-head">
            <p class="result-count">{format!("{} on this page, newest first", counted(page.calls.len(), "call", "calls"))}</p>
            <a class="button button-quiet" href=export download>"Export CSV"</a>
        </div>
        <DataTable class="data audit" columns=vec![col("Time (UTC)"), col("Key"), col("Call"), col("Customer"), num("Amount"), col("Decision"), num("Stripe"), col("Idempotency key")]>
            {page.calls.into_iter().map(|call| view! { <CallRow call/> }).collect_view()}
        </DataTable>
        {pager}
    }
    .into_any()
}

#[component]
fn CallRow(call: AuditCall) -> impl IntoView {
    let refused = call.decision.is_refusal().then_some("refused");
    let amount = call.amount.zip(call.currency.clone());
    view! {
        <tr class=refused data-call=call.id>
            <td class="nowrap"><a href=format!("/audit/{}", call.id)>{call.at.format("%Y-%m-%d %H:%M:%S").to_string()}</a></td>
            <td class="nowrap">{call.key_label.clone().unwrap_or_else(|| call.key_prefix.clone().map(|p| format!("{p}… (unknown)")).unwrap_or_default())}</td>
            <td class="nowrap"><code>{format!("{} {}", call.method, call.path)}</code></td>
            <td>{call.metadata_customer_id.clone().or(call.stripe_customer.clone()).unwrap_or_default()}</td>
            <td class="num">{amount.map(|(cents, currency)| view! { <Amount cents currency/> })}</td>
            <td class="nowrap">{call.decision.label()}</td>
            <td class="num">{call.upstream_status.map(|s| s.to_string()).unwrap_or_else(|| "—".into())}</td>
            <td class="idempotency"><code title=call.idempotency_key.clone()>{call.idempotency_key.clone().unwrap_or_default()}</code></td>
        </tr>
    }
}

/// Whether the log can be trusted as it reads: the last check of its hash
/// chain, and a warning when the application's own role could rewrite it.
#[component]
fn Integrity(integrity: LogIntegrity) -> impl IntoView {
    let rows = |n: i64| {
        format!(
            "{} {}",
            group_thousands(n as u64),
            if n == 1 { "row" } else { "rows" }
        )
    };
    let chain = match integrity.chain {
        ChainStatus::Empty => None,
        ChainStatus::NotChecked => Some(view! {
            <p class="chain-status" data-testid="chain-status">
                "Hash chain not checked yet: Vaultcap checks it within a minute of new calls."
            </p>
        }.into_any()),
        ChainStatus::Verified { checked_at, rows: verified, unchecked_rows } => {
            let pending = (unchecked_rows > 0).then(|| {
                format!(" {} written since are checked within a minute.", rows(unchecked_rows))
            });
            Some(view! {
                <p class="chain-status chain-verified" data-testid="chain-status">
                    <span aria-hidden="true">"✓ "</span>
                    {format!(
                        "Hash chain verified up to {}: {} hold.",
                        utc(checked_at),
                        rows(verified),
                    )}
                    {pending}
                </p>
            }.into_any())
        }
        ChainStatus::Broken { day, row_id, problem, checked_at } => Some(view! {
            <div class="notice notice-error" role="alert" data-testid="chain-status">
                <p><strong>"The audit log was changed outside Vaultcap."</strong></p>
                <p>{format!("Found {}: {problem}.", utc(checked_at))}</p>
                {row_id.map(|id| view! {
                    <p><a href=format!("/audit/{id}")>{format!("Open audit row {id}")}</a></p>
                })}
                <p>{format!(
                    "Rows of {day} and later are not vouched for. Run `vaultcap audit verify` on \
                     the server for the whole report."
                )}</p>
            </div>
        }.into_any()),
    };
    let role = integrity.role_can_rewrite.then(|| view! {
        <div class="notice notice-warning" role="status" data-testid="role-can-rewrite">
            <p>{format!(
                "The application's database role ({}) can change audit rows; only the hash chain \
                 would show it. Run Vaultcap as a member of vaultcap_app (README: tamper evidence).",
                integrity.role
            )}</p>
        </div>
    });
    view! { {chain} {role} }
}

/// A UTC time filter as a native date and time input (to the second).
#[component]
pub fn TimeField(
    id: &'static str,
    name: &'static str,
    label: &'static str,
    value: String,
) -> impl IntoView {
    view! {
        <div class="field">
            <label for=id>{label}</label>
            <input id=id name=name type="datetime-local" step="1" value=value/>
        </div>
    }
}
