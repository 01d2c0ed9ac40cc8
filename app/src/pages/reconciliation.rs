use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{RequireRole, Upcoming},
    domain::Role,
};

#[component]
pub fn ReconciliationPage() -> impl IntoView {
    view! {
        <Title text="Reconciliation"/>
        <RequireRole role=Role::Viewer>
            <h1>"Reconciliation"</h1>
            <Upcoming>
                <p>
                    "Stripe's charges for a billing period will be compared with the billing ledger "
                    "here: orphaned charges to adopt, duplicate charges to refund, and missing charges "
                    "to investigate, each with its evidence and a record of who resolved it."
                </p>
            </Upcoming>
        </RequireRole>
    }
}
