use leptos::prelude::*;

use super::Amount;
use crate::domain::{Currency, DayFigures};

/// A chart's figures as a table, folded under the chart: the text
/// alternative for anyone who cannot see the lines, or wants the numbers.
#[component]
pub fn DayFiguresTable(
    /// What the table holds, e.g. "Daily spend per key".
    caption: String,
    /// The amount columns' headings, in the order of each row's amounts.
    columns: Vec<String>,
    rows: Vec<DayFigures>,
    currency: Currency,
) -> impl IntoView {
    if rows.is_empty() {
        return view! { <p class="hint">"No day has spending through the proxy yet, so the chart has no figures."</p> }.into_any();
    }
    view! {
        <details class="chart-figures">
            <summary>"The figures as a table"</summary>
            <div class="table-scroll" tabindex="0">
                <table class="data compact">
                    <caption>{caption}</caption>
                    <thead>
                        <tr>
                            <th scope="col">"Day (UTC)"</th>
                            {columns.into_iter().map(|column| view! { <th scope="col" class="num">{column}</th> }).collect_view()}
                        </tr>
                    </thead>
                    <tbody>
                        {rows.into_iter().map(|row| view! {
                            <tr>
                                <th scope="row" class="nowrap">{row.day}</th>
                                {row.amounts.into_iter().map(|cents| view! {
                                    <td class="num"><Amount cents currency=currency.clone()/></td>
                                }).collect_view()}
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
            </div>
        </details>
    }
    .into_any()
}
