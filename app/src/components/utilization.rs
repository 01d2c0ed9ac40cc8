use leptos::prelude::*;

use crate::domain::KeySummary;

/// A key's utilization (spent + reserved over cap) as a meter the browser
/// colours at the key's alert thresholds (green below the lowest, amber
/// from it, red from the highest), with the figure beside it.
#[component]
pub fn UtilizationMeter(key: KeySummary, #[prop(optional)] large: bool) -> impl IntoView {
    let pct = key.utilization_pct();
    let lowest = key.thresholds_pct.iter().min().copied().unwrap_or(90);
    let highest = key.thresholds_pct.iter().max().copied().unwrap_or(90);
    let class = format!(
        "util util-{}{}",
        key.level(),
        if large { " util-large" } else { "" }
    );
    view! {
        <span class=class>
            <meter min="0" max="100" low=lowest high=highest optimum="0" value=pct.min(100)
                aria-label=format!("Cap utilization of {}", key.label)></meter>
            <span class="util-figure">{format!("{pct} %")}</span>
        </span>
    }
}
