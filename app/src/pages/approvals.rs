use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{RequireRole, Upcoming},
    domain::Role,
};

#[component]
pub fn ApprovalsPage() -> impl IntoView {
    view! {
        <Title text="Approvals"/>
        <RequireRole role=Role::Viewer>
            <h1>"Approvals"</h1>
            <Upcoming>
                <p>
                    "Requests to raise a key's cap will wait here for a decision. An approver other "
                    "than the requester approves or rejects each one with a note (the four-eyes rule)."
                </p>
            </Upcoming>
        </RequireRole>
    }
}
