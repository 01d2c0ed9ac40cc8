use leptos::prelude::*;

use crate::domain::{Me, Role};

/// Renders `children` only for operators whose role allows `role`; everyone
/// else gets an explanation (and, on the server, a 403 status). Data behind
/// the page is guarded again in its server functions.
#[component]
pub fn RequireRole(role: Role, children: ChildrenFn) -> impl IntoView {
    let me = use_context::<Me>();
    let allowed = me.as_ref().is_some_and(|me| me.role.allows(role));
    if !allowed {
        #[cfg(feature = "ssr")]
        if let Some(response) = use_context::<leptos_axum::ResponseOptions>() {
            response.set_status(http::StatusCode::FORBIDDEN);
        }
    }
    view! {
        <Show
            when=move || allowed
            fallback=move || view! {
                <section class="panel panel-error" role="alert">
                    <h2>"You do not have access to this page"</h2>
                    <p>
                        "It needs the " <strong>{role.as_str()}</strong> " role; you are signed in as "
                        {me.as_ref().map(|me| me.role.as_str()).unwrap_or("nobody")}
                        ". Ask an administrator if you need it."
                    </p>
                </section>
            }
        >
            {children()}
        </Show>
    }
}
