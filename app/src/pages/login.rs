use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_query_map;

use crate::domain::is_local_path;

/// The sign-in form. It posts to `/auth/login` as a plain HTML form, so it
/// behaves the same with or without JavaScript; the server redirects back
/// here with `?error=…` when sign-in fails.
#[component]
pub fn LoginPage() -> impl IntoView {
    let query = use_query_map();
    let param = move |name: &str| query.with_untracked(|q| q.get(name));
    let (next, foreign_next) = match param("next") {
        Some(next) if is_local_path(&next) => (next, false),
        Some(_) => (String::new(), true),
        None => (String::new(), false),
    };
    let wait = param("wait")
        .and_then(|s| s.parse::<u32>().ok())
        .map(|seconds| match seconds {
            0..=1 => "a second".to_string(),
            2..=119 => format!("{seconds} seconds"),
            _ => format!("{} minutes", seconds.div_ceil(60)),
        })
        .unwrap_or_else(|| "a minute".into());
    let error = param("error").map(|code| match code.as_str() {
        "invalid" => "Email or password is incorrect.".to_string(),
        "throttled" => format!("Too many failed sign-in attempts. Try again in {wait}."),
        "disabled" => "This account is disabled. Ask an administrator to enable it.".to_string(),
        "expired" => "Your session expired. Sign in again.".to_string(),
        "form" => "Enter your email and password.".to_string(),
        "code" => "That code is not right. Enter the 6 digits your authenticator shows now, or a recovery code.".to_string(),
        "code_used" => "That code was already used. Wait for the next one your authenticator shows.".to_string(),
        "code_missing" => "Enter the code from your authenticator, or a recovery code.".to_string(),
        "code_expired" => "Sign in again: the code must follow the password within 5 minutes.".to_string(),
        _ => "Sign-in failed. Try again.".to_string(),
    });
    let signed_out = param("signed_out").is_some();
    if param("step").as_deref() == Some("code") {
        return view! { <CodeStep next error/> }.into_any();
    }
    let invited = param("invited").is_some();

    view! {
        <Title text="Sign in"/>
        <main class="login">
            <form class="login-card" method="post" action="/auth/login">
                <h1 class="brand"><img class="logo" src="/pkg/favicon.svg" alt="" width="28" height="28"/>"Vaultcap"</h1>
                <p class="hint">"Spend governance for Stripe billing"</p>
                {error.map(|message| view! {
                    <div class="notice notice-error" role="alert"><p>{message}</p></div>
                })}
                {foreign_next.then(|| view! {
                    <div class="notice notice-error" role="alert" data-testid="foreign-next">
                        <p>"The link you followed would have sent you to another site after signing in. "
                           "You will land on the overview instead."</p>
                    </div>
                })}
                {invited.then(|| view! {
                    <div class="notice notice-success" role="status"><p>"Your password is set. Sign in with it."</p></div>
                })}
                {signed_out.then(|| view! {
                    <div class="notice notice-success" role="status"><p>"You have signed out."</p></div>
                })}
                <input type="hidden" name="next" value=next/>
                <label for="email">"Email"</label>
                <input id="email" name="email" type="email" autocomplete="username" required autofocus/>
                <label for="password">"Password"</label>
                <input id="password" name="password" type="password" autocomplete="current-password" required/>
                <button type="submit" class="button button-primary">"Sign in"</button>
            </form>
        </main>
    }
    .into_any()
}

/// The second step for an operator with two-factor sign-in: the code.
#[component]
fn CodeStep(next: String, error: Option<String>) -> impl IntoView {
    view! {
        <Title text="Sign in: code"/>
        <main class="login">
            <form class="login-card" method="post" action="/auth/login/code">
                <h1 class="brand"><img class="logo" src="/pkg/favicon.svg" alt="" width="28" height="28"/>"Vaultcap"</h1>
                <p class="hint">"Your password was right. One more step."</p>
                {error.map(|message| view! {
                    <div class="notice notice-error" role="alert"><p>{message}</p></div>
                })}
                <input type="hidden" name="next" value=next/>
                <label for="code">"Authentication code"</label>
                <input id="code" name="code" type="text" inputmode="numeric" autocomplete="one-time-code"
                    maxlength="20" required autofocus aria-describedby="code-hint"/>
                <p class="hint" id="code-hint">"The 6 digits your authenticator app shows, or one of your recovery codes."</p>
                <button type="submit" class="button button-primary">"Sign in"</button>
                <p class="hint"><a href="/login">"Start over with another account"</a></p>
            </form>
        </main>
    }
}
