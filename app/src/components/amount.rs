use leptos::prelude::*;

use crate::domain::{Cents, Currency};

/// An amount with its currency code, for a right-aligned numeric cell.
#[component]
pub fn Amount(cents: Cents, currency: Currency) -> impl IntoView {
    view! {
        <span class="amount">
            {cents.format(&currency)}
            <span class="currency">{currency.to_string()}</span>
        </span>
    }
}
