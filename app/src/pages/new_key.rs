use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::{
    components::{ErrorPanel, RequireRole},
    domain::{field_error, DuplicatePolicy, KeyDraft, KeyForm, Role, KNOWN_ENDPOINTS},
    server_fns::new_key_form,
};

/// An operator issues the vault key for a billing run from its expected
/// total. A plain form post; a refused one comes back with every field as
/// typed and a message next to each field that needs fixing.
#[component]
pub fn NewKeyPage() -> impl IntoView {
    let query = use_query_map();
    let form = Resource::new(
        move || query.with(|q| (q.get("draft"), q.get("checked"))),
        |(draft, checked)| new_key_form(draft, checked),
    );
    view! {
        <Title text="New vault key"/>
        <RequireRole role=Role::Operator>
            <h1>"New vault key"</h1>
            <Suspense>
                {move || Suspend::new(async move {
                    match form.await {
                        Ok(form) => view! { <KeyFormView form/> }.into_any(),
                        Err(error) => view! { <ErrorPanel error/> }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn KeyFormView(form: KeyForm) -> impl IntoView {
    let KeyForm {
        mut draft,
        errors,
        suggestion,
        label_in_use,
        checked,
    } = form;
    // A fresh form starts from the suggestion.
    if errors.is_empty() && draft.expected_total.is_empty() {
        if let Some(s) = &suggestion {
            draft.expected_total = s.expected.format(&s.currency);
            draft.currency = s.currency.as_str().to_owned();
        }
    }
    let has_errors = !errors.is_empty();
    let errors = StoredValue::new(errors);
    let error_for = move |field: &str| errors.with_value(|errors| field_error(errors, field));
    let suggestion_text = suggestion.map(|s| {
        format!(
            "Suggested: {} {} — {}.",
            s.expected.format(&s.currency),
            s.currency,
            s.source
        )
    });
    let ticked = draft.endpoints.clone();
    let draft_currency = draft.currency.clone();

    view! {
        <form class="panel key-form" method="post" action="/keys" novalidate>
            {match (has_errors, checked) {
                (true, false) => Some(view! {
                    <div class="notice notice-error" role="alert">
                        <p>"Nothing was created: fix the fields marked below."</p>
                    </div>
                }.into_any()),
                (true, true) => Some(view! {
                    <div class="notice notice-error" role="alert">
                        <p>"Checked: fix the fields marked below before creating the key."</p>
                    </div>
                }.into_any()),
                (false, true) => Some(view! {
                    <div class="notice notice-success" role="status">
                        <p>"Checked: the cap below is the one Create vault key issues. Nothing is created until you press it."</p>
                    </div>
                }.into_any()),
                (false, false) => None,
            }}
            <CapFields
                period=draft.period.clone()
                currency=draft.currency.clone()
                expected_total=draft.expected_total.clone()
                buffer_pct=draft.buffer_pct.clone()
                expected_hint=suggestion_text.unwrap_or_else(|| "What the run should charge in all, e.g. 5,000.00.".into())
                errors=errors.get_value()
            />

            <fieldset aria-describedby="endpoints-error">
                <legend>"Allowed endpoints"</legend>
                {KNOWN_ENDPOINTS.into_iter().map(|endpoint| {
                    let id = format!("endpoint-{}", endpoint.replace(['/', ' ', '{', '}'], "-"));
                    let input_id = id.clone();
                    view! {
                        <label class="check" for=id>
                            <input type="checkbox" id=input_id name="endpoint" value=endpoint checked=ticked.iter().any(|t| t == endpoint)/>
                            <code>{endpoint}</code>
                        </label>
                    }
                }).collect_view()}
                <FieldMessage name="endpoints" error=error_for("endpoints")/>
                <Field name="custom_endpoints" label="Other endpoints" error=error_for("custom_endpoints")
                    hint="More of the endpoints Vaultcap meters, one per line: method and path, e.g. GET /v1/charges/{id}.">
                    <textarea id="custom_endpoints" name="custom_endpoints" rows="2"
                        aria-describedby="custom_endpoints-hint custom_endpoints-error">{draft.custom_endpoints.clone()}</textarea>
                </Field>
            </fieldset>

            <div class="grid">
                <Field name="expires_at" label="Expires (UTC)" error=error_for("expires_at") hint="Defaults to the end of the billing period.">
                    <input id="expires_at" name="expires_at" type="datetime-local" value=draft.expires_at.clone() required
                        aria-describedby="expires_at-hint expires_at-error" aria-invalid=error_for("expires_at").is_some().to_string()/>
                </Field>
                <Field name="label" label="Label" error=error_for("label") hint="How people will recognise the key.">
                    <input id="label" name="label" type="text" maxlength="200" value=draft.label.clone() required
                        aria-describedby="label-hint label-error label-in-use" aria-invalid=error_for("label").is_some().to_string()/>
                    {(!label_in_use.is_empty()).then(|| view! {
                        <p class="field-warning" id="label-in-use" data-testid="label-in-use">
                            "A live key already has this label: "
                            {label_in_use.iter().enumerate().map(|(at, (id, period))| view! {
                                {(at > 0).then_some(", ")}
                                <a href=format!("/keys/{id}")>{format!("#{id} for {period}")}</a>
                            }).collect_view()}
                            ". People and billing jobs will confuse them: choose another label."
                        </p>
                    })}
                </Field>
                <Field name="thresholds" label="Alert at (% of cap)" error=error_for("thresholds") hint="Comma-separated, e.g. 75, 90.">
                    <input id="thresholds" name="thresholds" type="text" value=draft.thresholds.clone()
                        aria-describedby="thresholds-hint thresholds-error" aria-invalid=error_for("thresholds").is_some().to_string()/>
                </Field>
                <Field name="duplicate_policy" label="Duplicate guard" error=error_for("duplicate_policy")
                    hint="A second charge for a customer and period under another idempotency key (a redelivered message).">
                    <select id="duplicate_policy" name="duplicate_policy"
                        aria-describedby="duplicate_policy-hint duplicate_policy-error">
                        {DuplicatePolicy::ALL.into_iter().map(|policy| view! {
                            <option value=policy.as_str() selected=draft.duplicate_policy == policy.as_str()>{policy.label()}</option>
                        }).collect_view()}
                    </select>
                </Field>
            </div>
            <div class="form-actions">
                <button type="submit" class="button button-primary">"Create vault key"</button>
                <button type="submit" class="button button-quiet" name="intent" value="check">"Check cap and label"</button>
                <a class="button button-quiet" href="/keys">"Cancel"</a>
            </div>
        </form>
        <form class="panel form-inline" method="post" action="/keys/suggestion" enctype="multipart/form-data">
            <h2>"Expected total from a file"</h2>
            <p class="hint">"A CSV of customer, amount rows (a header row is fine), amounts in the currency's major unit: the total becomes the suggestion above."</p>
            <div class="field">
                <label for="suggestion-file">"CSV file"</label>
                <input id="suggestion-file" name="file" type="file" accept=".csv,text/csv" required/>
            </div>
            <div class="field">
                <label for="suggestion-currency">"Amounts in"</label>
                <input id="suggestion-currency" name="currency" type="text" maxlength="3" value=draft_currency/>
            </div>
            <button type="submit" class="button button-quiet">"Use this file"</button>
        </form>
    }
    .into_any()
}

/// The fields the cap comes from, and the cap they make. An island: in
/// the browser the cap follows what is typed.
#[island]
fn CapFields(
    period: String,
    currency: String,
    expected_total: String,
    buffer_pct: String,
    expected_hint: String,
    errors: Vec<(String, String)>,
) -> impl IntoView {
    let errors = StoredValue::new(errors);
    let error_for = move |field: &str| errors.with_value(|errors| field_error(errors, field));
    let invalid = move |field: &str| error_for(field).is_some().to_string();
    let expected = RwSignal::new(expected_total.clone());
    let buffer = RwSignal::new(buffer_pct.clone());
    let typed_currency = RwSignal::new(currency.clone());
    let preview = move || {
        let typed = KeyDraft {
            expected_total: expected.get(),
            buffer_pct: buffer.get(),
            currency: typed_currency.get(),
            ..KeyDraft::default()
        };
        match typed.preview() {
            Ok((currency, _, cap)) => format!("{} {currency}", cap.format(&currency)),
            Err(why) => format!("none yet ({why})"),
        }
    };
    view! {
        <div class="grid">
            <Field name="period" label="Billing period" error=error_for("period")
                hint="The month the billing run charges for (UTC).">
                <input id="period" name="period" type="month" value=period required
                    aria-describedby="period-hint period-error" aria-invalid=invalid("period")/>
            </Field>
            <Field name="currency" label="Currency" error=error_for("currency") hint="Three letters, as Stripe writes them.">
                <input id="currency" name="currency" type="text" maxlength="3" value=currency required
                    on:input=move |ev| typed_currency.set(event_target_value(&ev))
                    aria-describedby="currency-hint currency-error" aria-invalid=invalid("currency")/>
            </Field>
            <Field name="expected_total" label="Expected total" error=error_for("expected_total") hint=expected_hint>
                <input id="expected_total" name="expected_total" type="text" inputmode="decimal" class="num"
                    value=expected_total required
                    on:input=move |ev| expected.set(event_target_value(&ev))
                    aria-describedby="expected_total-hint expected_total-error"
                    aria-invalid=invalid("expected_total")/>
            </Field>
            <Field name="buffer_pct" label="Buffer (%)" error=error_for("buffer_pct") hint="Added on top of the expected total; 0 to 100.">
                <input id="buffer_pct" name="buffer_pct" type="text" inputmode="decimal" class="num" value=buffer_pct
                    on:input=move |ev| buffer.set(event_target_value(&ev))
                    aria-describedby="buffer_pct-hint buffer_pct-error" aria-invalid=invalid("buffer_pct")/>
            </Field>
        </div>
        <p class="cap-preview">
            "Cap: " <output for="expected_total buffer_pct currency" data-testid="cap-preview">{preview}</output>
            <span class="hint">" = expected total × (1 + buffer), rounded down to the cent. The proxy refuses any charge that would take spent + reserved past it."</span>
        </p>
    }
}

/// A labelled field with its hint and, after a refused submission, its
/// message.
#[component]
fn Field(
    name: &'static str,
    label: &'static str,
    #[prop(into)] hint: String,
    error: Option<String>,
    children: Children,
) -> impl IntoView {
    let invalid = error.is_some();
    view! {
        <div class="field" class:field-invalid=invalid>
            <label for=name>{label}</label>
            {children()}
            <span class="hint" id=format!("{name}-hint")>{hint}</span>
            <FieldMessage name error/>
        </div>
    }
}

#[component]
fn FieldMessage(name: &'static str, error: Option<String>) -> impl IntoView {
    view! {
        <span class="field-error" id=format!("{name}-error")>{error}</span>
    }
}
