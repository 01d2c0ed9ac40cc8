use leptos::prelude::*;
use leptos_meta::Title;

use super::{
    action_log::{ActionDetails, ActionWhat},
    reconciliation::{FindingActions, Resolution},
};
use crate::{
    components::{col, num, record_page, utc, Amount, DataTable, Record},
    domain::{EvidenceCharge, FindingEvidence, Me, Role},
    server_fns::get_finding,
};

/// One finding and everything behind it: why it was classified so, the
/// charges side by side, the billing record, the proxy calls with their
/// idempotency keys, and who did what about it. Operators resolve it here.
#[component]
pub fn FindingPage() -> impl IntoView {
    let can_act = use_context::<Me>().is_some_and(|me| me.role.allows(Role::Operator));
    record_page(
        Record {
            name: "Finding",
            missing: "There is no such finding.",
            back: ("/reconciliation", "Back to reconciliation"),
        },
        get_finding,
        move |evidence| view! { <Evidence evidence can_act/> }.into_any(),
    )
}

#[component]
fn Evidence(evidence: FindingEvidence, can_act: bool) -> impl IntoView {
    let finding = evidence.finding.clone();
    let id = finding.id;
    let title = format!("{} · {}", finding.kind.one(), finding.customer_id);
    let period = finding.billing_period.to_string();
    let synced = match evidence.last_synced_at {
        Some(at) => format!("Stripe's side as of the last sync, {}.", utc(at)),
        None => "No sync of this period has finished yet: Stripe's side as last stored.".into(),
    };
    view! {
        <Title text=title.clone()/>
        <p class="breadcrumb">
            <a href=format!("/reconciliation?period={period}")>{format!("Reconciliation {period}")}</a>
            {format!(" / #{id}")}
        </p>
        <div class="page-head">
            <h1>{title}</h1>
            <div class="actions">
                <span class="hint">{format!("Detected {}", utc(finding.detected_at))}</span>
            </div>
        </div>
        <section class="panel" aria-labelledby="why-heading">
            <h2 id="why-heading">"Why it was classified so"</h2>
            <p data-testid="explanation">{finding.explanation.clone()}</p>
            <dl class="facts facts-money">
                <div><dt>"Money at risk"</dt><dd><Amount cents=finding.at_risk currency=finding.currency.clone()/></dd></div>
                <div><dt>"Billing period"</dt><dd>{period.clone()}</dd></div>
                <div><dt>"Customer"</dt><dd>{finding.customer_id.clone()}</dd></div>
            </dl>
            {if finding.is_open() {
                view! { <p class="hint">{format!("Next: {}.", finding.kind.next_step())}</p> }.into_any()
            } else {
                view! { <div class="resolution"><Resolution finding=finding.clone()/></div> }.into_any()
            }}
            {(finding.is_open() && can_act).then(|| view! {
                <FindingActions finding=finding.clone() back=format!("/reconciliation/{id}") keys=evidence.keys.clone()/>
            })}
        </section>
        <section class="panel" aria-labelledby="charges-heading">
            <h2 id="charges-heading">"Charges side by side"</h2>
            <p class="hint">{synced}</p>
            <ChargeComparison charges=evidence.charges.clone()/>
        </section>
        <section class="panel" aria-labelledby="record-heading">
            <h2 id="record-heading">"Billing record"</h2>
            {match evidence.record.clone() {
                None => view! {
                    <p data-testid="no-record">{format!("No billing record for {} in {period}: the billing job never wrote one.", finding.customer_id)}</p>
                }.into_any(),
                Some(record) => view! {
                    <dl class="facts">
                        <div><dt>"Charge"</dt><dd><code>{record.charge_id.clone().unwrap_or_else(|| "—".into())}</code></dd></div>
                        <div><dt>"Amount"</dt><dd><Amount cents=record.amount currency=record.currency.clone()/></dd></div>
                        <div><dt>"Status"</dt><dd>{record.status.clone()}</dd></div>
                        <div><dt>"Stripe customer"</dt><dd>{record.stripe_customer_id.clone().unwrap_or_else(|| "—".into())}</dd></div>
                        <div><dt>"Written"</dt><dd>{utc(record.created_at)}</dd></div>
                    </dl>
                }.into_any(),
            }}
        </section>
        <ProxyCalls evidence=evidence.clone()/>
        <section class="panel" aria-labelledby="history-heading">
            <h2 id="history-heading">"What was done"</h2>
            {if evidence.history.is_empty() {
                view! { <p class="hint">"Nobody has acted on this finding yet."</p> }.into_any()
            } else {
                view! {
                    <DataTable class="data compact" columns=vec![col("Time (UTC)"), col("Who"), col("What"), col("Details")]>
                        {evidence.history.into_iter().map(|entry| view! {
                            <tr>
                                <td class="nowrap">{entry.at.format("%Y-%m-%d %H:%M:%S").to_string()}</td>
                                <td>{entry.who.clone()}</td>
                                <td><ActionWhat entry=entry.clone()/></td>
                                <td><ActionDetails entry/></td>
                            </tr>
                        }).collect_view()}
                    </DataTable>
                }.into_any()
            }}
        </section>
    }
    .into_any()
}

