use leptos::prelude::*;

/// An honest placeholder for a page whose capability is not built yet: says
/// what will appear here, shows no invented data.
#[component]
pub fn Upcoming(children: Children) -> impl IntoView {
    view! {
        <section class="panel panel-muted" aria-label="Not available yet">
            <p class="eyebrow">"Not available yet"</p>
            {children()}
        </section>
    }
}
