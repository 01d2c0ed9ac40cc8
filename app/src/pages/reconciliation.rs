use leptos::prelude::*;
use leptos_meta::{Meta, Title};
use leptos_router::hooks::use_query_map;

use crate::{
    components::{col, num, utc, Amount, DataTable, ErrorPanel, ReplicaLagNotice, RequireRole},
    domain::{
        BulkAction, Finding, FindingKind, KeyChoice, Me, ReconciliationView, Role, SyncState,
    },
    server_fns::get_reconciliation,
};

/// Stripe's charges for a billing period against the billing ledger: the
/// money at risk per kind, the last sync, and each finding with what to do
/// about it. Operators adopt orphaned charges and dismiss findings with a
/// reason, with plain form posts; viewers read.
#[component]
pub fn ReconciliationPage() -> impl IntoView {
    let query = use_query_map();
    let args = move || {
        query.with(|q| {
            (
                q.get("period"),
                q.get("kind"),
                q.get("state"),
                q.get("customer"),
            )
        })
    };
    let view_data = Resource::new(args, |(period, kind, state, customer)| {
        get_reconciliation(period, kind, state, customer)
    });
    let can_act = use_context::<Me>().is_some_and(|me| me.role.allows(Role::Operator));
    view! {
        <Title text="Reconciliation"/>
        <RequireRole role=Role::Viewer>
            <h1>"Reconciliation"</h1>
            <ReplicaLagNotice/>
            <Suspense>
                {move || Suspend::new(async move {
                    match view_data.await {
                        Ok(data) => view! { <Reconciliation data can_act/> }.into_any(),
                        Err(error) => view! {
                            <ErrorPanel error/>
                            <p><a href="/reconciliation">"Back to this month"</a></p>
                        }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn Reconciliation(data: ReconciliationView, can_act: bool) -> impl IntoView {
    let period = data.period.to_string();
    view! {
        <form class="filters" method="get" action="/reconciliation">
            <div class="field">
                <label for="rec-period">"Billing period"</label>
                <input id="rec-period" name="period" type="month" value=period.clone()/>
            </div>
            <div class="field">
                <label for="rec-kind">"Kind"</label>
                <select id="rec-kind" name="kind">
                    <option value="all">"All kinds"</option>
                    {FindingKind::ALL.into_iter().map(|kind| view! {
                        <option value=kind.as_str() selected=data.kind == Some(kind)>{kind.label()}</option>
                    }).collect_view()}
                </select>
            </div>
            <div class="field">
                <label for="rec-state">"State"</label>
                <select id="rec-state" name="state">
                    {[("open", "Open"), ("resolved", "Resolved"), ("all", "All")].into_iter().map(|(value, label)| view! {
                        <option value=value selected=data.state == value>{label}</option>
                    }).collect_view()}
                </select>
            </div>
            <div class="field">
                <label for="rec-customer">"Customer"</label>
                <input id="rec-customer" name="customer" type="search" maxlength="200" value=data.customer.clone()
                    placeholder="Customer id starts with"/>
            </div>
            <div class="filter-actions">
                <button type="submit" class="button button-quiet">"Show"</button>
                <a class="button button-quiet" href=format!("/reconciliation.csv?{}", data.export_query) download>"Download CSV"</a>
            </div>
        </form>
        <SyncPanel data=data.clone() can_act/>
        <Totals data=data.clone()/>
        {(can_act && data.state == "open" && !data.findings.is_empty()).then(|| view! { <BulkPanel data=data.clone()/> })}
        <Findings data can_act/>
    }
    .into_any()
}

/// How often a page showing a running sync reloads.
const SYNC_REFRESH_SECS: &str = "2";

/// Where the period's sync stands, and the one action that moves it on:
/// a Sync button when a sync can start and this person may start it, or
/// the reason it cannot and what to do instead.
#[component]
fn SyncPanel(data: ReconciliationView, can_act: bool) -> impl IntoView {
    let period = data.period.to_string();
    let (text, again) = match &data.sync {
        SyncState::Never => (
            format!("{period} has never been synced from Stripe, so no findings can show yet."),
            format!("Sync {period} from Stripe"),
        ),
        SyncState::Running(sync) => (
            format!(
                "A sync started {} is under way: {} so far. This page follows it.",
                utc(sync.started_at),
                sync.seen()
            ),
            String::new(),
        ),
        SyncState::Failed(sync) => (
            format!(
                "The sync started {} failed after {}: {}.",
                utc(sync.started_at),
                sync.seen(),
                sync.error.as_deref().unwrap_or_default()
            ),
            format!("Sync {period} again (resumes)"),
        ),
        SyncState::Stale(sync) => (
            format!(
                "Last synced {}, more than a day ago: charges made in Stripe since then are not checked.",
                sync.finished_at.map(utc).unwrap_or_default()
            ),
            format!("Sync {period} again"),
        ),
        SyncState::Fresh(sync) => (
            format!(
                "Last synced {}: {}.",
                sync.finished_at.map(utc).unwrap_or_default(),
                sync.seen()
            ),
            format!("Sync {period} again"),
        ),
    };
    let running = matches!(data.sync, SyncState::Running(_));
    let class = match data.sync {
        SyncState::Failed(_) => "panel panel-error sync-panel",
        SyncState::Never | SyncState::Stale(_) => "panel panel-warning sync-panel",
        _ => "panel sync-panel",
    };
    let action = if !data.sync.can_start() {
        None
    } else if let Some(reason) = data.sync_unavailable.clone() {
        Some(view! { <p class="hint" data-testid="sync-unavailable">{format!("Syncing is not possible: {reason}.")}</p> }.into_any())
    } else if !can_act {
        Some(view! { <p class="hint">"An operator can start a sync."</p> }.into_any())
    } else {
        Some(
            view! {
                <form method="post" action="/reconciliation/sync">
                    <input type="hidden" name="period" value=period/>
                    <button type="submit" class="button button-quiet">{again}</button>
                </form>
            }
            .into_any(),
        )
    };
    view! {
        // While a sync runs the page reloads itself, so its progress (pages
        // fetched, charges seen) and then its findings show without a click.
        {running.then(|| view! { <Meta http_equiv="refresh" content=SYNC_REFRESH_SECS/> })}
        <section class=class aria-label="Stripe sync" aria-live="polite">
            <p data-testid="sync-state">{text}</p>
            {action}
        </section>
    }
    .into_any()
}

/// Starts a bulk resolution of the filtered open findings: the next page
/// previews it and asks for the confirmation.
#[component]
fn BulkPanel(data: ReconciliationView) -> impl IntoView {
    let actions: Vec<BulkAction> = BulkAction::ALL
        .into_iter()
        .filter(|action| match (action.kind(), data.kind) {
            (Some(needed), Some(shown)) => needed == shown,
            _ => true,
        })
        .collect();
    view! {
        <form class="panel form-inline bulk-panel" method="get" action="/reconciliation/bulk" aria-label="Bulk resolution">
            <input type="hidden" name="period" value=data.period.to_string()/>
            <input type="hidden" name="kind" value=data.kind.map(|k| k.as_str()).unwrap_or("all")/>
            <input type="hidden" name="customer" value=data.customer.clone()/>
            <div class="field">
                <label for="bulk-action">"Resolve every open finding shown"</label>
                <select id="bulk-action" name="action">
                    {actions.into_iter().map(|action| view! {
                        <option value=action.as_str()>{action.label()}</option>
                    }).collect_view()}
                </select>
            </div>
            <button type="submit" class="button button-quiet">"Preview"</button>
        </form>
    }
}

/// The money at risk in the period's open findings, per kind, whatever
/// the filter below shows; nothing when none is open.
#[component]
fn Totals(data: ReconciliationView) -> impl IntoView {
    (!data.totals.is_empty()).then(|| view! {
        <section class="panel" aria-labelledby="at-risk-heading">
            <h2 id="at-risk-heading">{format!("Money at risk in {}", data.period)}</h2>
            <p class="hint">"Open findings of every kind, whatever the filter shows."</p>
            <DataTable class="data compact" columns=vec![col("Kind"), num("Open"), num("Money at risk")]>
                {data.totals.into_iter().map(|total| view! {
                    <tr data-kind=total.kind.as_str()>
                        <td>{total.kind.label()}</td>
                        <td class="num">{total.open}</td>
                        <td class="num"><Amount cents=total.at_risk currency=total.currency/></td>
                    </tr>
                }).collect_view()}
            </DataTable>
        </section>
    })
}

/// The findings the filter selects, under a heading that names the
/// filter. With none, it says Stripe and the billing records agree only
/// when a sync finished within the day; otherwise just that none is here.
#[component]
fn Findings(data: ReconciliationView, can_act: bool) -> impl IntoView {
    let heading = match data.state.as_str() {
        "open" => "Open findings",
        "resolved" => "Resolved findings",
        _ => "All findings",
    };
    let heading = match data.kind {
        Some(kind) => format!("{heading}: {}", kind.label().to_lowercase()),
        None => heading.to_owned(),
    };
    let body = if data.findings.is_empty() {
        let message = match (data.state.as_str(), &data.sync) {
            ("open", SyncState::Fresh(_)) if data.kind.is_none() && data.customer.is_empty() => {
                "Nothing to resolve: Stripe and the billing records agree for this period."
                    .to_owned()
            }
            ("open", SyncState::Stale(_)) => "Nothing to resolve as of the last sync.".to_owned(),
            ("open", _) => "No open findings.".to_owned(),
            ("resolved", _) => "No finding here has been resolved yet.".to_owned(),
            _ => "No findings.".to_owned(),
        };
        view! { <p class="hint" data-testid="findings-empty">{message}</p> }.into_any()
    } else {
        view! {
            <div class="table-scroll" tabindex="0">
                <table class="data findings">
                    <thead>
                        <tr>
                            <th scope="col">"Finding"</th>
                            <th scope="col">"Charges"</th>
                            <th scope="col" class="num">"At risk"</th>
                            <th scope="col">"Why"</th>
                            <th scope="col">{if can_act { "Resolve" } else { "State" }}</th>
                        </tr>
                    </thead>
                    <tbody>
                        {data.findings.into_iter().map(|finding| view! { <FindingRow finding can_act/> }).collect_view()}
                    </tbody>
                </table>
            </div>
        }
        .into_any()
    };
    view! {
        <section class="panel" aria-labelledby="findings-heading">
            <h2 id="findings-heading">{heading}</h2>
            {body}
        </section>
    }
    .into_any()
}

#[component]
fn FindingRow(finding: Finding, can_act: bool) -> impl IntoView {
    let id = finding.id;
    let kind = finding.kind;
    let keeper = finding.keeper_charge_id.clone();
    view! {
        <tr data-finding=id>
            <td class="nowrap">
                <strong>{kind.one()}</strong>
                <div>{finding.customer_id.clone()}</div>
                <div class="hint"><a href=format!("/reconciliation/{id}") aria-label=format!("Evidence for finding {id}")>{format!("#{id}")}</a>{format!(" · detected {}", utc(finding.detected_at))}</div>
            </td>
            <td>
                <ul class="plain-list">
                    {finding.charge_ids.iter().map(|charge| {
                        let kept = keeper.as_deref() == Some(charge.as_str());
                        view! {
                            <li><code>{charge.clone()}</code>{kept.then_some(" (keep)")}</li>
                        }
                    }).collect_view()}
                </ul>
            </td>
            <td class="num"><Amount cents=finding.at_risk currency=finding.currency.clone()/></td>
            <td>
                {finding.explanation.clone()}
                {finding.is_open().then(|| view! { <div class="hint">{format!("Next: {}.", kind.next_step())}</div> })}
            </td>
            <td>
                {if finding.is_open() {
                    if can_act {
                        view! { <FindingActions finding=finding.clone()/> }.into_any()
                    } else {
                        view! { <span class="status status-request-pending">"open"</span> }.into_any()
                    }
                } else {
                    view! { <Resolution finding=finding.clone()/> }.into_any()
                }}
            </td>
        </tr>
    }
    .into_any()
}

/// The resolutions an open finding allows, as plain form posts; each comes
/// back to `back` (this page, or the finding's own). An unmetered charge is
/// attributed to one of `keys` on the finding's own page (the list links
/// there).
#[component]
pub(crate) fn FindingActions(
    finding: Finding,
    #[prop(optional)] back: Option<String>,
    #[prop(optional)] keys: Option<Vec<KeyChoice>>,
) -> impl IntoView {
    let id = finding.id;
    let back = back.unwrap_or_default();
    let orphaned = finding.kind == FindingKind::Orphaned;
    let duplicate = finding.kind == FindingKind::Duplicate;
    let unmetered = finding.kind == FindingKind::Unmetered;
    let refund_label = format!(
        "Yes, refund {} {} to {}",
        finding.at_risk.format(&finding.currency),
        finding.currency.clone(),
        finding.customer_id
    );
    let period = finding.billing_period.to_string();
    view! {
        <div class="alert-actions">
            {orphaned.then(|| view! {
                <form class="row-form" method="post" action=format!("/reconciliation/{id}/adopt")>
                    <input type="hidden" name="period" value=period.clone()/>
                    <input type="hidden" name="return_to" value=back.clone()/>
                    <button type="submit" class="button button-primary"
                        aria-label=format!("Adopt finding {id}")>"Adopt"</button>
                </form>
            })}
            {duplicate.then(|| view! {
                <form class="refund-form" method="post" action=format!("/reconciliation/{id}/refund")>
                    <input type="hidden" name="period" value=period.clone()/>
                    <input type="hidden" name="return_to" value=back.clone()/>
                    <div class="field-check">
                        <input id=format!("refund-confirm-{id}") name="confirm" type="checkbox" value="yes" required/>
                        <label for=format!("refund-confirm-{id}")>{refund_label}</label>
                    </div>
                    <button type="submit" class="button button-danger"
                        aria-label=format!("Refund finding {id}")>"Refund duplicates"</button>
                </form>
            })}
            {unmetered.then(|| match keys {
                None => view! {
                    <a class="button button-primary" href=format!("/reconciliation/{id}")
                        aria-label=format!("Attribute finding {id} to a vault key")>"Attribute…"</a>
                }.into_any(),
                Some(keys) if keys.is_empty() => view! {
                    <p class="hint">{format!(
                        "No {} vault key of {} to attribute it to: dismiss it with what you found.",
                        finding.currency, finding.billing_period
                    )}</p>
                }.into_any(),
                Some(keys) => view! {
                    <form class="attribute-form" method="post" action=format!("/reconciliation/{id}/attribute")>
                        <input type="hidden" name="period" value=period.clone()/>
                        <input type="hidden" name="return_to" value=back.clone()/>
                        <div class="field">
                            <label for=format!("attribute-key-{id}")>"Vault key it belongs to"</label>
                            <select id=format!("attribute-key-{id}") name="vault_key_id" required>
                                <option value="">"Choose a key"</option>
                                {keys.into_iter().map(|key| view! {
                                    <option value=key.id.to_string()>{format!("{} ({}…)", key.label, key.secret_prefix)}</option>
                                }).collect_view()}
                            </select>
                        </div>
                        <div class="field">
                            <label for=format!("attribute-reason-{id}")>"Reason"</label>
                            <input id=format!("attribute-reason-{id}") name="reason" type="text" maxlength="2000" required
                                placeholder="Who made it with the real key, and why"/>
                        </div>
                        <button type="submit" class="button button-primary"
                            aria-label=format!("Attribute finding {id}")>"Attribute"</button>
                    </form>
                }.into_any(),
            })}
            <form class="row-form" method="post" action=format!("/reconciliation/{id}/dismiss")>
                <input type="hidden" name="period" value=period/>
                <input type="hidden" name="return_to" value=back.clone()/>
                <label class="visually-hidden" for=format!("dismiss-{id}")>{format!("Reason to dismiss finding {id}")}</label>
                <input id=format!("dismiss-{id}") name="reason" type="text" maxlength="2000" placeholder="Reason" required class="reason-input"/>
                <button type="submit" class="button button-quiet" aria-label=format!("Dismiss finding {id}")>"Dismiss"</button>
            </form>
        </div>
    }
    .into_any()
}

#[component]
pub(crate) fn Resolution(finding: Finding) -> impl IntoView {
    let resolution = finding.resolution.clone().unwrap_or_default();
    let by = match (&finding.resolved_by, finding.resolved_at) {
        (Some(who), Some(at)) => format!("by {who} at {}", utc(at)),
        (None, Some(at)) => format!("at {}", utc(at)),
        _ => String::new(),
    };
    let class = match resolution.as_str() {
        "dismissed" | "cleared" => "status status-request-expired",
        _ => "status status-request-approved",
    };
    view! {
        <span class=class>{resolution}</span>
        <div class="hint">{by}</div>
        {finding.attributed_to.clone().map(|key| view! { <div class="hint">{format!("To {key}")}</div> })}
        {finding.resolution_note.clone().map(|note| view! { <div class="hint">{format!("Reason: {note}")}</div> })}
    }
    .into_any()
}
