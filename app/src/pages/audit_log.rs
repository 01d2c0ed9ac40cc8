use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{RequireRole, Upcoming},
    domain::Role,
};

#[component]
pub fn AuditLogPage() -> impl IntoView {
    view! {
        <Title text="Audit log"/>
        <RequireRole role=Role::Viewer>
            <h1>"Audit log"</h1>
            <Upcoming>
                <p>
                    "Every call through the spend-cap proxy will be listed here, refusals included: "
                    "filter by key, customer, decision, time or idempotency key, open one call, and "
                    "export exactly the filtered set as CSV."
                </p>
            </Upcoming>
        </RequireRole>
    }
}
