use leptos::prelude::*;

/// Tabs that filter a list through the URL (`{path}?{param}={value}`), each
/// with its count; the shown one is marked as the current page. Plain
/// links, so they work without JavaScript.
#[component]
pub fn CountTabs(
    /// What the tabs choose, for screen readers.
    label: &'static str,
    path: &'static str,
    param: &'static str,
    /// (value, label, count), in order.
    tabs: Vec<(&'static str, &'static str, i64)>,
    shown: String,
) -> impl IntoView {
    view! {
        <nav class="tabs" aria-label=label>
            {tabs.into_iter().map(|(value, text, count)| {
                let current = (shown == value).then_some("page");
                view! {
                    <a href=format!("{path}?{param}={value}") aria-current=current>
                        {text} " " <span class="count">{count}</span>
                    </a>
                }
            }).collect_view()}
        </nav>
    }
    .into_any()
}
