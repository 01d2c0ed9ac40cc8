use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::{
    components::{utc, CountTabs, ErrorPanel, RequireRole},
    domain::{Alert, AlertId, AlertsView, Me, OperatorId, Role},
    server_fns::list_alerts,
};

/// Alerts by state. Operators acknowledge (with a note), assign and snooze
/// them with plain form posts; viewers read.
#[component]
pub fn AlertsPage() -> impl IntoView {
    view! {
        <Title text="Alerts"/>
        <RequireRole role=Role::Viewer>
            <AlertsList/>
        </RequireRole>
    }
}

#[component]
fn AlertsList() -> impl IntoView {
    let query = use_query_map();
    let state = move || query.with(|q| q.get("state"));
    let view_data = Resource::new(state, list_alerts);
    let can_act = use_context::<Me>().is_some_and(|me| me.role.allows(Role::Operator));
    view! {
        <h1>"Alerts"</h1>
        <Suspense>
            {move || Suspend::new(async move {
                let shown = state().unwrap_or_else(|| "open".into());
                match view_data.await {
                    Ok(data) => view! { <StateTabs data=data.clone() shown=shown.clone()/> <AlertTable data shown can_act/> }.into_any(),
                    Err(error) => view! { <ErrorPanel error/> }.into_any(),
                }
            })}
        </Suspense>
    }
}

#[component]
fn StateTabs(data: AlertsView, shown: String) -> impl IntoView {
    let total = data.open + data.snoozed + data.acknowledged;
    let tabs = vec![
        ("open", "Open", data.open),
        ("snoozed", "Snoozed", data.snoozed),
        ("acknowledged", "Acknowledged", data.acknowledged),
        ("all", "All", total),
    ];
    view! { <CountTabs label="Alert state" path="/alerts" param="state" tabs shown/> }
}

#[component]
fn AlertTable(data: AlertsView, shown: String, can_act: bool) -> impl IntoView {
    if data.alerts.is_empty() {
        let message = match shown.as_str() {
            "open" => "No open alerts. Keys crossing a threshold, calls refused for a cap and keys about to expire with billing left appear here.",
            "snoozed" => "No snoozed alerts.",
            "acknowledged" => "No acknowledged alerts yet.",
            _ => "No alerts yet.",
        };
        return view! { <section class="panel"><p>{message}</p></section> }.into_any();
    }
    let assignees = data.assignees;
    view! {
        <div class="table-scroll" tabindex="0">
            <table class="data alerts">
                <thead>
                    <tr>
                        <th scope="col">"Raised (UTC)"</th>
                        <th scope="col">"Key"</th>
                        <th scope="col">"Alert"</th>
                        <th scope="col">"State"</th>
                        <th scope="col">"Notified"</th>
                        {can_act.then(|| view! { <th scope="col">"Actions"</th> })}
                    </tr>
                </thead>
                <tbody>
                    {data.alerts.into_iter().map(|alert| {
                        let assignees = assignees.clone();
                        view! { <AlertRow alert assignees can_act/> }
                    }).collect_view()}
                </tbody>
            </table>
        </div>
    }
    .into_any()
}

#[component]
fn AlertRow(alert: Alert, assignees: Vec<(OperatorId, String)>, can_act: bool) -> impl IntoView {
    let id = alert.id;
    let kind = alert.kind_label();
    let repeated = (alert.occurrences > 1).then(|| {
        format!(
            "{} times, last {}",
            alert.occurrences,
            utc(alert.last_occurred_at)
        )
    });
    let handled = match alert.state.as_str() {
        "acknowledged" => format!(
            "by {} at {}",
            alert.acknowledged_by.clone().unwrap_or_default(),
            alert.acknowledged_at.map(utc).unwrap_or_default()
        ),
        "snoozed" => format!("until {}", alert.snoozed_until.map(utc).unwrap_or_default()),
        _ => String::new(),
    };
    let acknowledged = alert.state == "acknowledged";
    view! {
        <tr data-alert=id>
            <td class="nowrap">{utc(alert.raised_at)}</td>
            <td class="nowrap"><a href=format!("/keys/{}", alert.vault_key_id)>{alert.key_label.clone()}</a></td>
            <td>
                <strong>{kind}</strong>
                <div>{alert.describe()}</div>
                {repeated.map(|text| view! { <div class="hint">{text}</div> })}
                {alert.ack_note.clone().map(|note| view! { <div class="hint">{format!("Note: {note}")}</div> })}
            </td>
            <td>
                <span class=format!("status status-alert-{}", alert.state)>{alert.state.clone()}</span>
                <div class="hint">{handled}</div>
                {alert.assigned_to.clone().map(|who| view! { <div class="hint">{format!("Assigned to {who}")}</div> })}
            </td>
            <td class="nowrap">
                <Deliveries alert=alert.clone()/>
            </td>
            {(can_act).then(|| view! {
                <td>
                    {(!acknowledged).then(|| view! { <div class="alert-actions"><AlertActions id assignees/></div> })}
                    {(alert.kind != "expiring").then(|| view! {
                        <a href=format!("/keys/{}/cap-increase?origin=alert:{id}", alert.vault_key_id)>"Request cap increase"</a>
                    })}
                </td>
            })}
        </tr>
    }
    .into_any()
}

#[component]
fn Deliveries(alert: Alert) -> impl IntoView {
    let (delivered, pending, failed) = (
        alert.deliveries_delivered,
        alert.deliveries_pending,
        alert.deliveries_failed,
    );
    let text = if delivered + pending + failed == 0 {
        "no webhooks".to_string()
    } else {
        let mut parts = vec![format!("{delivered} delivered")];
        if pending > 0 {
            parts.push(format!("{pending} retrying"));
        }
        if failed > 0 {
            parts.push(format!("{failed} failed"));
        }
        parts.join(", ")
    };
    let class = if failed > 0 {
        "delivery delivery-failed"
    } else if pending > 0 {
        "delivery delivery-pending"
    } else {
        "delivery"
    };
    view! { <span class=class>{text}</span> }
}

#[component]
fn AlertActions(id: AlertId, assignees: Vec<(OperatorId, String)>) -> impl IntoView {
    view! {
        <form class="row-form" method="post" action=format!("/alerts/{id}/ack")>
            <label class="visually-hidden" for=format!("note-{id}")>{format!("Note for alert {id}")}</label>
            <input id=format!("note-{id}") name="note" type="text" maxlength="2000" placeholder="Note (optional)"/>
            <button type="submit" class="button button-primary">"Acknowledge"</button>
        </form>
        <form class="row-form" method="post" action=format!("/alerts/{id}/assign")>
            <label class="visually-hidden" for=format!("assignee-{id}")>{format!("Assign alert {id} to")}</label>
            <select id=format!("assignee-{id}") name="operator">
                <option value="">"Nobody"</option>
                {assignees.into_iter().map(|(operator, email)| view! {
                    <option value=operator.to_string()>{email}</option>
                }).collect_view()}
            </select>
            <button type="submit" class="button button-quiet">"Assign"</button>
        </form>
        <form class="row-form" method="post" action=format!("/alerts/{id}/snooze")>
            <label class="visually-hidden" for=format!("snooze-{id}")>{format!("Snooze alert {id} for")}</label>
            <select id=format!("snooze-{id}") name="hours">
                <option value="1">"1 hour"</option>
                <option value="4">"4 hours"</option>
                <option value="24" selected>"1 day"</option>
                <option value="72">"3 days"</option>
            </select>
            <button type="submit" class="button button-quiet">"Snooze"</button>
        </form>
    }
    .into_any()
}
