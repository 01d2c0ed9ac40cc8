use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::{use_params_map, use_query_map};

use crate::{
    components::{utc, Amount, ErrorPanel, RequireRole, UtilizationMeter},
    domain::{ApplyAs, CapIncreaseForm, Role, VaultKeyId},
    error::AppError,
    server_fns::get_cap_increase_form,
};

/// An operator asks for a higher cap on one key, with a reason; an
/// approver other than them decides on the Approvals page. Opened from the
/// key's page, from an alert or from a refused call, which prefills the
/// suggestion with the charge that was refused.
#[component]
pub fn CapIncreasePage() -> impl IntoView {
    let params = use_params_map();
    let query = use_query_map();
    let args = move || {
        let key = params.with(|p| p.get("id").and_then(|id| id.parse::<VaultKeyId>().ok()));
        query.with(|q| (key, q.get("origin"), q.get("remaining"), q.get("draft")))
    };
    let form = Resource::new(args, |(key, origin, remaining, draft)| async move {
        match key {
            Some(key) => get_cap_increase_form(key, origin, remaining, draft).await,
            None => Err(AppError::NotFound),
        }
    });
    view! {
        <Title text="Request a cap increase"/>
        <RequireRole role=Role::Operator>
            <Suspense>
                {move || Suspend::new(async move {
                    match form.await {
                        Ok(form) => view! { <RequestForm form/> }.into_any(),
                        Err(AppError::NotFound) => view! {
                            <h1>"Vault key not found"</h1>
                            <section class="panel"><p>"There is no such vault key. " <a href="/keys">"Back to the keys list"</a></p></section>
                        }.into_any(),
                        Err(error) => view! {
                            <h1>"Request a cap increase"</h1>
                            <ErrorPanel error/>
                            <p><a href=move || format!("/keys/{}/cap-increase", args().0.map_or(0, |key| key.0))>"Start again from the suggestion"</a></p>
                        }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn RequestForm(form: CapIncreaseForm) -> impl IntoView {
    let key = form.key.clone();
    let currency = key.currency.clone();
    let id = key.id;
    let draft = form.draft.clone().unwrap_or_default();
    let new_cap = if draft.new_cap.is_empty() {
        form.suggestion
            .suggested_cap()
            .map(|cap| cap.format(&currency))
            .unwrap_or_default()
    } else {
        draft.new_cap.clone()
    };
    let follow_on = draft.apply_as == ApplyAs::FollowOnKey.as_str();
    let derivation = form.suggestion.derivation(&currency);
    let origin = form.origin.clone();
    // Where no request can be made, the reason and what to do replace the form.
    let closed = if let Some(pending) = form.pending.clone() {
        Some(view! {
            <section class="panel" data-testid="no-request">
                <p>
                    {format!("Request #{} ({}) already waits for a decision on this key; a second one cannot be made until it is decided. ", pending.id, pending.change())}
                    <a href="/approvals">"See it on the Approvals page"</a>
                </p>
            </section>
        }.into_any())
    } else if key.status != crate::domain::KeyStatus::Active {
        Some(
            view! {
                <section class="panel panel-warning" data-testid="no-request">
                    <p>
                        {format!("This key is {}: its cap cannot be raised. ", key.status.as_str())}
                        <a href="/keys/new">"Issue a new key for the run"</a>
                    </p>
                </section>
            }
            .into_any(),
        )
    } else {
        None
    };
    let refused_waiting = form.refused_waiting;
    view! {
        <p class="breadcrumb"><a href="/keys">"Vault keys"</a> " / " <a href=format!("/keys/{id}")>{key.label.clone()}</a></p>
        <h1>{format!("Request a cap increase for {}", key.label)}</h1>
        <section class="panel" aria-labelledby="now-heading">
            <h2 id="now-heading">"Where the key stands"</h2>
            <UtilizationMeter key=key.clone() large=true/>
            <dl class="facts facts-money">
                <div><dt>"Spent"</dt><dd><Amount cents=key.spent currency=currency.clone()/></dd></div>
                <div><dt>"Reserved (in flight)"</dt><dd><Amount cents=key.reserved currency=currency.clone()/></dd></div>
                <div><dt>"Current cap"</dt><dd><Amount cents=form.granted currency=currency.clone()/></dd></div>
                <div><dt>"Expected total"</dt><dd><Amount cents=key.expected_total currency=currency.clone()/></dd></div>
                <div><dt>"Ceiling"</dt><dd><Amount cents=form.ceiling currency=currency.clone()/></dd></div>
            </dl>
            {form.refused_charge.map(|cents| view! {
                <p class="hint">"The refused charge this request is about: " <Amount cents currency=currency.clone()/></p>
            })}
            {(refused_waiting.charges > 0).then(|| view! {
                <p data-testid="refused-waiting">
                    {match refused_waiting.charges {
                        1 => "1 charge the cap refused has not got through since: ".to_owned(),
                        n => format!("{n} charges the cap refused have not got through since: "),
                    }}
                    <Amount cents=refused_waiting.total currency=currency.clone()/>
                    " "<a href=format!("/audit?key={id}&decision=refused_cap")>"See them in the audit log"</a>
                </p>
            })}
        </section>

        {match closed {
            Some(reason) => reason,
            None => view! {
        <form class="panel stacked" method="get" action=format!("/keys/{id}/cap-increase") aria-labelledby="suggest-heading">
            <h2 id="suggest-heading">"Suggested cap"</h2>
            <p class="derivation" data-testid="suggestion-derivation">{derivation}</p>
            <input type="hidden" name="origin" value=origin.clone()/>
            <div class="field">
                <label for="remaining">"Billing still to come"</label>
                <input id="remaining" name="remaining" type="text" inputmode="decimal" class="num"
                    value=form.suggestion.remaining.format(&currency) aria-describedby="remaining-hint"/>
                <span class="hint" id="remaining-hint">"Defaults to the expected total not yet spent, and at least what the cap refused."</span>
            </div>
            <button type="submit" class="button button-quiet">"Recalculate"</button>
        </form>

        <form class="panel stacked" method="post" action=format!("/keys/{id}/cap-increase-requests") aria-labelledby="request-heading">
            <h2 id="request-heading">"Request"</h2>
            <input type="hidden" name="origin" value=origin/>
            <div class="field">
                <label for="new_cap">{format!("New cap ({currency})")}</label>
                <input id="new_cap" name="new_cap" type="text" inputmode="decimal" class="num" value=new_cap required
                    aria-describedby="new_cap-hint"/>
                <span class="hint" id="new_cap-hint">{format!(
                    "Above the current cap {} and at most the ceiling {} {currency}.",
                    form.granted.format(&currency), form.ceiling.format(&currency)
                )}</span>
            </div>
            <div class="field">
                <label for="reason">"Reason (the approver decides on it)"</label>
                <textarea id="reason" name="reason" rows="3" maxlength="2000" required>{draft.reason.clone()}</textarea>
            </div>
            <fieldset class="choices">
                <legend>"When approved"</legend>
                <label class="check" for="apply-raise">
                    <input id="apply-raise" type="radio" name="apply_as" value="raise_cap" checked=!follow_on/>
                    <span><strong>{ApplyAs::RaiseCap.label()}</strong> <span class="hint">" — the billing job keeps its key; the proxy sees the new cap on the next call."</span></span>
                </label>
                <label class="check" for="apply-follow-on">
                    <input id="apply-follow-on" type="radio" name="apply_as" value="follow_on_key" checked=follow_on/>
                    <span><strong>{ApplyAs::FollowOnKey.label()}</strong> <span class="hint">" — a new key for the difference, linked to this one; its secret is shown once to the approver."</span></span>
                </label>
            </fieldset>
            <p class="hint">{format!(
                "An approver other than you decides by {}, or the request expires; until then nothing changes.",
                utc(form.decide_by)
            )}</p>
            <div class="form-actions">
                <button type="submit" class="button button-primary">"Request increase"</button>
                <a class="button button-quiet" href=format!("/keys/{id}")>"Cancel"</a>
            </div>
        </form>
            }.into_any(),
        }}
    }
    .into_any()
}
