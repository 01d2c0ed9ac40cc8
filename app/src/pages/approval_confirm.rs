use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::{use_params_map, use_query_map};

use crate::{
    components::{utc, Amount, ErrorPanel, RequireRole},
    domain::{ApplyAs, ApprovalPreview, Cents, Role},
    error::AppError,
    server_fns::get_approval_preview,
};

/// The step between an approver's Approve and the decision: what the
/// approval changes (the cap, the utilization, what billing jobs may still
/// charge, the ceiling) and one button that confirms it. A plain page and
/// form, so it is the same with JavaScript off.
#[component]
pub fn ApprovalConfirmPage() -> impl IntoView {
    let params = use_params_map();
    let query = use_query_map();
    let args = move || {
        let id = params.with(|p| p.get("id").and_then(|id| id.parse::<i64>().ok()));
        (id, query.with(|q| q.get("note")))
    };
    let preview = Resource::new(args, |(id, note)| async move {
        match id {
            Some(id) => get_approval_preview(id, note).await,
            None => Err(AppError::NotFound),
        }
    });
    view! {
        <Title text="Confirm the approval"/>
        <RequireRole role=Role::Approver>
            <Suspense>
                {move || Suspend::new(async move {
                    match preview.await {
                        Ok(preview) => view! { <Confirmation preview/> }.into_any(),
                        Err(AppError::NotFound) => view! {
                            <h1>"Request not found"</h1>
                            <section class="panel"><p>"There is no such cap increase request. " <a href="/approvals">"Back to Approvals"</a></p></section>
                        }.into_any(),
                        Err(error) => view! {
                            <h1>"Nothing to confirm"</h1>
                            <ErrorPanel error/>
                            <p><a href="/approvals">"Back to Approvals"</a></p>
                        }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn Confirmation(preview: ApprovalPreview) -> impl IntoView {
    let request = preview.request.clone();
    let id = request.id;
    let currency = request.currency();
    let amount = move |cents| view! { <Amount cents currency=currency.clone()/> };
    let follow_on = request.apply_as() == ApplyAs::FollowOnKey;
    let consequence = if follow_on {
        format!(
            "A new key for {} is issued with a cap of {} {}, linked to this one; its secret is shown to you once. This key's cap stays as it is.",
            request.key_label,
            request.additional().format(&request.currency()),
            request.currency()
        )
    } else {
        format!(
            "The cap of {} goes from {} to {} {}; the proxy applies it from the next call.",
            request.key_label,
            preview.cap_now().format(&request.currency()),
            preview.cap_after().format(&request.currency()),
            request.currency()
        )
    };
    let confirm_label = if follow_on {
        format!(
            "Approve: issue a key for {}",
            request.additional().format(&request.currency())
        )
    } else {
        format!(
            "Approve: cap {} {}",
            preview.cap_after().format(&request.currency()),
            request.currency()
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
                        Cents(request.from_cap_cents).format(&request.currency()),
                        preview.granted.format(&request.currency()),
                        request.currency()
                    )}</p>
                    <p><a href="/approvals">"Back to Approvals"</a></p>
                </section>
            }.into_any()
        } else {
            view! {
                <form class="panel stacked" method="post" action=format!("/approvals/{id}/decide")>
                    <input type="hidden" name="verdict" value="approve"/>
                    <input type="hidden" name="confirmed" value="yes"/>
                    <div class="field">
                        <label for="note">"Note (optional)"</label>
                        <input id="note" name="note" type="text" maxlength="2000" value=preview.note.clone()/>
                    </div>
                    <div class="form-actions">
                        <button type="submit" class="button button-primary">{confirm_label}</button>
                        <a class="button button-quiet" href="/approvals">"Back to Approvals"</a>
                    </div>
                </form>
            }.into_any()
        }}
    }
    .into_any()
}
