use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{Amount, ErrorPanel, RequireRole},
    domain::{Cents, Overview, Role},
    server_fns::get_overview,
};

#[component]
pub fn OverviewPage() -> impl IntoView {
    let overview = OnceResource::new(get_overview());
    view! {
        <Title text="Overview"/>
        <RequireRole role=Role::Viewer>
            <Suspense>
                {move || Suspend::new(async move {
                    match overview.await {
                        Ok(overview) => view! { <PeriodSummary overview/> }.into_any(),
                        Err(error) => view! { <h1>"Overview"</h1><ErrorPanel error/> }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn PeriodSummary(overview: Overview) -> impl IntoView {
    let period = overview.period.to_string();
    view! {
        <h1>"Overview " <span class="muted">{period.clone()}</span></h1>
        {if overview.totals.is_empty() {
            view! {
                <section class="panel">
                    <p>"No vault keys were issued for " {period.clone()} " yet."</p>
                    <p class="hint">"Billing jobs get their key from the key API before a run; keys appear here as soon as they exist."</p>
                </section>
            }.into_any()
        } else {
            view! {
                <table class="data">
                    <caption>"Vault keys this period, by currency"</caption>
                    <thead>
                        <tr>
                            <th scope="col">"Currency"</th>
                            <th scope="col" class="num">"Keys (active)"</th>
                            <th scope="col" class="num">"Expected"</th>
                            <th scope="col" class="num">"Cap"</th>
                            <th scope="col" class="num">"Spent"</th>
                            <th scope="col" class="num">"Reserved"</th>
                            <th scope="col" class="num">"Utilization"</th>
                        </tr>
                    </thead>
                    <tbody>
                        {overview.totals.into_iter().map(|t| {
                            let pct = Cents(t.spent.0 + t.reserved.0).percent_of(t.cap);
                            view! {
                                <tr>
                                    <th scope="row">{t.currency.to_string()}</th>
                                    <td class="num">{format!("{} ({})", t.keys, t.active_keys)}</td>
                                    <td class="num"><Amount cents=t.expected_total currency=t.currency.clone()/></td>
                                    <td class="num"><Amount cents=t.cap currency=t.currency.clone()/></td>
                                    <td class="num"><Amount cents=t.spent currency=t.currency.clone()/></td>
                                    <td class="num"><Amount cents=t.reserved currency=t.currency.clone()/></td>
                                    <td class="num">{format!("{pct} %")}</td>
                                </tr>
                            }
                        }).collect_view()}
                    </tbody>
                </table>
            }.into_any()
        }}
        <section class="panel">
            <h2>"Billing ledger"</h2>
            <p>
                <strong>{overview.billing_records}</strong>
                " customers recorded as charged in " {period} " by the billing jobs"
                {overview.billed_customers_amount.into_iter().map(|(currency, total)| view! {
                    ", " <Amount cents=total currency/>
                }).collect_view()}
                "."
            </p>
        </section>
    }
}
