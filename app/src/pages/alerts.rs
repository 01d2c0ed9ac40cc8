use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{RequireRole, Upcoming},
    domain::Role,
};

#[component]
pub fn AlertsPage() -> impl IntoView {
    view! {
        <Title text="Alerts"/>
        <RequireRole role=Role::Viewer>
            <h1>"Alerts"</h1>
            <Upcoming>
                <p>
                    "Alerts will appear here when a key's utilization crosses one of its thresholds "
                    "(90 % by default), when a call is refused for its cap, and when a key is within "
                    "24 hours of expiry with expected total left unspent. You will be able to "
                    "acknowledge, assign and snooze them."
                </p>
            </Upcoming>
        </RequireRole>
    }
}