/// One column per charge, one row per fact, so the differences (and the
/// sameness of a duplicate) show at a glance.
#[component]
fn ChargeComparison(charges: Vec<EvidenceCharge>) -> impl IntoView {
    if charges.is_empty() {
        return view! { <p class="hint">"Stripe has no charge for this customer and period."</p> }
            .into_any();
    }
    type Fact = (&'static str, fn(&EvidenceCharge) -> AnyView);
    let facts: [Fact; 10] = [
        ("Created (UTC)", |c| {
            c.created_at
                .map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_else(|| "—".into())
                .into_any()
        }),
        ("Amount", |c| {
            view! { <Amount cents=c.amount currency=c.currency.clone()/> }.into_any()
        }),
        ("Refunded", |c| {
            view! { <Amount cents=c.refunded currency=c.currency.clone()/> }.into_any()
        }),
        ("Status", |c| {
            c.status
                .clone()
                .unwrap_or_else(|| "not in Stripe".into())
                .into_any()
        }),
        ("Stripe customer", |c| {
            or_dash(&c.stripe_customer).into_any()
        }),
        ("metadata[customer_id]", |c| {
            or_dash(&c.metadata_customer_id).into_any()
        }),
        ("metadata[billing_period]", |c| {
            or_dash(&c.metadata_billing_period).into_any()
        }),
        ("Payment intent", |c| match c.payment_intent.clone() {
            Some(intent) => view! { <code>{intent}</code> }.into_any(),
            None => "—".into_any(),
        }),
        ("Idempotency key", |c| {
            view! { <code>{c.idempotency_key.clone().unwrap_or_else(|| "not made through the proxy".into())}</code> }
                .into_any()
        }),
        ("Vault key", |c| {
            or_dash(&c.key_prefix.as_ref().map(|p| format!("{p}…"))).into_any()
        }),
    ];
    view! {
        <div class="table-scroll" tabindex="0">
            <table class="data comparison" data-testid="charge-comparison">
                <thead>
                    <tr>
                        <th scope="col">"Charge"</th>
                        {charges.iter().map(|c| {
                            let role = match (c.keeper, c.in_finding, c.synced) {
                                (true, _, _) => "keep",
                                (_, _, false) => "missing in Stripe",
                                (_, true, _) => "in this finding",
                                _ => "other charge",
                            };
                            view! {
                                <th scope="col" class=c.in_finding.then_some("in-finding")>
                                    <code>{c.id.clone()}</code>
                                    <div class="hint">{role}</div>
                                </th>
                            }
                        }).collect_view()}
                    </tr>
                </thead>
                <tbody>
                    {facts.into_iter().map(|(label, show)| view! {
                        <tr>
                            <th scope="row">{label}</th>
                            {charges.iter().map(|c| view! { <td>{show(c)}</td> }).collect_view()}
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        </div>
    }
    .into_any()
}

/// The value, or a dash where there is none.
fn or_dash(value: &Option<String>) -> String {
    value.clone().unwrap_or_else(|| "—".into())
}

#[component]
fn ProxyCalls(evidence: FindingEvidence) -> impl IntoView {
    let currency = evidence.finding.currency.clone();
    view! {
        <section class="panel" aria-labelledby="calls-heading">
            <h2 id="calls-heading">"Proxy calls"</h2>
            {if evidence.calls.is_empty() {
                view! { <p class="hint">"No call through the proxy for this customer and period: the charges were made around Vaultcap."</p> }.into_any()
            } else {
                view! {
                    <DataTable class="data" columns=vec![col("Time (UTC)"), col("Vault key"), col("Idempotency key"), num("Amount"), col("Decision"), num("Stripe status"), col("Stripe object")]>
                        {evidence.calls.into_iter().map(|call| view! {
                            <tr class=call.decision.is_refusal().then_some("refused")>
                                <td class="nowrap"><a href=format!("/audit/{}", call.id)>{call.at.format("%Y-%m-%d %H:%M:%S").to_string()}</a></td>
                                <td class="nowrap">{call.key_prefix.clone().map(|p| format!("{p}…")).unwrap_or_default()}</td>
                                <td><code>{call.idempotency_key.clone().unwrap_or_else(|| "none".into())}</code></td>
                                <td class="num">{call.amount.map(|cents| view! { <Amount cents currency=currency.clone()/> })}</td>
                                <td>
                                    {call.decision.label()}
                                    {call.message.clone().map(|m| view! { <div class="hint">{m}</div> })}
                                </td>
                                <td class="num">{call.upstream_status.map(|s| s.to_string()).unwrap_or_else(|| "—".into())}</td>
                                <td class="object-id"><code>{call.stripe_object_id.clone().unwrap_or_default()}</code></td>
                            </tr>
                        }).collect_view()}
                    </DataTable>
                }.into_any()
            }}
        </section>
    }
}
