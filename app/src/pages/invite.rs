use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;

use crate::{components::NoticeBanner, domain::MIN_PASSWORD_CHARS, server_fns::take_notice};

/// Where an invited operator sets their own password, from the one-time
/// link an admin passed on. A plain form: it works without JavaScript.
#[component]
pub fn InvitePage() -> impl IntoView {
    let params = use_params_map();
    let token = params
        .with_untracked(|p| p.get("token"))
        .unwrap_or_default();
    let notice = OnceResource::new(take_notice());
    view! {
        <Title text="Set your password"/>
        <main class="login">
            <form class="login-card" method="post" action="/auth/invite">
                <h1 class="brand"><img class="logo" src="/pkg/favicon.svg" alt="" width="28" height="28"/>"Vaultcap"</h1>
                <p class="hint">"Choose the password you will sign in with. Nobody else sees it; this link works once."</p>
                <Suspense>
                    {move || Suspend::new(async move {
                        notice.await.ok().flatten().map(|notice| view! { <NoticeBanner notice/> })
                    })}
                </Suspense>
                <input type="hidden" name="token" value=token/>
                <label for="password">"New password"</label>
                <input id="password" name="password" type="password" autocomplete="new-password"
                    required minlength=MIN_PASSWORD_CHARS/>
                <label for="password-again">"The same password again"</label>
                <input id="password-again" name="password_again" type="password" autocomplete="new-password"
                    required minlength=MIN_PASSWORD_CHARS/>
                <p class="hint">{format!("At least {MIN_PASSWORD_CHARS} characters.")}</p>
                <button type="submit" class="button button-primary">"Set password"</button>
            </form>
        </main>
    }
}
