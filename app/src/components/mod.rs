//! Pieces several pages use.

mod amount;
mod count_tabs;
mod data_table;
mod day_figures;
mod filters;
mod layout;
mod notice_banner;
mod pager;
mod record_page;
mod replica_lag;
mod require_role;
mod utilization;

pub use amount::Amount;
pub use count_tabs::CountTabs;
pub use data_table::{col, num, DataTable};
pub use day_figures::DayFiguresTable;
pub use filters::{ApplyOrClear, PerPage};
pub use layout::Layout;
pub use notice_banner::NoticeBanner;
pub use pager::KeysetPager;
pub use record_page::{record_page, Record};
pub use replica_lag::ReplicaLagNotice;
pub use require_role::RequireRole;
pub use utilization::UtilizationMeter;

use leptos::prelude::*;

use crate::error::AppError;

/// A failed load, said plainly, with the way forward.
#[component]
pub fn ErrorPanel(error: AppError) -> impl IntoView {
    view! {
        <div class="panel panel-error" role="alert">
            <p>{error.to_string()}</p>
        </div>
    }
}

/// Formats a UTC time the same way everywhere: `2026-07-31 23:59 UTC`.
/// (Written out rather than with `format`, whose pattern interpreter would
/// otherwise be the browser bundle's only use of it.)
pub fn utc(at: chrono::DateTime<chrono::Utc>) -> String {
    use chrono::{Datelike, Timelike};
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        at.year(),
        at.month(),
        at.day(),
        at.hour(),
        at.minute()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_times_read_the_same_everywhere() {
        let at = "2026-07-01T09:05:59Z".parse().unwrap();
        assert_eq!(super::utc(at), "2026-07-01 09:05 UTC");
    }
}
