use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{
        col, num, record_page, utc, Amount, DataTable, DayFiguresTable, Record, ReplicaLagNotice,
        UtilizationMeter,
    },
    domain::{
        ApplyAs, Cents, DuplicatePolicy, KeyDetail, KeyStatus, KeySummary, Me, RequestState, Role,
        VaultKeyId,
    },
    server_fns::get_vault_key,
};

/// One vault key: how much of its cap is used, how its spend grew, what its
/// calls were, and revoking it.
#[component]
pub fn KeyPage() -> impl IntoView {
    let can_act = use_context::<Me>().is_some_and(|me| me.role.allows(Role::Operator));
    record_page(
        Record {
            name: "Vault key",
            missing: "There is no such vault key.",
            back: ("/keys", "Back to the keys list"),
        },
        get_vault_key,
        move |detail| view! { <KeyView detail can_act/> }.into_any(),
    )
}

#[component]
fn KeyView(detail: KeyDetail, can_act: bool) -> impl IntoView {
    let key = detail.key.clone();
    let revocable = can_act && key.status != KeyStatus::Revoked;
    let raisable = can_act && key.status == KeyStatus::Active;
    let title = key.label.clone();
    view! {
        <Title text=title/>
        <p class="breadcrumb"><a href="/keys">"Vault keys"</a> " / " {key.billing_period.to_string()}</p>
        <div class="page-head">
            <h1>{key.label.clone()} " " <span class=format!("status status-{}", key.status.as_str())>{key.status.as_str()}</span></h1>
            <div class="actions">
                {raisable.then(|| view! {
                    <a class="button button-quiet" href=format!("/keys/{}/cap-increase", key.id)>"Request cap increase"</a>
                })}
                <a class="button button-quiet" href=format!("/audit.csv?key={}", key.id) download>"Download audit CSV"</a>
            </div>
        </div>
        <ReplicaLagNotice/>

        <UtilizationPanel key=key.clone()/>
        <SpendPanel detail=detail.clone()/>
        <div class="columns">
            <section class="panel" aria-labelledby="calls-heading">
                <h2 id="calls-heading">"Calls by decision"</h2>
                <CallCounts detail=detail.clone()/>
            </section>
            <section class="panel" aria-labelledby="key-heading">
                <h2 id="key-heading">"Key"</h2>
                <KeyFacts detail=detail.clone()/>
            </section>
        </div>
        <section class="panel" aria-labelledby="latest-heading">
            <h2 id="latest-heading">"Latest calls"</h2>
            <LatestCalls detail=detail.clone()/>
            <p><a href=format!("/audit?key={}", key.id)>"Every call with this key in the audit log"</a></p>
        </section>
        <KeyAlerts detail=detail.clone()/>
        <CapHistory detail=detail.clone()/>
        {raisable.then(|| view! { <PolicyForm id=key.id policy=detail.duplicate_policy/> })}
        {revocable.then(|| view! { <RevokeForm detail=detail.clone()/> })}
    }
    .into_any()
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// The key's duplicate guard, changed from the next call on.
#[component]
fn PolicyForm(id: VaultKeyId, policy: DuplicatePolicy) -> impl IntoView {
    view! {
        <section class="panel" aria-labelledby="guard-heading">
            <h2 id="guard-heading">"Duplicate guard"</h2>
            <p class="hint">"What the proxy does with a second charge for a customer and billing period under another idempotency key, as a redelivered message sends it. Changes apply from the next call."</p>
            <form method="post" action=format!("/keys/{id}/duplicate-policy") class="form-inline">
                <div class="field">
                    <label for="duplicate-policy">"Policy"</label>
                    <select id="duplicate-policy" name="duplicate_policy">
                        {DuplicatePolicy::ALL.into_iter().map(|option| view! {
                            <option value=option.as_str() selected=option == policy>{option.label()}</option>
                        }).collect_view()}
                    </select>
                </div>
                <button type="submit" class="button button-quiet">"Save duplicate guard"</button>
            </form>
        </section>
    }
}

#[component]
fn UtilizationPanel(key: KeySummary) -> impl IntoView {
    let currency = key.currency.clone();
    let remaining = Cents((key.cap.0 - key.committed().0).max(0));
    view! {
        <section class="panel utilization" aria-labelledby="utilization-heading">
            <h2 id="utilization-heading">"Cap utilization"</h2>
            <UtilizationMeter key=key.clone() large=true/>
            <dl class="facts facts-money">
                <div><dt>"Spent"</dt><dd><Amount cents=key.spent currency=currency.clone()/></dd></div>
                <div><dt>"Reserved (in flight)"</dt><dd><Amount cents=key.reserved currency=currency.clone()/></dd></div>
                <div><dt>"Remaining under the cap"</dt><dd><Amount cents=remaining currency=currency.clone()/></dd></div>
                <div><dt>"Cap"</dt><dd><Amount cents=key.cap currency=currency.clone()/></dd></div>
                <div><dt>"Expected total"</dt><dd><Amount cents=key.expected_total currency=currency.clone()/></dd></div>
            </dl>
        </section>
    }
    .into_any()
}

#[component]
fn SpendPanel(detail: KeyDetail) -> impl IntoView {
    let key = detail.key;
    let currency = key.currency.clone();
    view! {
        <section class="panel" aria-labelledby="chart-heading">
            <h2 id="chart-heading">"Spend over time"</h2>
            <figure class="chart">
                <div class="chart-svg" inner_html=detail.spend_chart_svg></div>
                <figcaption class="legend">
                    <span class="swatch swatch-spent"></span>"Spent (cumulative)"
                    <span class="swatch swatch-cap"></span>{format!("Cap {} {currency}", key.cap.format(&currency))}
                    <span class="swatch swatch-expected"></span>{format!("Expected {} {currency}", key.expected_total.format(&currency))}
                </figcaption>
            </figure>
            <DayFiguresTable caption="Spend by day".to_owned()
                columns=vec!["Spent that day".to_owned(), "Spent to date".to_owned()]
                rows=detail.spend_by_day currency=currency.clone()/>
        </section>
    }
    .into_any()
}

#[component]
fn KeyAlerts(detail: KeyDetail) -> impl IntoView {
    view! {
        <section class="panel" aria-labelledby="alerts-heading">
            <h2 id="alerts-heading">"Alerts"</h2>
            {if detail.alerts.is_empty() {
                view! { <p class="hint">"No alerts for this key."</p> }.into_any()
            } else {
                view! {
                    <ul class="plain-list">
                        {detail.alerts.iter().map(|alert| view! {
                            <li>
                                <span class=format!("status status-alert-{}", alert.state)>{alert.state.clone()}</span>
                                " " <strong>{alert.kind_label()}</strong> " · " {alert.describe()}
                                " · " <span class="hint">{utc(alert.raised_at)}</span>
                            </li>
                        }).collect_view()}
                    </ul>
                    <p><a href="/alerts?state=all">"All alerts"</a></p>
                }.into_any()
            }}
        </section>
    }
    .into_any()
}

/// Every cap increase asked for on this key: what was asked, by whom and
/// why, and what became of it.
#[component]
fn CapHistory(detail: KeyDetail) -> impl IntoView {
    let currency = detail.key.currency.clone();
    let approved_raises: i64 = detail
        .cap_history
        .iter()
        .filter(|r| r.state == RequestState::Approved && r.apply_as == ApplyAs::RaiseCap)
        .map(|r| r.additional().0)
        .sum();
    let issued_with = Cents(detail.key.cap.0 - approved_raises);
    view! {
        <section class="panel" aria-labelledby="cap-history-heading">
            <h2 id="cap-history-heading">"Cap history"</h2>
            <DataTable class="data compact" columns=vec![col("Requested (UTC)"), num("Cap"), col("Reason"), col("Outcome")]>
                {detail.cap_history.into_iter().map(|request| {
                    let state = request.state;
                    let outcome = match state {
                        RequestState::Pending => format!("waiting for an approver until {}", utc(request.expires_at)),
                        RequestState::Expired => format!("expired undecided at {}", utc(request.expires_at)),
                        _ => format!(
                            "{} by {} at {}{}",
                            state.as_str(),
                            request.decided_by.clone().unwrap_or_default(),
                            request.decided_at.map(utc).unwrap_or_default(),
                            request.decision_note.as_ref().map(|n| format!(": {n}")).unwrap_or_default()
                        ),
                    };
                    view! {
                        <tr data-request=request.id>
                            <td class="nowrap">{utc(request.requested_at)}</td>
                            <td class="num nowrap">
                                <span class="amount">{request.change()}</span>
                                <div class="hint">{request.apply_as.label()}</div>
                            </td>
                            <td>{request.reason.clone()}<div class="hint">{format!("by {} {}", request.requested_by, request.origin_label())}</div></td>
                            <td>
                                <span class=format!("status status-request-{}", state.as_str())>{state.as_str()}</span>
                                <div class="hint">{outcome}</div>
                                {request.follow_on_key_id.map(|key| view! { <a href=format!("/keys/{key}")>"Follow-on key"</a> })}
                            </td>
                        </tr>
                    }
                }).collect_view()}
                <tr>
                    <td class="nowrap">{utc(detail.created_at)}</td>
                    <td class="num"><Amount cents=issued_with currency=currency.clone()/></td>
                    <td>"Issued"</td>
                    <td class="hint">{detail.parent_key_id.map(|parent| format!("follow-on of key {parent}")).unwrap_or_default()}</td>
                </tr>
            </DataTable>
            {detail.parent_key_id.map(|parent| view! {
                <p><a href=format!("/keys/{parent}")>"The key this one extends"</a></p>
            })}
        </section>
    }
    .into_any()
}

#[component]
fn KeyFacts(detail: KeyDetail) -> impl IntoView {
    let key = &detail.key;
    let thresholds = key
        .thresholds_pct
        .iter()
        .map(|t| format!("{t} %"))
        .collect::<Vec<_>>()
        .join(", ");
    let created = format!(
        "{}{}",
        utc(detail.created_at),
        detail
            .created_by
            .as_ref()
            .map(|who| format!(" by {who}"))
            .unwrap_or_default()
    );
    let bps = detail.buffer_bps;
    let buffer = if bps % 100 == 0 {
        format!("{} %", bps / 100)
    } else {
        format!("{}.{:02} %", bps / 100, bps % 100)
    };
    view! {
        <dl class="facts">
            <div><dt>"Key prefix"</dt><dd><code>{format!("{}…", key.secret_prefix)}</code></dd></div>
            <div><dt>"Billing period"</dt><dd>{key.billing_period.to_string()}</dd></div>
            <div><dt>"Buffer over expected"</dt><dd>{buffer}</dd></div>
            <div><dt>"Alert thresholds"</dt><dd>{thresholds}</dd></div>
            <div><dt>"Duplicate guard"</dt><dd>
                <span data-testid="duplicate-policy">{detail.duplicate_policy.as_str()}</span>
                <div class="hint">{format!("{}.", capitalized(detail.duplicate_policy.explain()))}</div>
            </dd></div>
            <div><dt>"Expires"</dt><dd>{utc(key.expires_at)}</dd></div>
            <div><dt>"Created"</dt><dd>{created}</dd></div>
            <div><dt>"Allowed endpoints"</dt><dd>
                <ul class="plain-list">{detail.allowed_endpoints.iter().map(|e| view! { <li><code>{e.clone()}</code></li> }).collect_view()}</ul>
            </dd></div>
            {detail.revoked_at.map(|at| view! {
                <div><dt>"Revoked"</dt><dd>
                    {format!("{}{}", utc(at), detail.revoked_by.as_ref().map(|who| format!(" by {who}")).unwrap_or_default())}
                    <div class="hint">{format!("Reason: {}", detail.revoke_reason.clone().unwrap_or_default())}</div>
                </dd></div>
            })}
        </dl>
    }
}

#[component]
fn CallCounts(detail: KeyDetail) -> impl IntoView {
    if detail.calls.is_empty() {
        return view! { <p class="hint">"No calls through the proxy with this key yet."</p> }
            .into_any();
    }
    let total: i64 = detail.calls.iter().map(|c| c.calls).sum();
    view! {
        <div class="table-scroll" tabindex="0">
            <table class="data compact">
                <thead><tr><th scope="col">"Decision"</th><th scope="col" class="num">"Calls"</th></tr></thead>
                <tbody>
                    {detail.calls.into_iter().map(|c| view! {
                        <tr class=c.decision.is_refusal().then_some("refused")>
                            <td>{c.decision.label()}</td>
                            <td class="num">{crate::domain::group_thousands(c.calls.unsigned_abs())}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
                <tfoot><tr><th scope="row">"All calls"</th><td class="num">{crate::domain::group_thousands(total.unsigned_abs())}</td></tr></tfoot>
            </table>
        </div>
    }
    .into_any()
}

#[component]
fn LatestCalls(detail: KeyDetail) -> impl IntoView {
    if detail.latest_calls.is_empty() {
        return view! { <p class="hint">"No calls yet. Calls appear here as soon as the billing job uses the key."</p> }.into_any();
    }
    let currency = detail.key.currency.clone();
    view! {
        <DataTable class="data" columns=vec![col("Time (UTC)"), col("Call"), col("Customer"), num("Amount"), col("Decision"), num("Stripe status"), col("Stripe object")]>
            {detail.latest_calls.into_iter().map(|call| view! {
                <tr class=call.decision.is_refusal().then_some("refused")>
                    <td class="nowrap"><a href=format!("/audit/{}", call.id)>{call.at.format("%Y-%m-%d %H:%M:%S").to_string()}</a></td>
                    <td class="nowrap"><code>{format!("{} {}", call.method, call.path)}</code></td>
                    <td>{call.customer.clone().unwrap_or_default()}</td>
                    <td class="num">{call.amount.map(|cents| view! { <Amount cents currency=currency.clone()/> })}</td>
                    <td class="nowrap">{call.decision.label()}</td>
                    <td class="num">{call.upstream_status.map(|s| s.to_string()).unwrap_or_else(|| "—".into())}</td>
                    <td class="object-id"><code>{call.stripe_object_id.clone().unwrap_or_default()}</code></td>
                </tr>
            }).collect_view()}
        </DataTable>
    }
    .into_any()
}

/// Revoking shows what it changes first (what was spent stays spent, what
/// is in flight still settles, the headroom given up, the requests that
/// lapse), then needs a reason and an explicit confirmation; the server
/// checks both, so the form works the same without JavaScript.
#[component]
fn RevokeForm(detail: KeyDetail) -> impl IntoView {
    let key = detail.key.clone();
    let id = key.id;
    let currency = key.currency.clone();
    let headroom = Cents((key.cap.0 - key.spent.0 - key.reserved.0).max(0));
    let calls: i64 = detail.calls.iter().map(|c| c.calls).sum();
    let last_call = detail.latest_calls.first().map(|call| utc(call.at));
    let pending = detail
        .cap_history
        .iter()
        .filter(|request| request.state == RequestState::Pending)
        .count();
    view! {
        <section class="panel panel-danger" aria-labelledby="revoke-heading">
            <h2 id="revoke-heading">"Revoke this key"</h2>
            <p>"The proxy refuses every call with this key from the next one on. This cannot be undone: the billing job needs a new key."</p>
            <dl class="facts facts-money" data-testid="revoke-consequences">
                <div><dt>"Spent: stays charged"</dt><dd><Amount cents=key.spent currency=currency.clone()/></dd></div>
                <div><dt>"In flight: still settles"</dt><dd><Amount cents=key.reserved currency=currency.clone()/></dd></div>
                <div><dt>"Headroom given up"</dt><dd><Amount cents=headroom currency=currency.clone()/></dd></div>
                <div><dt>"Calls so far"</dt><dd>{match last_call {
                    Some(at) => format!("{calls}, the last at {at}"),
                    None => "none".to_owned(),
                }}</dd></div>
                {(pending > 0).then(|| view! {
                    <div><dt>"Cap increase requests that lapse"</dt><dd>{pending}</dd></div>
                })}
            </dl>
            <form method="post" action=format!("/keys/{id}/revoke") class="stacked">
                <div class="field">
                    <label for="revoke-reason">"Reason (recorded in the action log)"</label>
                    <textarea id="revoke-reason" name="reason" rows="2" maxlength="2000" required></textarea>
                </div>
                <div class="field field-check">
                    <input id="revoke-confirm" name="confirm" type="checkbox" value="yes" required/>
                    <label for="revoke-confirm">{format!("Yes, revoke {} now", key.label)}</label>
                </div>
                <button type="submit" class="button button-danger">"Revoke key"</button>
            </form>
        </section>
    }
}
