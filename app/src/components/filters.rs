//! The end of a filter form: how many rows a page shows, and the buttons
//! that apply the filters or clear them all.

use leptos::prelude::*;

use crate::domain::AUDIT_PAGE_SIZES;

/// The "Per page" choice (`name="limit"`), `limit` selected.
#[component]
pub fn PerPage(id: &'static str, limit: String) -> impl IntoView {
    view! {
        <div class="field">
            <label for=id>"Per page"</label>
            <select id=id name="limit">
                {AUDIT_PAGE_SIZES.into_iter().map(|n| {
                    let n = n.to_string();
                    view! { <option value=n.clone() selected=n == limit>{n.clone()}</option> }
                }).collect_view()}
            </select>
        </div>
    }
}

/// "Apply", and "Clear" back to `page` without any filter.
#[component]
pub fn ApplyOrClear(page: &'static str) -> impl IntoView {
    view! {
        <div class="filter-actions">
            <button type="submit" class="button button-primary">"Apply"</button>
            <a class="button button-quiet" href=page>"Clear"</a>
        </div>
    }
}
