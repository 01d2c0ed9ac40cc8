use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::{use_params_map, use_query_map};

use crate::{
    components::{utc, Amount, ErrorPanel, RequireRole},
    domain::{ApplyAs, ApprovalPreview, KeyRequestPreview, Role},
    error::AppError,
    server_fns::{get_approval_preview, get_key_request_preview},
};

/// The step between an approver's Approve and the decision: what the
/// approval changes (the cap, the utilization, what billing jobs may still
/// charge, the ceiling) and one button that confirms it. A plain page and
/// form, so it is the same with JavaScript off.
#[component]
pub fn ApprovalConfirmPage() -> impl IntoView {
    confirm_page(
        "Confirm the approval",
        "cap increase request",
        get_approval_preview,
        |preview| view! { <Confirmation preview/> }.into_any(),
    )
}

/// A confirmation page: the request in the path (`what`), loaded with the
/// note carried from the Approvals page and shown by `show`, or why there
/// is nothing to confirm.
fn confirm_page<Id, T, Fut>(
    title: &'static str,
    what: &'static str,
    load: impl Fn(Id, Option<String>) -> Fut + Copy + Send + Sync + 'static,
    show: fn(T) -> AnyView,
) -> impl IntoView
where
    Id: std::str::FromStr + Clone + PartialEq + Send + Sync + 'static,
    T: Clone + Send + Sync + serde::Serialize + serde::de::DeserializeOwned + 'static,
    Fut: std::future::Future<Output = Result<T, AppError>> + Send + 'static,
{
    let preview = Resource::new(id_and_note(), move |(id, note)| async move {
        match id {
            Some(id) => load(id, note).await,
            None => Err(AppError::NotFound),
        }
    });
    view! {
        <Title text=title/>
        <RequireRole role=Role::Approver>
            <Suspense>
                {move || Suspend::new(async move {
                    match preview.await {
                        Ok(preview) => show(preview),
                        Err(error) => nothing_to_confirm(error, what),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

/// Why there is nothing to confirm: no such request (`what`), or one this
/// approver may not decide (already decided, expired, their own).
fn nothing_to_confirm(error: AppError, what: &str) -> AnyView {
    match error {
        AppError::NotFound => view! {
            <h1>"Request not found"</h1>
            <section class="panel"><p>{format!("There is no such {what}. ")} <a href="/approvals">"Back to Approvals"</a></p></section>
        }
        .into_any(),
        error => view! {
            <h1>"Nothing to confirm"</h1>
            <ErrorPanel error/>
            <p><a href="/approvals">"Back to Approvals"</a></p>
        }
        .into_any(),
    }
}

/// The id in the path and the note carried from the Approvals page.
fn id_and_note<Id: std::str::FromStr>(
) -> impl Fn() -> (Option<Id>, Option<String>) + Clone + 'static {
    let params = use_params_map();
    let query = use_query_map();
    move || {
        let id = params.with(|p| p.get("id").and_then(|id| id.parse::<Id>().ok()));
        (id, query.with(|q| q.get("note")))
    }
}

#[component]
fn Confirmation(preview: ApprovalPreview) -> impl IntoView {
    let request = preview.request.clone();
    let id = request.id;
    let currency = request.currency.clone();
    let amount = move |cents| view! { <Amount cents currency=currency.clone()/> };
    let follow_on = request.apply_as == ApplyAs::FollowOnKey;
    let consequence = if follow_on {
        format!(
            "A new key for {} is issued with a cap of {} {}, linked to this one; its secret is shown to you once. This key's cap stays as it is.",
            request.key_label,
            request.additional().format(&request.currency),
            request.currency.clone()
        )
    } else {
        format!(
            "The cap of {} goes from {} to {} {}; the proxy applies it from the next call.",
            request.key_label,
            preview.cap_now().format(&request.currency),
            preview.cap_after().format(&request.currency),
            request.currency.clone()
        )
    };
    let confirm_label = if follow_on {
        format!(
            "Approve: issue a key for {}",
            request.additional().format(&request.currency)
        )
    } else {
        format!(
            "Approve: cap {} {}",
            preview.cap_after().format(&request.currency),
            request.currency.clone()
        )
    };
    view! {
        <p class="breadcrumb"><a href="/approvals">"Approvals"</a> " / " {format!("Request #{id}")}</p>
        <h1>{format!("Approve {} for {}?", request.change(), request.key_label)}</h1>
        <section class="panel" aria-labelledby="change-heading">
            <h2 id="change-heading">"What changes"</h2>
            <p data-testid="consequence">{consequence}</p>
            <div class="table-scroll" tabindex="0">
                <table class="data compact" data-testid="approval-figures">
                    <thead>
                        <tr>
                            <th scope="col"></th>
                            <th scope="col" class="num">"Now"</th>
                            <th scope="col" class="num">"Once approved"</th>
                        </tr>
                    </thead>
                    <tbody>
                        <tr>
                            <th scope="row">"Cap"</th>
                            <td class="num">{amount(preview.cap_now())}</td>
                            <td class="num">{amount(preview.cap_after())}</td>
                        </tr>
                        <tr>
                            <th scope="row">"Utilization"</th>
                            <td class="num">{format!("{} %", request.utilization_pct())}</td>
                            <td class="num">{format!("{} %", preview.utilization_after_pct())}</td>
                        </tr>
                        <tr>
                            <th scope="row">"Still chargeable"</th>
                            <td class="num">{amount(preview.headroom_now())}</td>
                            <td class="num"><strong>{amount(preview.headroom_after())}</strong></td>
                        </tr>
                    </tbody>
                </table>
            </div>
            <p class="hint">"Utilization is spent + reserved of the cap; still chargeable is what billing jobs may charge before the proxy refuses, through this key and any follow-on key."</p>
            <dl class="facts">
                <div><dt>"Spent + reserved"</dt><dd>{amount(preview.committed())}</dd></div>
                <div><dt>"Expected total"</dt><dd>{amount(preview.expected_total)}</dd></div>
                <div><dt>"Ceiling for this key"</dt><dd>{amount(preview.ceiling)}</dd></div>
            </dl>
        </section>
        <section class="panel" aria-labelledby="asked-heading">
            <h2 id="asked-heading">"What was asked"</h2>
            <p>{format!("{} asked {} ({} ago, {}): ", request.requested_by, request.origin_label(), request.age(), utc(request.requested_at))} <q>{request.reason.clone()}</q></p>
            <p class="hint">{format!("Undecided, it expires at {}.", utc(request.expires_at))}</p>
        </section>
        {if preview.cap_moved() {
            view! {
                <section class="panel panel-error" role="alert">
                    <p>{format!(
                        "This cannot be approved: {}'s cap changed since the request (from {} to {} {}). Reject it and ask again for what is still needed.",
                        request.key_label,
                        request.from_cap_cents.format(&request.currency),
                        preview.granted.format(&request.currency),
                        request.currency.clone()
                    )}</p>
                    <p><a href="/approvals">"Back to Approvals"</a></p>
                </section>
            }.into_any()
        } else {
            view! {
                <ConfirmForm action=format!("/approvals/{id}/decide") note=preview.note.clone() label=confirm_label/>
            }.into_any()
        }}
    }
    .into_any()
}

/// The step between Approve on a key asked for beyond policy and its
/// issue: what the key may charge, how far beyond policy that is, and what
/// the period's live keys may charge altogether once it is issued.
#[component]
pub fn KeyRequestConfirmPage() -> impl IntoView {
    confirm_page(
        "Confirm the new key",
        "key request",
        get_key_request_preview,
        |preview| view! { <KeyConfirmation preview/> }.into_any(),
    )
}

#[component]
fn KeyConfirmation(preview: KeyRequestPreview) -> impl IntoView {
    let request = preview.request.clone();
    let id = request.id;
    let currency = request.currency.clone();
    let amount = move |cents| view! { <Amount cents currency=currency.clone()/> };
    let cap = format!(
        "{} {}",
        request.cap_cents.format(&request.currency),
        request.currency.clone()
    );
    view! {
        <p class="breadcrumb"><a href="/approvals">"Approvals"</a> " / " {format!("Key request #{id}")}</p>
        <h1>{format!("Issue {} with a cap of {cap}?", request.label)}</h1>
        <section class="panel" aria-labelledby="change-heading">
            <h2 id="change-heading">"What changes"</h2>
            <p data-testid="consequence">{format!(
                "{} is issued for {}: the billing job holding key {}… may charge up to {cap} through the proxy from the moment you confirm, {} {} more than policy allows without an approver.",
                request.label,
                request.billing_period,
                request.secret_prefix,
                preview.above_policy().format(&request.currency),
                request.currency.clone()
            )}</p>
            <dl class="facts facts-money">
                <div><dt>"Cap asked for"</dt><dd>{amount(request.cap_cents)}</dd></div>
                <div><dt>"Expected total"</dt><dd>{amount(request.expected_total_cents)}</dd></div>
                <div><dt>"Policy allows"</dt><dd>{amount(request.policy_cap_cents)}</dd></div>
                <div><dt>"Above policy"</dt><dd>{amount(preview.above_policy())}</dd></div>
                <div><dt>{format!("Live {} {} caps now", request.billing_period, request.currency.clone())}</dt><dd>{amount(preview.live_caps)}</dd></div>
                <div><dt>{format!("Live {} {} caps once approved", request.billing_period, request.currency.clone())}</dt><dd><strong>{amount(preview.live_caps_after())}</strong></dd></div>
            </dl>
        </section>
        <section class="panel" aria-labelledby="asked-heading">
            <h2 id="asked-heading">"What was asked"</h2>
            <p>{format!("{} asked at {}: beyond policy because {}", request.requested_by, utc(request.requested_at), request.over_policy)}</p>
            <p class="hint">{format!("Undecided, it expires at {}.", utc(request.expires_at))}</p>
        </section>
        <ConfirmForm action=format!("/key-requests/{id}/decide") note=preview.note.clone() label=format!("Approve: issue {cap}")/>
    }
    .into_any()
}

/// The one button that confirms an approval, with the note carried along
/// (`confirmed=yes` is what the decision checks for).
#[component]
fn ConfirmForm(action: String, note: String, label: String) -> impl IntoView {
    view! {
        <form class="panel stacked" method="post" action=action>
            <input type="hidden" name="verdict" value="approve"/>
            <input type="hidden" name="confirmed" value="yes"/>
            <div class="field">
                <label for="note">"Note (optional)"</label>
                <input id="note" name="note" type="text" maxlength="2000" value=note/>
            </div>
            <div class="form-actions">
                <button type="submit" class="button button-primary">{label}</button>
                <a class="button button-quiet" href="/approvals">"Back to Approvals"</a>
            </div>
        </form>
    }
}
