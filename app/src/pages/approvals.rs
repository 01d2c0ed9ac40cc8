use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::{
    components::{col, num, utc, Amount, CountTabs, DataTable, ErrorPanel, RequireRole},
    domain::{ApprovalsView, CapIncrease, KeyRequest, Me, RequestState, Role},
    server_fns::list_approvals,
};

/// Cap increases waiting for a decision, and the history. Approvers other
/// than the requester approve or reject each with a note (the four-eyes
/// rule); everyone else reads.
#[component]
pub fn ApprovalsPage() -> impl IntoView {
    let query = use_query_map();
    let tab = move || query.with(|q| q.get("tab"));
    let view_data = Resource::new(tab, list_approvals);
    let me = StoredValue::new(use_context::<Me>());
    view! {
        <Title text="Approvals"/>
        <RequireRole role=Role::Viewer>
            <h1>"Approvals"</h1>
            <Suspense>
                {move || {
                    let me = me.get_value();
                    Suspend::new(async move {
                        let shown = tab().unwrap_or_else(|| "pending".into());
                        match view_data.await {
                            Ok(data) => view! {
                                <ApprovalTabs data=data.clone() shown=shown.clone()/>
                                <KeyRequestTable requests=data.key_requests.clone() me=me.clone()/>
                                <RequestTable data shown me/>
                            }.into_any(),
                            Err(error) => view! { <ErrorPanel error/> }.into_any(),
                        }
                    })
                }}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn ApprovalTabs(data: ApprovalsView, shown: String) -> impl IntoView {
    let tabs = vec![
        ("pending", "Waiting for a decision", data.pending),
        ("history", "History", data.history),
    ];
    view! { <CountTabs label="Requests" path="/approvals" param="tab" tabs shown/> }
}

/// New keys asked for beyond the key policy: an approver other than the
/// requester issues or rejects each.
#[component]
fn KeyRequestTable(requests: Vec<KeyRequest>, me: Option<Me>) -> impl IntoView {
    if requests.is_empty() {
        return ().into_any();
    }
    let can_decide = me.as_ref().is_some_and(|me| me.role.allows(Role::Approver));
    let me_id = me.map(|me| me.id);
    view! {
        <section aria-labelledby="key-requests">
            <h2 id="key-requests">"New keys beyond policy"</h2>
            <DataTable class="data approvals stack" columns=vec![col("Requested (UTC)"), col("Key"), num("Cap asked for"), col("Beyond policy because"), col("Decision")]>
                {requests.into_iter().map(|request| {
                    let own = me_id.is_some() && request.requested_by_id == me_id;
                    view! { <KeyRequestRow request can_decide own/> }
                }).collect_view()}
            </DataTable>
        </section>
        <h2>"Cap increases"</h2>
    }
    .into_any()
}

#[component]
fn KeyRequestRow(request: KeyRequest, can_decide: bool, own: bool) -> impl IntoView {
    let id = request.id;
    let currency = request.currency.clone();
    let expires =
        view! { <div class="hint">{format!("expires {}", utc(request.expires_at))}</div> };
    let decision = if own {
        view! {
            <p class="hint">"You asked for this key: another approver decides it (four-eyes rule)."</p>
            {expires}
        }
        .into_any()
    } else if !can_decide {
        view! { <p class="hint">"Waiting for an approver."</p> {expires} }.into_any()
    } else {
        view! {
            <DecideForm action=format!("/key-requests/{id}/decide") subject=format!("key request {id}")
                confirm_at=format!("/key-requests/{id}/confirm")/>
            {expires}
        }
        .into_any()
    };
    view! {
        <tr data-key-request=id>
            <td data-label="Requested (UTC)">
                <span class="nowrap">{utc(request.requested_at)}</span>
                <div class="hint">{format!("#{id} · by {}", request.requested_by)}</div>
            </td>
            <td data-label="Key">
                {request.label.clone()}
                <div class="hint">{format!("{} · key {}…", request.billing_period, request.secret_prefix)}</div>
            </td>
            <td class="num" data-label="Cap asked for">
                <strong><Amount cents=request.cap_cents currency=currency.clone()/></strong>
                <div class="hint">{format!(
                    "expected {} · policy allows {}",
                    request.expected_total_cents.format(&currency),
                    request.policy_cap_cents.format(&currency)
                )}</div>
            </td>
            <td class="reason" data-label="Beyond policy because">{request.over_policy.clone()}</td>
            <td data-label="Decision">{decision}</td>
        </tr>
    }
    .into_any()
}

#[component]
fn RequestTable(data: ApprovalsView, shown: String, me: Option<Me>) -> impl IntoView {
    let pending = shown != "history";
    if data.requests.is_empty() {
        let message = if pending && !data.key_requests.is_empty() {
            "No cap increase waits for a decision."
        } else if pending {
            "Nothing waits for a decision. Requests to raise a key's cap appear here; an approver other than the requester decides each."
        } else {
            "No cap increase has been decided or has expired yet."
        };
        return view! { <section class="panel"><p>{message}</p></section> }.into_any();
    }
    let can_decide = me.as_ref().is_some_and(|me| me.role.allows(Role::Approver));
    let me_id = me.map(|me| me.id);
    view! {
        <div class="table-scroll" tabindex="0">
            <table class="data approvals stack">
                <thead>
                    <tr>
                        <th scope="col">"Requested (UTC)"</th>
                        <th scope="col">"Key"</th>
                        <th scope="col" class="num">"Requested cap"</th>
                        <th scope="col">"Reason"</th>
                        <th scope="col">{if pending { "Decision" } else { "Outcome" }}</th>
                    </tr>
                </thead>
                <tbody>
                    {data.requests.into_iter().map(|request| {
                        let own = me_id.is_some() && request.requested_by_id == me_id;
                        view! { <RequestRow request can_decide own/> }
                    }).collect_view()}
                </tbody>
            </table>
        </div>
    }
    .into_any()
}

#[component]
fn RequestRow(request: CapIncrease, can_decide: bool, own: bool) -> impl IntoView {
    let id = request.id;
    let currency = request.currency.clone();
    let state = request.state;
    let pct = request.utilization_pct();
    let util_class = if pct >= 90 { "util-high" } else { "" };
    view! {
        <tr data-request=id>
            <td data-label="Requested (UTC)">
                <span class="nowrap">{utc(request.requested_at)}</span>
                <div class="hint">{format!("#{id} · {} ago", request.age())}</div>
                <div class="hint">{format!("by {} {}", request.requested_by, request.origin_label())}</div>
            </td>
            <td class="nowrap" data-label="Key">
                <a href=format!("/keys/{}", request.vault_key_id)>{request.key_label.clone()}</a>
                <div class=format!("hint {util_class}")>{format!("{pct} % of cap used now")}</div>
            </td>
            <td class="num" data-label="Requested cap">
                <strong><Amount cents=request.to_cap_cents currency=currency.clone()/></strong>
                <div class="hint">{format!(
                    "from {} · +{}",
                    request.from_cap_cents.format(&currency),
                    request.additional().format(&currency)
                )}</div>
                <div class="hint">{request.apply_as.label()}</div>
            </td>
            <td class="reason" data-label="Reason">{request.reason.clone()}</td>
            <td data-label=if matches!(state, RequestState::Pending) { "Decision" } else { "Outcome" }>
                {match state {
                    RequestState::Pending => view! {
                        <PendingCell request=request.clone() can_decide own/>
                    }.into_any(),
                    _ => view! { <Outcome request=request.clone()/> }.into_any(),
                }}
            </td>
        </tr>
    }
    .into_any()
}

#[component]
fn PendingCell(request: CapIncrease, can_decide: bool, own: bool) -> impl IntoView {
    let id = request.id;
    let expires =
        view! { <div class="hint">{format!("expires {}", utc(request.expires_at))}</div> };
    if own {
        return view! {
            <p class="hint">"You asked for this increase: another approver decides it (four-eyes rule)."</p>
            {expires}
        }
        .into_any();
    }
    if !can_decide {
        return view! { <p class="hint">"Waiting for an approver."</p> {expires} }.into_any();
    }
    view! {
        <DecideForm action=format!("/approvals/{id}/decide") subject=format!("request {id}")
            confirm_at=format!("/approvals/{id}/confirm")/>
        {expires}
    }
    .into_any()
}

/// Approve, or reject with a note, the request the form posts to;
/// `subject` names it for screen readers (`request 7`, `key request 3`).
/// With `confirm_at`, Approve first opens that page, which shows what the
/// approval changes and confirms it (the note goes along).
#[component]
fn DecideForm(
    action: String,
    subject: String,
    #[prop(optional, into)] confirm_at: Option<String>,
) -> impl IntoView {
    let confirm_method = confirm_at.is_some().then_some("get");
    // An ellipsis: the button leads to a step, it does not decide yet.
    let approve_text = if confirm_at.is_some() {
        "Approve…"
    } else {
        "Approve"
    };
    let note_id = format!("note-{}", subject.replace(' ', "-"));
    view! {
        <form class="decide-form" method="post" action=action>
            <label class="visually-hidden" for=note_id.clone()>{format!("Note on {subject}")}</label>
            <input id=note_id name="note" type="text" maxlength="2000"
                placeholder="Note (a rejection needs one)"/>
            <div class="row-form">
                <button type="submit" name="verdict" value="approve" class="button button-primary"
                    formaction=confirm_at formmethod=confirm_method
                    aria-label=format!("Approve {subject}")>{approve_text}</button>
                <button type="submit" name="verdict" value="reject" class="button button-quiet"
                    aria-label=format!("Reject {subject}")>"Reject"</button>
            </div>
        </form>
    }
}

#[component]
fn Outcome(request: CapIncrease) -> impl IntoView {
    let state = request.state;
    let detail = match state {
        RequestState::Expired => format!("undecided by {}", utc(request.expires_at)),
        _ => format!(
            "by {} at {}",
            request.decided_by.clone().unwrap_or_default(),
            request.decided_at.map(utc).unwrap_or_default()
        ),
    };
    view! {
        <span class=format!("status status-request-{}", state.as_str())>{state.as_str()}</span>
        <div class="hint">{detail}</div>
        {request.decision_note.clone().map(|note| view! { <div class="hint">{format!("Note: {note}")}</div> })}
        {request.follow_on_key_id.map(|key| view! {
            <div><a href=format!("/keys/{key}")>"Follow-on key"</a></div>
        })}
    }
    .into_any()
}
