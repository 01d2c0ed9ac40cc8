use leptos::prelude::*;

/// Links between keyset pages: back to the newest page when not on it,
/// then newer and older when there are such pages.
#[component]
pub fn KeysetPager(
    /// What the pages hold, for the navigation's name ("Pages of calls").
    label: &'static str,
    newest: Option<String>,
    newer: Option<String>,
    older: Option<String>,
) -> impl IntoView {
    view! {
        <nav class="pager" aria-label=label>
            {newest.map(|href| view! { <a href=href>"⇤ Newest"</a> })}
            {newer.map(|href| view! { <a rel="prev" href=href>"← Newer"</a> })}
            {older.map(|href| view! { <a rel="next" href=href>"Older →"</a> })}
        </nav>
    }
}
