use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{
        utc, Amount, DayFiguresTable, ErrorPanel, ReplicaLagNotice, RequireRole, UtilizationMeter,
    },
    domain::{group_thousands, Overview, PeriodState, PeriodStatus, Role, SpendChart},
    server_fns::get_overview,
};

/// How often the hydrated page asks for fresh numbers.
const REFRESH_MS: u64 = 5_000;

/// The current billing period at a glance. Rendered complete on the server;
/// once hydrated it refreshes its numbers every five seconds.
#[component]
pub fn OverviewPage() -> impl IntoView {
    let overview = OnceResource::new(get_overview());
    view! {
        <Title text="Overview"/>
        <RequireRole role=Role::Viewer>
            <ReplicaLagNotice/>
            <Suspense>
                {move || Suspend::new(async move {
                    match overview.await {
                        Ok(overview) => view! { <LiveOverview overview/> }.into_any(),
                        Err(error) => view! { <h1>"Overview"</h1><ErrorPanel error/> }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

/// An island: the server's snapshot, replaced by a fresh one every
/// `REFRESH_MS` in the browser. A refresh that fails keeps the last numbers
/// (their "As of" says how old they are).
#[island]
fn LiveOverview(overview: Overview) -> impl IntoView {
    let current = RwSignal::new(overview);
    // Effects run only in the browser: the server renders one snapshot.
    Effect::new(move |_| {
        let refresh = move || {
            leptos::task::spawn_local(async move {
                if let Ok(fresh) = get_overview().await {
                    current.set(fresh);
                }
            })
        };
        if let Ok(handle) =
            set_interval_with_handle(refresh, std::time::Duration::from_millis(REFRESH_MS))
        {
            on_cleanup(move || handle.clear());
        }
    });
    move || view! { <PeriodSummary overview=current.get()/> }
}

#[component]
fn PeriodSummary(overview: Overview) -> impl IntoView {
    let period = overview.period.to_string();
    view! {
        <div class="page-head">
            <h1>{format!("Overview {period}")}</h1>
            <p class="hint as-of">{format!("As of {}", utc(overview.as_of))}</p>
        </div>
        <section class="tiles" aria-label="This period at a glance">
            <a class="tile" href=format!("/keys?period={period}&at_threshold=1&sort=utilization")>
                <span class="tile-figure" data-figure="at-threshold">{overview.at_threshold_count}</span>
                <span class="tile-label">"keys at or above an alert threshold"</span>
            </a>
            <a class="tile" href="/alerts">
                <span class="tile-figure" data-figure="open-alerts">{overview.open_alerts}</span>
                <span class="tile-label">"open alerts"</span>
            </a>
            <div class="tile">
                <span class="tile-figure" data-figure="refused-24h">{group_thousands(overview.refused_last_24h.unsigned_abs())}</span>
                <span class="tile-label">"calls refused in the last 24 h"</span>
            </div>
        </section>
        {if overview.totals.is_empty() {
            view! {
                <section class="panel">
                    <p>{format!("No vault keys were issued for {period} yet.")}</p>
                    <p class="hint">"Billing jobs get their key from the key API before a run; keys appear here as soon as they exist."</p>
                </section>
            }.into_any()
        } else {
            view! { <PeriodTotals overview=overview.clone()/> }.into_any()
        }}
        <NearCap overview=overview.clone()/>
        <Periods periods=overview.periods.clone()/>
        {overview.daily_spend.into_iter().map(|chart| view! { <DailySpend chart/> }).collect_view()}
        <section class="panel">
            <h2>"Billing ledger"</h2>
            <p>
                <strong>{overview.billing_records}</strong>
                {format!(" customers recorded as charged in {period} by the billing jobs")}
                {overview.billed_customers_amount.into_iter().map(|(currency, total)| view! {
                    ", " <Amount cents=total currency/>
                }).collect_view()}
                "."
            </p>
        </section>
    }
}

#[component]
fn PeriodTotals(overview: Overview) -> impl IntoView {
    view! {
        <div class="table-scroll" tabindex="0">
            <table class="data totals">
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
                        let pct = crate::domain::Cents(t.spent.0 + t.reserved.0).percent_of(t.cap);
                        view! {
                            <tr>
                                <th scope="row">{t.currency.to_string()}</th>
                                <td class="num">{format!("{} ({})", t.keys, t.active_keys)}</td>
                                <td class="num"><Amount cents=t.expected_total currency=t.currency.clone()/></td>
                                <td class="num"><Amount cents=t.cap currency=t.currency.clone()/></td>
                                <td class="num" data-figure="spent"><Amount cents=t.spent currency=t.currency.clone()/></td>
                                <td class="num"><Amount cents=t.reserved currency=t.currency.clone()/></td>
                                <td class="num">{format!("{pct} %")}</td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
        </div>
    }
}

#[component]
fn NearCap(overview: Overview) -> impl IntoView {
    if overview.at_threshold.is_empty() {
        return view! {
            <section class="panel">
                <h2>"Keys near their caps"</h2>
                <p class="hint">"No key of this period has reached an alert threshold."</p>
            </section>
        }
        .into_any();
    }
    let more = overview.at_threshold_count - overview.at_threshold.len() as i64;
    view! {
        <section class="panel">
            <h2>"Keys near their caps"</h2>
            <div class="table-scroll" tabindex="0">
                <table class="data compact">
                    <thead>
                        <tr>
                            <th scope="col">"Key"</th>
                            <th scope="col" class="num">"Spent + reserved"</th>
                            <th scope="col" class="num">"Cap"</th>
                            <th scope="col" class="num">"Utilization"</th>
                        </tr>
                    </thead>
                    <tbody>
                        {overview.at_threshold.into_iter().map(|key| view! {
                            <tr>
                                <td><a href=format!("/keys/{}", key.id)>{key.label.clone()}</a></td>
                                <td class="num"><Amount cents=key.committed() currency=key.currency.clone()/></td>
                                <td class="num"><Amount cents=key.cap currency=key.currency.clone()/></td>
                                <td class="num"><UtilizationMeter key=key.clone()/></td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
            </div>
            {(more > 0).then(|| view! {
                <p><a href=format!("/keys?period={}&at_threshold=1&sort=utilization", overview.period)>{format!("{more} more")}</a></p>
            })}
        </section>
    }
    .into_any()
}

/// The latest billing periods and where each stands with finance: open,
/// closing (prepared, not signed) or signed off; each links to its close.
#[component]
fn Periods(periods: Vec<PeriodStatus>) -> impl IntoView {
    if periods.is_empty() {
        return ().into_any();
    }
    view! {
        <section class="panel" aria-labelledby="periods-heading">
            <h2 id="periods-heading">"Billing periods"</h2>
            <div class="table-scroll" tabindex="0">
                <table class="data compact" data-testid="periods">
                    <thead>
                        <tr>
                            <th scope="col">"Period"</th>
                            <th scope="col">"State"</th>
                            <th scope="col" class="num">"Keys"</th>
                            <th scope="col" class="num">"Open findings"</th>
                        </tr>
                    </thead>
                    <tbody>
                        {periods.into_iter().map(|p| view! {
                            <tr>
                                <td><a href=format!("/periods/{}", p.period)>{p.period.to_string()}</a></td>
                                <td><span class=format!("period-state {}", state_class(p.state))>{p.state.label()}</span></td>
                                <td class="num">{p.keys}</td>
                                <td class="num">{p.open_findings}</td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
            </div>
        </section>
    }
    .into_any()
}

/// The CSS class of a period's state.
pub fn state_class(state: PeriodState) -> &'static str {
    match state {
        PeriodState::Open => "state-open",
        PeriodState::Closing => "state-closing",
        PeriodState::SignedOff => "state-signed",
    }
}

#[component]
fn DailySpend(chart: SpendChart) -> impl IntoView {
    let currency = chart.currency.clone();
    let columns = chart
        .legend
        .iter()
        .map(|(_, label, _, _)| label.clone())
        .collect();
    view! {
        <section class="panel">
            <h2>{format!("Daily spend per key ({currency})")}</h2>
            <figure class="chart">
                <div class="chart-svg" inner_html=chart.svg></div>
                <figcaption>
                    <ul class="legend">
                        {chart.legend.into_iter().map(|(id, label, colour, spent)| view! {
                            <li>
                                <span class="swatch" style=format!("background: {colour}")></span>
                                <a href=format!("/keys/{id}")>{label}</a>
                                " " <Amount cents=spent currency=currency.clone()/>
                            </li>
                        }).collect_view()}
                    </ul>
                </figcaption>
            </figure>
            <DayFiguresTable caption=format!("Daily spend per key ({currency})") columns rows=chart.by_day currency=currency.clone()/>
        </section>
    }
}
