use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::{
    components::{col, num, Amount, DataTable, ErrorPanel, RequireRole},
    domain::{counted, BulkAction, BulkPreview, MAX_BULK},
    server_fns::preview_bulk,
};

/// The preview of a bulk resolution (operator role): how many findings,
/// how much money, which ones; then one confirmation for exactly those.
#[component]
pub fn BulkResolvePage() -> impl IntoView {
    let query = use_query_map();
    let args = move || {
        query.with(|q| {
            (
                q.get("period"),
                q.get("kind"),
                q.get("customer"),
                q.get("action"),
            )
        })
    };
    let preview = Resource::new(args, |(period, kind, customer, action)| {
        preview_bulk(period, kind, customer, action)
    });
    view! {
        <Title text="Bulk resolution"/>
        <RequireRole role=crate::domain::Role::Operator>
            <Suspense>
                {move || Suspend::new(async move {
                    match preview.await {
                        Ok(preview) => view! { <Preview preview/> }.into_any(),
                        Err(error) => view! {
                            <h1>"Bulk resolution"</h1>
                            <ErrorPanel error/>
                            <p><a href="/reconciliation">"Back to reconciliation"</a></p>
                        }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn Preview(preview: BulkPreview) -> impl IntoView {
    let period = preview.period.to_string();
    let back = format!("/reconciliation?{}", preview.back_query);
    let scope = if preview.customer.is_empty() {
        String::new()
    } else {
        format!(" for customers starting with {}", preview.customer)
    };
    let count = preview.findings.len();
    let total = preview.total_text();
    let what = match preview.action {
        BulkAction::Adopt => format!(
            "Adopt {} in {period}{scope}",
            counted(count, "orphaned charge", "orphaned charges")
        ),
        BulkAction::Refund => format!(
            "Refund {} in {period}{scope}",
            counted(count, "duplicate finding", "duplicate findings")
        ),
        BulkAction::Dismiss => format!(
            "Dismiss {} in {period}{scope}",
            counted(count, "finding", "findings")
        ),
    };
    let effect = match preview.action {
        BulkAction::Adopt => format!(
            "Vaultcap writes the missing billing record of each customer ({total} of charges Stripe already took), so a redelivered message skips them."
        ),
        BulkAction::Refund => format!(
            "Vaultcap refunds every charge but the keeper in Stripe, reason duplicate: {total} goes back to the customers. A refund cannot be undone."
        ),
        BulkAction::Dismiss => format!(
            "The findings close with your reason and stay in the record; nothing changes in Stripe or the ledger ({total} at risk)."
        ),
    };
    let confirm = match preview.action {
        BulkAction::Refund => format!(
            "Yes, refund {total} to {}",
            counted(count, "customer", "customers")
        ),
        BulkAction::Adopt => format!(
            "Yes, adopt {}",
            counted(count, "orphaned charge", "orphaned charges")
        ),
        BulkAction::Dismiss => format!("Yes, dismiss {}", counted(count, "finding", "findings")),
    };
    let danger = preview.action == BulkAction::Refund;
    view! {
        <p class="breadcrumb"><a href=back.clone()>{format!("Reconciliation {period}")}</a>" / bulk"</p>
        <h1>{what}</h1>
        {if count == 0 {
            view! {
                <section class="panel">
                    <p data-testid="bulk-empty">"No open finding matches: there is nothing to do."</p>
                    <p><a href=back.clone()>"Back to the findings"</a></p>
                </section>
            }.into_any()
        } else {
            view! {
                <section class=if danger { "panel panel-danger" } else { "panel" } aria-labelledby="bulk-summary">
                    <h2 id="bulk-summary">"What happens"</h2>
                    <dl class="facts facts-money">
                        <div><dt>"Findings"</dt><dd data-testid="bulk-count">{count}</dd></div>
                        <div><dt>"Money at risk"</dt><dd data-testid="bulk-total">{total.clone()}</dd></div>
                    </dl>
                    <p>{effect}</p>
                    {(preview.left_over > 0).then(|| view! {
                        <p class="hint">{format!("{} more match; at most {MAX_BULK} are resolved at once. Run it again for the rest.", counted(preview.left_over as usize, "open finding", "open findings"))}</p>
                    })}
                    <form method="post" action="/reconciliation/bulk" class="stacked">
                        <input type="hidden" name="action" value=preview.action.as_str()/>
                        <input type="hidden" name="period" value=period.clone()/>
                        <input type="hidden" name="kind" value=preview.kind.map(|k| k.as_str()).unwrap_or("all")/>
                        <input type="hidden" name="customer" value=preview.customer.clone()/>
                        <input type="hidden" name="ids" value=preview.ids()/>
                        {(preview.action == BulkAction::Dismiss).then(|| view! {
                            <div class="field">
                                <label for="bulk-reason">"Reason (recorded on every finding)"</label>
                                <textarea id="bulk-reason" name="reason" rows="2" maxlength="2000" required></textarea>
                            </div>
                        })}
                        <div class="field field-check">
                            <input id="bulk-confirm" name="confirm" type="checkbox" value="yes" required/>
                            <label for="bulk-confirm">{confirm}</label>
                        </div>
                        <div class="form-actions">
                            <button type="submit" class=if danger { "button button-danger" } else { "button button-primary" }>
                                {preview.action.label()}
                            </button>
                            <a class="button button-quiet" href=back.clone()>"Cancel"</a>
                        </div>
                    </form>
                </section>
                <DataTable class="data" columns=vec![col("Finding"), col("Customer"), col("Charges"), num("At risk")]>
                    {preview.findings.iter().map(|finding| view! {
                        <tr data-finding=finding.id>
                            <td class="nowrap"><a href=format!("/reconciliation/{}", finding.id)>{format!("#{}", finding.id)}</a>{format!(" {}", finding.kind.one())}</td>
                            <td>{finding.customer_id.clone()}</td>
                            <td><code>{finding.charge_ids.join(", ")}</code></td>
                            <td class="num"><Amount cents=finding.at_risk currency=finding.currency.clone()/></td>
                        </tr>
                    }).collect_view()}
                </DataTable>
            }.into_any()
        }}
    }
    .into_any()
}
