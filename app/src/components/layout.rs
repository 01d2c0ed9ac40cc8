use leptos::prelude::*;
use leptos_router::components::{Outlet, A};

use super::{ErrorPanel, NoticeBanner};
use crate::{
    domain::{Me, Notice, Role},
    server_fns::{get_me, open_alert_count, pending_approval_count, take_notice},
};

/// The console's frame: brand, navigation, who is signed in, sign-out, the
/// one-time notice, and the page. Provides the signed-in [`Me`] to pages.
#[component]
pub fn Layout() -> impl IntoView {
    let me = OnceResource::new(get_me());
    let notice = OnceResource::new(take_notice());
    let open_alerts = OnceResource::new(open_alert_count());
    let pending_approvals = OnceResource::new(pending_approval_count());
    view! {
        <Suspense>
            {move || Suspend::new(async move {
                match me.await {
                    Ok(Some(me)) => {
                        provide_context(me.clone());
                        let notice = notice.await.ok().flatten();
                        let counts = NavCounts {
                            open_alerts: open_alerts.await.unwrap_or(0),
                            pending_approvals: pending_approvals.await.unwrap_or(0),
                        };
                        view! { <Frame me notice counts/> }.into_any()
                    }
                    // The server sends anonymous visitors to the sign-in page
                    // before rendering; this covers a session that ended while
                    // the page was open.
                    Ok(None) => view! {
                        <main class="centered">
                            <p>"Your session has ended. " <a href="/login">"Sign in again"</a></p>
                        </main>
                    }.into_any(),
                    Err(error) => view! { <main class="centered"><ErrorPanel error/></main> }.into_any(),
                }
            })}
        </Suspense>
    }
}

// The frame's parts return `AnyView`: a Leptos view's type nests as deep as
// its markup, and the whole frame as one type overflows the compiler's
// recursion limit where the router is instantiated.

/// What the navigation's badges count.
#[derive(Debug, Clone, Copy)]
struct NavCounts {
    open_alerts: i64,
    pending_approvals: i64,
}

#[component]
fn Frame(me: Me, notice: Option<Notice>, counts: NavCounts) -> impl IntoView {
    let is_admin = me.role.allows(Role::Admin);
    view! {
        <a class="skip-link" href="#main">"Skip to content"</a>
        <div class="frame">
            // On a narrow screen the navigation folds away behind the
            // top bar's Menu: a checkbox and its label, so it opens with
            // JavaScript off too.
            <input type="checkbox" id="nav-toggle" class="nav-toggle" aria-controls="main-nav"
                aria-label="Show the navigation"/>
            <TopBar me/>
            <MainNav is_admin counts/>
            <main class="content" id="main">
                {notice.map(|notice| view! { <NoticeBanner notice/> }.into_any())}
                <Outlet/>
            </main>
        </div>
    }
}

#[component]
fn TopBar(me: Me) -> impl IntoView {
    view! {
        <header class="topbar">
            <label for="nav-toggle" class="nav-toggle-button" aria-hidden="true">"Menu"</label>
            <a class="brand" href="/"><img class="logo" src="/pkg/favicon.svg" alt="" width="24" height="24"/>"Vaultcap"</a>
            <div class="whoami">
                <span class="who" data-testid="signed-in-as">{me.email}</span>
                <span class="role-badge">{me.role.as_str()}</span>
                {me.role.allows(Role::Approver).then(|| view! {
                    <a class="button button-quiet" href="/account/two-factor">"Two-factor sign-in"</a>
                })}
                <form method="post" action="/auth/logout">
                    <button type="submit" class="button button-quiet">"Sign out"</button>
                </form>
            </div>
        </header>
    }
    .into_any()
}

#[component]
fn MainNav(is_admin: bool, counts: NavCounts) -> impl IntoView {
    let badge = |count: i64, what: &'static str| {
        (count > 0).then(|| {
            view! {
                <span class="badge" aria-label=format!("{count} {what}")>{count}</span>
            }
        })
    };
    view! {
        <nav class="sidenav" id="main-nav" aria-label="Main">
            <ul>
                <li><A href="/" exact=true>"Overview"</A></li>
                <li><A href="/keys">"Vault keys"</A></li>
                <li><A href="/alerts">"Alerts" {badge(counts.open_alerts, "open")}</A></li>
                <li><A href="/audit">"Audit log"</A></li>
                <li><A href="/actions">"Action log"</A></li>
                <li><A href="/reconciliation">"Reconciliation"</A></li>
                <li><A href="/approvals">"Approvals" {badge(counts.pending_approvals, "waiting")}</A></li>
                {is_admin.then(|| view! {
                    <li><A href="/operators">"Operators"</A></li>
                    <li><A href="/tokens">"API tokens"</A></li>
                })}
            </ul>
        </nav>
    }
    .into_any()
}
