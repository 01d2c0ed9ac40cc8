use leptos::prelude::*;
use leptos_meta::{provide_meta_context, MetaTags, Stylesheet, Title};
use leptos_router::{
    components::{ParentRoute, Route, Router, Routes},
    path, SsrMode,
};

use crate::{
    components::Layout,
    pages::{
        ActionLogPage, AlertsPage, ApiTokensPage, ApprovalConfirmPage, ApprovalsPage,
        AuditCallPage, AuditLogPage, BulkResolvePage, CapIncreasePage, FindingPage, InvitePage,
        KeyPage, KeyRequestConfirmPage, LoginPage, NewKeyPage, NotFoundPage, OperatorsPage,
        OverviewPage, PeriodClosePage, ReconciliationPage, TwoFactorPage, VaultKeysPage,
    },
};

/// The HTML document the server renders around the app. Its scripts carry
/// the nonce the server's Content-Security-Policy names for this response.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    #[cfg(feature = "ssr")]
    if let Some(nonce) = use_context::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<leptos::nonce::Nonce>().cloned())
    {
        provide_context(nonce);
    }
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <meta name="color-scheme" content="light"/>
                <link rel="icon" type="image/svg+xml" href="/pkg/favicon.svg"/>
                <HydrationScripts options islands=true/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

/// Every page renders completely on the server before it is sent
/// (`SsrMode::Async`), so the console reads the same with JavaScript off.
/// Rendered only on the server: in the browser only the islands run.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();

    view! {
        <Stylesheet id="vaultcap" href="/pkg/vaultcap.css"/>
        <Title formatter=|page: String| format!("{page} · Vaultcap")/>
        <Router>
            <Routes fallback=|| view! { <NotFoundPage/> }>
                <Route path=path!("/login") view=LoginPage ssr=SsrMode::Async/>
                <Route path=path!("/invite/:token") view=InvitePage ssr=SsrMode::Async/>
                <ParentRoute path=path!("") view=Layout ssr=SsrMode::Async>
                    <Route path=path!("") view=OverviewPage/>
                    <Route path=path!("/keys") view=VaultKeysPage/>
                    <Route path=path!("/keys/new") view=NewKeyPage/>
                    <Route path=path!("/keys/:id") view=KeyPage/>
                    <Route path=path!("/keys/:id/cap-increase") view=CapIncreasePage/>
                    <Route path=path!("/alerts") view=AlertsPage/>
                    <Route path=path!("/audit") view=AuditLogPage/>
                    <Route path=path!("/audit/:id") view=AuditCallPage/>
                    <Route path=path!("/actions") view=ActionLogPage/>
                    <Route path=path!("/reconciliation") view=ReconciliationPage/>
                    <Route path=path!("/reconciliation/bulk") view=BulkResolvePage/>
                    <Route path=path!("/reconciliation/:id") view=FindingPage/>
                    <Route path=path!("/periods/:id") view=PeriodClosePage/>
                    <Route path=path!("/approvals") view=ApprovalsPage/>
                    <Route path=path!("/approvals/:id/confirm") view=ApprovalConfirmPage/>
                    <Route path=path!("/key-requests/:id/confirm") view=KeyRequestConfirmPage/>
                    <Route path=path!("/account/two-factor") view=TwoFactorPage/>
                    <Route path=path!("/operators") view=OperatorsPage/>
                    <Route path=path!("/tokens") view=ApiTokensPage/>
                </ParentRoute>
            </Routes>
        </Router>
    }
}
