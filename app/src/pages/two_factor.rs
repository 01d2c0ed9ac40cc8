use leptos::prelude::*;
use leptos_meta::Title;

use crate::{
    components::{utc, ErrorPanel, RequireRole},
    domain::{Enrollment, Role, TwoFactorView},
    server_fns::get_two_factor,
};

/// An approver's or admin's own second factor: set it up with an
/// authenticator app (QR code or the secret typed in), confirm it with a
/// first code, or turn it off with a current one.
#[component]
pub fn TwoFactorPage() -> impl IntoView {
    let view_data = Resource::new(|| (), |_| get_two_factor());
    view! {
        <Title text="Two-factor sign-in"/>
        <RequireRole role=Role::Approver>
            <div class="page-head">
                <h1>"Two-factor sign-in"</h1>
            </div>
            <Suspense>
                {move || Suspend::new(async move {
                    match view_data.await {
                        Ok(view) => view! { <TwoFactor view/> }.into_any(),
                        Err(error) => view! { <ErrorPanel error/> }.into_any(),
                    }
                })}
            </Suspense>
        </RequireRole>
    }
}

#[component]
fn TwoFactor(view: TwoFactorView) -> impl IntoView {
    match (view.enabled_at, view.enrollment) {
        (Some(since), _) => view! {
            <section class="panel" aria-labelledby="two-factor-on">
                <h2 id="two-factor-on">"On"</h2>
                <p data-testid="two-factor-state">{format!(
                    "Since {}, sign-in asks for a code from your authenticator after your password. {} recovery {} left.",
                    utc(since),
                    view.recovery_codes_left,
                    if view.recovery_codes_left == 1 { "code" } else { "codes" },
                )}</p>
                <form method="post" action="/account/two-factor/disable" class="stacked">
                    <label for="disable-code">"Current code or a recovery code"</label>
                    <input id="disable-code" name="code" type="text" inputmode="numeric"
                        autocomplete="one-time-code" maxlength="20" required/>
                    <button type="submit" class="button button-danger">"Turn off two-factor sign-in"</button>
                </form>
            </section>
        }.into_any(),
        (None, Some(enrollment)) => view! { <Confirm enrollment/> }.into_any(),
        (None, None) => view! {
            <section class="panel" aria-labelledby="two-factor-off">
                <h2 id="two-factor-off">"Off"</h2>
                <p data-testid="two-factor-state">
                    "Sign-in asks for your password only. With two-factor sign-in, it also asks for a \
                     6-digit code from an authenticator app on your phone, so a stolen password alone \
                     cannot approve money."
                </p>
                <form method="post" action="/account/two-factor/setup">
                    <button type="submit" class="button button-primary">"Set up two-factor sign-in"</button>
                </form>
            </section>
        }.into_any(),
    }
}

#[component]
fn Confirm(enrollment: Enrollment) -> impl IntoView {
    view! {
        <section class="panel" aria-labelledby="two-factor-setup">
            <h2 id="two-factor-setup">"Set up your authenticator"</h2>
            <ol class="steps">
                <li>"Scan this QR code with an authenticator app (or add the account by hand with the secret below)."</li>
                <li>"Enter the 6-digit code the app shows. Two-factor sign-in is on once the code matches."</li>
            </ol>
            <div class="qr" role="img" aria-label="QR code for your authenticator app" inner_html=enrollment.qr_svg></div>
            <p>"Secret: " <code class="secret-text" data-testid="totp-secret">{enrollment.secret}</code></p>
            <form method="post" action="/account/two-factor/confirm" class="stacked">
                <label for="confirm-code">"Code from the app"</label>
                <input id="confirm-code" name="code" type="text" inputmode="numeric"
                    autocomplete="one-time-code" maxlength="6" required/>
                <button type="submit" class="button button-primary">"Turn on two-factor sign-in"</button>
            </form>
            <form method="post" action="/account/two-factor/setup" class="start-over">
                <button type="submit" class="button button-quiet">"Start over with a new secret"</button>
            </form>
        </section>
    }
}
